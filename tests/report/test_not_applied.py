"""features_not_applied: what a build with symbolic dims does not get, and why (regression:
with --dim, CNNs got no in-place reuse, concat in place or conv chains and the report did not
say so)."""

from tvm.script import ir as I, relax as R

from relax_memplan.report.not_applied import features_not_applied, symbolic_call_counts
from relax_memplan.report import CompileReport, ShapeMeasurement


@I.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("n", 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
        with R.dataflow():
            a = R.nn.conv2d(x, w, strides=2, padding=1)
            b = R.nn.conv2d(x, w, strides=1, padding=1)
            c = R.concat((b, b), axis=1)
            d = R.nn.conv2d(c, R.zeros((4, 8, 3, 3), "float32"), strides=(1, 2), padding=1)
            R.output(a, d)
        return (a, d)


@I.ir_module
class Fixed:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
        with R.dataflow():
            a = R.nn.conv2d(x, w, strides=2, padding=1)
            b = R.nn.conv2d(x, w, strides=1, padding=1)
            c = R.concat((b, b), axis=1)
            R.output(a, c)
        return (a, c)


def _module(batch):
    """Strided convs (one stride 1) and a concat, batch symbolic (``"n"``) or 1."""
    return Symbolic if batch == "n" else Fixed


def test_counts_symbolic_concats_and_strided_convs_only():
    assert symbolic_call_counts(_module("n")) == (1, 2)
    assert symbolic_call_counts(_module(1)) == (0, 0)


def test_each_feature_says_why():
    got = features_not_applied(_module("n"), strategy="exact", inplace=True, concat_inplace=True,
                               conv_chain=True, inplace_calls=0)
    assert got["concat_inplace"].startswith("static shapes only")
    assert "1 concatenation(s) with symbolic shapes" in got["concat_inplace"]
    assert got["conv_chain"].startswith("static shapes only")
    assert "2 strided convolution(s)" in got["conv_chain"]
    assert "provably equal" in got["inplace"]
    upper = features_not_applied(_module("n"), strategy="upper_bound", inplace=True,
                                 concat_inplace=False, conv_chain=False, inplace_calls=None)
    assert list(upper) == ["inplace"] and "upper_bound" in upper["inplace"]


def test_nothing_listed_when_off_applied_or_nothing_to_act_on():
    # features off, in-place found calls: nothing to say
    assert features_not_applied(_module("n"), strategy="exact", inplace=True,
                                concat_inplace=False, conv_chain=False, inplace_calls=3) == {}
    # fixed shapes inside the module: no symbolic concat or conv
    assert features_not_applied(_module(1), strategy="exact", inplace=False,
                                concat_inplace=True, conv_chain=True) == {}


def test_report_text_and_json_carry_the_reasons():
    report = CompileReport(model="m", strategy="exact", dims={"n": (1, 4)},
                           shapes=[ShapeMeasurement({"n": 1}, None, 64, 64)],
                           not_applied={"concat_inplace": "static shapes only (x); 1 concat"})
    assert "  concat in place: not applied, static shapes only (x); 1 concat" \
        in report.format_text().splitlines()
    assert report.to_dict()["not_applied"] == {"concat_inplace": "static shapes only (x); 1 concat"}
    report.not_applied = {}
    assert "not applied" not in report.format_text()
