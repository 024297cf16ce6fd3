"""Step ``int64_shape_arithmetic``: keep values computed from ``Shape`` in int64.

Exporters such as tf2onnx cast a shape to int32, slice and concatenate it with int32
constants, and cast it back to int64 for ``Reshape``/``Expand``.  TVM 0.27 carries a
shape value symbolically (a Relax ``ShapeExpr``) only while it stays int64: the first
``Cast`` turns it into a run-time tensor, and ``Reshape`` then fails ("Reshape requires
the input new shape to be Shape. However, the given one is relax.TensorType") or
``Expand`` invents fresh dims unrelated to the input's.

The step finds the *shape values*: outputs of ``Shape`` and of ``Cast`` (to a 32/64-bit
integer type), ``Slice``/``Gather``/``Unsqueeze``/``Squeeze``/``Reshape`` (data input),
``Concat`` and ``Identity`` nodes fed only by shape values and integer constants.  Casts
between integer types on shape values are removed (their readers read the cast's input),
integer constants concatenated into shape values become int64, and every other reader of
a value whose type changed gets a ``Cast`` back to the type it had, so the model keeps
its meaning.  Dims fit in 32 bits, so dropping the casts changes no value.

Run after ``fold_constants`` (static shapes are then constants already).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

from ._graph import constant_values

__all__ = ["Int64ShapeArithmetic"]

_WIDE_INTEGERS = frozenset(
    {TensorProto.INT32, TensorProto.INT64, TensorProto.UINT32, TensorProto.UINT64}
)
_DATA_INPUT_OPS = frozenset({"Slice", "Gather", "Unsqueeze", "Squeeze", "Reshape", "Identity"})
_SHAPE_INPUTS = frozenset(
    {("Reshape", 1), ("Expand", 1), ("ConstantOfShape", 0), ("Tile", 1), ("Resize", 3)}
)
"""(op, input index) pairs that read a shape: they accept int64 and need no cast back."""


class Int64ShapeArithmetic:
    """Remove integer casts from shape computations so shape values stay int64."""

    name = "int64_shape_arithmetic"

    def __call__(self, model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
        dtypes = _find_shape_values(model.graph)
        # Every Cast inside the closure goes; its readers read its input instead.
        rename = {
            node.output[0]: node.input[0]
            for node in model.graph.node
            if node.op_type == "Cast" and node.output[0] in dtypes
        }
        if not rename:
            return model, ""  # unchanged: no copy of the weights
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        graph = copy.graph
        constants = constant_values(graph)
        new_inits, new_nodes, cast_backs = {}, [], 0
        for node in graph.node:
            if node.op_type == "Cast" and node.output[0] in rename:
                continue
            in_closure = bool(node.output) and node.output[0] in dtypes
            for index, name in enumerate(node.input):
                if in_closure and node.op_type == "Concat" and name in constants:
                    if constants[name].dtype.name != "int64":
                        wide = f"{name}__int64"
                        new_inits[wide] = numpy_helper.from_array(
                            constants[name].astype("int64"), wide
                        )
                        node.input[index] = wide
                    continue
                if name not in dtypes:
                    continue
                node.input[index] = _resolve(name, rename)  # now int64
                needs_original_type = not in_closure and (node.op_type, index) not in _SHAPE_INPUTS
                if needs_original_type and dtypes[name] != TensorProto.INT64:
                    back = f"{node.input[index]}__as_{TensorProto.DataType.Name(dtypes[name]).lower()}"
                    if back not in {n.output[0] for n in new_nodes if n.op_type == "Cast"}:
                        new_nodes.append(
                            helper.make_node("Cast", [node.input[index]], [back], name=back,
                                             to=dtypes[name])
                        )
                        cast_backs += 1
                    node.input[index] = back
            new_nodes.append(node)
        del graph.node[:]
        graph.node.extend(new_nodes)
        graph.initializer.extend(new_inits.values())
        kept_info = [v for v in graph.value_info if v.name not in dtypes]
        del graph.value_info[:]
        graph.value_info.extend(kept_info)  # shape values' types changed: drop stale info
        return copy, (
            f"removed {len(rename)} integer Cast(s) on shape values, widened "
            f"{len(new_inits)} constant(s) to int64, added {cast_backs} Cast(s) back to the "
            "original type for other readers"
        )


def _resolve(name: str, rename: dict[str, str]) -> str:
    while name in rename:
        name = rename[name]
    return name


def _find_shape_values(graph: onnx.GraphProto) -> dict[str, int]:
    """Shape values of ``graph`` and the element type each has in the original model."""
    constants = constant_values(graph)
    outputs = {value.name for value in graph.output}
    dtypes: dict[str, int] = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or any(o in outputs for o in node.output):
            continue
        if node.op_type == "Shape":
            dtypes[node.output[0]] = TensorProto.INT64
            continue
        if node.op_type == "Cast":
            to = next(a.i for a in node.attribute if a.name == "to")
            if node.input[0] in dtypes and to in _WIDE_INTEGERS:
                dtypes[node.output[0]] = to
            continue
        if node.op_type in _DATA_INPUT_OPS and node.input[0] in dtypes:
            dtypes[node.output[0]] = dtypes[node.input[0]]
            continue
        if node.op_type == "Concat":
            feeds = [name for name in node.input if name]
            integer_constants = all(
                name in dtypes or (name in constants and constants[name].dtype.kind in "iu")
                for name in feeds
            )
            if integer_constants and any(name in dtypes for name in feeds):
                dtypes[node.output[0]] = next(dtypes[n] for n in feeds if n in dtypes)
    return dtypes
