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


def _library_with_manifest(tmp_path, *inputs):
    from relax_memplan.library import ManifestInput, write_manifest

    lib = tmp_path / "m.so"
    lib.write_bytes(b"\x7fELF not really")
    write_manifest(lib, inputs=[ManifestInput(*i) for i in inputs], dims={"seq": (1, 128)})
    return lib


def test_a_number_fills_a_fixed_shape_input_in_its_dtype(tmp_path):
    from relax_memplan.tools.run import fill_numbers

    lib = _library_with_manifest(tmp_path, ("image", "float32", (1, 3, 4, 4)),
                                 ("sr", "int64", ()), ("ids", "int64", (1, 8)))
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    values = parse_inputs(["image=0.5", "sr=16000"]) | {"ids": ids}
    filled = fill_numbers(lib, values, {"image", "sr"})
    assert filled["image"].shape == (1, 3, 4, 4) and filled["image"].dtype == np.float32
    assert np.all(filled["image"] == 0.5)
    assert filled["sr"].shape == () and filled["sr"].dtype == np.int64
    assert filled["ids"] is ids  # a file's array is left to the call's own checks


def test_a_number_for_a_symbolic_input_or_outside_its_dtype_is_refused(tmp_path):
    from relax_memplan.tools.run import fill_numbers

    lib = _library_with_manifest(tmp_path, ("mask", "int64", (1, "seq")))
    with pytest.raises(ShapeSpecError, match=r"mask\[1, seq\]:int64 has symbolic dims: give a .npy"):
        fill_numbers(lib, parse_inputs(["mask=1"]), {"mask"})
    with pytest.raises(ShapeSpecError, match=r"'mask' changes when cast to int64"):
        fill_numbers(lib, parse_inputs(["mask=1.5"]), {"mask"})


def test_without_a_manifest_a_number_is_refused_and_files_pass(tmp_path):
    from relax_memplan.tools.run import fill_numbers

    lib = tmp_path / "bare.so"
    lib.write_bytes(b"x")
    with pytest.raises(ShapeSpecError, match=r"--input x: .*bare.so.json is missing: give a .npy"):
        fill_numbers(lib, parse_inputs(["x=2"]), {"x"})
    values = {"x": np.zeros((2, 2), np.float32)}
    assert fill_numbers(lib, values, set())["x"] is values["x"]
