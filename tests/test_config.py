"""Tests of relax_memplan.config: YAML loading, validation, defaults, CLI overrides."""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from relax_memplan.config import Config, PlannerConfig, VerifyConfig, load_config
from relax_memplan.errors import ConfigError
from relax_memplan.frontend import import_onnx

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
MODELS = REPO.parent / "shared" / "models"


def write_yaml(tmp_path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_none_gives_defaults_without_a_file():
    assert load_config() == Config()


def test_default_yaml_matches_dataclass_defaults():
    path = CONFIGS / "default.yaml"
    assert load_config(path) == Config()
    assert yaml.safe_load(path.read_text()) == Config().to_dict()


def test_default_yaml_gives_every_key():
    data = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    assert set(data) == {f.name for f in dataclasses.fields(Config)}
    assert set(data["planner"]) == {f.name for f in dataclasses.fields(PlannerConfig)}
    assert set(data["verify"]) == {f.name for f in dataclasses.fields(VerifyConfig)}


def test_static_cnn_yaml_loads_and_fits_mobilenet():
    config = load_config(CONFIGS / "static_cnn.yaml")
    assert config.shapes == {"x": (5, 3, 96, 96)}
    assert config.planner.algorithms is None
    model = MODELS / "mobilenetv2-tiny.onnx"
    if not model.exists():
        pytest.skip(f"model {model} not available")
    _, info = import_onnx(model, config.shapes)
    assert info.input_shapes == {"x": (5, 3, 96, 96)}


def test_partial_file_keeps_other_defaults(tmp_path):
    config = load_config(write_yaml(tmp_path, "planner:\n  time_limit_s: 3\n"))
    assert config.planner.time_limit_s == 3.0
    assert dataclasses.replace(config, planner=PlannerConfig()) == Config()


def test_empty_file_gives_defaults(tmp_path):
    assert load_config(write_yaml(tmp_path, "")) == Config()


@pytest.mark.parametrize(
    "text, key",
    [
        ("targt: llvm\n", "targt"),
        ("planner:\n  alignment: 64\n", "planner.alignment"),
        ("verify:\n  rtoll: 0.1\n", "verify.rtoll"),
    ],
)
def test_unknown_key_names_key_and_file(tmp_path, text, key):
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"unknown key '{key}'" in message and str(path) in message
    assert "valid keys here" in message


@pytest.mark.parametrize(
    "text, match",
    [
        ("target: 3\n", "target must be one of"),
        ("target: vulkan\n", "target must be one of"),
        ("planner: [1, 2]\n", "planner must be a mapping"),
        ("planner:\n  algorithms: greedy_by_size\n", "planner.algorithms must be a list"),
        ("planner:\n  algorithms: []\n", "planner.algorithms is empty"),
        ("planner:\n  algorithms: [1]\n", "planner.algorithms has a non-name entry"),
        ("planner:\n  time_limit_s: fast\n", "planner.time_limit_s must be a number"),
        ("planner:\n  time_limit_s: 0\n", "planner.time_limit_s must be > 0"),
        ("planner:\n  alignment_bytes: 64.0\n", "planner.alignment_bytes must be an integer"),
        ("planner:\n  alignment_bytes: 96\n", "power of two >= 64"),
        ("planner:\n  alignment_bytes: 32\n", "power of two >= 64"),
        ("planner:\n  algorithms: [best_fit_magic]\n", "unknown algorithm 'best_fit_magic'"),
        ("shapes: [1, 2]\n", "shapes must be a mapping"),
        ("shapes:\n  x: 1,3\n", r"shapes.x must be a list of integers"),
        ("shapes:\n  x: [1, 0]\n", r"shapes.x\[1\] must be >= 1"),
        ("shapes:\n  x: [1, true]\n", r"shapes.x\[1\] must be an integer"),
        ("verify:\n  rtol: -1.0\n", "verify.rtol must be >= 0"),
        ("verify:\n  seed: 1.5\n", "verify.seed must be an integer"),
        ("fusion_conv_chain: fast\n", "fusion_conv_chain must be one of"),
        ("fusion_conv_chain: on\n", r"fusion_conv_chain: true \(YAML reads on/yes/true as "
         r"true\) is not a mode; give one of \['auto', 'memory', 'off'\]"),
        ("fusion_conv_chain: 0\n", "fusion_conv_chain must be one of .*, got 0"),
    ],
)
def test_wrong_type_or_range_names_key_and_file(tmp_path, text, match):
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")


def test_float_written_without_dot_is_accepted(tmp_path):
    # PyYAML reads 1e-3 as a string; the config treats numeric text as a number.
    config = load_config(write_yaml(tmp_path, "verify:\n  rtol: 1e-3\n"))
    assert config.verify.rtol == pytest.approx(1e-3)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write_yaml(tmp_path, "planner: [unclosed\n"))


@pytest.mark.parametrize("text, key", [("fusion: true\nfusion: false\n", "fusion"),
                                       ("planner:\n  inplace: true\n  inplace: false\n",
                                        "inplace")])
def test_a_key_given_twice_is_refused_with_both_lines(tmp_path, text, key):
    # plain YAML keeps the last value silently
    with pytest.raises(ConfigError, match=rf"key '{key}' given twice \(lines \d and \d\)"):
        load_config(write_yaml(tmp_path, text))
    # the same key in two sections is two keys
    config = load_config(write_yaml(tmp_path, "planner:\n  time_limit_s: 2\n"
                                              "verify:\n  seed: 3\n"))
    assert (config.planner.time_limit_s, config.verify.seed) == (2.0, 3)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().target = "cuda"


def test_replace_from_cli_applies_given_values_only():
    base = load_config(CONFIGS / "static_cnn.yaml")
    config = base.replace_from_cli(
        target="cuda", alignment_bytes=128, shapes={"y": [2, 4]}, rtol=1e-3,
        algorithms=["greedy_by_breadth"],
    )
    assert config.target == "cuda" and config.planner.alignment_bytes == 128
    assert config.planner.algorithms == ("greedy_by_breadth",)
    assert config.planner.time_limit_s == base.planner.time_limit_s
    assert config.shapes == {"x": (5, 3, 96, 96), "y": (2, 4)}
    assert config.verify == VerifyConfig(rtol=1e-3)
    assert base.replace_from_cli() == base
    with pytest.raises(ConfigError, match="planner.alignment_bytes"):
        base.replace_from_cli(alignment_bytes=100)


def test_dims_and_strategy_load_and_validate(tmp_path):
    cfg = tmp_path / "dyn.yaml"
    cfg.write_text("dims:\n  seq: [1, 128]\n  batch: [1, null]\nplanner:\n  strategy: upper_bound\n")
    config = load_config(cfg)
    assert config.dims == {"seq": (1, 128), "batch": (1, None)}
    assert config.planner.strategy == "upper_bound"
    for text, words in [("dims:\n  seq: 5\n", "dims.seq must be [lower, upper]"),
                        ("dims:\n  seq: [4, 2]\n", "dims.seq[1] must be >= 4"),
                        ("planner:\n  strategy: buckets_of_joy\n", "planner.strategy must be"),
                        ("planner:\n  strategy: buckets\n", "planner.strategy buckets needs planner.buckets"),
                        ("planner:\n  buckets: {seq: [0, 64]}\n", "planner.buckets.seq[0] must be >= 1"),
                        ("planner:\n  buckets: {seq: 64}\n", "planner.buckets.seq must be a non-empty list"),
                        ("planner:\n  size_classes: 2\n", "planner.size_classes must be true or false"),
                        ("dispatch: {seq: [64, x]}\n", "dispatch.seq[1] must be"),
                        ("schedule: maybe\n", "schedule must be true or false")]:
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(words)):
            load_config(cfg)


def test_buckets_dispatch_and_size_classes_load(tmp_path):
    cfg = tmp_path / "dyn.yaml"
    cfg.write_text("planner:\n  strategy: buckets\n  buckets: {seq: [128, 64, 64]}\n"
                   "  size_classes: true\ndispatch: {seq: [64]}\nschedule: true\n")
    config = load_config(cfg)
    assert config.planner.buckets == {"seq": (64, 128)} and config.planner.size_classes
    assert config.dispatch == {"seq": (64,)} and config.schedule
    assert config.to_dict()["planner"]["buckets"] == {"seq": [64, 128]}


def test_size_class_growth_loads_and_is_checked(tmp_path):
    cfg = tmp_path / "growth.yaml"
    cfg.write_text("planner:\n  size_classes: true\n  size_class_growth: 2\n")
    assert load_config(cfg).planner.size_class_growth == 2.0
    cfg.write_text("planner:\n  size_class_growth: 1.0\n")
    with pytest.raises(ConfigError, match="planner.size_class_growth must be > 1"):
        load_config(cfg)


def test_planner_reorder_and_inplace_keys_are_bools():
    from relax_memplan.config import ConfigError, PlannerConfig

    assert PlannerConfig(reorder=False, inplace=False).reorder is False
    # on by default since the latency check (benchmarks/inplace_latency_bench.py)
    assert PlannerConfig().reorder is True and PlannerConfig().inplace is True
    with pytest.raises(ConfigError, match="planner.reorder must be true or false"):
        PlannerConfig(reorder="yes")
    with pytest.raises(ConfigError, match="planner.inplace"):
        PlannerConfig(inplace=1)
    assert PlannerConfig().concat_inplace is True
    with pytest.raises(ConfigError, match="planner.concat_inplace must be true or false"):
        PlannerConfig(concat_inplace="on")


def test_cli_passes_planner_inplace_and_reorder_to_the_build(tmp_path):
    from relax_memplan.cli import build_parser
    from relax_memplan.cli.commands import _build_options
    from relax_memplan.transform.reorder_for_memory import ReorderForMemory

    cfg = tmp_path / "c.yaml"
    cfg.write_text("planner:\n  inplace: false\n  reorder: false\n", encoding="utf-8")
    args = build_parser().parse_args(["compile", "--config", str(cfg)])
    _, options = _build_options(args, load_config(cfg))
    assert options.plan_pass.inplace is False and options.reorder_pass is None
    _, default = _build_options(build_parser().parse_args(["compile"]), load_config(None))
    assert default.plan_pass.inplace is True
    assert isinstance(default.reorder_pass, ReorderForMemory)
    # the command line wins over the config, both ways
    args = build_parser().parse_args(["compile", "--config", str(cfg), "--inplace", "--reorder"])
    _, flags = _build_options(args, load_config(cfg))
    assert flags.plan_pass.inplace is True and isinstance(flags.reorder_pass, ReorderForMemory)
    args = build_parser().parse_args(["compile", "--no-inplace", "--no-reorder"])
    _, flags = _build_options(args, load_config(None))
    assert flags.plan_pass.inplace is False and flags.reorder_pass is None
    assert default.plan_pass.concat_inplace is True
    cfg.write_text("planner:\n  concat_inplace: false\n", encoding="utf-8")
    args = build_parser().parse_args(["compile", "--config", str(cfg)])
    _, options = _build_options(args, load_config(cfg))
    assert options.plan_pass.concat_inplace is False


def test_cli_passes_fusion_conv_chain_to_the_build(tmp_path):
    from relax_memplan.cli import build_parser
    from relax_memplan.cli.commands import _build_options

    cfg = tmp_path / "c.yaml"
    cfg.write_text("fusion_conv_chain: memory\n", encoding="utf-8")
    _, options = _build_options(build_parser().parse_args(["compile", "--config", str(cfg)]),
                                load_config(cfg))
    assert options.fusion_conv_chain == "memory"
    _, default = _build_options(build_parser().parse_args(["compile"]), load_config(None))
    assert default.fusion_conv_chain == "auto"


@pytest.mark.parametrize("text", ["off", "false", "no", "'off'", '"off"'])
def test_fusion_conv_chain_off_unquoted_is_off(tmp_path, text):
    """Regression: YAML 1.1 reads a bare ``off`` as False, and the documented
    ``fusion_conv_chain: off`` was refused ("got False")."""
    assert load_config(write_yaml(tmp_path, f"fusion_conv_chain: {text}\n")).fusion_conv_chain == "off"
