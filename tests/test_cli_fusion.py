"""relax-memplan compile --fusion: both builds get our fusion, the report counts what fused."""

import json

from relax_memplan.cli import main
from tests.conftest import shared_model


def test_fusion_on_bert_tiny_verifies_and_reports_attention_fused(tmp_path, capsys):
    report_path = tmp_path / "r.json"
    status = main(["compile", str(shared_model("bert-tiny-randw.onnx")), "-q", "--fusion",
                   "--verify", "--shape", "input_ids=1,16", "--time-limit", "0.2",
                   "--report", str(report_path)])
    text = capsys.readouterr().out
    assert status == 0
    report = json.loads(report_path.read_text())
    assert report["verified"] is True
    # bert-tiny: 2 layers, one attention block each
    assert report["fusion"] == {"enabled": True, "fused": {"attention": 2, "dropout": 0}}
    assert "fusion: on (attention fused 2x, dropout removed 0x)" in text
    assert report["arena_bytes"] <= report["tvm_default_bytes"]


def test_fusion_on_the_example_fuses_nothing_and_says_so(tmp_path, capsys):
    report_path = tmp_path / "r.json"
    assert main(["compile", "-q", "--fusion", "--time-limit", "0.2",
                 "--report", str(report_path)]) == 0
    text = capsys.readouterr().out
    assert json.loads(report_path.read_text())["fusion"] == {
        "enabled": True, "fused": {"attention": 0, "dropout": 0}}
    assert "fusion: on (attention fused 0x, dropout removed 0x)" in text


def test_config_fusion_is_honoured_and_no_fusion_overrides_it(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("fusion: true\n")
    for extra, enabled in (([], True), (["--no-fusion"], False)):
        report_path = tmp_path / "r.json"
        assert main(["compile", "-q", "--no-measure", "--config", str(config),
                     "--time-limit", "0.2", "--report", str(report_path)] + extra) == 0
        assert json.loads(report_path.read_text())["fusion"]["enabled"] is enabled
    assert "fusion: off" in capsys.readouterr().out


def test_fusion_is_on_by_default_in_config_options_and_cli(tmp_path):
    from relax_memplan.compile import BuildOptions
    from relax_memplan.config import load_config

    assert load_config(None).fusion is True and BuildOptions().fusion is True
    report_path = tmp_path / "r.json"
    assert main(["compile", "-q", "--no-measure", "--time-limit", "0.2",
                 "--report", str(report_path)]) == 0
    assert json.loads(report_path.read_text())["fusion"]["enabled"] is True
