"""Check that a shared library file is whole before the dynamic loader maps it.

A truncated ELF file passed to ``dlopen`` (what ``tvm.runtime.load_module`` calls) is mapped
page by page; touching a page past the end of the file raises SIGBUS, which kills Python with
exit status 135 and nothing on stderr (e.g. after ``head -c 100000 lib.so > tr.so``).
This module reads the ELF header, program headers and section headers with :mod:`struct`
(ELF specification, System V ABI, "Object Files") and checks every file range they name lies
within the file. Mach-O and PE files are not checked (TVM on Linux writes ELF).
"""

from __future__ import annotations

import os
import struct

from ..errors import ModelLoadError

__all__ = ["check_elf_complete"]

_PT_LOAD = 1
_SHT_NOBITS = 8
# Per ELF class (1: 32-bit, 2: 64-bit): header layout after e_ident, program header layout
# (offset, file size fields), section header layout (type, offset, size fields).
_HEADER = {1: "HHIIIIIHHHHHH", 2: "HHIQQQIHHHHHH"}
_PHDR = {1: ("IIIIIIII", 1, 4), 2: ("IIQQQQQQ", 2, 5)}
_SHDR = {1: ("IIIIIIIIII", 1, 4, 5), 2: ("IIQQQQIIQQ", 1, 4, 5)}


def _ranges(data: bytes, klass: int, endian: str):
    """Yield (what, start, length) for each file range the ELF headers name; lazily, so a
    table is read only after the caller has checked that its range fits."""
    header = struct.unpack_from(endian + _HEADER[klass], data, 16)
    phoff, shoff = header[4], header[5]
    phentsize, phnum, shentsize, shnum = header[8], header[9], header[10], header[11]
    yield "program header table", phoff, phentsize * phnum
    yield "section header table", shoff, shentsize * shnum
    pfmt, poff_i, psize_i = _PHDR[klass]
    for i in range(phnum):
        entry = struct.unpack_from(endian + pfmt, data, phoff + i * phentsize)
        if entry[0] == _PT_LOAD:
            yield f"loadable segment {i}", entry[poff_i], entry[psize_i]
    sfmt, stype_i, soff_i, ssize_i = _SHDR[klass]
    for i in range(shnum):
        entry = struct.unpack_from(endian + sfmt, data, shoff + i * shentsize)
        if entry[stype_i] != _SHT_NOBITS:
            yield f"section {i}", entry[soff_i], entry[ssize_i]


def check_elf_complete(path) -> None:
    """Refuse an ELF file whose headers name bytes past its end.

    Checks, in this order: the ELF header (52 or 64 bytes) fits; the program header table and
    the section header table (``e_phoff + e_phnum * e_phentsize``, ``e_shoff + e_shnum *
    e_shentsize``, in bytes) lie within the file; then each loadable (``PT_LOAD``) segment's
    file range ``[p_offset, p_offset + p_filesz)`` and each section's range except
    ``SHT_NOBITS`` ones. Files not starting with the ELF magic are left alone.

    Parameters
    ----------
    path : str or os.PathLike
        The library file (read whole; libraries we write are a few MB).

    Raises
    ------
    ModelLoadError
        "truncated or corrupt library", naming the first range past the end, its bytes and
        the file size.
    """
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(b"\x7fELF"):
        return
    size = len(data)
    klass = data[4] if size > 5 else 0
    endian = {1: "<", 2: ">"}.get(data[5] if size > 5 else 0)
    if klass not in _HEADER or endian is None:
        raise ModelLoadError(f"{path}: truncated or corrupt library (ELF class/byte order "
                             f"unreadable, file is {size} bytes)")
    need = 16 + struct.calcsize(endian + _HEADER[klass])
    if size < need:
        raise ModelLoadError(f"{path}: truncated or corrupt library (ELF header needs {need} "
                             f"bytes, file is {size} bytes)")
    try:
        for what, start, length in _ranges(data, klass, endian):
            if length and start + length > size:
                raise ModelLoadError(f"{path}: truncated or corrupt library ({what} at bytes "
                                     f"{start}..{start + length}, file is {size} bytes)")
    except struct.error:
        raise ModelLoadError(f"{path}: truncated or corrupt library (a header entry runs "
                             f"past the end, file is {size} bytes)") from None
