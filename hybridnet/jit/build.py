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
    # per result: True when the eager result shares memory with no input and no other
    # result (the compiled result must not either)
    fresh: list = field(default_factory=list)


class _Builder:
    def __init__(self, recorder, flat_args, arg_nodes):
        self.rec = recorder
        self.flat = flat_args
        self.arg_index = {id(n): i for i, n in enumerate(arg_nodes)}
        self.recorded = {id(n) for n in recorder.nodes}
        self.mapping = {}  # id(tape node) -> new Node
        self.inputs, self.sources, self.consts = [], [], []
        self.source_of_tensor = {}  # id(tensor) -> input position
        self.leaf_of_tensor = {}  # id(tensor) -> the leaf node it was first met as

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
        first = self.leaf_of_tensor.setdefault(id(t), tape_node)
        value = getattr(tape_node, "value", None)
        stale = value is not None and value is not t._data
        if first is not tape_node or stale or any(a is t for a in self.flat):
            # an argument met again as a new leaf, or two leaves of one tensor: its
            # buffer was replaced (t.data = ...) during the call
            raise Untraceable("the function replaces a tensor's data (t.data = ...); the "
                              "JIT cannot replay that yet")
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
    if recorder.mutated:
        _check_aliasing(b, recorder, [node_of(t) for t in result_leaves])
    writebacks = _writebacks(b, recorder, out_nodes)
    graph = Graph(b.inputs + b.consts + body, b.inputs, out_nodes)
    return TraceGraph(graph, b.sources, outputs, guards, writebacks, n_results,
                      fresh=_fresh_results(b, result_leaves))


def _fresh_results(b, result_leaves):
    outside = [t._data for t in b.flat]
    outside += [t._data for t in (s.ref() for s in b.sources if s.kind == "captured")
                if t is not None]
    fresh = []
    for k, t in enumerate(result_leaves):
        others = outside + [r._data for j, r in enumerate(result_leaves) if j != k]
        fresh.append(not any(np.may_share_memory(t._data, a) for a in others))
    return fresh


def _writebacks(b, recorder, out_nodes):
    import weakref
    first_node = {}  # id(tensor) -> the node it had before its first in-place update
    for t, previous in recorder._rebound:
        first_node.setdefault(id(t), previous)
    result, seen = [], set()
    for t in reversed(recorder.mutated):
        if id(t) in seen or id(t) in recorder.created:
            continue
        seen.add(id(t))
        if id(first_node.get(id(t))) in b.recorded:
            # made by an op of this call (x.clone().add_(y)): its final value is a graph
            # value like any other, there is nothing outside the call to update
            continue
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


def _check_aliasing(b, recorder, result_nodes):
    """Refuse in-place updates that another tensor of the call sees through shared memory.

    The graph gives each value its own buffer. When an updated tensor shares memory with
    another one (a view taken before the update and read after it, or an outside tensor
    that a view made inside the call writes into), eager code sees the update through
    the alias and a replay of the graph would not.
    """
    pos = {id(n): i for i, n in enumerate(recorder.nodes)}
    last_use, leaves = {}, {}
    for i, node in enumerate(recorder.nodes):
        for inp in node.inputs:
            last_use[id(inp)] = i
            if id(inp) not in pos and inp.op == "input":
                leaves[id(inp)] = inp
    for node in result_nodes:
        last_use[id(node)] = len(recorder.nodes)
    chains = {}  # id(tensor) -> (tensor, [node before each update...])
    for t, previous in recorder._rebound:
        chains.setdefault(id(t), (t, []))[1].append(previous)
    candidates = list(recorder.nodes) + list(leaves.values())
    for t, previous in chains.values():
        data = t._data
        made_inside = id(previous[0]) in pos or id(t) in recorder.created
        own = {id(n) for n in previous} | {id(t._node)}
        updates = [pos.get(id(n), -1) for n in previous[1:] + [t._node]]
        for c in candidates:
            value = getattr(c, "value", None)
            if id(c) in own or value is None or not np.may_share_memory(value, data):
                continue  # (p.detach() and p.data hold p's very buffer: aliases too)
            born, used = pos.get(id(c), -1), last_use.get(id(c), -1)
            if (made_inside and id(c) not in pos) or any(born < u < used for u in updates):
                raise Untraceable(f"an in-place update of {data.dtype}{list(data.shape)} "
                                  "writes memory that another tensor of the call shares (a "
                                  "view); the JIT cannot replay it yet")
