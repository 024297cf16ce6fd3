"""A default :class:`BuildOptions` plans as the CLI does: the config's planner section
(in-place writes, concatenation in place, memory-aware reorder), fresh passes per options."""

import pytest

from relax_memplan.cli.commands import _planner_passes
from relax_memplan.compile import BuildOptions, CheckOptions, default_planner_passes
from relax_memplan.config import PlannerConfig, load_config
from relax_memplan.errors import ConfigError
from relax_memplan.transform import PlanStaticMemory


def _settings(plan_pass):
    return (plan_pass.inplace, plan_pass.concat_inplace, plan_pass.alignment_bytes,
            plan_pass.algorithms, plan_pass.time_limit_s)


def test_default_build_options_plan_as_the_cli_default():
    cli_plan, cli_reorder = _planner_passes(load_config(None).planner)
    options = BuildOptions()
    assert _settings(options.plan_pass) == _settings(cli_plan)
    assert options.plan_pass.inplace and options.plan_pass.concat_inplace
    assert options.reorder_pass is not None and cli_reorder is not None


def test_each_build_options_gets_its_own_passes():
    # the passes record their plans: two builds must not share one
    first, second = BuildOptions(), BuildOptions()
    assert first.plan_pass is not second.plan_pass
    assert first.reorder_pass is not second.reorder_pass


def test_given_passes_and_reorder_false_are_kept():
    bare = PlanStaticMemory()
    options = BuildOptions(plan_pass=bare, reorder=False)
    assert options.plan_pass is bare and not bare.inplace
    assert options.reorder_pass is None


def test_default_planner_passes_follow_the_config_and_the_overrides():
    plan, reorder = default_planner_passes(PlannerConfig(inplace=False, reorder=False,
                                                         concat_inplace=False))
    assert not plan.inplace and not plan.concat_inplace and reorder is None
    plan, reorder = default_planner_passes(PlannerConfig(inplace=False), time_limit_s=0.25,
                                           inplace=True, reorder=True)
    assert plan.inplace and plan.time_limit_s == 0.25 and reorder is not None


def test_default_planner_passes_refuse_what_is_not_a_planner_config():
    with pytest.raises(ConfigError, match="PlannerConfig"):
        default_planner_passes({"inplace": True})


@pytest.mark.parametrize("field, value", [("rtol", -1.0), ("atol", float("nan")),
                                          ("rtol", float("inf")), ("atol", "1e-5"),
                                          ("seed", -1), ("seed", 1.5), ("sample_shapes", 1),
                                          ("sample_shapes", True)])
def test_check_options_refuse_a_tolerance_or_count_that_cannot_check(field, value):
    with pytest.raises(ConfigError, match=rf"CheckOptions\.{field} must be"):
        CheckOptions(**{field: value})


def test_check_options_take_zero_tolerance_and_integer_tolerance():
    assert CheckOptions(rtol=0, atol=0).atol == 0
    assert CheckOptions(rtol=1, sample_shapes=2).rtol == 1
