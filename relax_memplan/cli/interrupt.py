"""Ctrl-C that ends the command line promptly, also while TVM's C++ code runs.

Python runs a SIGINT handler only when the main thread executes Python code. During
``tvm.compile`` the main thread spends tens of seconds in C++ (TIR lowering, LLVM code
generation) and the ``KeyboardInterrupt`` raised in one of our passes (Python callbacks) is
turned into another error by TVM's FFI, which a fallback may swallow; a Ctrl-C would then
wait for the build to finish (17 s to 46 s on yolov8n).

:func:`exit_on_interrupt` watches for SIGINT from a helper thread, woken through
:func:`signal.set_wakeup_fd` by CPython's C-level signal handler (it needs no Python code in
the main thread). TVM's FFI releases the GIL during its calls, so the helper runs while the
build is in C++. When the main thread has not ended the command ``grace_s`` seconds after
the signal, the helper removes what the command had begun writing
(:class:`OutputGuard`), prints one line and ends the process with exit status 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import Dict, Iterator, Optional, Sequence, Tuple

__all__ = ["OutputGuard", "exit_on_interrupt", "INTERRUPTED_LINE", "EXIT_INTERRUPTED"]

INTERRUPTED_LINE = "relax-memplan: interrupted"
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what a shell reports for a program ended by Ctrl-C."""

_Stamp = Optional[Tuple[int, int, int]]


def _stamp(path: str) -> _Stamp:
    """(inode, size in bytes, mtime in ns) of a file, ``None`` when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class OutputGuard:
    """The output files of one command, as they were before it began.

    Parameters
    ----------
    paths : sequence of str
        Files the command may write (``-o``, ``--report``, ...); ``None`` or empty entries are
        skipped. Folders are not guarded (``--dump-ir`` keeps the phases dumped so far).
    """

    def __init__(self, paths: Sequence[Optional[str]]):
        self._before: Dict[str, _Stamp] = {os.fspath(p): _stamp(os.fspath(p)) for p in paths if p}

    def remove_partial(self) -> list:
        """Remove every guarded file the command created or changed (an interrupted command
        leaves no output, not a half-written one); files it has not touched stay. Returns the
        removed paths."""
        removed = []
        for path, before in self._before.items():
            now = _stamp(path)
            if now is not None and now != before and not os.path.isdir(path):
                with contextlib.suppress(OSError):
                    os.remove(path)
                    removed.append(path)
        return removed


@contextlib.contextmanager
def exit_on_interrupt(guard: OutputGuard, grace_s: float = 0.5) -> Iterator[None]:
    """While the block runs, a Ctrl-C that the main thread has not acted on within
    ``grace_s`` seconds ends the process: ``guard``'s partial outputs removed,
    :data:`INTERRUPTED_LINE` on the stderr of the block's start, exit status
    :data:`EXIT_INTERRUPTED`, no traceback, no collected TVM log.

    A Ctrl-C the main thread handles in time (it was running Python code) takes the ordinary
    ``KeyboardInterrupt`` path of the caller. Outside the main thread (no signal handlers
    there) the block runs unwatched.

    Parameters
    ----------
    guard : OutputGuard
        The command's output files.
    grace_s : float
        Seconds the main thread has to end the command itself.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    err_fd = os.dup(2)  # the terminal, even when TVM's native log is captured later
    lock, done = threading.Lock(), threading.Event()
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter
        reader.close(), writer.close(), os.close(err_fd)
        yield
        return

    def watch() -> None:
        while True:
            data = reader.recv(64)
            if not data:  # the block ended: the writer is closed
                return
            if signal.SIGINT in data and not done.wait(grace_s):
                with lock:
                    if done.is_set():
                        return
                    guard.remove_partial()
                    os.write(err_fd, f"{INTERRUPTED_LINE}\n".encode())
                    os._exit(EXIT_INTERRUPTED)

    watcher = threading.Thread(target=watch, name="relax-memplan-interrupt", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with lock:
            done.set()
        signal.set_wakeup_fd(previous)
        writer.close()
        watcher.join()
        reader.close()
        os.close(err_fd)
