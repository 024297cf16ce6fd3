"""``--input NAME=VALUE|FILE.npy``: what is not an array or numbers is one clear line."""

import numpy as np
import pytest

from relax_memplan.cli.args import parse_inputs
from relax_memplan.errors import ShapeSpecError


def test_a_npy_file_and_numbers_are_read(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.ones((2, 3), np.float32))
    values = parse_inputs([f"x={path}", "sr=16000", "v=0.5,1"])
    assert values["x"].shape == (2, 3) and int(values["sr"]) == 16000
    assert values["v"].tolist() == [0.5, 1.0]


def test_a_text_file_named_npy_is_not_called_a_pickle(tmp_path):
    path = tmp_path / "bad.npy"
    path.write_text("hello")
    with pytest.raises(ShapeSpecError, match=r"not an array saved with numpy.save") as err:
        parse_inputs([f"x={path}"])
    assert "pickle" not in str(err.value)


def test_a_missing_npy_file_and_an_npz_file_say_what_is_wrong(tmp_path):
    with pytest.raises(ShapeSpecError, match=r"cannot read .*No such file"):
        parse_inputs([f"x={tmp_path / 'none.npy'}"])
    with pytest.raises(ShapeSpecError, match=r"neither a .npy file nor a number"):
        parse_inputs([f"x={tmp_path / 'x.npz'}"])
