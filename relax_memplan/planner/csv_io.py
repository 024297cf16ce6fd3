"""Read and write planning problems in the MiniMalloc CSV format.

MiniMalloc (Moffitt, ASPLOS 2023) stores one buffer per row under the header
``id,lower,upper,size``: the buffer is live over the half-open step interval
``[lower, upper)`` and needs ``size`` bytes. This module also accepts the optional columns
``alignment`` (bytes, default 1) and ``offset`` (bytes; a solution). Columns are matched by
name, so their order is free; unknown columns are rejected.
"""

from __future__ import annotations

import csv
import io
import os
from contextlib import contextmanager
from typing import Mapping, Optional, Sequence, Union

from .buffer import Buffer, check_unique_ids

__all__ = ["read_csv", "read_csv_solution", "write_csv"]

PathOrFile = Union[str, os.PathLike, io.TextIOBase]

_REQUIRED = ("id", "lower", "upper", "size")
_OPTIONAL = ("alignment", "offset")


@contextmanager
def _opened(path_or_file, mode: str):
    if hasattr(path_or_file, "read") or hasattr(path_or_file, "write"):
        yield path_or_file
    else:
        with open(path_or_file, mode, newline="", encoding="utf-8") as f:
            yield f


def _name(path_or_file) -> str:
    return str(getattr(path_or_file, "name", path_or_file))


def _parse(path_or_file) -> tuple[list[Buffer], Optional[dict]]:
    """Return the buffers and, if the file has an ``offset`` column, the offsets."""
    try:
        return _parse_text(path_or_file)
    except UnicodeDecodeError:
        raise ValueError(f"{_name(path_or_file)}: not a UTF-8 text CSV file") from None


def _parse_text(path_or_file) -> tuple[list[Buffer], Optional[dict]]:
    with _opened(path_or_file, "r") as f:
        where = _name(path_or_file)
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{where}: line 1: empty file, expected header 'id,lower,upper,size'")
        columns = [c.strip().lower() for c in header]
        unknown = [c for c in columns if c not in _REQUIRED + _OPTIONAL]
        missing = [c for c in _REQUIRED if c not in columns]
        if unknown or missing or len(set(columns)) != len(columns):
            raise ValueError(
                f"{where}: line 1: bad header {header!r}: expected columns id,lower,upper,size "
                f"and optionally alignment,offset (unknown: {unknown}, missing: {missing})"
            )
        col = {name: i for i, name in enumerate(columns)}
        buffers: list[Buffer] = []
        offsets: Optional[dict] = {} if "offset" in col else None
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise ValueError(
                    f"{where}: line {line}: expected {len(columns)} fields, got {len(row)}: {row!r}"
                )
            values = {}
            for name in columns:
                if name == "id":
                    continue
                text = row[col[name]].strip()
                try:
                    values[name] = int(text)
                except ValueError:
                    raise ValueError(
                        f"{where}: line {line}: column {name!r} must be an integer, got {text!r}"
                    ) from None
            try:
                buf = Buffer(
                    id=row[col["id"]].strip(),
                    start=values["lower"],
                    end=values["upper"],
                    size_bytes=values["size"],
                    alignment_bytes=values.get("alignment", 1),
                )
            except ValueError as err:
                raise ValueError(f"{where}: line {line}: {err}") from None
            buffers.append(buf)
            if offsets is not None:
                offsets[buf.id] = values["offset"]
        try:
            check_unique_ids(buffers)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        return buffers, offsets


def read_csv(path_or_file: PathOrFile) -> list[Buffer]:
    """Read buffers from a MiniMalloc CSV file.

    Parameters
    ----------
    path_or_file : str, os.PathLike or text file
        The file; its header must contain ``id,lower,upper,size`` and may contain
        ``alignment`` and ``offset`` (an offset column is read but ignored here).

    Returns
    -------
    list of Buffer
        In file order; ``lower``/``upper`` become ``start``/``end`` (steps), ``size``
        becomes ``size_bytes``.

    Raises
    ------
    ValueError
        If the file is malformed; the message names the line number and the problem.
    """
    return _parse(path_or_file)[0]


def read_csv_solution(path_or_file: PathOrFile) -> tuple[list[Buffer], dict[str, int]]:
    """Read buffers and their offsets from a MiniMalloc CSV file with an ``offset`` column.

    Returns
    -------
    (list of Buffer, dict of str to int)
        The buffers in file order and the byte offset of each, keyed by id. The offsets are
        not validated; use :func:`relax_memplan.planner.validate`.

    Raises
    ------
    ValueError
        If the file is malformed or has no ``offset`` column.
    """
    buffers, offsets = _parse(path_or_file)
    if offsets is None:
        raise ValueError(f"{_name(path_or_file)}: line 1: no 'offset' column, not a solution")
    return buffers, offsets


def write_csv(
    path_or_file: PathOrFile,
    buffers: Sequence[Buffer],
    offsets: Optional[Mapping[str, int]] = None,
) -> None:
    """Write buffers (and optionally offsets) in the MiniMalloc CSV format.

    Parameters
    ----------
    path_or_file : str, os.PathLike or text file
        Destination.
    buffers : sequence of Buffer
        Written in order as ``id,lower,upper,size``; an ``alignment`` column is added if
        any buffer has ``alignment_bytes != 1``.
    offsets : mapping of str to int, optional
        If given, an ``offset`` column is added; every buffer id must have an offset.

    Raises
    ------
    KeyError
        If ``offsets`` is given and lacks a buffer id.
    """
    with_alignment = any(b.alignment_bytes != 1 for b in buffers)
    header = list(_REQUIRED) + (["alignment"] if with_alignment else [])
    if offsets is not None:
        header.append("offset")
    with _opened(path_or_file, "w") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for b in buffers:
            row = [b.id, b.start, b.end, b.size_bytes]
            if with_alignment:
                row.append(b.alignment_bytes)
            if offsets is not None:
                if b.id not in offsets:
                    raise KeyError(f"no offset for buffer {b.id!r}")
                row.append(offsets[b.id])
            writer.writerow(row)
