"""Random valid ONNX graphs for differential testing, one per seed, reproducible.

:func:`generate` builds a graph with ``onnx.helper`` from a seed: a few float32 inputs, then
a random sequence of *motifs* (an elementwise chain with broadcasting, MatMul/Gemm,
Conv/pooling, views, Concat/Split/Slice, Gather/ScatterElements, reductions,
Softmax/LayerNormalization, an attention block, an ``If`` whose branches read tensors that
stay live after it), each applied to tensors already in the graph. Every tensor whose value no
node reads becomes a graph output, so each computed value is checked.

About a third of the seeds declare the leading dim of every input symbolic (``dim_param``
:data:`SYMBOLIC_DIM`); motifs keep that dim on axis 0, so the graph runs at any size of it.
The model is checked with ``onnx.checker`` (full check, shape inference included) before it
is returned. Shapes are tracked here (a dim is an int or :data:`SYMBOLIC_DIM`), not read back
from shape inference, so the motifs stay simple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import _motifs

__all__ = ["SYMBOLIC_DIM", "OPSET", "FuzzGraph", "generate", "MOTIFS"]

SYMBOLIC_DIM = "N"
"""Name of the symbolic leading dim of graphs generated with one."""

OPSET = 17
"""Default-domain opset of the generated models (LayerNormalization needs 17)."""

Dim = Union[int, str]
Shape = Tuple[Dim, ...]


@dataclass
class FuzzGraph:
    """A generated model and what the runner needs to feed it.

    Attributes
    ----------
    model : onnx.ModelProto
        The checked model.
    seed : int
        The seed it was generated from.
    symbolic : bool
        Whether the inputs' leading dim is :data:`SYMBOLIC_DIM`.
    static_dim : int
        The leading dim's size at import when not symbolic (the value the graph was built with).
    motifs : list of str
        The motifs applied, in order.
    """

    model: onnx.ModelProto
    seed: int
    symbolic: bool
    static_dim: int
    motifs: List[str] = field(default_factory=list)

    @property
    def op_types(self) -> List[str]:
        """The op types of the graph's nodes, branches included, sorted and unique."""
        return sorted(_op_types(self.model.graph))


def _op_types(graph: onnx.GraphProto) -> set:
    found = set()
    for node in graph.node:
        found.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found |= _op_types(attr.g)
    return found


class _Builder:
    """Nodes, initializers and the shapes of the tensors made so far."""

    def __init__(self, rng: np.random.Generator, lead: Dim):
        self.rng, self.lead = rng, lead
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []
        self.inputs: List[onnx.ValueInfoProto] = []
        self.shapes: Dict[str, Shape] = {}
        self.pool: List[str] = []  # float tensors motifs may read
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def add_input(self, shape: Shape, dtype=TensorProto.FLOAT, pool: bool = True) -> str:
        name = self.name("in")
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        self.shapes[name] = tuple(shape)
        if pool:
            self.pool.append(name)
        return name

    def const(self, value: np.ndarray) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        self.shapes[name] = tuple(np.shape(value))
        return name

    def weight(self, *shape: int, scale: float = None) -> str:
        fan_in = shape[-2] if len(shape) > 1 else shape[0]
        std = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        return self.const(self.rng.normal(0.0, std, shape).astype(np.float32))

    def node(self, op: str, inputs: List[str], shape: Shape, pool: bool = True, **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n_{out}", **attrs))
        self.shapes[out] = tuple(shape)
        if pool:
            self.pool.append(out)
        return out

    def pick(self, rank: int = None, min_rank: int = 1) -> str:
        """A recent tensor of the pool (of rank ``rank`` if given), or a new input."""
        fits = [t for t in self.pool if (rank is None or len(self.shapes[t]) == rank)
                and len(self.shapes[t]) >= min_rank]
        if not fits or self.rng.random() < 0.15:
            rank = rank if rank is not None else int(self.rng.integers(max(min_rank, 2), 5))
            return self.add_input(self.random_shape(rank))
        return fits[-1 - int(self.rng.integers(0, min(3, len(fits))))]

    def random_shape(self, rank: int) -> Shape:
        dims = [int(d) for d in self.rng.choice([2, 3, 4, 5, 6, 8], size=rank - 1)]
        return (self.lead, *dims)

    def small(self, lo: int = 2, hi: int = 8) -> int:
        return int(self.rng.integers(lo, hi + 1))


MOTIFS = _motifs.MOTIFS
"""Motif name -> function(builder) adding its nodes."""


def _outputs(b: _Builder) -> List[onnx.ValueInfoProto]:
    read = {i for n in b.nodes for i in n.input} | _outer_reads(b.nodes)
    made = [n.output[0] for n in b.nodes]
    sinks = [t for t in made if t not in read] or made[-1:]
    return [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(b.shapes[t])) for t in sinks]


def _outer_reads(nodes) -> set:
    reads = set()
    for n in nodes:
        for attr in n.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                reads |= {i for m in attr.g.node for i in m.input}
    return reads


def generate(seed: int, max_motifs: int = 5, symbolic: bool = None) -> FuzzGraph:
    """The graph of ``seed``: the same seed gives the same model, byte for byte.

    Parameters
    ----------
    seed : int
        Seed of ``numpy.random.default_rng``.
    max_motifs : int
        At most this many motifs (at least one).
    symbolic : bool, optional
        Force a symbolic (True) or static (False) leading dim; default: drawn from the seed.

    Returns
    -------
    FuzzGraph

    Raises
    ------
    onnx.checker.ValidationError
        If a motif produced an invalid graph (a generator bug: report the seed).
    """
    rng = np.random.default_rng(seed)
    sym = bool(rng.random() < 0.35) if symbolic is None else symbolic
    static_dim = int(rng.choice([1, 2, 3]))
    b = _Builder(rng, SYMBOLIC_DIM if sym else static_dim)
    b.add_input(b.random_shape(int(rng.integers(2, 5))))
    names = sorted(MOTIFS)
    chosen = [names[int(k)] for k in rng.integers(0, len(names), int(rng.integers(1, max_motifs + 1)))]
    for motif in chosen:
        MOTIFS[motif](b)
    graph = helper.make_graph(b.nodes, f"fuzz_{seed}", b.inputs, _outputs(b), b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="relax_memplan.tools.fuzz")
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return FuzzGraph(model=model, seed=seed, symbolic=sym, static_dim=static_dim, motifs=chosen)
