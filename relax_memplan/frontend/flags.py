"""Command-line flags as the tool suggests them: one spelling, quoted for a POSIX shell.

Every suggested ``--dim``/``--shape`` flag is built here, its value ``shlex.quote``-d, so that
a dim named ``seq len`` is suggested as ``--dim 'seq len=1..128'`` (one argument when
pasted); ``--dim`` splits its value on the last ``=`` (so ``a=b=1..64`` is dim ``a=b``).
"""

from __future__ import annotations

import shlex
from typing import Sequence

__all__ = ["dim_flag", "shape_flag", "tvm_dim_name"]


def dim_flag(name: str, range_text: str) -> str:
    """``--dim 'seq len=1..128'`` for dim ``seq len`` and range text ``1..128``."""
    return "--dim " + shlex.quote(f"{name}={range_text}")


def shape_flag(input_name: str, dims: Sequence) -> str:
    """``--shape 'in put=1,16'`` for input ``in put`` and dims ``(1, 16)``."""
    return "--shape " + shlex.quote(f"{input_name}={','.join(str(d) for d in dims)}")


def tvm_dim_name(onnx_name: str) -> str:
    """The name TVM's ONNX frontend gives a symbolic dim: its ``parse_shape_name`` removes
    spaces (``seq len`` -> ``seqlen``); other characters are kept."""
    return onnx_name.replace(" ", "")
