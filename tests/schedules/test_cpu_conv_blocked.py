"""ChannelBlockedConv: which convolutions it takes, its tile, its numbers (in a subprocess)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

from relax_memplan.schedules import (ChannelBlockedConv, ChannelBlockedDepthwise, DirectConv,
                                    cpu_schedule_rules, host_target)
from relax_memplan.schedules.cpu_conv_blocked import ChannelTile, choose_tile, column_lane_use
from tests.schedules.conv_blocked_checks import CASES, DW_CASES, _fused
from tests.schedules.conv_checks import conv_module

REPO_ROOT = Path(__file__).resolve().parents[2]
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})  # 16 lanes, 32 registers
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})  # 8 lanes, 16 registers


def _run_isolated(call, marker, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TVM_NUM_THREADS="2")
    src = f"from tests.schedules import conv_blocked_checks as c; {call}"
    try:
        proc = subprocess.run([sys.executable, "-c", src], env=env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"subprocess hung for {timeout} s: {err}")
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"subprocess exited with {proc.returncode}:\n{tail}"
    assert marker in proc.stdout, tail


def test_runs_before_direct_conv():
    names = [type(r).__name__ for r in cpu_schedule_rules()]
    assert names.index("ChannelBlockedConv") < names.index("DirectConv")
    assert names.index("ChannelBlockedDepthwise") < names.index("DirectConv")


@pytest.mark.parametrize("case", DW_CASES, ids=[c[0] for c in DW_CASES])
def test_depthwise_rule_takes_large_kernels_strides_and_narrow_maps(case):
    (func,) = _fused(conv_module(*case[1:]))
    sch = ChannelBlockedDepthwise(min_parallel_macs=0).apply(func, AVX512, False)
    assert sch is not None, case[0]
    text = sch.mod["main"].script()
    assert "T.parallel(" in text and "T.vectorized(" in text and "_local" in text


@pytest.mark.parametrize("label, case", [
    ("3x3 on a 14-wide map: DirectConv's vectors are full enough",
     ((1, 32, 14, 14), 32, 3, 1, 1, 1, 32, "relu")),
    ("7x7 on a 56-wide map", ((1, 16, 56, 56), 16, 7, 1, 3, 1, 16, "relu")),
    ("24 channels: no vector multiple", ((1, 24, 14, 14), 24, 7, 1, 3, 1, 24, "relu")),
    ("dense", ((1, 32, 14, 14), 32, 7, 1, 3, 1, 1, "relu")),
])
def test_depthwise_rule_declines(label, case):
    (func,) = _fused(conv_module(*case))
    assert ChannelBlockedDepthwise().apply(func, AVX512, False) is None, label


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_takes_dense_convolutions_with_channel_vectors(case):
    (func,) = _fused(conv_module(*case[1:]))
    sch = ChannelBlockedConv(min_parallel_macs=0).apply(func, AVX512, False)
    assert sch is not None, case[0]
    text = sch.mod["main"].script()
    assert "T.parallel(" in text and "T.vectorized(" in text and "_local" in text


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_on_avx2_the_narrow_maps_are_declined_and_the_rest_taken(case):
    """The subprocess checks run the cases the host's rule takes: on an AVX2 host all but
    AVX2_DECLINED, which this pins down (so a case silently dropped there fails here)."""
    from tests.schedules.conv_blocked_checks import AVX2_DECLINED, taken_on

    (func,) = _fused(conv_module(*case[1:]))
    sch = ChannelBlockedConv(min_parallel_macs=0).apply(func, AVX2, False)
    assert (sch is not None) == (case[0] not in AVX2_DECLINED) == taken_on(AVX2, case[0])
    assert taken_on(AVX512, case[0])


@pytest.mark.parametrize("label, case", [
    ("depthwise", ((1, 32, 14, 14), 32, 3, 1, 1, 1, 32, "relu")),
    ("grouped", ((1, 32, 14, 14), 32, 3, 1, 1, 1, 2, "relu")),
    ("24 output channels: no vector multiple", ((1, 32, 14, 14), 24, 3, 1, 1, 1, 1, "relu")),
    # 16 multiply-adds per output on a map 64 wide: the column tile loses no lane
    ("1x1 16 -> 32 on a 64-wide map", ((1, 16, 8, 64), 32, 1, 1, 0, 1, 1, "relu")),
    ("1x1 output pixel", ((1, 48, 1, 1), 192, 1, 1, 0, 1, 1, "se")),
])
def test_declines(label, case):
    (func,) = _fused(conv_module(*case))
    assert ChannelBlockedConv().apply(func, AVX512, False) is None, label


def test_tile_fills_the_register_file():
    # AVX-512: 32 registers = accumulators + channel vectors + one broadcast
    assert choose_tile(256, 14, 14, 16, 32) == ChannelTile(2, 1, 14)  # 28 accumulators
    assert choose_tile(512, 7, 7, 16, 32) == ChannelTile(2, 1, 7)
    assert choose_tile(48, 7, 7, 16, 32) == ChannelTile(3, 1, 7)
    assert choose_tile(16, 55, 55, 16, 32) == ChannelTile(1, 5, 5)  # 25 accumulators
    assert choose_tile(24, 14, 14, 16, 32) is None
    # AVX2: 16 registers
    tile = choose_tile(64, 14, 14, 8, 16)
    assert tile.accumulators + tile.channel_vectors + 1 <= 16
    for channels, height, width in [(64, 56, 56), (128, 28, 28), (2048, 7, 7), (32, 1, 508)]:
        tile = choose_tile(channels, height, width, 16, 32)
        assert tile.accumulators + tile.channel_vectors + 1 <= 32
        assert height % tile.rows == 0 and width % tile.columns == 0


def test_lane_use_of_the_column_tile():
    assert column_lane_use(64, 16) == 1.0
    assert column_lane_use(7, 16) == 7 / 16
    assert column_lane_use(56, 16) == 56 / 64


def test_avx2_target_gets_a_smaller_tile():
    (func,) = _fused(conv_module((1, 32, 14, 14), 32, 3, 1, 1, 1, 1, "relu"))
    assert ChannelBlockedConv().apply(func, AVX2, False) is not None
    assert DirectConv().apply(func, AVX2, False) is not None  # the next rule would take it


def test_blocked_conv_matches_unscheduled_with_weight_parameters_subprocess():
    _run_isolated("c.check_rule_on_parameters()", "BLOCKED PARAMS OK")


def test_blocked_conv_matches_unscheduled_with_prepacked_weights_subprocess():
    _run_isolated("c.check_pipeline_with_constant_weights()", "BLOCKED PIPELINE OK")
