"""CountingRewritePass: the base of the passes that rewrite each Relax function and count."""

import pytest
import tvm
from tvm.script import ir as I, relax as R

from relax_memplan.transform._module_util import CountingRewritePass
from relax_memplan.transform.remove_dropout import RemoveDropout


@I.ir_module
class _TwoDropouts:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            a = R.nn.dropout(x, rate=0.1)
            b = R.nn.dropout(a[0], rate=0.1)
            out = b[0]
            R.output(out)
        return out


def test_the_count_is_of_the_last_run_under_the_pass_own_name():
    dropout = RemoveDropout()
    assert dropout.removed == 0
    dropout(_TwoDropouts)
    assert dropout.removed == 2
    dropout(dropout(_TwoDropouts))  # a run that changes nothing resets it
    assert dropout.removed == 0


def test_a_subclass_without_a_rewriter_says_so():
    @tvm.transform.module_pass(opt_level=0, name="NoRewriter")
    class NoRewriter(CountingRewritePass):
        count_attr = "done"

    with pytest.raises(Exception, match="NoRewriter must set make_rewriter"):
        NoRewriter()(_TwoDropouts)
