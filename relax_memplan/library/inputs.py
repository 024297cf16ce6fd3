"""The inputs of a library's manifest: written from the Relax function's signature, and the
values given for a call checked against them (:mod:`.manifest`).

Pure Python but for :func:`inputs_of` (which reads a Relax function): the loader runs with
TVM's runtime library alone.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..errors import ShapeSpecError
from .manifest import LibraryManifest, ManifestInput

__all__ = ["check_input_names", "check_inputs", "inputs_of"]


def inputs_of(mod, function: str = "main") -> Tuple[ManifestInput, ...]:
    """The parameters of a module's Relax function as manifest inputs: a static extent is an
    int, a symbolic one the text of its expression (``batch``); empty when there is no such
    function or a parameter is not a tensor with a known shape (the VM's own checks are then
    the only ones)."""
    import tvm

    func = next((f for g, f in mod.functions_items() if g.name_hint == function), None)
    if func is None:
        return ()
    out = []
    for param in func.params:
        ty = param.ty
        shape = getattr(ty, "shape", None)
        values = getattr(shape, "values", None)
        if values is None or not getattr(ty, "dtype", None):
            return ()
        dims = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in values)
        out.append(ManifestInput(str(param.name), str(ty.dtype), dims))
    return tuple(out)


def check_input_names(given: Mapping[str, object], names: Sequence[str], function: str) -> None:
    """Refuse inputs missing or unknown to a function taking ``names``.

    Raises
    ------
    ShapeSpecError
        One line listing the unknown and missing names and what the function takes.
    """
    unknown = sorted(set(given) - set(names))
    missing = [n for n in names if n not in given]
    if unknown or missing:
        raise ShapeSpecError(
            ("unknown input(s) " + ", ".join(unknown) + "; " if unknown else "")
            + ("missing input(s) " + ", ".join(missing) + "; " if missing else "")
            + f"{function} takes " + ", ".join(names) + " (give each as --input NAME=FILE.npy)")


def check_inputs(manifest: LibraryManifest, inputs: Mapping[str, "object"]) -> None:
    """Compare the values given for a call with the manifest's inputs, before loading.

    Names (missing or unknown), dtypes, each static extent, and each symbolic dim's value
    (the same in every input using it, inside its declared range) are checked. A manifest
    without inputs checks nothing.

    Raises
    ------
    ShapeSpecError
        One line naming the input, the expected and the given shape or dtype.
    """
    if not manifest.inputs:
        return
    check_input_names(inputs, [i.name for i in manifest.inputs], manifest.function)
    seen: Dict[str, Tuple[int, str]] = {}
    for spec in manifest.inputs:
        value = inputs[spec.name]
        shape, dtype = tuple(getattr(value, "shape", ())), str(getattr(value, "dtype", ""))
        if dtype != spec.dtype:
            raise ShapeSpecError(f"input {spec.name} is {dtype}, the library takes "
                                 f"{spec.describe()}")
        if len(shape) != len(spec.shape) or any(
                isinstance(want, int) and want != got for want, got in zip(spec.shape, shape)):
            raise ShapeSpecError(f"input {spec.name} has shape {list(shape)}, the library "
                                 f"takes {spec.describe()}")
        for want, got in zip(spec.shape, shape):
            if isinstance(want, int):
                continue
            if want in seen and seen[want][0] != got:
                raise ShapeSpecError(f"dim {want} is {seen[want][0]} in input {seen[want][1]} "
                                     f"but {got} in input {spec.name} ({spec.describe()})")
            seen[want] = (got, spec.name)
            if want in manifest.dims and not _in_range(got, *manifest.dims[want]):
                raise ShapeSpecError(f"input {spec.name}: dim {want} = {got} is outside its "
                                     f"declared range {_range_text(*manifest.dims[want])}")


# as analysis.dims.DimRange (which needs TVM's compiler; the loader runs with its runtime alone)
def _in_range(value: int, lower: int, upper: Optional[int], step: int) -> bool:
    return value >= lower and (upper is None or value <= upper) and (value - lower) % step == 0


def _range_text(lower: int, upper: Optional[int], step: int) -> str:
    return (f"[{lower}, {'inf' if upper is None else upper}]"
            + (f" in steps of {step}" if step > 1 else ""))
