"""run_checked: a failed run is one RunError line; a stop at our index check is an
IndexValueError, without the shape hint (the input's value is at fault)."""

import numpy as np
import pytest

from relax_memplan.runtime import vm as runtime
from relax_memplan.errors import INDEX_CHECK_MESSAGE, IndexValueError, RunError

HINT = " (does the model accept this shape?)"


def _failing(message):
    def run(*_args, **_kwargs):
        raise RuntimeError(message)

    return run


def test_an_index_check_stop_is_an_index_value_error_without_the_hint(monkeypatch):
    monkeypatch.setattr(runtime, "run_and_measure", _failing(
        f"Traceback ...\nInternalError: Check failed: {INDEX_CHECK_MESSAGE} Gather node 'g': "
        f"valid [-10, 9]"))
    with pytest.raises(IndexValueError) as info:
        runtime.run_checked(None, [np.zeros(2)], "our build", dims={"seq": 4}, hint=HINT)
    message = str(info.value)
    assert message.startswith("running main of our build at seq=4 failed: ")
    assert "Gather node 'g': valid [-10, 9]" in message and HINT not in message


def test_another_failure_is_a_run_error_with_the_hint(monkeypatch):
    monkeypatch.setattr(runtime, "run_and_measure", _failing("Check failed: shapes differ"))
    with pytest.raises(RunError) as info:
        runtime.run_checked(None, [np.zeros(2)], "our build", dims={"seq": 4}, hint=HINT)
    assert not isinstance(info.value, IndexValueError)
    assert str(info.value).endswith(HINT)
