"""Tests of the MiniMalloc CSV reader and writer."""

import io
from pathlib import Path

import pytest
from hypothesis import given, settings

from relax_memplan.planner import Buffer, read_csv, read_csv_solution, write_csv

from .strategies import buffer_lists

BENCH = Path(__file__).parents[2].parent / "shared" / "bench" / "minimalloc-challenging"


def test_reads_minimalloc_header():
    text = "id,lower,upper,size\n0,10,20,64\nx1,0,5,8\n"
    assert read_csv(io.StringIO(text)) == [Buffer("0", 10, 20, 64), Buffer("x1", 0, 5, 8)]


@settings(max_examples=30, deadline=None)
@given(buffer_lists())
def test_round_trip(buffers):
    out = io.StringIO()
    write_csv(out, buffers)
    assert read_csv(io.StringIO(out.getvalue())) == buffers


def test_writes_alignment_column_only_when_needed(tmp_path):
    path = tmp_path / "p.csv"
    write_csv(path, [Buffer("a", 0, 1, 8)])
    assert path.read_text().splitlines()[0] == "id,lower,upper,size"
    write_csv(path, [Buffer("a", 0, 1, 8, alignment_bytes=16)])
    assert path.read_text().splitlines() == ["id,lower,upper,size,alignment", "a,0,1,8,16"]
    assert read_csv(path) == [Buffer("a", 0, 1, 8, alignment_bytes=16)]


def test_solution_round_trip(tmp_path):
    buffers = [Buffer("a", 0, 2, 8), Buffer("b", 1, 3, 8, alignment_bytes=8)]
    offsets = {"a": 0, "b": 8}
    path = tmp_path / "solution.csv"
    write_csv(path, buffers, offsets)
    assert path.read_text().splitlines()[0] == "id,lower,upper,size,alignment,offset"
    assert read_csv_solution(path) == (buffers, offsets)
    assert read_csv(path) == buffers


def test_solution_needs_offset_column():
    with pytest.raises(ValueError, match="no 'offset' column"):
        read_csv_solution(io.StringIO("id,lower,upper,size\na,0,1,8\n"))


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "line 1: empty file"),
        ("id,lower,size\n", "line 1: bad header"),
        ("id,lower,upper,size,colour\n", "unknown: ['colour']"),
        ("id,lower,upper,size\na,0,1,8\nb,0,x,8\n", "line 3: column 'upper' must be an integer"),
        ("id,lower,upper,size\na,0,1\n", "line 2: expected 4 fields, got 3"),
        ("id,lower,upper,size\na,0,1,8\n\nb,5,5,8\n", "line 4: buffer 'b': end (5)"),
        ("id,lower,upper,size\na,0,1,8\na,0,1,8\n", "'a' occurs more than once"),
    ],
)
def test_malformed_csv_names_line(text, fragment):
    with pytest.raises(ValueError) as info:
        read_csv(io.StringIO(text))
    assert fragment in str(info.value)


@pytest.mark.skipif(not BENCH.is_dir(), reason="MiniMalloc benchmark not checked out")
def test_reads_real_instance():
    buffers = read_csv(BENCH / "A.1048576.csv")
    assert len(buffers) == 154
    assert len(read_csv(BENCH / "K.1048576.csv")) == 454
