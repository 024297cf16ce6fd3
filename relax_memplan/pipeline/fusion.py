"""Our graph-level fusion passes, in the order they run, and what they did."""

from __future__ import annotations

import tvm

from ..schedules.cpu_matmul import simd_lanes
from ..transform.chunk_feed_forward import ChunkFeedForward
from ..transform.fold_matmul_reshape import FoldMatmulReshape
from ..transform.fuse_add_layer_norm import FuseAddLayerNorm
from ..transform.fuse_attention import FuseAttention
from ..transform.fuse_conv_chain import FuseConvChain
from ..transform.fuse_normalization import FuseNormalization
from ..transform.remove_dropout import RemoveDropout
from .options import CONV_CHAIN_MODES

__all__ = ["fusion_passes", "fusion_counts"]


def fusion_passes(target: tvm.target.Target, conv_chain: str = "auto",
                  schedule: bool = True) -> list:
    """Our graph-level fusion passes, in the order they run (before ``LegalizeOps``).

    :class:`~relax_memplan.transform.fold_matmul_reshape.FoldMatmulReshape` (a matmul between
    reshapes to and from 2-d becomes the N-d matmul, so FuseOps fuses its epilogue),
    :class:`~relax_memplan.transform.remove_dropout.RemoveDropout`,
    :class:`~relax_memplan.transform.fuse_attention.FuseAttention` (its kernel scheduled for
    ``target``: CPU for llvm, CUDA for cuda),
    :class:`~relax_memplan.transform.fuse_normalization.FuseNormalization` (layer and RMS
    norms written as element-wise steps become the norm ops),
    :class:`~relax_memplan.transform.fuse_add_layer_norm.FuseAddLayerNorm` (its scheduled CPU
    kernel for ``llvm``/``c``, else a compute the target's default schedule rules schedule) and
    :class:`~relax_memplan.transform.chunk_feed_forward.ChunkFeedForward` (the feed-forward
    block over row chunks where the lowered peak drops), on every target; on llvm/c targets
    :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain` last (a conv and the
    stride-2 conv reading it as one kernel where the live bytes improve; CPU kernel only, so not
    for cuda), for the consumers ``conv_chain`` selects (:data:`CONV_CHAIN_MODES`; ``schedule``:
    the build applies our CPU schedules, as ``get_pipeline(schedule=...)``). Give the
    list to ``get_pipeline(..., fusion_pass_list=...)`` and read :func:`fusion_counts` after the
    build.

    Raises
    ------
    ValueError
        An unknown ``conv_chain`` mode.
    """
    if conv_chain not in CONV_CHAIN_MODES:
        raise ValueError(f"conv_chain must be one of {list(CONV_CHAIN_MODES)}, "
                         f"got {conv_chain!r}")
    cpu = target.kind.name in ("llvm", "c")
    passes = [FoldMatmulReshape(), RemoveDropout(), FuseAttention(target=target),
              FuseNormalization(),
              FuseAddLayerNorm(kernel="cpu" if cpu else "compute", target=target),
              ChunkFeedForward(target=target)]
    consumers = CONV_CHAIN_MODES[conv_chain][0 if schedule else 1]
    if cpu and consumers is not None:
        passes.append(FuseConvChain(lanes=simd_lanes(target), target=target,
                                    consumers=consumers))
    return passes


def fusion_counts(passes) -> dict:
    """What the fusion passes of one build did: pattern -> count (``attention``: attention
    blocks fused into one kernel, ``dropout``: dropouts removed, ``layer_norm``/``rms_norm``:
    norms written as element-wise steps made one norm op, ``add_layer_norm``/``add_rms_norm``:
    residual add + layer/RMS norm pairs fused into one kernel, ``matmul_reshape``: matmuls
    taken out of a reshape sandwich so that FuseOps fuses their epilogue,
    ``feed_forward_chunked``: feed-forward
    blocks computed over row chunks, ``conv_chain``: conv + strided conv pairs fused,
    ``conv_chain_refused``: chains found but not fused, because the intermediate has another
    reader, the live bytes would not improve or the threads' scratch would not be smaller,
    ``conv_chain_candidates``: strided convs the pass looked at, fused or not, each once: the
    same in every mode, the reasons of the others in
    :func:`~relax_memplan.report.fusion_summary.fusion_skips`); a pattern whose pass did not
    run is absent."""
    by_name = {p.info.name: p for p in passes}
    counts = {}
    if "FuseAttention" in by_name:
        counts["attention"] = int(by_name["FuseAttention"].fused)
    if "RemoveDropout" in by_name:
        counts["dropout"] = int(by_name["RemoveDropout"].removed)
    if "FoldMatmulReshape" in by_name:
        counts["matmul_reshape"] = int(by_name["FoldMatmulReshape"].folded)
    if "FuseNormalization" in by_name:
        counts.update({k: int(n) for k, n in by_name["FuseNormalization"].fused.items()})
    if "FuseAddLayerNorm" in by_name:
        counts.update({k: int(n)
                       for k, n in by_name["FuseAddLayerNorm"].fused_by_pattern.items()})
    if "ChunkFeedForward" in by_name:
        counts["feed_forward_chunked"] = int(by_name["ChunkFeedForward"].chunked)
    if "FuseConvChain" in by_name:
        counts["conv_chain"] = int(by_name["FuseConvChain"].fused)
        skipped = by_name["FuseConvChain"].skipped
        counts["conv_chain_refused"] = sum(skipped.get(k, 0)
                                           for k in ("other_consumer", "peak", "scratch"))
        counts["conv_chain_candidates"] = counts["conv_chain"] + sum(skipped.values())
    return counts
