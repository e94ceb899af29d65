"""The IR: a `Graph` of `Node`s in SSA form, with ordered inputs.

The same node objects form the eager autograd tape (hybridnet subclasses `Node`
to attach the recorded value) and the graphs that passes transform and backends
lower. A `Graph` is a view over nodes: inputs (leaves), nodes in execution order
and outputs.
"""

import hashlib
import itertools

import numpy as np

from . import graphviz, interpret
from .errors import OpError
from .registry import REGISTRY, Trait

_seq = itertools.count()


class Node:
    """One op application: `op(*inputs, **attrs) -> shape, dtype`.

    `seq` is a global creation counter, so sorting nodes by it gives a valid
    execution order. `requires_grad` says whether gradients flow into it.
    """

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "seq", "requires_grad",
                 "__weakref__")

    def __init__(self, op: str, inputs: tuple, attrs: dict, shape: tuple, dtype,
                 requires_grad: bool = False):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.requires_grad = requires_grad
        self.seq = next(_seq)

    @property
    def opdef(self):
        """This node's registry entry."""
        return REGISTRY[self.op]

    @property
    def is_source(self) -> bool:
        """True for graph leaves (inputs and constants)."""
        return Trait.SOURCE in self.opdef.traits

    def type_str(self) -> str:
        """'float32[3, 4]'."""
        return f"{self.dtype}[{', '.join(str(s) for s in self.shape)}]"

    def __repr__(self) -> str:
        return f"<{self.op} {self.type_str()}>"


def _fmt_attr(value) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"array({value.tolist()})"
        return f"array({value.dtype}[{', '.join(str(s) for s in value.shape)}])"
    return repr(value)


def _hash_attr(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array({value.dtype},{value.shape},{hashlib.sha256(value.tobytes()).hexdigest()})"
    return repr(value)


def pad_shape(shape) -> tuple:
    """A shape as generated loops index it: 0-d values are 1-element arrays."""
    return tuple(shape) if len(shape) else (1,)


def size_class(shape) -> tuple:
    """A shape abstracted to what size-generic code depends on: rank and size-1 dims."""
    return tuple(1 if s == 1 else -1 for s in shape)


def next_seq() -> int:
    """The `seq` the next node created will get (nodes made from now on have seq >= it)."""
    global _seq
    value = next(_seq)
    _seq = itertools.count(value)
    return value


def collect(outputs) -> list:
    """All nodes that `outputs` depend on, in execution (seq) order."""
    seen, stack = set(), list(outputs)
    found = []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        stack.extend(node.inputs)
    found.sort(key=lambda n: n.seq)
    return found


class Graph:
    """A computation graph: `inputs` (leaves), `nodes` in execution order, `outputs`.

    >>> g = Graph.from_outputs([some_node])        # doctest: +SKIP
    >>> print(g)                                   # readable text
    >>> g.run(x_array)                             # re-executes with new inputs
    """

    def __init__(self, nodes, inputs, outputs):
        self.nodes = list(nodes)
        self.inputs = list(inputs)
        self.outputs = list(outputs)

    @classmethod
    def from_outputs(cls, outputs) -> "Graph":
        """The graph that produced `outputs`: every ancestor node, leaves as inputs."""
        nodes = collect(outputs)
        inputs = [n for n in nodes if n.op == "input"]
        return cls(nodes, inputs, outputs)

    # -- printing ------------------------------------------------------------------

    def names(self) -> dict:
        """Printed names: '%0', '%1', ... in execution order."""
        return {id(n): f"%{i}" for i, n in enumerate(self.nodes)}

    def __str__(self) -> str:
        names = self.names()
        head = ", ".join(f"{names[id(n)]}: {n.type_str()}" for n in self.inputs)
        lines = [f"graph({head}) {{"]
        for node in self.nodes:
            if node.op != "input":
                lines.append("  " + self.node_line(node, names))
        outs = ", ".join(names.get(id(o), "?") for o in self.outputs)
        lines.append(f"  return ({outs})")
        lines.append("}")
        return "\n".join(lines)

    def node_line(self, node, names=None) -> str:
        """One node as the printer shows it: '%3 = add(%1, %2) : float32[4]'."""
        names = self.names() if names is None else names
        args = [names.get(id(i), "?") for i in node.inputs]
        args += [f"{k}={_fmt_attr(v)}" for k, v in node.attrs.items()]
        return f"{names.get(id(node), '?')} = {node.op}({', '.join(args)}) : {node.type_str()}"

    def __repr__(self) -> str:
        return (f"<Graph: {len(self.inputs)} inputs, {len(self.nodes)} nodes, "
                f"{len(self.outputs)} outputs>")

    # -- identity and checking -------------------------------------------------------

    def structural_hash(self, exact_shapes: bool = True) -> str:
        """A hash of the graph's structure (ops, attrs, wiring, shapes, dtypes).

        With exact_shapes=False, shapes count only by rank and which dims are 1, so
        graphs that differ only in sizes (a new batch size) hash alike.
        """
        index = {id(n): i for i, n in enumerate(self.nodes)}
        h = hashlib.sha256()
        for node in self.nodes:
            ins = [index[id(i)] for i in node.inputs]
            attrs = sorted((k, _hash_attr(v)) for k, v in node.attrs.items())
            shape = node.shape if exact_shapes else size_class(node.shape)
            h.update(repr((node.op, ins, attrs, shape, str(node.dtype))).encode())
        h.update(repr([index[id(n)] for n in self.inputs]).encode())
        h.update(repr([index[id(n)] for n in self.outputs]).encode())
        return h.hexdigest()

    def verify(self) -> None:
        """Check SSA order, arities and that every shape/dtype matches its rule."""
        seen = set()
        for node in self.nodes:
            if node.op not in REGISTRY:
                raise OpError(f"verify: unknown op {node.op!r}")
            for inp in node.inputs:
                if id(inp) not in seen:
                    raise OpError(f"verify: {node!r} uses {inp!r} before it is defined")
            opdef = REGISTRY[node.op]
            if node.op != "input":
                shape, dtype = opdef.infer_node(node) if opdef.infer_node is not None else \
                    opdef.check([i.shape for i in node.inputs], [i.dtype for i in node.inputs],
                                node.attrs)
                if tuple(shape) != tuple(node.shape) or np.dtype(dtype) != node.dtype:
                    raise OpError(f"verify: {node!r} recorded as {node.type_str()} but its rule "
                                  f"gives {np.dtype(dtype)}{list(shape)}")
            seen.add(id(node))
        for node in list(self.inputs) + list(self.outputs):
            if id(node) not in seen:
                raise OpError(f"verify: {node!r} is an input or output but not in the graph")

    # -- editing (used by passes) -------------------------------------------------------

    def clone(self, wrap=None) -> "Graph":
        """A copy made of fresh plain `Node`s (passes never edit the eager tape).
        `wrap(node, copy)`, if given, may return a node made from the copy, which then
        follows it and stands for `node` in the nodes after it."""
        mapping = {}
        nodes = []
        for node in self.nodes:
            new = Node(node.op, tuple(mapping[id(i)] for i in node.inputs), dict(node.attrs),
                       tuple(node.shape), node.dtype, node.requires_grad)
            nodes.append(new)
            wrapped = wrap(node, new) if wrap is not None else None
            if wrapped is not None:
                nodes.append(wrapped)
                new = wrapped
            mapping[id(node)] = new
        return Graph(nodes, [mapping[id(n)] for n in self.inputs],
                     [mapping[id(n)] for n in self.outputs])

    def users(self) -> dict:
        """id(node) -> list of nodes that use it (in graph order; repeats kept)."""
        table = {id(n): [] for n in self.nodes}
        for node in self.nodes:
            for inp in node.inputs:
                table.setdefault(id(inp), []).append(node)
        return table

    # -- execution and conversion -------------------------------------------------------

    def run(self, *arrays) -> list:
        """Re-execute the graph with the reference interpreter on new input arrays."""
        return interpret.run(self, *arrays)

    def to_networkx(self, groups=None):
        """A `networkx.DiGraph`: one vertex per node (attrs op, shape, dtype, and
        fusion_group from `groups`, id(node) -> kernel index), edges by use."""
        return graphviz.to_networkx(self, groups)

    def to_dot(self, groups=None) -> str:
        """Graphviz DOT source for the graph; nodes fused into one kernel (`groups`,
        id(node) -> kernel index) drawn inside one cluster."""
        return graphviz.to_dot(self, groups)
