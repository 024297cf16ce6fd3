"""GPU (CUDA) schedules: TVM's dlight GPU rules, made robust to rule failures.

Where it runs
-------------
In the ``legalize`` phase of a CUDA build, in place of the
``ApplyDefaultSchedule`` pass of TVM's CUDA ``legalize_passes`` (see
``relax_memplan.pipeline.backend_phases``), and as the ``schedule`` function
``SpecializeKernels`` uses on CUDA
(:func:`relax_memplan.transform.specialize_kernels.backend_schedule`).

Why
---
dlight tries its rules in order (Matmul, GEMV, Reduction, GeneralReduction,
Fallback) and takes the first that returns a schedule. Some rules fail
instead of returning ``None`` on shapes they do not handle: e.g. ``GEMV``
raises a bare ``AssertionError`` on bert-tiny's attention ``matmul(probs, V)``
at ``seq == 1`` (a reduction of length 1), which aborts the whole build.
:class:`GuardedRule` turns any exception of a rule into "not applicable", so
the next rule (in the end ``Fallback``) schedules the kernel. ``Fallback``
itself is not guarded: a kernel it cannot schedule would silently become host
code, so that error is kept.

Each rule builds its own ``Schedule`` from the function, so a failed attempt
leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Union

import tvm
from tvm import tirx
from tvm.s_tir import dlight
from tvm.target import Target

__all__ = ["GuardedRule", "gpu_schedule_rules", "gpu_schedule_pass", "schedule_gpu_prim_func"]


_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_BUG_TYPES = (AttributeError, NameError, TypeError, ImportError)


def _bug_in_our_code(err: Exception) -> bool:
    """Whether ``err`` is a programming error raised inside relax_memplan itself (its innermost
    frame is in this package): such an error is a bug to report, not "the rule does not
    apply"."""
    if not isinstance(err, _BUG_TYPES):
        return False
    tb, last = err.__traceback__, None
    while tb is not None:
        last, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    return last is not None and Path(last).resolve().is_relative_to(_PACKAGE_DIR)


class GuardedRule(dlight.ScheduleRule):
    """A dlight rule whose exceptions mean "does not apply" (``None``), except a programming
    error (``AttributeError``, ``NameError``, ``TypeError``, ``ImportError``) raised inside
    relax_memplan's own code, which is re-raised: otherwise a bug in one of our rules would
    silently turn the rule off (it once left a guard doing nothing while the build it was
    meant to save hung).

    Parameters
    ----------
    rule : tvm.s_tir.dlight.ScheduleRule
        The rule to try.

    Attributes
    ----------
    failures : list of str
        ``"<RuleClass>: <ExceptionType>: <message>"`` for each failure caught
        (for diagnostics; grows over the rule's lifetime).
    """

    def __init__(self, rule: dlight.ScheduleRule):
        self.rule = rule
        self.failures: List[str] = []

    def apply(self, func, target, tunable):
        try:
            return self.rule.apply(func, target, tunable)
        except Exception as err:  # pylint: disable=broad-except
            if _bug_in_our_code(err):
                raise
            # dlight rules raise AssertionError, ScheduleError, TVMError, IndexError... on
            # shapes they do not handle; any of them means: try the next rule.
            message = str(err).strip().splitlines()
            self.failures.append(f"{type(self.rule).__name__}: {type(err).__name__}: "
                                 f"{message[-1] if message else ''}")
            return None

    def __repr__(self) -> str:
        return f"GuardedRule({type(self.rule).__name__})"


def gpu_schedule_rules() -> list:
    """dlight's GPU rules in the order of TVM's CUDA pipeline, all but ``Fallback`` guarded.

    Returns
    -------
    list of tvm.s_tir.dlight.ScheduleRule
        ``Matmul``, ``GEMV``, ``Reduction``, ``GeneralReduction`` (each in a
        :class:`GuardedRule`), then ``Fallback``.
    """
    gpu = dlight.gpu
    return [GuardedRule(gpu.Matmul()), GuardedRule(gpu.GEMV()), GuardedRule(gpu.Reduction()),
            GuardedRule(gpu.GeneralReduction()), gpu.Fallback()]


def gpu_schedule_pass(target: Union[str, dict, Target, None] = None) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule`` with :func:`gpu_schedule_rules` (same pass name as TVM's).

    Parameters
    ----------
    target : str, dict or tvm.target.Target, optional
        Unused (the rules read each kernel's ``target`` attribute, else the
        current target); accepted for symmetry with ``cpu_schedule_pass``.

    Returns
    -------
    tvm.transform.Pass
    """
    del target
    return dlight.ApplyDefaultSchedule(*gpu_schedule_rules())


def schedule_gpu_prim_func(func: tirx.PrimFunc,
                           target: Union[str, dict, Target]) -> tirx.PrimFunc:
    """Schedule one PrimFunc with :func:`gpu_schedule_rules` under ``target``.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        An unscheduled (legalized, possibly fused or specialized) PrimFunc.
    target : str, dict or tvm.target.Target
        A CUDA target.

    Returns
    -------
    tvm.tirx.PrimFunc
        The scheduled function (``tirx.is_scheduled = True``), or ``func`` if
        it was already scheduled.
    """
    tgt = target if isinstance(target, Target) else Target(target)
    with tgt:
        out: Optional[tirx.PrimFunc] = gpu_schedule_pass()(tvm.IRModule({"main": func}))["main"]
    return out
