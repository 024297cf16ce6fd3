"""Run a compiled Relax VM executable and measure the bytes it allocates.

The VM is created with the *naive* allocator (every ``alloc_storage`` is a real
allocation, nothing is cached) and an instrument hook
(``VirtualMachine.set_instrument``) that sees every ``vm.builtin.alloc_storage``
call before it runs. The bytes are the requested storage sizes; kernel
workspaces allocated inside PrimFuncs are not seen by the hook.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from ..analysis.liveness import dtype_size_bytes
from ..errors import INDEX_CHECK_MESSAGE, IndexValueError, RunError, summarize_error
from .vm_errors import describe_input_mismatch

__all__ = ["RuntimeMemory", "kernel_profile", "kernels_per_call", "run_and_measure",
           "run_checked", "recording_interrupts", "raise_if_interrupted",
           "to_numpy_list", "release_pooled_memory", "heap_bytes"]


@dataclass
class RuntimeMemory:
    """What one call allocated through ``vm.builtin.alloc_storage``.

    Attributes
    ----------
    alloc_bytes : int
        Sum of the requested storage sizes, in bytes.
    alloc_sizes_bytes : list of int
        Each request, in call order.
    outputs : list of numpy.ndarray
        The function's results, flattened (tuples in order).
    """

    alloc_bytes: int
    alloc_sizes_bytes: List[int] = field(default_factory=list)
    outputs: List[np.ndarray] = field(default_factory=list)

    @property
    def num_allocs(self) -> int:
        """Number of ``alloc_storage`` calls."""
        return len(self.alloc_sizes_bytes)


def to_numpy_list(value) -> List[np.ndarray]:
    """Flatten a VM result (tensor, tuple/array of them, shape, scalar) into numpy arrays."""
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__") and not isinstance(value, str):
        out = []
        for v in value:
            out.extend(to_numpy_list(v))
        return out
    return [np.asarray(value)]


def _storage_bytes(args) -> int:
    # vm.builtin.alloc_storage(vm_state, shape, device_index, dtype_hint, storage_scope)
    shape, dtype = args[1], str(args[3])
    n = 1
    for d in shape:
        n *= int(d)
    return dtype_size_bytes(dtype, n)


def run_and_measure(
    executable: tvm.runtime.Executable,
    inputs: Sequence[np.ndarray],
    device: tvm.runtime.Device = None,
    func_name: str = "main",
) -> RuntimeMemory:
    """Call ``func_name`` once on ``inputs`` and record its storage allocations.

    Parameters
    ----------
    executable : tvm.runtime.Executable
        Result of ``tvm.compile`` for a Relax module.
    inputs : sequence of numpy.ndarray
        Positional arguments, converted with ``tvm.runtime.tensor``.
    device : tvm.runtime.Device, optional
        Default ``tvm.cpu()``.
    func_name : str
        The VM function to call.

    Returns
    -------
    RuntimeMemory
        Bytes and count of ``alloc_storage`` calls, and the outputs.
    """
    dev = device if device is not None else tvm.cpu()
    vm = relax.VirtualMachine(executable, dev, memory_cfg="naive")
    sizes: List[int] = []
    hook_interrupted: List[bool] = []

    def _instrument(_func, name, before_run, _ret, *args):
        try:
            if before_run and name == "vm.builtin.alloc_storage":
                sizes.append(_storage_bytes(args))
        except KeyboardInterrupt:
            hook_interrupted.append(True)
            raise
        return 0

    vm.set_instrument(_instrument)
    # np.ascontiguousarray would turn a 0-d array (a scalar input) into 1-d
    args = [tvm.runtime.tensor(np.asarray(x, order="C"), dev) for x in inputs]
    with recording_interrupts() as interrupted:
        try:
            result = vm[func_name](*args)
        except Exception:
            # Ctrl-C lands in the instrument hook (the only Python code running during
            # the call); TVM's FFI turns that KeyboardInterrupt into a bare RuntimeError.
            if interrupted or hook_interrupted:
                raise KeyboardInterrupt from None
            raise
    outputs = to_numpy_list(result)
    return RuntimeMemory(alloc_bytes=sum(sizes), alloc_sizes_bytes=sizes, outputs=outputs)


@contextlib.contextmanager
def recording_interrupts() -> Iterator[List[int]]:
    """Record SIGINT (Ctrl-C) while the block runs; the handler in place still runs.

    Yields a list that is non-empty once a SIGINT arrived, so code that sees the
    KeyboardInterrupt converted to another exception type (TVM's FFI does that when
    it is raised inside a Python callback) can raise KeyboardInterrupt again. Outside
    the main thread (no signal handlers there) it records nothing.
    """
    received: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = signal.getsignal(signal.SIGINT)
    _RECORDING.append(received)

    def _handler(signum, frame):
        received.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _handler)
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, previous)
        # by identity: nested blocks that each recorded [2] compare equal, and list.remove
        # would take the outer block's list (a ValueError traceback and exit 1 on a Ctrl-C
        # while TVM's default build runs)
        del _RECORDING[next(i for i, r in enumerate(_RECORDING) if r is received)]


_RECORDING: List[List[int]] = []
"""The lists of the active :func:`recording_interrupts` blocks, outermost first."""


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C arrived inside an active :func:`recording_interrupts`
    block, even though the KeyboardInterrupt itself was lost.

    TVM's FFI turns a KeyboardInterrupt raised inside a Python callback (our passes run as
    such callbacks inside ``tvm.compile``) into another exception type, which a fallback
    (``except Exception``) may then swallow; calling this at each phase boundary turns the
    interrupt back into one.
    """
    if any(_RECORDING):
        raise KeyboardInterrupt


def run_checked(executable: tvm.runtime.Executable, inputs: Sequence[np.ndarray], build_name: str,
                dims: Mapping[str, int] = None, hint: str = "",
                func_name: str = "main") -> RuntimeMemory:
    """:func:`run_and_measure`, with any failure of the run as a one-line :class:`RunError`.

    Parameters
    ----------
    executable : tvm.runtime.Executable
    inputs : sequence of numpy.ndarray
    build_name : str
        Which build runs, for the message (e.g. ``"relax_memplan's build"``).
    dims : mapping of str to int, optional
        The symbolic dims' values, named in the message; else the input shapes are.
    hint : str
        Advice appended to the message (not to an :class:`IndexValueError`: the value of an
        input is at fault there, whatever the shapes).
    func_name : str
        The VM function to call.

    Returns
    -------
    RuntimeMemory

    Raises
    ------
    IndexValueError
        The call stopped at one of our index checks (:data:`INDEX_CHECK_MESSAGE`).
    RunError
        An input's shape or dtype differs from the function's annotation (the input and the
        expected shape named: :func:`relax_memplan.runtime.vm_errors.describe_input_mismatch`), or
        the call failed otherwise (TVM's error summarized on one line: :func:`summarize_error`).
    KeyboardInterrupt
        Ctrl-C during the call, whatever type TVM turned it into.
    """
    try:
        return run_and_measure(executable, inputs, func_name=func_name)
    except Exception as err:  # noqa: BLE001 - TVM raises many types; one clear message
        expecter = "the library" if build_name.startswith("library") else build_name
        mismatch = describe_input_mismatch(str(err), inputs, expecter=expecter)
        if mismatch is not None:
            raise RunError(f"running {func_name} of {build_name} failed: {mismatch}") from None
        at = (", ".join(f"{k}={v}" for k, v in dims.items()) if dims is not None
              else "inputs " + ", ".join(str(tuple(np.shape(x))) for x in inputs))
        index_check = INDEX_CHECK_MESSAGE in str(err)
        raise (IndexValueError if index_check else RunError)(
            f"running {func_name} of {build_name} at {at} failed: "
            f"{summarize_error(err)}{'' if index_check else hint}") from None


def release_pooled_memory() -> None:
    """Give every buffer cached by TVM's pooled VM allocator back to the system.

    TVM's pooled allocator (``memory_cfg="pooled"``, the VM default) is
    process-global per device, caches every freed buffer by its exact size and
    never shrinks on its own; this calls ``vm.builtin.memory_manager.clear``.
    Buffers still referenced (live tensors) are not affected; the next calls
    allocate afresh. With ``PlanDynamicMemory(size_classes=True)`` the cache
    stays bounded (one arena per size-class cell) and this is rarely needed.
    """
    tvm.get_global_func("vm.builtin.memory_manager.clear")()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def heap_bytes() -> int:
    """Bytes the process heap holds now: in-use + mmapped (glibc ``mallinfo2``), after a GC.

    How much memory the pooled VM allocator (and everything else) keeps, for
    benchmarks that compare what stays held after many calls.

    Raises
    ------
    OSError
        If the C library is not glibc (no ``mallinfo2``).
    """
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    info = libc.mallinfo2()
    return info.hblkhd + info.uordblks


def kernel_profile(vm: relax.VirtualMachine, args: Sequence, rounds: int = 1, sync=None,
                   merge_numbered: bool = True, include_builtins: bool = False,
                   clock=time.perf_counter) -> dict:
    """Time every packed call of ``vm["main"](*args)`` with the VM's instrument hook.

    Parameters
    ----------
    vm : tvm.relax.VirtualMachine
    args : sequence of tvm.runtime.Tensor
        The inputs of ``main``.
    rounds : int
        Calls of ``main`` timed; the result is the mean per call.
    sync : callable, optional
        Called before and after every kernel (a GPU device's ``sync``), so each kernel's time is
        its own.
    merge_numbered : bool
        Key by the name without digits (``fused_matmul3_add2`` -> ``fused_matmul_add``), so one
        kind of kernel sums over its numbered copies.
    include_builtins : bool
        Also time ``vm.builtin.*`` calls (allocation, views, shape checks).
    clock : callable
        Seconds now; default wall time. ``time.thread_time`` (CPU time of the calling thread)
        is immune to other processes taking the core, but counts only work done in the calling
        thread: use it with ``TVM_NUM_THREADS=1`` only.

    Returns
    -------
    dict of str to (float, float)
        Name -> (seconds per ``main`` call, calls per ``main`` call).
    """
    total, calls, started = {}, {}, {}

    def hook(func, name, before_run, _ret, *_args):
        if not include_builtins and name.startswith("vm.builtin."):
            return 0
        if _is_relax_function(func):
            return 0  # a call of another Relax function (a loop driver), not a kernel
        if sync is not None:
            sync()
        if before_run:
            started[name] = clock()
        else:
            key = re.sub(r"\d+", "", name) if merge_numbered else name
            total[key] = total.get(key, 0.0) + clock() - started.pop(name)
            calls[key] = calls.get(key, 0) + 1
        return 0

    vm.set_instrument(hook)
    try:
        for _ in range(rounds):
            vm["main"](*args)
    finally:
        vm.set_instrument(lambda *_a: 0)
    return {k: (total[k] / rounds, calls[k] / rounds) for k in total}


def _is_relax_function(func) -> bool:
    """Whether an instrumented call is a VM closure (a Relax function calling another, such
    as a recursive loop driver calling itself) rather than a packed function."""
    cls = type(func)
    return f"{cls.__module__}.{cls.__name__}" == "relax.vm.Closure"


def kernels_per_call(vm: relax.VirtualMachine, args: Sequence) -> int:
    """Packed calls one ``vm["main"](*args)`` makes that are not ``vm.builtin.*`` (kernels)."""
    return int(sum(n for _s, n in kernel_profile(vm, args, merge_numbered=False).values()))
