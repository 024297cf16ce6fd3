"""The relax_memplan compilation pipeline: TVM's per-target phases with our passes.

One :class:`PipelineOptions` says what runs; :func:`phases` writes the four phases out as
plain ordered lists (``library_dispatch``, ``legalize``, ``dataflow_lower``, ``finalize``:
TVM's passes and ours, in the order they run), and :func:`pass_order` /
``relax-memplan inspect --pipeline`` print them. What our passes recorded (the plans, fusion,
index checks, specialized kernels) is in the :class:`PipelinePasses` that
:func:`build_pipeline` returns beside the pass.

With ``planner="relax_memplan"`` the finalize phase runs
:class:`~relax_memplan.transform.PlanStaticMemory` (and ``PlanDynamicMemory`` for symbolic
sizes) before TVM's ``StaticPlanBlockMemory``, which then plans only what ours left. With
``planner="tvm"`` memory planning is TVM's own, unchanged: the baseline of every comparison
(both planners get the same kernels, so kernel time and numerics never differ between them).

By default the pipeline applies our CPU schedules for the target's CPU
(:mod:`relax_memplan.schedules`); unlike ``tvm.compile``'s bare default it also folds
constants and fuses operators.

Importing this package registers the pipeline as ``relax.get_pipeline("relax_memplan")``, so
``tvm.compile(mod, target, relax_pipeline="relax_memplan")`` works once
:mod:`relax_memplan` is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple, Union

import tvm
from tvm import relax

from .fusion import fusion_counts, fusion_passes
from .options import CONV_CHAIN_MODES, PLANNERS, PipelineOptions, PipelinePasses, as_options
from .phases import SUPPORTED_KINDS, make_passes, phases

__all__ = ["PipelineOptions", "PipelinePasses", "get_pipeline", "build_pipeline", "phases",
           "pass_order", "format_pass_order", "backend_phases", "fusion_passes",
           "fusion_counts", "PLANNERS", "CONV_CHAIN_MODES"]

#: ``get_pipeline`` keyword -> :class:`PipelinePasses` field: configured instances of our passes
#: a caller gives to set their options or read what they recorded after the build.
_PASS_KWARGS = {"plan_pass": "plan", "record_pass": "record", "dynamic_pass": "dynamic",
                "dispatch_pass": "dispatch", "index_pass": "index",
                "fusion_pass_list": "fusion", "reorder_pass": "reorder", "hoist_pass": "hoist"}


def _as_target(target: Union[str, dict, tvm.target.Target, None]) -> tvm.target.Target:
    """``target`` as a Target; None: the target ``tvm.compile`` entered, else this machine's
    CPU (the target our CPU schedules are written for)."""
    if target is None:
        current = tvm.target.Target.current(allow_none=True)
        if current is not None:
            return current
        from ..schedules.host import host_target

        return host_target()
    if isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(target)


def _split_kwargs(kwargs: Mapping) -> Tuple[dict, PipelinePasses]:
    """(option overrides, given passes) from ``get_pipeline``'s keyword arguments."""
    given = PipelinePasses(**{_PASS_KWARGS[k]: v for k, v in kwargs.items()
                              if k in _PASS_KWARGS and v is not None})
    options = {k: v for k, v in kwargs.items() if k not in _PASS_KWARGS}
    return options, given


def build_pipeline(target: Union[str, dict, tvm.target.Target, None] = None,
                   options: Optional[PipelineOptions] = None,
                   passes: Optional[PipelinePasses] = None,
                   ) -> Tuple[tvm.transform.Pass, PipelinePasses]:
    """The pipeline for ``target`` and the passes that record what it did.

    Parameters
    ----------
    target : str, dict or tvm.target.Target, optional
        Default: the target ``tvm.compile`` runs under, else this machine's CPU
        (:func:`~relax_memplan.schedules.host_target`). Our CPU schedules generate vector code
        for the target's CPU: plain ``"llvm"`` is the architecture's baseline (x86-64: SSE2),
        2-5x slower than the host CPU; :func:`relax_memplan.targets.make_target` gives the host
        CPU (``make_target("llvm")``), a named one or a portable one.
    options : PipelineOptions, optional
        Default ones when None: our planner, schedules, fusion and index checks.
    passes : PipelinePasses, optional
        Configured instances to use (a planner with its own settings, ...); the others are
        made by :func:`~relax_memplan.pipeline.phases.make_passes`.

    Returns
    -------
    (tvm.transform.Pass, PipelinePasses)
        The module pass running the four phases under ``target`` (give it to
        ``tvm.compile(mod, target, relax_pipeline=...)``), and the passes it runs: read their
        records after the build.

    Raises
    ------
    ValueError
        An unsupported target kind, unknown planner or conv chain mode.
    """
    options = options if options is not None else PipelineOptions()
    tgt = _as_target(target)
    used = make_passes(tgt, options, passes)
    ordered = phases(tgt, options, used)
    dump = Path(options.dump_dir) if options.dump_dir is not None else None

    @tvm.transform.module_pass(opt_level=0, name=f"RelaxMemplanPipeline_{options.planner}")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with tgt:
            for k, (name, phase) in enumerate(ordered):
                mod = tvm.transform.Sequential(phase, name=name)(mod)
                if dump is not None:
                    dump.mkdir(parents=True, exist_ok=True)
                    (dump / f"{k}_{name}.py").write_text(mod.script(), encoding="utf-8")
        return mod

    return _pipeline, used


def get_pipeline(target: Union[str, dict, tvm.target.Target, None] = None,
                 options: Optional[PipelineOptions] = None, **kwargs) -> tvm.transform.Pass:
    """The Relax pipeline to give ``tvm.compile(mod, target, relax_pipeline=...)``.

    Parameters
    ----------
    target : str, dict or tvm.target.Target, optional
        As :func:`build_pipeline`. Without one and outside ``tvm.compile`` (``relax_pipeline=
        "relax_memplan"`` makes the pipeline before entering the target), the phases are
        chosen for the target ``tvm.compile`` enters, when the pipeline runs.
    options : PipelineOptions, optional
        What runs; default ones when None.
    **kwargs
        Fields of :class:`PipelineOptions` replacing those of ``options`` (``planner="tvm"``,
        ``schedule=False``, ``dim_ranges={...}``, ...), and configured passes to use, read
        after the build: ``plan_pass``, ``record_pass``, ``dynamic_pass``, ``dispatch_pass``,
        ``index_pass``, ``fusion_pass_list``, ``reorder_pass``, ``hoist_pass``
        (:class:`PipelinePasses`; :func:`build_pipeline` returns them all instead).

    Raises
    ------
    ValueError
        An unsupported target kind, unknown planner or conv chain mode.
    TypeError
        An unknown keyword argument.
    """
    overrides, given = _split_kwargs(kwargs)
    opts = as_options(options, overrides)
    if target is None and tvm.target.Target.current(allow_none=True) is None:
        @tvm.transform.module_pass(opt_level=0, name=f"RelaxMemplanPipeline_{opts.planner}")
        def _deferred(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
            return build_pipeline(None, opts, given)[0](mod)

        return _deferred
    return build_pipeline(target, opts, given)[0]


def backend_phases(target: tvm.target.Target, **kwargs) -> List[Tuple[str, list]]:
    """The four phases for ``target`` with the passes given as :func:`get_pipeline`'s keyword
    arguments; TVM's planner alone unless ``plan_pass`` or ``dynamic_pass`` is given, and no
    index check unless ``index_pass`` is (the phases exactly as given, for tests and tools that
    look at one phase).

    Raises
    ------
    ValueError
        An unsupported target kind.
    TypeError
        An unknown keyword argument.
    """
    overrides, given = _split_kwargs(kwargs)
    ours = given.plan is not None or given.dynamic is not None
    opts = as_options(None, {"planner": "relax_memplan" if ours else "tvm", **overrides})
    used = make_passes(target, opts, given)
    if given.index is None:
        used.index = None
    if ours and given.plan is None:
        used.plan = None
    return phases(target, opts, used)


def pass_order(target: Union[str, dict, tvm.target.Target, None] = None,
               options: Optional[PipelineOptions] = None,
               passes: Optional[PipelinePasses] = None) -> List[Tuple[str, List[str]]]:
    """Phase name -> the registered names of its passes, in the order they run (``passes``:
    configured instances, as :func:`build_pipeline`).

    Raises
    ------
    ValueError
        An unsupported target kind.
    """
    tgt = _as_target(target)
    opts = options if options is not None else PipelineOptions()
    return [(name, [p.info.name for p in phase])
            for name, phase in phases(tgt, opts, make_passes(tgt, opts, passes))]


def format_pass_order(target: Union[str, dict, tvm.target.Target, None] = None,
                      options: Optional[PipelineOptions] = None,
                      passes: Optional[PipelinePasses] = None) -> str:
    """:func:`pass_order` as text: one numbered line per pass, ours marked ``*``."""
    tgt = _as_target(target)
    words = tgt.kind.name + "".join(f" {key}={tgt.attrs[key]}" for key in ("mcpu", "arch")
                                    if tgt.attrs.get(key) is not None)
    lines, k = [f"relax_memplan pipeline for {words} (* = relax_memplan's pass)"], 0
    for name, names in pass_order(tgt, options, passes):
        lines.append(f"{name}:")
        for pass_name in names:
            k += 1
            mark = " " if _is_tvm_pass(pass_name) else "*"
            lines.append(f"  {k:3d} {mark} {pass_name}")
    return "\n".join(lines)


def _is_tvm_pass(name: str) -> bool:
    return name in _tvm_pass_names()


def _tvm_pass_names() -> set:
    from tvm.relax.backend.cpu_generic import pipeline as cpu
    from tvm.relax.backend.cuda import pipeline as cuda

    names = set()
    target = tvm.target.Target("llvm")
    for backend in (cpu, cuda):
        for make in (backend.library_dispatch_passes, backend.legalize_passes,
                     backend.dataflow_lower_passes, backend.finalize_passes):
            names.update(p.info.name for p in make(target))
    return names


if "relax_memplan" not in relax.pipeline.PIPELINE_MAP:
    relax.pipeline.register_pipeline("relax_memplan")(get_pipeline)
