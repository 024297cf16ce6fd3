"""vm_errors: TVM's input-check and loader texts read into one-line messages, or left alone."""

import numpy as np

from relax_memplan.runtime.vm_errors import describe_input_mismatch, describe_loader_error

_SHAPE = ('Check failed: input_shape[i] == reg (1 vs. 5) : ErrorContext(fn=main, loc=param[0], '
          'param=x, annotation=R.Tensor((5, 3, 96, 96), dtype="float32"))  match_cast error,  '
          'shape[0] mismatch to specified constant.')
_DTYPE = ('Check failed: (ptr->dtype == dtype.value()) is false: ErrorContext(fn=main, '
          'loc=param[1], param=ids, annotation=R.Tensor((n, 7), dtype="int64"))  expect Tensor '
          'with dtype int64 but get float32')


def test_shape_mismatch_names_input_and_expected_shape():
    x = np.zeros((1, 3, 96, 96), "float32")
    assert (describe_input_mismatch(_SHAPE, [x])
            == "input x has shape (1, 3, 96, 96); the library expects (5, 3, 96, 96)")


def test_dtype_mismatch_names_input_and_expected_dtype():
    inputs = [np.zeros((2, 3), "float32"), np.zeros((2, 7), "float32")]
    assert (describe_input_mismatch(_DTYPE, inputs, expecter="main")
            == "input ids has dtype float32; main expects int64")


def test_text_that_disagrees_with_the_inputs_is_left_to_tvm():
    # the text says dim 0 is 1, the input's is 2: not this call's error, keep TVM's text
    assert describe_input_mismatch(_SHAPE, [np.zeros((2, 3, 96, 96), "float32")]) is None
    assert describe_input_mismatch(_DTYPE, [np.zeros(3), np.zeros((2, 7), "int64")]) is None
    assert describe_input_mismatch(_DTYPE, [np.zeros((2, 7), "float32")]) is None  # no param[1]


def test_unparsed_text_is_left_to_tvm():
    x = [np.zeros((1, 3, 96, 96), "float32")]
    assert describe_input_mismatch("some other failure", x) is None
    assert describe_input_mismatch(_SHAPE.replace("match_cast error", "other error"), x) is None
    assert describe_input_mismatch(_SHAPE.replace("(5, 3, 96, 96)", "((n + 1) // 2, 3)"), x) is None


def test_loader_errors():
    cuda = ("Library binary was created using {cuda} but a loader of that name is not "
            "registered. Make sure to have runtime that registers ffi.Module.load_from_bytes.cuda")
    assert describe_loader_error("x.so", cuda, cuda_available=False) == (
        "x.so: the library was built for CUDA and needs a CUDA GPU; no CUDA GPU is available "
        "here (tvm.cuda(0).exist is false)")
    assert "no CUDA loader" in describe_loader_error("x.so", cuda, cuda_available=True)
    assert "built for vulkan" in describe_loader_error("x.so", cuda.replace("{cuda}", "{vulkan}"),
                                                      cuda_available=False)
    assert describe_loader_error("x.so", "something else", cuda_available=False) is None
