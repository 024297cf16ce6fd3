"""User messages for the errors a Relax VM raises when a compiled library is loaded or called.

Pure text handling (no TVM import): the texts parsed here are TVM 0.27's. A text that does not
parse is left to the caller (the functions return ``None``), so the original TVM message is
kept rather than a guessed translation.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

__all__ = ["describe_input_mismatch", "describe_loader_error"]

# ErrorContext(fn=main, loc=param[0], param=ids, annotation=R.Tensor((5, 3), dtype="int64"))
_CONTEXT = re.compile(
    r"ErrorContext\(fn=[^,()]*, loc=param\[(?P<index>\d+)\], param=(?P<name>[^,()]*), "
    r"annotation=R\.Tensor\((?P<shape>\([^()]*\)), dtype=\"(?P<dtype>\w+)\"\)\)\s*(?P<what>.*)")
_DTYPE = re.compile(r"^expect Tensor with dtype (?P<want>\w+) but get (?P<got>\w+)\s*$")
_NDIM = re.compile(r"^expect Tensor with ndim (?P<want>\d+) but get (?P<got>\d+)\s*$")
# Check failed: input_shape[i] == reg (1 vs. 5) : ErrorContext(...)  match_cast error,
#   shape[0] mismatch to specified constant.   (or: "... to a previous populated value.")
_SHAPE_VALUES = re.compile(r"input_shape\[i\] == [\w\[\]]+ \((?P<got>-?\d+) vs\. (?P<want>-?\d+)\)")
_SHAPE_DIM = re.compile(r"^match_cast error,\s+shape\[(?P<axis>\d+)\] mismatch to "
                        r"(?P<kind>specified constant|a previous populated value)\.?\s*$")
_LOADER_KINDS = re.compile(r"Library binary was created using \{(?P<kinds>[^}]*)\} but a loader "
                           r"of that name is not registered")
_NO_FILE_LOADER = re.compile(r"Loader for `(?P<suffix>\.[^`]*)` files is not registered")


def _shape_text(shape) -> str:
    return str(tuple(int(d) for d in shape))


def describe_input_mismatch(message: str, inputs: Sequence[np.ndarray],
                            expecter: str = "the library") -> Optional[str]:
    """One line naming the input whose shape or dtype the VM rejected, or None.

    The VM checks each parameter against its annotation at the start of a call (TVM's
    ``vm.builtin.check_tensor_info`` and ``vm.builtin.match_shape``) and raises a message
    with an ``ErrorContext(... loc=param[i], param=NAME, annotation=R.Tensor(SHAPE,
    dtype=...))``. This reads that context and the failed check.

    Parameters
    ----------
    message : str
        The VM's error text (the whole text, not a summary that may be cut).
    inputs : sequence of numpy.ndarray
        The arguments of the call, in parameter order (``loc=param[i]`` indexes them).
    expecter : str
        Who expects the annotation, for the message (``"the library"``).

    Returns
    -------
    str or None
        ``"input ids has shape (1, 3); the library expects (5, 3)"`` (or ``dtype``); when a
        symbolic dim disagrees with an earlier input, the axis, the dim's name and the value
        the earlier input set (``": axis 0 of b is the symbolic dim n, which an earlier input
        set to 3"``);
        None when the text does not parse or disagrees with ``inputs`` (then keep TVM's).
    """
    ctx = _CONTEXT.search(message)
    if ctx is None or int(ctx["index"]) >= len(inputs):
        return None
    value = np.asarray(inputs[int(ctx["index"])])
    name, want_shape, what = ctx["name"], ctx["shape"], ctx["what"].strip()
    dtype = _DTYPE.match(what)
    if dtype:
        if str(value.dtype) != dtype["got"] or ctx["dtype"] != dtype["want"]:
            return None
        return f"input {name} has dtype {dtype['got']}; {expecter} expects {dtype['want']}"
    ndim = _NDIM.match(what)
    if ndim:
        if value.ndim != int(ndim["got"]):
            return None
        return f"input {name} has shape {_shape_text(value.shape)}; {expecter} expects {want_shape}"
    dim, values = _SHAPE_DIM.match(what), _SHAPE_VALUES.search(message)
    if dim is None or values is None:
        return None
    axis = int(dim["axis"])
    if axis >= value.ndim or value.shape[axis] != int(values["got"]):
        return None
    text = f"input {name} has shape {_shape_text(value.shape)}; {expecter} expects {want_shape}"
    if dim["kind"] == "a previous populated value":
        dims = [d.strip() for d in want_shape.strip("()").split(",")]
        sym = dims[axis] if axis < len(dims) and dims[axis] else f"of axis {axis}"
        text += (f": axis {axis} of {name} is the symbolic dim {sym}, which an earlier input "
                 f"set to {values['want']}")
    return text


def describe_loader_error(path: str, message: str, cuda_available: bool) -> Optional[str]:
    """One line saying why ``tvm.runtime.load_module`` could not load ``path``, or None.

    Parameters
    ----------
    path : str
        The file given to ``relax-memplan run``.
    message : str
        TVM's error text.
    cuda_available : bool
        ``tvm.cuda(0).exist`` on this machine.

    Returns
    -------
    str or None
        For a library built for CUDA (its binary names the ``cuda`` loader) the GPU it needs;
        for a file whose extension has no loader, that it is not a compiled library; None
        for any other text (keep TVM's).
    """
    kinds = _LOADER_KINDS.search(message)
    if kinds:
        names = [k.strip() for k in kinds["kinds"].split(",") if k.strip()]
        if "cuda" in names:
            why = ("no CUDA GPU is available here (tvm.cuda(0).exist is false)"
                   if not cuda_available else "this TVM runtime has no CUDA loader")
            return f"{path}: the library was built for CUDA and needs a CUDA GPU; {why}"
        return (f"{path}: the library was built for {', '.join(names)}, which this TVM "
                f"runtime cannot load")
    suffix = _NO_FILE_LOADER.search(message)
    if suffix:
        return (f"{path}: not a compiled library (TVM has no loader for {suffix['suffix']} "
                f"files; 'relax-memplan compile -o' writes a .so)")
    return None
