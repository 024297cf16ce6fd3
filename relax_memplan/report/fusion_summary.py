"""What our fusion changed in one fixed-shape build, for the fusion report.

Compares the module after our pipeline's Relax phases with ``fusion=False`` (TVM's
FuseOps/FuseTIR alone) and ``fusion=True`` (our passes first), both with our planner
(:class:`~relax_memplan.transform.PlanStaticMemory`), without code generation; the fused side
is the build's own module and plan when the build hands them over (:func:`summarize_fusion`'s
``fused``), so only the unfused side is run again:

* kernels per call: the PrimFunc calls ``main`` makes after ``RewriteDataflowReshape`` (reshape
  views are not kernels), counted in the IR (``main`` of an imported ONNX model has no loop;
  both branches of an ``If`` count);
* intermediate bytes: the sum of the sizes of the tensors ``main`` allocates per call (each
  tensor once, before any reuse), and the lower bound (peak live bytes) of our plan, both runs
  with the build's planner settings (in-place reuse, concat in place, reordering: the same
  baseline as the report's lower bound, so ``lower_bound_bytes_ours`` is that bound and the
  difference is fusion's effect alone; on yolov8n a bound computed without concat in place
  says fusion changes nothing while turning conv chains off raises the report's bound), and
  the build's kernels: with ``schedule`` both runs apply our CPU schedules (on bert-tiny
  ``--schedule``, runs with unscheduled kernels would print "-> 393,216 B", the unscheduled
  build's bound, beside a report bound of 458,752 B). The
  build's own bound is kept beside it (``lower_bound_bytes_build``); the text says so when
  they differ;
* onnxruntime's reference: the node count of its optimized graph for the same ONNX model
  (``SessionOptions.optimized_model_filepath`` with ``ORT_ENABLE_ALL``, CPU provider).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple

import tvm
from tvm import relax

from ..pipeline import fusion_passes, get_pipeline
from ..transform.fuse_conv_chain import REASONS as CONV_CHAIN_REASONS
from ..transform.plan_static_memory import PlanStaticMemory
from ..transform.reorder_for_memory import ReorderForMemory

__all__ = ["FusionSummary", "summarize_fusion", "count_kernel_calls", "ort_optimized_nodes",
           "fusion_skips"]

#: FuseConvChain reason -> words in the report: every strided conv the pass looked at and did
#: not fuse has one (fused + these = the candidates, the same total in every mode); "refused"
#: are pairs the pass could fuse but its memory rules or another reader forbid, "skipped"
#: convs not in a fusable form or not fused in this mode.
_SKIP_WORDS = {code: ("refused: " if code in ("other_consumer", "peak", "scratch") else "skipped: ")
               + words for code, words in CONV_CHAIN_REASONS.items()}


@dataclass
class FusionSummary:
    """Kernels and bytes of ``main`` without (``tvm``) and with (``ours``) our fusion.

    Bytes are bytes; ``ort_nodes`` is ``None`` when onnxruntime could not optimize the model
    (or was given none); it counts the nodes of If/Loop/Scan bodies too, ``ort_subgraph_nodes``
    of them (silero's 4 nodes are Reshape, Gather, Equal and an If holding the model).
    ``conv_chain_scratch_bytes``: the largest kernel-local scratch of one parallel iteration
    of a :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain`
    kernel (TVM's CPU workspace pool, once per running thread; not in the lower bound).
    ``planner_settings``: the planner features both lower bounds were computed with
    (``"in-place, concat in place, reordering"``; ``"none"``), the build's.
    ``lower_bound_bytes_build``: the lower bound of ``main`` in the build the report describes
    (``None`` when not given); equal to ``lower_bound_bytes_ours`` unless the runs here planned
    differently from the build.
    """

    kernels_tvm: int
    kernels_ours: int
    intermediate_bytes_tvm: int
    intermediate_bytes_ours: int
    lower_bound_bytes_tvm: int
    lower_bound_bytes_ours: int
    ort_nodes: Optional[int] = None
    ort_subgraph_nodes: int = 0
    conv_chain_scratch_bytes: int = 0
    planner_settings: str = ""
    lower_bound_bytes_build: Optional[int] = None

    @property
    def intermediate_bytes_removed(self) -> int:
        """Bytes of intermediates per call that our fusion removed (negative: added)."""
        return self.intermediate_bytes_tvm - self.intermediate_bytes_ours

    def to_dict(self) -> Dict:
        return dict(asdict(self), intermediate_bytes_removed=self.intermediate_bytes_removed)


def count_kernel_calls(func: relax.Function, mod: tvm.IRModule) -> int:
    """Calls of ``mod``'s PrimFuncs in ``func`` (after ``CallTIRRewrite`` a kernel is called
    directly; before it through ``R.call_tir``)."""
    prim = {gv for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    count = [0]

    def visit(expr):
        if not isinstance(expr, relax.Call):
            return
        callee = expr.op
        if isinstance(callee, tvm.ir.Op) and callee.name.startswith("relax.call_tir"):
            callee = expr.args[0]
        if isinstance(callee, tvm.ir.GlobalVar) and callee in prim:
            count[0] += 1

    relax.analysis.post_order_visit(func, visit)
    return count[0]


def _relax_phases(mod, target, fusion: bool, conv_chain: str = "auto", schedule: bool = True,
                  planner=(False, False, False)):
    """(kernel calls of main, intermediate bytes, lower bound bytes, conv chain scratch bytes)
    after our Relax phases; ``planner``: (in-place, concat in place, reorder)."""
    inplace, concat_inplace, reorder = planner
    plan = PlanStaticMemory(time_limit_s=0.1, inplace=inplace, concat_inplace=concat_inplace)
    passes = fusion_passes(target, conv_chain, schedule) if fusion else None
    # the build's kernels: scheduled kernels decide in-place reuse (analysis/inplace.py)
    lowered = get_pipeline(target, plan_pass=plan, fusion=fusion, fusion_pass_list=passes,
                           schedule=schedule,
                           reorder_pass=ReorderForMemory() if reorder else None)(mod)
    return _phases_of(lowered, plan.plans.get("main"), passes)


def _phases_of(lowered, fplan, passes):
    """(kernel calls of main, intermediate bytes, lower bound bytes, conv chain scratch bytes)
    of a module after the Relax phases, ``fplan`` its plan of ``main``."""
    total = sum(t.size_bytes or 0 for t in fplan.liveness.tensors) if fplan else 0
    lower = fplan.lower_bound_bytes if fplan else 0
    scratch = max([p.scratch_bytes for p in passes or [] if p.info.name == "FuseConvChain"],
                  default=0)
    return count_kernel_calls(lowered["main"], lowered), total, lower, scratch


def _settings_words(planner) -> str:
    words = [w for on, w in zip(planner, ("in-place", "concat in place", "reordering")) if on]
    return ", ".join(words) or "none"


def fusion_skips(passes) -> dict:
    """Conv chain candidates one build's fusion passes did not fuse, by reason in words
    (``{"skipped: dense consumer under --schedule": 7}``: ``conv_chain="auto"`` with our CPU
    schedules fuses depthwise consumers only; ``{"refused: intermediate has another reader":
    3}``), every reason of :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain`
    (``skipped``); empty when none or fusion is off. With the fused chains they add up to the
    candidates (``fusion_counts()["conv_chain_candidates"]``), the same in every mode.
    Without the reasons, yolov8n under ``--schedule`` reads "conv chains fused 0x, conv chains
    refused 0x" (its stem pair skipped without a word), and without ``--schedule`` "fused 2x,
    refused 4x" with no reason and one of its 7 strided convs in no count."""
    skips = {}
    for p in passes or []:
        if p.info.name == "FuseConvChain":
            for reason, n in p.skipped.items():
                if n:
                    words = _SKIP_WORDS.get(reason, f"skipped: {reason}")
                    skips[words] = skips.get(words, 0) + int(n)
    return skips


def _node_counts(graph) -> Tuple[int, int]:
    """(nodes of ``graph``, nodes inside its nodes' subgraph attributes, recursively)."""
    inside = 0
    for node in graph.node:
        for attr in node.attribute:
            for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                top, nested = _node_counts(body)
                inside += top + nested
    return len(graph.node), inside


def ort_optimized_nodes(onnx_model, split: bool = False):
    """Nodes of onnxruntime's optimized graph (``ORT_ENABLE_ALL``, CPU) of ``onnx_model``,
    those in If/Loop/Scan bodies included; with ``split``, (all nodes, nodes in bodies).
    ``None`` when onnxruntime is missing or refuses the model."""
    try:
        import onnx  # pylint: disable=import-outside-toplevel
        import onnxruntime  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = path
        options.log_severity_level = 4
        # only the nodes are counted: weights go to a side file that is never read back
        # (writing and reloading GPT-2's 500 MB of them took 5 of the 7 s)
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "weights.bin")
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        # packing the GEMM weights for its kernels changes no node, and the session never runs
        options.add_session_config_entry("session.disable_prepacking", "1")
        try:
            source = _with_zero_weights(onnx_model, tmp)
            onnxruntime.InferenceSession(source, sess_options=options,
                                         providers=["CPUExecutionProvider"])
            top, inside = _node_counts(onnx.load(path, load_external_data=False).graph)
            return (top + inside, inside) if split else top + inside
        except Exception:  # noqa: BLE001 - a reference column only; absent when ORT refuses
            return None


def _with_zero_weights(onnx_model, folder: str) -> str:
    """The path of a copy of ``onnx_model`` in ``folder`` whose large weights read as zeros
    (:func:`~relax_memplan.frontend.weightless.weightless_copy`): serializing and loading
    GPT-2's 500 MB of them was most of the time onnxruntime took to optimize its graph, and
    its fusions match the graph, not weight values."""
    from ..frontend.weightless import save_weightless

    return save_weightless(onnx_model, folder)[0]


def summarize_fusion(mod: tvm.IRModule, target, onnx_model=None, conv_chain: str = "auto",
                     schedule: bool = True, plan_pass: Optional[PlanStaticMemory] = None,
                     reorder: bool = False, fused: Optional[tvm.IRModule] = None,
                     fusion_pass_list: Optional[list] = None) -> FusionSummary:
    """Kernels, intermediate bytes and lower bound of ``mod``'s ``main`` without and with our
    fusion (fixed shapes: a symbolic dim makes the lower bound a function of it, see the
    per-shape report instead), and onnxruntime's optimized node count of ``onnx_model``.

    Parameters
    ----------
    mod : tvm.IRModule
        The imported module (before any pass), with a ``main``.
    target : tvm.target.Target
        Target of the build (the fusion passes depend on it).
    onnx_model : onnx.ModelProto, optional
        The model ``mod`` was imported from, for the onnxruntime column.
    conv_chain : {"auto", "memory", "off"}
        The build's conv chain mode (:data:`~relax_memplan.pipeline.CONV_CHAIN_MODES`).
    schedule : bool
        Whether the build applies our CPU schedules: both runs then do (``get_pipeline(
        schedule=...)``), and the conv chain mode ``auto`` depends on it.
    plan_pass : PlanStaticMemory, optional
        The build's planner, after the build: both runs use its ``inplace`` and
        ``concat_inplace`` (default: neither), so the two bounds differ by fusion alone and
        the fused one equals the report's lower bound; its plan of ``main`` gives
        ``lower_bound_bytes_build``.
    reorder : bool
        Whether the build runs :class:`~relax_memplan.transform.ReorderForMemory` (both runs
        then do).
    fused : tvm.IRModule, optional
        The build's module after its Relax pipeline (with our fusion), given with
        ``plan_pass`` and ``fusion_pass_list``: the fused column is read from it, the build's
        plan of ``main`` and its fusion passes instead of running the pipeline again (on
        GPT-2 that run took about half a minute).
    fusion_pass_list : list, optional
        The build's fusion passes, after the build (for the conv chain scratch).

    Returns
    -------
    FusionSummary
    """
    planner = (bool(plan_pass and plan_pass.inplace), bool(plan_pass and plan_pass.concat_inplace),
               reorder)
    k_tvm, b_tvm, lb_tvm, _ = _relax_phases(mod, target, False, planner=planner)
    build = plan_pass.plans.get("main") if plan_pass is not None else None
    if fused is not None and build is not None:
        k_ours, b_ours, lb_ours, scratch = _phases_of(fused, build, fusion_pass_list)
    else:
        k_ours, b_ours, lb_ours, scratch = _relax_phases(mod, target, True, conv_chain,
                                                         schedule, planner)
    ort = ort_optimized_nodes(onnx_model, split=True) if onnx_model is not None else None
    return FusionSummary(k_tvm, k_ours, b_tvm, b_ours, lb_tvm, lb_ours,
                         ort[0] if ort else None, ort[1] if ort else 0, scratch,
                         _settings_words(planner),
                         build.lower_bound_bytes if build is not None else None)
