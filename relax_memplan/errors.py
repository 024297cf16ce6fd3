"""Exception types raised by relax_memplan.

Every error the package raises on bad input derives from :class:`RelaxMemplanError`, so a
caller (the CLI, a notebook) can catch one type.  Messages are single lines that name the
file, node, input or config key at fault.
"""

from __future__ import annotations

import re

__all__ = [
    "RelaxMemplanError",
    "ModelLoadError",
    "UnsupportedOperatorError",
    "ShapeSpecError",
    "ConfigError",
    "CompileError",
    "IndexBoundsError",
    "VerificationError",
    "summarize_error",
]

_TRACE_LINE = re.compile(r"^(Traceback|File |During handling|The above exception|\d+: |at )")
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false:\s*")
_PYTHON_BUG_ERRORS = (TypeError, KeyError, AttributeError, IndexError, AssertionError)


def summarize_error(error: BaseException, max_chars: int = 240) -> str:
    """The most informative single line of an error message (TVM's or Python's).

    Traceback and C++ backtrace lines are dropped and TVM's ``Check failed: (...) is
    false:`` prefix is removed; errors that usually mean a bug in the code that raised
    them (TypeError, KeyError, ...) keep their type name.

    Parameters
    ----------
    error : BaseException
        The error to summarize.
    max_chars : int
        Longest result; longer lines are cut and end in ``...``.

    Returns
    -------
    str
        One line, never empty.
    """
    lines = [line.strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and not _TRACE_LINE.match(line)]
    text = _CHECK_FAILED.sub("", lines[0]) if lines else ""
    text = _readable_cast_error(_readable_op_error(text))
    if not text or isinstance(error, _PYTHON_BUG_ERRORS):
        text = f"{type(error).__name__}: {text}".rstrip(": ")
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


_CAST_CHECK = re.compile(r"^(?:Check failed: )?input_shape\[i\] == heap_data\[reg\] \((-?\d+) vs\. (-?\d+)\)"
                         r"\s*:\s*ErrorContext\(match_cast")


def _readable_cast_error(text: str) -> str:
    """The VM's failed ``R.match_cast`` (``input_shape[i] == heap_data[reg] (2 vs. 1) :
    ErrorContext(match_cast, ty=R.Tensor(<a long shape>)) ...``) in a few words, so that the
    line is not cut inside the shape (it would end ``match_cast e...``)."""
    match = _CAST_CHECK.match(text)
    if match is None:
        return text
    return (f"a shape cast of the model failed: an extent is {match.group(1)} where the "
            f"model's shape arithmetic expects {match.group(2)}")


_TIR_INT = re.compile(r"T\.int(?:8|16|32|64)\((-?\d+)\)")


def _readable_op_error(text: str) -> str:
    """TVM's operator errors start with the whole op object (``In ir.Op(span=None, ...,
    name="relax.add", ...), the first input shape ...``): keep its name and the sentence
    after it, with ``T.int64(200)`` written ``200``."""
    if text.startswith("In ir.Op("):
        depth, end = 0, None
        for i, ch in enumerate(text[len("In ir."):], start=len("In ir.")):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and ch == ")":
                end = i
                break
        if end is not None:
            name = re.search(r'name="([^"]+)"', text[:end])
            rest = text[end + 1:].lstrip(", ")
            text = f"{name.group(1)}: {rest}" if name else rest
    return _TIR_INT.sub(r"\1", text)


class RelaxMemplanError(Exception):
    """Base class of all errors raised by relax_memplan."""


class ModelLoadError(RelaxMemplanError):
    """An ONNX model could not be read or imported.

    Raised for a missing file, a directory, bytes that are not an ONNX model, a model that
    fails ``onnx.checker``, or a model the TVM ONNX frontend cannot convert.
    """


class UnsupportedOperatorError(ModelLoadError):
    """The TVM ONNX frontend failed on one node of the graph.

    Parameters
    ----------
    node_name : str
        The ONNX node's name, or its first output name when the node is unnamed.
    op_type : str
        The ONNX operator type, e.g. ``"Reshape"``.
    opset : int
        The opset of the node's domain that the import used.
    reason : str
        One line: the most informative line of TVM's error.
    upgraded_from_opset : int or None
        The model's original default-domain opset when the failure happened after an
        automatic opset upgrade, else None.
    hint : str
        Optional advice appended to the message, e.g. which dynamic dims were set to 1.
    domain : str
        The node's operator domain (``""`` for standard ONNX); a custom one, such as
        ``com.microsoft``, is named in the message beside its opset.
    unnamed : bool
        The node has no name: ``node_name`` is its first output, and the message says so.
    """

    def __init__(
        self,
        node_name: str,
        op_type: str,
        opset: int,
        reason: str,
        upgraded_from_opset: int | None = None,
        hint: str = "",
        domain: str = "",
        unnamed: bool = False,
    ):
        self.node_name = node_name
        self.unnamed = unnamed
        self.op_type = op_type
        self.opset = opset
        self.reason = reason
        self.upgraded_from_opset = upgraded_from_opset
        self.hint = hint
        self.domain = domain
        custom = domain not in ("", "ai.onnx")
        opset_text = f"{domain} opset {opset}" if custom else f"opset {opset}"
        if upgraded_from_opset is not None:
            opset_text += f" after upgrade from {upgraded_from_opset}"
        super().__init__(
            ("cannot import the unnamed ONNX node with output " if unnamed
             else "cannot import ONNX node ")
            + f"'{node_name}' (op {op_type}, {opset_text}): {reason}"
            + (f" [{hint}]" if hint else "")
        )

    def __reduce__(self):
        return (
            type(self),
            (
                self.node_name,
                self.op_type,
                self.opset,
                self.reason,
                self.upgraded_from_opset,
                self.hint,
                self.domain,
                self.unnamed,
            ),
        )


class ShapeSpecError(RelaxMemplanError):
    """An input shape given by the user is malformed or does not fit the model.

    Raised for unparsable ``--shape`` text, an unknown input name, a wrong rank, a
    non-positive dimension, or a dimension that contradicts a static one in the model.
    """


class ConfigError(RelaxMemplanError):
    """A YAML config file has an unknown key, a value of the wrong type or range, or
    cannot be read; the message names the file and the key."""


class CompileError(RelaxMemplanError):
    """TVM failed to build a module (lowering, code generation or linking)."""

    @classmethod
    def from_tvm(cls, planner: str, error: BaseException) -> CompileError:
        """Wrap an error TVM raised while building with memory planner ``planner``.

        Parameters
        ----------
        planner : str
            Name of the memory planner the build used.
        error : BaseException
            TVM's error; only its most informative line is kept
            (:func:`summarize_error`).

        Returns
        -------
        CompileError
            With a one-line message naming the planner.
        """
        return cls(f"TVM build with planner '{planner}' failed: {summarize_error(error)}")


class IndexBoundsError(RelaxMemplanError):
    """An index certainly leaves its tensor at a declared dim value (found at compile time by
    :class:`~relax_memplan.transform.check_index_bounds.CheckIndexBounds`); the message names
    the op and the largest allowed dim value."""


class VerificationError(RelaxMemplanError):
    """Outputs of a compiled module cannot be compared with the reference outputs
    (different count or shape), or differ beyond the tolerance."""


class PrepareStepError(RelaxMemplanError, ValueError):
    """An ONNX preparation step name is unknown (``import_onnx(prepare_steps=...)``,
    ``onnx_prepare.prepare``); the message lists the known steps."""


class ReferenceRunError(RelaxMemplanError):
    """onnxruntime (the reference) refused the model or the inputs, e.g. a token id
    beyond the vocabulary; the message is onnxruntime's, on one line."""


class RunError(RelaxMemplanError):
    """A compiled module failed at run time; the message names the function and,
    where known, the shapes it ran at."""


__all__ += ["PrepareStepError", "ReferenceRunError", "RunError"]


class TargetError(RelaxMemplanError, ValueError):
    """A compilation target option is not valid, e.g. a CUDA arch that is not ``sm_XX``
    (``--cuda-arch``, config ``cuda_arch``); the message names the option and the value."""


__all__ += ["TargetError"]


class UndeclaredDimError(ShapeSpecError):
    """A symbolic dim of the model has neither a ``--dim`` range nor a ``--shape`` value;
    the message gives the flags that declare it. Raised before the import."""


__all__ += ["UndeclaredDimError"]


INDEX_CHECK_MESSAGE = "relax_memplan: index out of range in"
"""How the message of each run-time index check starts (the asserts
:class:`~relax_memplan.transform.check_index_bounds.CheckIndexBounds` inserts); TVM passes
it on as the text of its error, where :func:`relax_memplan.runtime.run_checked` finds it."""


class IndexValueError(RunError):
    """A run stopped at one of our index checks: an index value (a Gather id, ...) is outside
    its tensor. The input's value is at fault, not its shape; the message names the ONNX
    node and the valid range."""


__all__ += ["INDEX_CHECK_MESSAGE", "IndexValueError"]
