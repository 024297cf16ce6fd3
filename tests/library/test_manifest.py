"""The manifest beside a library: what compile -o writes, and each check refusing a wrong
value."""

import json
import shutil

import numpy as np
import pytest

from relax_memplan import __version__
from relax_memplan.errors import ShapeSpecError
from relax_memplan.library.inputs import check_inputs
from relax_memplan.library.manifest import (LibraryIntegrityError, LibraryManifest,
                                            ManifestInput, MissingManifestWarning, file_sha256,
                                            manifest_path, read_manifest, verify_library,
                                            write_manifest)


def test_compile_writes_the_inputs_target_versions_and_digest(dense_libraries):
    library = dense_libraries[0]
    data = json.loads(open(manifest_path(library)).read())
    assert data["library"] == {"size_bytes": library.stat().st_size,
                               "sha256": file_sha256(library)}
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": [4, 64]}]
    assert data["dims"] == {} and data["function"] == "main"
    assert "llvm" in data["target"] and data["relax_memplan_version"] == __version__
    assert data["tvm_version"] == "0.27.0.post1"
    assert data["constants_bytes"] == (64 * 256 + 256) * 4  # w and b, each once
    assert data["model"].endswith("dense0.onnx")


def test_verify_returns_the_manifest_of_a_whole_library(dense_libraries):
    manifest = verify_library(dense_libraries[0])
    assert manifest.inputs == (ManifestInput("x", "float32", (4, 64)),)


def test_verify_without_manifest_warns_and_returns_none(dense_libraries, tmp_path):
    library = tmp_path / "lib.so"
    shutil.copy(dense_libraries[0], library)
    with pytest.warns(MissingManifestWarning, match="has no manifest"):
        assert verify_library(library) is None


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(format="something else"), "not a relax_memplan library manifest"),
    (lambda d: d.update(format_version=2), "manifest format version 2"),
    (lambda d: d["library"].pop("sha256"), "key 'library.sha256' missing"),
    (lambda d: d["library"].update(size_bytes="12"), "key 'library.size_bytes'"),
    (lambda d: d["inputs"][0].pop("dtype"), "key 'inputs.dtype'"),
    (lambda d: d.update(dims={"n": [1, 8]}), "key 'dims'"),
])
def test_a_malformed_manifest_names_the_key(dense_libraries, tmp_path, change, words):
    library = tmp_path / "lib.so"
    shutil.copy(dense_libraries[0], library)
    data = json.loads(open(manifest_path(dense_libraries[0])).read())
    change(data)
    open(manifest_path(library), "w").write(json.dumps(data))
    with pytest.raises(LibraryIntegrityError, match=words):
        read_manifest(library)


def test_write_then_read_round_trips_dims_and_symbolic_shapes(tmp_path):
    library = tmp_path / "lib.so"
    library.write_bytes(b"\x7fELF" + bytes(100))
    inputs = (ManifestInput("ids", "int64", ("batch", 128)),)
    written = write_manifest(library, target="llvm", inputs=inputs, dims={"batch": (1, 8)})
    assert written.dims == {"batch": (1, 8, 1)}
    assert read_manifest(library) == written
    assert not (tmp_path / "lib.so.json.partial").exists()


def _manifest(**dims) -> LibraryManifest:
    return LibraryManifest(1, "0" * 64, inputs=(ManifestInput("a", "float32", ("n", 4)),
                                                 ManifestInput("b", "int64", ("n",))),
                           dims=dims or {"n": (2, 16, 2)})


@pytest.mark.parametrize("inputs, words", [
    ({"a": np.ones((4, 4), "float32")}, "missing input(s) b; main takes a, b"),
    ({"a": np.ones((4, 4), "float32"), "b": np.ones(4, "int64"), "c": 1}, "unknown input(s) c"),
    ({"a": np.ones((4, 4), "float64"), "b": np.ones(4, "int64")}, "input a is float64"),
    ({"a": np.ones((4, 5), "float32"), "b": np.ones(4, "int64")}, "input a has shape [4, 5]"),
    ({"a": np.ones((4,), "float32"), "b": np.ones(4, "int64")}, "input a has shape [4]"),
    ({"a": np.ones((4, 4), "float32"), "b": np.ones(6, "int64")},
     "dim n is 4 in input a but 6 in input b"),
    ({"a": np.ones((18, 4), "float32"), "b": np.ones(18, "int64")},
     "dim n = 18 is outside its declared range [2, 16] in steps of 2"),
    ({"a": np.ones((5, 4), "float32"), "b": np.ones(5, "int64")}, "dim n = 5 is outside"),
])
def test_check_inputs_refuses_each_mismatch(inputs, words):
    with pytest.raises(ShapeSpecError) as err:
        check_inputs(_manifest(), inputs)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_check_inputs_accepts_values_inside_the_ranges():
    check_inputs(_manifest(), {"a": np.ones((6, 4), "float32"), "b": np.ones(6, "int64")})
    check_inputs(LibraryManifest(1, "0" * 64), {"anything": 1})  # no inputs known: no check
