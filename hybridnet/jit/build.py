"""Turn one recorded call (a TraceRecorder) into a self-contained graph to compile.

Graph inputs are the flattened tensor arguments and every tensor the function
reached another way (parameters, closures, globals), read afresh at each call.
Constants are what the function built from literals. Outputs are the returned
tensors, then the values behind each value guard, then the final values of
tensors updated in place (written back after the kernel runs).
"""

from dataclasses import dataclass, field

import numpy as np

from compiler.ir import Graph, Node


class Untraceable(Exception):
    """The call cannot be replayed from its graph; the message says why."""


@dataclass
class Source:
    """Where a graph input comes from at call time."""

    kind: str  # "arg" (index into the flat tensor args) or "captured" (weakref)
    index: int = -1
    ref: object = None
    shape: tuple = ()
    dtype: object = None


@dataclass
class TraceGraph:
    graph: Graph
    sources: list
    outputs: list  # per result leaf: ("out", k) | ("arg", i) | ("captured", ref)
    guards: list  # (output index, kind, value)
    writebacks: list  # (output index, input index)
    n_results: int
    notes: list = field(default_factory=list)


class _Builder:
    def __init__(self, recorder, flat_args, arg_nodes):
        self.rec = recorder
        self.flat = flat_args
        self.arg_index = {id(n): i for i, n in enumerate(arg_nodes)}
        self.recorded = {id(n) for n in recorder.nodes}
        self.mapping = {}  # id(tape node) -> new Node
        self.inputs, self.sources, self.consts = [], [], []
        self.source_of_tensor = {}  # id(tensor) -> input position

    # -- external values --------------------------------------------------------------

    def _add_input(self, tape_node, source, tensor=None):
        node = Node("input", (), {}, tuple(tape_node.shape), tape_node.dtype)
        self.mapping[id(tape_node)] = node
        self.inputs.append(node)
        self.sources.append(source)
        if tensor is not None:
            self.source_of_tensor[id(tensor)] = len(self.inputs) - 1
        return node

    def external(self, tape_node):
        found = self.mapping.get(id(tape_node))
        if found is not None:
            return found
        if id(tape_node) in self.arg_index:
            i = self.arg_index[id(tape_node)]
            t = self.flat[i]
            return self._add_input(tape_node, Source("arg", i, shape=t.shape,
                                                     dtype=t._data.dtype), t)
        if tape_node.op == "const":
            node = Node("const", (), dict(tape_node.attrs), (), tape_node.dtype)
            self.mapping[id(tape_node)] = node
            self.consts.append(node)
            return node
        if tape_node.op != "input":
            raise Untraceable(f"the function uses a tensor with autograd history that is "
                              f"neither an argument nor computed inside it ({tape_node.op})")
        return self._leaf(tape_node)

    def _leaf(self, tape_node):
        import weakref
        t = tape_node.ref() if tape_node.ref is not None else None
        if t is None:
            raise Untraceable("a tensor the function used was freed during the call")
        if id(t) in self.rec.created:
            if id(t) not in self.rec.literals:
                raise Untraceable("a tensor was built from values the JIT cannot see (for "
                                  "example from t.numpy() or Python values read from tensors)")
            value = np.array(t._data, copy=True)
            node = Node("const", (), {"value": value.item() if value.ndim == 0 else value,
                                      "dtype": str(value.dtype)}, value.shape, value.dtype)
            self.mapping[id(tape_node)] = node
            self.consts.append(node)
            return node
        return self._add_input(tape_node, Source("captured", ref=weakref.ref(t), shape=t.shape,
                                                 dtype=t._data.dtype), t)

    # -- the body ---------------------------------------------------------------------------

    def value(self, tape_node):
        if id(tape_node) in self.mapping:
            return self.mapping[id(tape_node)]
        return self.external(tape_node)

    def body(self):
        nodes = []
        for tn in self.rec.nodes:
            if tn.requires_grad:
                raise Untraceable("autograd not compiled yet: the call needs gradients (run "
                                  "it under hn.no_grad() or on tensors that need no grad)")
            node = Node(tn.op, tuple(self.value(i) for i in tn.inputs), dict(tn.attrs),
                        tuple(tn.shape), tn.dtype)
            self.mapping[id(tn)] = node
            nodes.append(node)
        return nodes


def build(recorder, flat_args, arg_nodes, result_leaves) -> TraceGraph:
    """The TraceGraph of a finished recording (call while still inside the recorder)."""
    if recorder.reasons:
        raise Untraceable("; ".join(recorder.reasons))
    from ..dispatch import node_of
    b = _Builder(recorder, flat_args, arg_nodes)
    body = b.body()
    out_nodes, outputs = [], []
    for t in result_leaves:
        node = b.value(node_of(t))
        outputs.append(("out", len(out_nodes)))
        out_nodes.append(node)
    n_results = len(out_nodes)
    guards = []
    for g in recorder.guards:
        guards.append((len(out_nodes), g.kind, g.value))
        out_nodes.append(b.value(g.node))
    writebacks = _writebacks(b, recorder, out_nodes)
    graph = Graph(b.inputs + b.consts + body, b.inputs, out_nodes)
    return TraceGraph(graph, b.sources, outputs, guards, writebacks, n_results)


def _writebacks(b, recorder, out_nodes):
    import weakref
    result, seen = [], set()
    for t in reversed(recorder.mutated):
        if id(t) in seen or id(t) in recorder.created:
            continue
        seen.add(id(t))
        pos = b.source_of_tensor.get(id(t))
        if pos is None:
            arg = next((i for i, a in enumerate(b.flat) if a is t), None)
            source = Source("arg", arg, shape=t.shape, dtype=t._data.dtype) if arg is not None \
                else Source("captured", ref=weakref.ref(t), shape=t.shape, dtype=t._data.dtype)
            fake = Node("input", (), {}, t.shape, t._data.dtype)
            b.inputs.append(fake)
            b.sources.append(source)
            pos = len(b.inputs) - 1
            b.source_of_tensor[id(t)] = pos
        result.append((len(out_nodes), pos))
        from ..dispatch import node_of
        out_nodes.append(b.value(node_of(t)))
    return result
