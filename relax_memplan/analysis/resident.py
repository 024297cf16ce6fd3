"""Bytes a call of a compiled library keeps resident: the embedded constants, the arena and
outputs of a call, and the largest kernel workspace.

- **Constants**: every tensor constant of the module's Relax functions, counted once per
  distinct content, as the VM's code generator stores them (``ExecBuilder`` keeps one pool
  entry per structurally equal constant: two equal ONNX initializers are one tensor; a
  weight used raw and also transposed or prepacked at compile time is two). Loaded with
  :func:`relax_memplan.library.load_library`, they are resident once.
- **Workspace**: buffers a kernel allocates inside itself (``alloc_buffer`` of an
  unscheduled fused kernel's intermediate stage, a schedule's packing or tile buffer). On CPU,
  TVM puts one of at most ``kMaxStackAlloca`` (1,024 bytes) on the stack and takes a larger one
  from its workspace pool (``TVMBackendAllocWorkspace``), which keeps freed pages for the
  next kernel; inside a parallel loop each running thread has its own. Kernels run one
  after another, so a call needs the largest kernel's workspace: its buffers outside
  parallel loops plus those inside times the thread count.

The arena and outputs are the report's "our build, per call" (the static plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

__all__ = ["KernelWorkspace", "ResidentBytes", "constant_tensors", "kernel_workspace",
           "MAX_STACK_ALLOCA_BYTES"]

MAX_STACK_ALLOCA_BYTES = 1024
"""TVM's ``runtime::kMaxStackAlloca``: CPU buffers up to this size live on the stack."""


@dataclass(frozen=True)
class KernelWorkspace:
    """Workspace of one PrimFunc, in bytes.

    Attributes
    ----------
    kernel : str
    shared_bytes : int
        Buffers allocated outside any parallel loop (one per call of the kernel).
    per_thread_bytes : int
        Buffers allocated inside a parallel loop (one per running thread).
    """

    kernel: str
    shared_bytes: int
    per_thread_bytes: int

    def bytes_with(self, threads: int) -> int:
        """Workspace with ``threads`` running threads."""
        return self.shared_bytes + self.per_thread_bytes * max(1, threads)


@dataclass
class ResidentBytes:
    """What a build keeps resident besides the arena and outputs of a call.

    Attributes
    ----------
    constants_bytes : int
        Distinct constant tensors of the module, in bytes.
    num_constants : int
        How many distinct constant tensors.
    kernels : list of KernelWorkspace
        Kernels with a workspace (those without one are left out).
    threads : int
        Threads assumed for per-thread workspace (TVM's thread pool size at build time).
    """

    constants_bytes: int = 0
    num_constants: int = 0
    kernels: List[KernelWorkspace] = field(default_factory=list)
    threads: int = 1

    @property
    def largest_workspace(self) -> Optional[KernelWorkspace]:
        """The kernel whose workspace is largest with :attr:`threads` threads."""
        return max(self.kernels, key=lambda k: k.bytes_with(self.threads), default=None)

    @property
    def workspace_bytes(self) -> int:
        """The largest kernel workspace, in bytes (0 without any)."""
        top = self.largest_workspace
        return top.bytes_with(self.threads) if top else 0

    def total_bytes(self, per_call_bytes: int) -> int:
        """Constants + ``per_call_bytes`` (arena and outputs of a call) + workspace."""
        return self.constants_bytes + per_call_bytes + self.workspace_bytes

    def to_dict(self, per_call_bytes: Optional[int] = None) -> Dict:
        """JSON-ready dict; with ``per_call_bytes``, also it and the total."""
        top = self.largest_workspace
        out = {"constants_bytes": self.constants_bytes, "num_constants": self.num_constants,
               "workspace_bytes": self.workspace_bytes,
               "workspace_kernel": top.kernel if top else None, "threads": self.threads}
        if per_call_bytes is not None:
            out["per_call_bytes"] = per_call_bytes
            out["resident_bytes"] = self.total_bytes(per_call_bytes)
        return out


def _content_key(array: np.ndarray) -> Tuple:
    flat = array.reshape(-1).view(np.uint8) if array.size else array.reshape(-1)
    return (str(array.dtype), array.shape, bytes(flat[:64]), bytes(flat[-64:]))


def constant_tensors(mod) -> Tuple[int, int]:
    """``(count, bytes)`` of the distinct tensor constants in the Relax functions of ``mod``.

    Constants are compared by content (dtype, shape and bytes), as the VM's code generator
    deduplicates them: first by a key of dtype, shape and the first and last 64 bytes, then
    in full where keys collide. Views through DLPack, no copy of the weights.
    """
    import tvm
    from tvm import relax

    seen: Dict[Tuple, List[np.ndarray]] = {}
    handles = set()

    def visit(expr):
        if not isinstance(expr, tvm.ir.GenericConst):
            return
        value = expr.value
        if not isinstance(value, tvm.runtime.Tensor):
            return
        array = np.from_dlpack(value) if value.device.dlpack_device_type() == 1 else value.numpy()
        where = (array.__array_interface__["data"][0], array.dtype.str, array.shape)
        if where in handles:  # the same tensor met again (one constant used twice)
            return
        handles.add(where)
        same = seen.setdefault(_content_key(array), [])
        if not any(np.array_equal(array, other) for other in same):
            same.append(array)

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    arrays = [a for group in seen.values() for a in group]
    return len(arrays), int(sum(a.nbytes for a in arrays))


def _buffer_bytes(buffer) -> Optional[int]:
    import tvm

    from .liveness import dtype_size_bytes

    n = 1
    for extent in buffer.shape:
        if not isinstance(extent, tvm.tirx.IntImm):
            return None
        n *= int(extent)
    return dtype_size_bytes(str(buffer.dtype), n)


def kernel_workspace(name: str, func) -> KernelWorkspace:
    """The workspace of a PrimFunc (see the module docstring): every ``alloc_buffer`` of a
    block and every ``AllocBuffer`` statement larger than :data:`MAX_STACK_ALLOCA_BYTES`,
    split by whether a parallel loop encloses it. A buffer of symbolic size counts 0."""
    from tvm import s_tir, tirx

    shared = per_thread = 0
    stack = [(func.body, False)]
    while stack:
        node, parallel = stack.pop()
        if node is None:
            continue
        buffers = []
        if isinstance(node, s_tir.SBlockRealize):
            buffers = list(node.block.alloc_buffers)
            stack += [(node.block.body, parallel), (node.block.init, parallel)]
        elif isinstance(node, tirx.SeqStmt):
            stack += [(s, parallel) for s in node.seq]
        elif isinstance(node, tirx.IfThenElse):
            stack += [(node.then_case, parallel), (node.else_case, parallel)]
        elif isinstance(node, tirx.For):
            stack.append((node.body, parallel or node.kind == tirx.ForKind.PARALLEL))
        else:
            if isinstance(node, tirx.AllocBuffer):
                buffers = [node.buffer]
            body = getattr(node, "body", None)
            if isinstance(body, tirx.Stmt):
                stack.append((body, parallel))
        for buffer in buffers:
            size = _buffer_bytes(buffer) or 0
            if size > MAX_STACK_ALLOCA_BYTES:
                if parallel:
                    per_thread += size
                else:
                    shared += size
    return KernelWorkspace(name, shared, per_thread)
