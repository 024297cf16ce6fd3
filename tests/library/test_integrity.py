"""relax-memplan run refuses a library that does not match its manifest: one line, exit 1,
before the file is mapped (unchecked, flipped code bytes end in SIGILL or SIGSEGV and flipped
weight bytes give wrong outputs with exit status 0)."""

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from relax_memplan.cli import EXIT_ERROR, main
from relax_memplan.library import manifest_path

from .conftest import dense_model, reference


def _copy(library, folder, name="lib.so", with_manifest=True):
    target = folder / name
    shutil.copy(library, target)
    if with_manifest:
        shutil.copy(manifest_path(library), manifest_path(target))
    return target


def _section(data: bytes, wanted: str):
    """(offset, size) of an ELF64 little-endian section by name."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names_offset = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        name, = struct.unpack_from("<I", data, shoff + i * shentsize)
        offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
        end = data.index(b"\0", names_offset + name)
        if data[names_offset + name:end].decode() == wanted:
            return offset, size
    raise AssertionError(f"no section {wanted}")


def _weights_offset(data: bytes) -> int:
    """Where the bias b of dense_model(0) lies in the library (the embedded constants)."""
    bias = np.frombuffer(dense_model(0).graph.initializer[1].raw_data, "float32")
    offset = data.find(bias.tobytes())
    assert offset > 0, "the bias is not stored verbatim in the library"
    return offset


def _flip(path, offset: int, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + count] = bytes(b ^ 0xFF for b in data[offset:offset + count])
    path.write_bytes(bytes(data))


def _run(capsys, library, x_file):
    status = main(["run", str(library), "--input", f"x={x_file}"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err.strip()


def _refused(capsys, library, x_file, words: str) -> None:
    status, out, err = _run(capsys, library, x_file)
    assert status == EXIT_ERROR
    assert "\n" not in err and err.startswith("relax-memplan: error: "), err
    assert words in err and str(library) in err, err
    assert "output0" not in out


def test_whole_library_with_its_manifest_runs_silently(dense_libraries, dense_input, tmp_path,
                                                       capsys):
    library = _copy(dense_libraries[0], tmp_path)
    status, out, err = _run(capsys, library, dense_input[0])
    assert status == 0 and err == "" and "output0: float32 [4, 256]" in out


@pytest.mark.parametrize("where", ["header", "code", "weights"])
def test_flipped_bytes_are_refused(dense_libraries, dense_input, tmp_path, capsys, where):
    library = _copy(dense_libraries[0], tmp_path)
    data = library.read_bytes()
    offset = {"header": lambda: 16, "code": lambda: _section(data, ".text")[0] + 256,
              "weights": lambda: _weights_offset(data)}[where]()
    _flip(library, offset)
    _refused(capsys, library, dense_input[0], "does not match its manifest")


def test_truncated_library_is_refused(dense_libraries, dense_input, tmp_path, capsys):
    library = _copy(dense_libraries[0], tmp_path)
    whole = library.read_bytes()
    library.write_bytes(whole[:50_000])
    _refused(capsys, library, dense_input[0],
             f"is 50,000 bytes, its manifest lib.so.json says {len(whole):,}")
    shutil.move(manifest_path(library), tmp_path / "away.json")  # unchecked: the ELF check
    _refused(capsys, library, dense_input[0], "truncated or corrupt library")


def test_another_models_manifest_is_refused(dense_libraries, dense_input, tmp_path, capsys):
    first, second, _ = dense_libraries
    library = _copy(first, tmp_path, with_manifest=False)
    shutil.copy(manifest_path(second), manifest_path(library))
    assert library.stat().st_size == second.stat().st_size  # the same graph: only the digest differs
    _refused(capsys, library, dense_input[0], "does not match its manifest")


def test_manifest_of_another_tvm_is_refused(dense_libraries, dense_input, tmp_path, capsys):
    library = _copy(dense_libraries[0], tmp_path)
    data = json.loads(open(manifest_path(library)).read())
    data["tvm_version"] = "0.26.0"
    open(manifest_path(library), "w").write(json.dumps(data))
    _refused(capsys, library, dense_input[0], "was built with TVM 0.26.0")


@pytest.mark.parametrize("key, value, words", [
    ("target", 7, "key 'target' is 7"),
    ("target", "", "key 'target' is ''"),
    ("function", "main; rm", "key 'function' is 'main; rm'"),
    ("inputs", [{"name": "x", "dtype": "float33", "shape": [4, 256]}], "key 'inputs.dtype'"),
    ("inputs", [{"name": "x", "dtype": "float32", "shape": [-4, 256]}], "holds -4"),
    ("inputs", [{"name": "x", "dtype": "float32", "shape": [1.5, 256]}], "holds 1.5"),
    ("inputs", [{"name": "x", "dtype": "float32", "shape": [True, 256]}], "holds True"),
    ("inputs", [{"name": "x", "dtype": "float32", "shape": [4, 256]}] * 2, "not distinct"),
    ("function", 5, "key 'function'"),
    ("function", None, "key 'function'"),
    ("dims", {"seq": 1}, "key 'dims'"),
])
def test_an_edited_manifest_field_is_refused_by_name(dense_libraries, dense_input, tmp_path,
                                                     capsys, key, value, words):
    library = _copy(dense_libraries[0], tmp_path)
    data = json.loads(open(manifest_path(library)).read())
    data[key] = value
    open(manifest_path(library), "w").write(json.dumps(data))
    status, _, err = _run(capsys, library, dense_input[0])
    assert status == EXIT_ERROR and "\n" not in err, err
    assert "not a valid library manifest" in err and words in err, err


def test_unreadable_manifest_is_refused(dense_libraries, dense_input, tmp_path, capsys):
    library = _copy(dense_libraries[0], tmp_path)
    open(manifest_path(library), "w").write("{")
    status, _, err = _run(capsys, library, dense_input[0])
    assert status == EXIT_ERROR and "\n" not in err and "cannot read the library manifest" in err


def test_missing_manifest_warns_once_and_runs(dense_libraries, dense_input, tmp_path, capsys):
    library = _copy(dense_libraries[0], tmp_path, with_manifest=False)
    out_file = tmp_path / "y.npz"
    status = main(["run", str(library), "--input", f"x={dense_input[0]}", "--output",
                   str(out_file)])
    err = capsys.readouterr().err.strip()
    assert status == 0
    assert err == (f"relax-memplan: warning: {library} has no manifest (lib.so.json): it is "
                   f"loaded unchecked (compile -o writes one)")
    np.testing.assert_allclose(np.load(out_file)["output0"], reference(0, dense_input[1]),
                               rtol=1e-5, atol=1e-5)


def test_inputs_are_checked_against_the_manifest(dense_libraries, tmp_path, capsys):
    library = _copy(dense_libraries[0], tmp_path)
    for value, words in [(np.ones((4, 63), "float32"),
                          "input x has shape [4, 63], the library takes x[4, 64]:float32"),
                         (np.ones((4, 64), "float64"),
                          "input x is float64, the library takes x[4, 64]:float32")]:
        np.save(tmp_path / "x.npy", value)
        status, _, err = _run(capsys, library, tmp_path / "x.npy")
        assert status == EXIT_ERROR and err == f"relax-memplan: error: {words}"


def test_flipped_code_ends_the_real_process_with_exit_1_not_a_signal(dense_libraries,
                                                                    dense_input, tmp_path):
    """In a fresh process: what a user sees (SIGILL is exit 132 unchecked)."""
    library = _copy(dense_libraries[0], tmp_path)
    data = library.read_bytes()
    _flip(library, _section(data, ".text")[0] + 256, 256)
    proc = subprocess.run([sys.executable, "-m", "relax_memplan.cli", "run", str(library),
                           "--input", f"x={dense_input[0]}"], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not match its manifest" in lines[0], proc.stderr
