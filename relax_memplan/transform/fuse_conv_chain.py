"""FuseConvChain: a convolution and the strided convolution reading it as one kernel that never
stores the tensor between them whole.

Where it runs: on the high-level Relax graph, before ``LegalizeOps`` (our pipeline runs it in
the ``legalize`` phase with ``fusion=True``, last of
:func:`~relax_memplan.pipeline.fusion_passes`, on llvm/c targets only: its kernel has a CPU
schedule and no GPU one). Reads and writes no function attribute.

What it matches (:mod:`~relax_memplan.transform._conv_chain_match`)::

    a = R.nn.conv2d(x, w_a, ...)          # any stride, dense/grouped/depthwise
    t = epilogue_a(a)                      # bias, folded batch norm, ReLU/ReLU6/clip/SiLU
    b = R.nn.conv2d(t, w_b, strides=[s, .]) # s >= min_stride (2), padding any
    y = epilogue_b(b)

when ``a``, ``t`` and every var between them are read only inside the chain (an intermediate
with another consumer is refused: ``skipped["other_consumer"]``), shapes are static, the
weights constant, float32, NCHW/OIHW, dilation 1. ``y`` becomes one ``R.call_tir`` of the
kernel of :mod:`~relax_memplan.transform._conv_chain_kernel` (per output-row tile, the
intermediate rows that tile reads are computed into a kernel-local buffer: patch-based
inference as in MCUNetV2, Lin et al., NeurIPS 2021, and Halide/TVM ``compute_at``), at the
position of ``y``'s binding. Where the intermediate sets the function's peak (mobilenetv2's
expand output before its stride-2 depthwise conv), the peak drops: mobilenetv2-tiny 1,105,920 ->
718,848 B (the new peak is a stride-1 block: expand + depthwise outputs + residual). yolov8n's
stem pair ties with a C2f Concat at 2,457,600 B: fused, the Concat alone sets the bound.

When it applies: the rewrites of a function are kept only when its live bytes after TVM's
fusion and lowering (:func:`~relax_memplan.analysis.lowered_peak.lowered_live_bytes_by_step`,
whose maximum is the lower bound our planner reports) improve: the peak drops, or it stays
(another step ties with it) and the per-step live bytes, sorted from the largest, are
lexicographically smaller (the largest step that changes gets smaller; a smaller step may grow,
as the producer's input now lives until the fused call). When all sites together do not pass,
sites are tried one at a time in program order and kept while the rule holds (the others
counted in ``skipped["peak"]``). Which consumers may be fused is an argument (``consumers``:
depthwise only, or all), set by the pipeline from measured kernel speed.

Cost: the intermediate rows shared by two row tiles are recomputed
(:func:`~relax_memplan.transform._conv_chain_kernel.recompute_factor`, 1.25 for a 3x3 stride-2
consumer with 2-row tiles), and each parallel iteration allocates its scratch
(:func:`~relax_memplan.transform._conv_chain_kernel.scratch_bytes`) from TVM's CPU workspace
pool; that scratch is outside the planner's arena, so :attr:`FuseConvChain.scratch_bytes`
records the largest per iteration (times the number of threads at run time).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..analysis.lowered_peak import lowered_live_bytes_by_step
from ..schedules.cpu_conv_blocked import vector_registers
from ._conv_chain_blocked import blocked_plan, pack_weight
from ._conv_chain_kernel import conv_chain_kernel, scratch_bytes
from ._conv_chain_match import ChainSite, ConvChainMatcher, conv_spec
from ._module_util import replace_functions
from .fusion_record import RefusalLog

__all__ = ["FuseConvChain", "CONSUMER_KINDS", "REASONS"]

#: ``skipped`` reason -> the words of the fusion report.
REASONS = {"other_consumer": "intermediate has another reader",
           "peak": "live bytes would not improve",
           "scratch": "scratch of the threads not smaller than the intermediate",
           "dense_consumer": "dense consumer under --schedule",
           "kernel_below_stride": "kernel smaller than its stride",
           "no_producer": "input not made by a conv",
           "form": "producer conv not in the supported form",
           "epilogue": "op between the convs not a supported epilogue",
           "overlap": "producer already fused into another chain"}

#: ``depthwise``: only consumers with one input channel per output channel (mobilenetv2's
#: stride-2 depthwise convs); ``blocked``: those, and dense consumers whose pair gets the
#: register-blocked kernel (:func:`~relax_memplan.transform._conv_chain_blocked.blocked_plan`:
#: yolov8n's stem pair); ``all``: every dense and grouped consumer too.
CONSUMER_KINDS = ("depthwise", "blocked", "all")


@tvm.transform.module_pass(opt_level=0, name="FuseConvChain")
class FuseConvChain:
    """Fuse conv (+ epilogue) into a following strided conv (+ epilogue) where the function's
    live bytes improve (module docstring).

    Parameters
    ----------
    min_stride : int
        Smallest row stride of the consumer conv (>= 1; default 2).
    consumers : {"depthwise", "blocked", "all"}
        Which consumer convs may be fused (:data:`CONSUMER_KINDS`). The register-blocked
        kernel (channel counts multiples of the SIMD width, dense producer) is not slower than
        the two scheduled kernels it replaces (one thread, znver5, CPU time, whole model with
        and without FuseConvChain: efficientnet-b0 9.1 / 9.5 ms, mobilenetv2 5.8 / 6.3 ms,
        yolov8n's stem pair alone 0.74 ms against 0.36 + 0.44); the generic kernel (other
        channel counts) blocks no channels in registers and ran 1.19x the time of our
        scheduled convs on yolov8n's dense consumers. The pipeline's ``auto`` mode
        (:data:`~relax_memplan.pipeline.CONV_CHAIN_MODES`) follows that.
    tile_rows : int
        Output rows of the consumer per parallel iteration (>= 1).
    lanes : int
        SIMD lanes of the kernel's inner loops (the target's, see
        :func:`~relax_memplan.schedules.cpu_matmul.simd_lanes`).
    memory_check : bool
        Apply the live-bytes rule (module docstring), and refuse a site whose scratch for
        ``threads`` parallel iterations is not smaller than the intermediate it removes
        (the scratch lives in TVM's workspace, outside the arena and the lower bound, so the
        live-bytes rule cannot see it); ``False`` fuses every match.
    threads : int, optional
        Threads that run a fused kernel at once, for the scratch rule (>= 1; default
        ``tvm.runtime.num_threads()`` at compile time: a library run with more threads than
        it was compiled for uses more scratch than this rule allowed for).
    target : tvm.target.Target or str, optional
        Whose lowering passes the check runs (default ``llvm``).

    Attributes
    ----------
    fused : int
        Chains fused by the last run.
    skipped : dict of str to int
        Strided convs not fused, by reason (``other_consumer``: the intermediate has another
        reader; ``epilogue``: an op between the convs that is not a supported epilogue;
        ``no_producer``/``form``: no conv producer in the supported form;
        ``kernel_below_stride``: the consumer's kernel height is below its row stride;
        ``dense_consumer``: not depthwise, with ``consumers="depthwise"`` (or, with
        ``consumers="blocked"``, without the register-blocked kernel), and fusable otherwise
        (checked after every other reason but ``peak``); ``overlap``: the
        producer is the consumer of a chain already fused;
        ``peak``: the function's live bytes would not improve; ``scratch``: the scratch of
        ``threads`` parallel iterations is not smaller than the intermediate).
    scratch_bytes : int
        Largest kernel-local scratch of one parallel iteration among the fused kernels (bytes).
    records : list of PatternRecord
        ``[conv_chain]``: candidates (every strided conv looked at), fused, and each refusal
        with its reason (:data:`REASONS`) and bindings
        (:mod:`~relax_memplan.transform.fusion_record`).

    Raises
    ------
    ValueError
        ``min_stride``, ``tile_rows`` or ``lanes`` below 1, or an unknown ``consumers``.
    """

    def __init__(self, min_stride: int = 2, tile_rows: int = 2, lanes: int = 4,
                 consumers: str = "all", memory_check: bool = True, target=None,
                 threads: Optional[int] = None):
        for name, value in (("min_stride", min_stride), ("tile_rows", tile_rows),
                            ("lanes", lanes)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if consumers not in CONSUMER_KINDS:
            raise ValueError(f"consumers must be one of {CONSUMER_KINDS}, got {consumers!r}")
        self.consumers = consumers
        self.min_stride, self.tile_rows, self.lanes = min_stride, tile_rows, lanes
        self.memory_check = memory_check
        self.target = target
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.fused = 0
        self.skipped: Dict[str, int] = {}
        self._log = RefusalLog()
        self.scratch_bytes = 0

    @property
    def records(self):
        return [self._log.record("conv_chain", self.fused, REASONS)]

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.fused, self.skipped, self.scratch_bytes = 0, {}, 0
        self._log = RefusalLog()
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                mod = self._function(mod, gv, func)
        return mod

    def _skip(self, reason: str, n: int = 1, names=(), func=None, function: str = ""):
        if n:
            self.skipped[reason] = self.skipped.get(reason, 0) + n
            if names:
                for name in names:
                    self._log.refuse(reason, [name], func=func, function=function)
            else:
                self._log.refuse(reason, n=n, func=func, function=function)

    def _sites(self, mod, func) -> List[ChainSite]:
        matcher = ConvChainMatcher(mod, func)
        sites, claimed = [], set()
        for var, value in matcher.bound.items():
            b = conv_spec(value)
            if b is None or b.stride[0] < self.min_stride:
                continue
            if b.kernel[0] < b.stride[0]:  # tiles would skip rows (see the kernel module)
                self._skip("kernel_below_stride", names=[var.name], func=func)
                continue
            found = matcher.backward(value.args[0])
            if isinstance(found, str):
                self._skip(found, names=[var.name], func=func)
                continue
            producer, a, a_steps, a_arrays, replaced = found
            readers = replaced + [var]
            if not matcher.private_uses(replaced, readers):
                self._skip("other_consumer", names=[var.name], func=func)
                continue
            shape = tuple(int(v) for v in value.ty.shape.values)
            b_steps, b_arrays, last, after = matcher.forward(var, b.out_channels, shape)
            site = ChainSite(producer, a, a_steps, a_arrays, value, b, b_steps, b_arrays, last,
                             replaced + [var] + after)
            if self.memory_check and self._scratch_exceeds(a, b):
                self._skip("scratch", names=[var.name], func=func)
                continue
            if claimed & set(site.replaced):  # conv -> s2 conv -> s2 conv: the first pair only
                self._skip("overlap", names=[var.name], func=func)
                continue
            # the mode's choice last: a pair refused for another reason is counted by that
            # reason (review: under --schedule every dense candidate was "dense consumer")
            if not self._consumer_allowed(a, b):
                self._skip("dense_consumer", names=[var.name], func=func)
                continue
            claimed |= set(site.replaced)
            sites.append(site)
        return sites

    def _consumer_allowed(self, a, b) -> bool:
        if self.consumers == "all" or b.groups == b.in_channels == b.out_channels:
            return True
        return self.consumers == "blocked" and self.plan(a, b) is not None

    def plan(self, a, b):
        """The register-blocked kernel's tiles for the pair (``None``: the generic kernel)."""
        return blocked_plan(a, b, self.lanes, vector_registers(_target(self.target)))

    def _scratch_exceeds(self, a, b) -> bool:
        """Scratch of all threads >= the intermediate of one image (float32 bytes)."""
        threads = self.threads if self.threads is not None else tvm.runtime.num_threads()
        intermediate = 4 * a.out_channels * a.out_hw[0] * a.out_hw[1]
        return scratch_bytes(a, b, self.tile_rows) * threads >= intermediate

    def _rewrite(self, mod, gv, func, sites):
        if not sites:
            return mod
        rewriter = _Rewriter(mod, self, {s.last: s for s in sites})
        new_func = relax.analysis.remove_all_unused(rewriter.visit_expr(func))
        return replace_functions(rewriter.builder_.get(), {gv: new_func})

    def _better(self, mod, new_mod, name) -> bool:
        before = sorted(lowered_live_bytes_by_step(mod, name, self.target), reverse=True)
        after = sorted(lowered_live_bytes_by_step(new_mod, name, self.target), reverse=True)
        return after < before

    def _function(self, mod, gv, func):
        sites = self._sites(mod, func)
        new_mod = self._rewrite(mod, gv, func, sites)
        if sites and self.memory_check and not self._better(mod, new_mod, gv.name_hint):
            accepted, current = [], mod
            for site in sites:  # greedy, in program order
                tried = self._rewrite(mod, gv, func, accepted + [site])
                if self._better(current, tried, gv.name_hint):
                    accepted.append(site)
                    current = tried
            self._skip("peak", len(sites) - len(accepted),
                       [s.last.name for s in sites if s not in accepted], func, gv.name_hint)
            sites, new_mod = accepted, current
        self.fused += len(sites)
        for s in sites:
            self.scratch_bytes = max(self.scratch_bytes, scratch_bytes(s.a, s.b, self.tile_rows))
        return new_mod


def _target(target) -> tvm.target.Target:
    if target is None:
        return tvm.target.Target("llvm")
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod, owner: FuseConvChain, by_last: Dict[relax.Var, ChainSite]):
        super().__init__(mod)
        self.owner = owner
        self.by_last = by_last
        self.kernels: Dict[tuple, relax.GlobalVar] = {}

    def _kernel(self, site: ChainSite, batch: int, plan) -> relax.GlobalVar:
        key = (batch, site.a, tuple(site.a_steps), site.b, tuple(site.b_steps))
        if key not in self.kernels:
            func = conv_chain_kernel(batch, site.a, site.a_steps, site.b, site.b_steps,
                                     tile_rows=self.owner.tile_rows, lanes=self.owner.lanes,
                                     plan=plan)
            self.kernels[key] = self.builder_.add_func(func, "conv_chain")
        return self.kernels[key]

    def _weights(self, site: ChainSite, plan):
        """The two weights as the kernel reads them (blocked layouts with ``plan``)."""
        wa, wb = site.producer.args[1], site.consumer.args[1]
        if plan is None:
            return wa, wb
        return (relax.const(pack_weight(wa.value.numpy(), plan.producer_block)),
                relax.const(pack_weight(wb.value.numpy(), plan.consumer_block, plan.depthwise)))

    def visit_var_binding_(self, binding):
        site: Optional[ChainSite] = self.by_last.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        x = self.visit_expr(site.producer.args[0])
        batch = int(site.producer.args[0].ty.shape.values[0])
        plan = self.owner.plan(site.a, site.b)
        wa, wb = self._weights(site, plan)
        args = ([x, wa] + [relax.const(a) for a in site.a_arrays]
                + [wb] + [relax.const(a) for a in site.b_arrays])
        call = relax.call_tir(self._kernel(site, batch, plan), args, out_ty=binding.var.ty)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(call)))
