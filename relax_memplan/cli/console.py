"""What the command line prints while it works: timed progress lines and TVM's native log.

:class:`PhaseProgress` is the ``progress`` callback the compile and bench functions call
before each long phase (import, build ours, build TVM's, run); it prints each phase with
its seconds, and the total at the end. :func:`native_log` decides what becomes of the
lines TVM's C++ code writes to file descriptor 2 (``Warning: Fast mode segfaults ...``
once per Gather, ``BlockBuilder destroyed ...``): shown as they come (``verbose``),
dropped (``mute``), or, by default, collected and shown once each with a count.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile
import time
from collections import Counter
from typing import Iterator, List, Optional, TextIO

__all__ = ["PhaseProgress", "native_log", "summarize_native_log"]

PREFIX = "[relax-memplan] "

# "[21:16:05] /project/src/relax/ir/block_builder.cc:67: " in front of TVM's messages
_LOG_HEADER = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")

NOT_SHOWN = ("BlockBuilder destroyed with remaining blocks!",)
"""TVM messages the summary leaves out: TVM's C++ ``BlockBuilder`` logs this when an importer
or pass that stopped half-way (an import we retry with the opset upgraded, a Ctrl-C) is freed.
What stopped it is already said in our words (the report's note on the retry, the error or
``interrupted`` line), so the line carries nothing for the user (it would follow ``bench``
on ultraface and a Ctrl-C). ``-v`` still shows TVM's log raw."""

EXPLAINED = {
    "Fast mode segfaults when there are out-of-bounds indices. Make sure input indices are in "
    "bound": "our index checks, on unless --no-index-checks, stop an out-of-range index with "
             "an error before such a kernel runs"}
"""TVM messages that alarm without context, and what our build does about them (added after
the message): TVM's gather/take kernels in ``fast`` mode do not check their indices."""


class PhaseProgress:
    """Progress callback printing each phase with its seconds, and the total on :meth:`finish`.

    On a terminal a phase is one line, ``importing model.onnx ... 1.3 s``, its start shown
    while it runs; elsewhere (a log, a pipe) ``importing model.onnx ...`` is written when the
    phase starts and ``importing model.onnx: 1.3 s`` when it ends (a line written only at
    the end would leave a log empty for the 45 s of a build).

    Parameters
    ----------
    stream : file, optional
        Where to write; default: ``sys.stderr`` as it is at each write.
    """

    def __init__(self, stream: Optional[TextIO] = None):
        self._stream = stream
        self._started = time.perf_counter()
        self._phase: Optional[str] = None
        self._phase_started = 0.0

    def _out(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _tty(self) -> bool:
        return bool(getattr(self._out(), "isatty", lambda: False)())

    def __call__(self, message: str) -> None:
        """Start the phase ``message``, ending the current one; a Ctrl-C that TVM swallowed
        in the phase before ends the work here (:func:`relax_memplan.runtime.raise_if_interrupted`)."""
        from ..runtime import raise_if_interrupted

        self._end_phase()
        raise_if_interrupted()
        self._phase, self._phase_started = message, time.perf_counter()
        self._out().write(f"{PREFIX}{message} ..." + ("" if self._tty() else "\n"))
        self._out().flush()

    def _end_phase(self) -> None:
        if self._phase is None:
            return
        seconds = time.perf_counter() - self._phase_started
        out = self._out()
        out.write(f" {seconds:.1f} s\n" if self._tty() else f"{PREFIX}{self._phase}: {seconds:.1f} s\n")
        out.flush()
        self._phase = None

    def finish(self) -> float:
        """End the current phase and print the total seconds; returns them."""
        self._end_phase()
        total = time.perf_counter() - self._started
        self._out().write(f"{PREFIX}total {total:.1f} s\n")
        self._out().flush()
        return total


def summarize_native_log(text: str) -> List[str]:
    """Distinct lines of TVM's native log, first-seen order, with ``(N times)`` when repeated;
    the time stamp and source location in front of each message are dropped, and so are the
    messages in :data:`NOT_SHOWN`."""
    counts: Counter = Counter()
    order: List[str] = []
    for line in text.splitlines():
        message = _LOG_HEADER.sub("", line).strip()
        if not message or any(message.endswith(m) for m in NOT_SHOWN):
            continue
        if message not in counts:
            order.append(message)
        counts[message] += 1
    return [f"TVM: {m}" + (f" ({counts[m]} times)" if counts[m] > 1 else "")
            + "".join(f"; {why}" for known, why in EXPLAINED.items() if m.endswith(known))
            for m in order]


@contextlib.contextmanager
def native_log(mode: str = "once") -> Iterator[None]:
    """Handle what TVM's C++ code writes to file descriptor 2 while the block runs.

    Parameters
    ----------
    mode : {"once", "mute", "verbose"}
        ``once``: collect it and, after the block, print each distinct line once with its
        count (on ``sys.stderr``); ``mute``: drop it; ``verbose``: leave it alone. Python's
        own writes to ``sys.stderr`` (progress lines) still show in every mode.

    Notes
    -----
    The garbage collector runs before the capture ends, so that TVM objects the block left
    in reference cycles log their destruction into the capture.
    """
    if mode == "verbose":
        yield
        return
    if mode not in ("once", "mute"):
        raise ValueError(f"mode must be 'once', 'mute' or 'verbose', got {mode!r}")
    sys.stderr.flush()
    saved = os.dup(2)
    python_stderr = sys.stderr
    try:
        on_fd2 = python_stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # e.g. pytest's capture: not a real file
        on_fd2 = False
    with tempfile.TemporaryFile("w+b") as sink:
        os.dup2(sink.fileno(), 2)
        if on_fd2:  # Python's writes go where fd 2 went before
            sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1)
        try:
            yield
        finally:
            # objects of the block left in reference cycles (an importer's BlockBuilder
            # from a failed first import) are freed here, not later at garbage collection
            # or interpreter exit, where their C++ destructor logs to the real fd 2
            # ("BlockBuilder destroyed with remaining blocks!", even with -q)
            gc.collect()
            if on_fd2:
                sys.stderr.flush()
                sys.stderr.close()
                sys.stderr = python_stderr
            os.dup2(saved, 2)
            os.close(saved)
            if mode == "once":
                sink.seek(0)
                for line in summarize_native_log(sink.read().decode("utf-8", "replace")):
                    print(f"{PREFIX}{line}", file=sys.stderr)
