"""Tests of the step list and prepare()."""

import pytest

from relax_memplan.errors import PrepareStepError
from relax_memplan.frontend.prepare import CONVERTER_STEP_NAMES, STEP_NAMES, prepare, select_steps

from .test_fold_constants import scalar_constant_of_shape_model


def test_steps_run_in_fixed_order_whatever_the_order_given():
    assert select_steps() == list(STEP_NAMES)
    assert select_steps(["exact_resize", "fold_constants"]) == ["fold_constants", "exact_resize"]
    assert select_steps(disable=["fold_constants"]) == list(STEP_NAMES[1:])


def test_unknown_step_names_listed():
    with pytest.raises(PrepareStepError, match="'bogus'.*known steps: fold_constants"):
        select_steps(disable=["bogus"])


def test_prepare_reports_changes_and_keeps_input():
    model = scalar_constant_of_shape_model()
    before = model.SerializeToString()
    prepared = prepare(model)
    assert model.SerializeToString() == before
    assert [note.split(":")[0] for note in prepared.notes] == ["fold_constants"]
    assert prepared.converter_steps == CONVERTER_STEP_NAMES
    nothing = prepare(model, steps=[])
    assert nothing.notes == () and nothing.converter_steps == ()
    assert nothing.model.SerializeToString() == before
