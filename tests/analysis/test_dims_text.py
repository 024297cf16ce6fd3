"""expr_text: shape expressions as the user reads them, dims named as --dim takes them."""

from tvm import tirx

from relax_memplan.analysis.dims import expr_text


def test_dims_keep_the_models_spelling_not_tvmscripts():
    """Regression: ppocrv4-det's shapes showed p2o_DynamicDimension_1, its flags need
    p2o.DynamicDimension.1."""
    h = tirx.Var("p2o.DynamicDimension.1", "int64")
    h_ = tirx.Var("p2o_DynamicDimension_10", "int64")  # a prefix that must stay as it is
    assert expr_text((h - 1) // 16 + 1) == "(p2o.DynamicDimension.1 - 1) // 16 + 1"
    assert expr_text(h * h_ + 3) == "p2o.DynamicDimension.1 * p2o_DynamicDimension_10 + 3"
    assert expr_text(tirx.Var("seq", "int64") * 2) == "seq * 2"
