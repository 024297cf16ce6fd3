"""Pack a Relax VM executable into its shared library with the assembler's ``.incbin``.

``export_library`` embeds the serialized executable (kernels' imports and every weight) as the
array ``__tvm_ffi__library_bin``: TVM 0.27 builds an LLVM module holding the bytes as one
constant and emits it as an object file (``ModulePackImportsToLLVM``). For GPT-2 that is
500 MB copied into LLVM's constant, again into its object code and again by the linker: 6.5 s
and more than 1 GB of peak resident memory on top of the weights.

:func:`pack_imports` gives ``export_library`` (its ``fpack_imports`` hook) the same array from
a file instead: TVM serializes the executable into a tensor (``ModulePackImportsToTensor``:
the 8-byte length and the bytes that the LLVM path embeds), the bytes are written to a file,
and an assembler source includes them with ``.incbin`` under the same symbol in read-only
data, which the linker then copies once. The library's content and its loading are TVM's own
(``tvm.runtime.load_module`` reads the symbol as it reads TVM's).

Only for ELF targets built with the GNU toolchain (Linux): elsewhere
:func:`pack_imports_hook` gives ``None`` and TVM's own packing runs. A system library (whose
array is registered by a constructor, not found by ``dlsym``) is refused.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

from .loader import EMBEDDED_SYMBOL

__all__ = ["pack_imports", "pack_imports_hook"]

_ASSEMBLY = """\
/* the serialized Relax VM executable, as tvm.runtime.load_module reads it */
  .section .rodata.{symbol},"a",@progbits
  .globl {symbol}
  .type {symbol}, @object
  .p2align 4
{symbol}:
  .incbin "{blob}"
  .size {symbol}, . - {symbol}
  .section .note.GNU-stack,"",@progbits
"""


def pack_imports(module, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
    """``fpack_imports`` of ``tvm.runtime.Module.export_library``: write the serialized
    imports of ``module`` and an assembler file including them; returns the ``.S`` path,
    which ``export_library``'s compiler (``g++``) assembles and links.

    Raises
    ------
    ValueError
        ``is_system_lib`` (its array is registered at load time by code this packing does not
        write); ``export_library`` of a Relax VM executable built for a shared library never
        asks for one.
    """
    import numpy as np
    from tvm.runtime import _ffi_api

    if is_system_lib:
        raise ValueError("pack_imports packs a shared library, not a system library")
    blob = _ffi_api.ModulePackImportsToTensor(module)
    blob_path = os.path.join(workspace_dir, "devc.bin")
    with open(blob_path, "wb") as f:
        f.write(memoryview(np.from_dlpack(blob)).cast("B"))
    del blob
    source = os.path.join(workspace_dir, "devc.S")
    with open(source, "w", encoding="ascii") as f:
        f.write(_ASSEMBLY.format(symbol=symbol_prefix + EMBEDDED_SYMBOL,
                                 blob=blob_path.replace("\\", "\\\\").replace('"', '\\"')))
    return source


def pack_imports_hook(target=None) -> Optional[Callable]:
    """:func:`pack_imports` where it applies (on Linux, for a ``target`` whose host triple,
    when set, is a Linux one), else None (TVM's packing)."""
    if not sys.platform.startswith("linux"):
        return None
    if target is not None:
        host = getattr(target, "host", None) or target
        triple = str(host.attrs.get("mtriple", "") or "") if hasattr(host, "attrs") else ""
        if triple and "linux" not in triple:
            return None
    return pack_imports
