"""Turn one recorded call (a TraceRecorder) into a self-contained graph to compile.

Graph inputs are the flattened tensor arguments and every tensor the function
reached another way (parameters, closures, globals), read afresh at each call.
Constants are what the function built from literals. Outputs are the returned
tensors, then the values behind each value guard, then the final values of
tensors updated in place (written back after the kernel runs).
"""

import weakref
from dataclasses import dataclass, field

import numpy as np

from compiler.ir import Graph, Node

from ..autograd import no_grad
from ..dispatch import node_of
from ..tensor import Tensor
from .reads import Check, entry_checks


class Untraceable(Exception):
    """The call cannot be replayed from its graph; the message says why.

    `retry`: the reason is this call's own (it changed state that a later call will find
    settled), so the next call is traced again instead of running eagerly for good.
    `unpack`: the call uses an item of a list argument as an object (updates it in place,
    returns it, reads its .grad), which a packed list (pytree.Packed) cannot replay: the
    function's list arguments are traced item by item from the next call on.
    """

    def __init__(self, message, retry=False, unpack=False):
        super().__init__(message)
        self.retry = retry
        self.unpack = unpack


def _unpack(what):
    return Untraceable(f"the call {what} an item of a list argument; list arguments of "
                       "this function are traced item by item from now on", unpack=True)


@dataclass
class Source:
    """Where a graph input comes from at call time.

    kind "arg": flat tensor argument `index`; "captured": the tensor behind weakref
    `ref`; "random": the `index`-th random draw of the call (recipe `ref`, drawn anew);
    "grad": the `.grad` of the tensor `ref` names (a TensorRef); "hyper": the
    number `group[key]` (or its `index`-th item) of an optimizer's parameter group,
    `ref` = (weakref(group), key, index), passed as a float64 0-d array.
    """

    kind: str
    index: int = -1
    ref: object = None
    shape: tuple = ()
    dtype: object = None
    rg: bool = False


@dataclass(frozen=True)
class TensorRef:
    """A tensor the trace touched: flat argument `index`, or the tensor behind `ref`."""

    index: int = -1
    ref: object = None

    def resolve(self, flat):
        return flat[self.index] if self.ref is None else self.ref()


@dataclass
class TraceGraph:
    graph: Graph
    sources: list
    outputs: list  # per result leaf: ("out", k) | ("arg", i) | ("captured", input pos)
    guards: list  # (output index, kind, value)
    writebacks: list  # (output index, input index)
    n_results: int
    notes: list = field(default_factory=list)
    # per result: True when the eager result shares memory with no input and no other
    # result (the compiled result must not either)
    fresh: list = field(default_factory=list)
    checks: list = field(default_factory=list)  # reads.Check: what the trace read
    grad_writes: list = field(default_factory=list)  # (TensorRef, None | output index)
    version_bumps: list = field(default_factory=list)  # (input position, count)
    readonly: list = field(default_factory=list)  # per result: eager's array is read-only
    versions: list = field(default_factory=list)  # per result: its version counter's value
    # per result: None, or the (op, shape, dtype) of its autograd node, which a backward()
    # inside the call has already freed (eager returns it with requires_grad and a grad_fn)
    spent: list = field(default_factory=list)
    # results that carry live autograd history (their compiled backward is built), and
    # the graph inputs that require grad (what that backward differentiates)
    grad_results: list = field(default_factory=list)
    grad_inputs: list = field(default_factory=list)
    blocked: frozenset = frozenset()  # graph nodes recorded without autograd (no_grad)
    # sizes of the dims a view's bounds were decided from while recording (a clamped slice
    # bound, x[:20] of 10 rows; split and chunk pieces): traces whose clamps differ never
    # merge into one specialization of symbolic lengths (hybridnet.jit.generalize)
    clamps: frozenset = frozenset()
    # the recipes of the random draws the call made, in order (creation.random_tensor):
    # a compiled call draws them all, used or not, so the generator ends where eager's does
    randoms: tuple = ()


class _Builder:
    def __init__(self, recorder, flat_args, arg_nodes, pinned):
        self.rec = recorder
        self.pinned = pinned
        self.flat = flat_args
        self.arg_index, self.item_index, self.items = {}, {}, {}
        for i, n in enumerate(arg_nodes):
            if isinstance(n, list):  # a Packed list: its items' nodes
                for k, item in enumerate(n):
                    self.item_index.setdefault(id(item), (i, k))
                self.items.update((id(t), t) for t in flat_args[i].items)
            else:
                self.arg_index[id(n)] = i
        self.packed_inputs = {}  # flat index of a Packed -> its input node
        self.nodes = []  # the body, in order
        self.recorded = {id(n) for n in recorder.nodes}
        self.mapping = {}  # id(tape node) -> new Node
        self.inputs, self.sources, self.consts = [], [], []
        self.source_of_tensor = {}  # id(tensor) -> input position
        self.leaf_of_tensor = {}  # id(tensor) -> the leaf node it was first met as
        self.version_bumps = []  # (input position, in-place updates eager made to it)
        self.blocked = set()  # ids of graph nodes recorded without autograd
        # id(grad tensor) -> its owner, for grads the call found in `.grad` on entry
        self.grad_of = {id(e[2]): e[0] for e in recorder.grads.values()
                        if e[1] and e[2] is not None}

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
                                                     dtype=t._data.dtype, rg=t._rg), t)
        if id(tape_node) in self.item_index:
            return self._item(tape_node, *self.item_index[id(tape_node)])
        if tape_node.op == "const":
            node = Node("const", (), dict(tape_node.attrs), (), tape_node.dtype)
            self.mapping[id(tape_node)] = node
            self.consts.append(node)
            return node
        if tape_node.op != "input":
            raise Untraceable(f"the function uses a tensor with autograd history that is "
                              f"neither an argument nor computed inside it ({tape_node.op})")
        return self._leaf(tape_node)

    def _item(self, tape_node, i, k):
        """Item k of the Packed list argument i: `packed[k]`, recorded where it is first
        used, as indexing records x[k] (so a loop over the list rerolls like one over a
        tensor's first dim)."""
        packed = self.packed_inputs.get(i)
        if packed is None:
            p = self.flat[i]
            packed = Node("input", (), {}, p.shape, p._data.dtype)
            self.inputs.append(packed)
            self.sources.append(Source("arg", i, shape=p.shape, dtype=p._data.dtype))
            self.packed_inputs[i] = packed
        shape, dtype = tuple(tape_node.shape), tape_node.dtype
        index = ((k, k + 1, 1),) + tuple((0, s, 1) for s in shape)
        cut = Node("slice", (packed,), {"index": index}, (1,) + shape, dtype)
        node = Node("reshape", (cut,), {"shape": shape}, shape, dtype)
        self.nodes += [cut, node]
        self.mapping[id(tape_node)] = node
        return node

    def outside_arrays(self) -> list:
        """The arrays of the tensors passed in (a list's items, not its stacked copy)."""
        arrays = [t._data for t in self.flat if not hasattr(t, "items")]
        return arrays + [t._data for t in self.items.values()]

    def tensor_ref(self, t) -> TensorRef:
        if id(t) in self.items:
            raise _unpack("reads or assigns the .grad of (or checks an attribute of)")
        i = next((i for i, a in enumerate(self.flat) if a is t), None)
        return TensorRef(i) if i is not None else TensorRef(ref=weakref.ref(t))

    def _leaf(self, tape_node):
        t = tape_node.ref() if tape_node.ref is not None else None
        if t is None:
            raise Untraceable("a tensor the function used was freed during the call")
        first = self.leaf_of_tensor.setdefault(id(t), tape_node)
        value = getattr(tape_node, "value", None)
        stale = value is not None and value is not t._data
        if first is not tape_node or stale or any(a is t for a in self.flat) or \
                id(t) in self.items:
            # an argument met again as a new leaf, or two leaves of one tensor: its
            # buffer was replaced (t.data = ...) during the call
            raise Untraceable("the function replaces a tensor's data (t.data = ...); the "
                              "JIT cannot replay that yet")
        if id(t) in self.rec.hypers:
            group, key, index = self.rec.hypers[id(t)]
            return self._add_input(tape_node, Source("hyper", ref=(weakref.ref(group), key, index),
                                                     shape=(), dtype=t._data.dtype), t)
        if id(t) in self.rec.randoms:  # drawn anew by each compiled call (run.py)
            if t._rg:
                raise Untraceable("a random tensor created inside the call requires grad; "
                                  "the JIT cannot replay it yet")
            seq, recipe, _ = self.rec.randoms[id(t)]
            return self._add_input(tape_node, Source("random", index=seq, ref=recipe,
                                                     shape=t.shape, dtype=t._data.dtype), t)
        if id(t) in self.rec.created:
            if id(t) not in self.rec.literals:
                raise Untraceable("a tensor was built from values the JIT cannot see (for "
                                  "example from t.numpy() or Python values read from tensors)")
            if t._rg:
                raise Untraceable("a tensor created inside the call requires grad (a leaf "
                                  "of the call's own); the JIT cannot replay it yet")
            value = self.rec.literals[id(t)]  # (its value when built, not after updates)
            node = Node("const", (), {"value": value.item() if value.ndim == 0 else value,
                                      "dtype": str(value.dtype)}, value.shape, value.dtype)
            self.mapping[id(tape_node)] = node
            self.consts.append(node)
            return node
        return self._add_input(tape_node, self.source_for(t), t)

    def source_for(self, t) -> Source:
        """How a call finds tensor `t` from outside it (not an argument)."""
        if id(t) in self.items:
            raise _unpack("updates in place")
        meta = dict(shape=t.shape, dtype=t._data.dtype, rg=t._rg)
        if id(t) in self.grad_of:
            # read through owner.grad; when the function can reach t another way too (the
            # key pins its identity: a closure, a global, a module tensor), only as long as
            # owner.grad is still t or t is gone
            seen = weakref.ref(t) if id(t) in self.pinned else None
            return Source("grad", ref=(self.tensor_ref(self.grad_of[id(t)]), seen), **meta)
        return Source("captured", ref=weakref.ref(t), **meta)

    # -- the body ---------------------------------------------------------------------------

    def value(self, tape_node):
        if id(tape_node) in self.mapping:
            return self.mapping[id(tape_node)]
        return self.external(tape_node)

    def body(self):
        nodes = self.nodes
        for tn in self.rec.nodes:
            node = Node(tn.op, tuple(self.value(i) for i in tn.inputs), dict(tn.attrs),
                        tuple(tn.shape), tn.dtype)
            self.mapping[id(tn)] = node
            nodes.append(node)
            if not tn.requires_grad:  # (recorded under no_grad, or not differentiable)
                self.blocked.add(id(node))
        return nodes


def build(recorder, flat_args, arg_nodes, result_leaves, pinned=frozenset()) -> TraceGraph:
    """The TraceGraph of a finished recording (call while still inside the recorder).
    `pinned`: ids of the tensors the static key holds by identity (reached by name)."""
    with no_grad():  # (node_of must not start fresh leaves for tensors updated in place)
        return _build(recorder, flat_args, arg_nodes, result_leaves, pinned)


def _build(recorder, flat_args, arg_nodes, result_leaves, pinned):
    if recorder.reasons:
        raise Untraceable("; ".join(recorder.reasons))
    if recorder.state_changed():
        raise Untraceable("the call changed module attributes or optimizer state or settings "
                          "(an optimizer's first step creates its state); such a call runs "
                          "eagerly and the next one is traced again", retry=True)
    b = _Builder(recorder, flat_args, arg_nodes, pinned | _tensors_in_reads(recorder))
    body = b.body()
    out_nodes = [b.value(node_of(t)) for t in result_leaves]
    n_results = len(out_nodes)
    guards = []
    for g in recorder.guards:
        guards.append((len(out_nodes), g.kind, g.value))
        out_nodes.append(b.value(g.node))
    if recorder.mutated:
        _check_aliasing(b, recorder, [node_of(t) for t in result_leaves])
    writebacks = _writebacks(b, recorder, out_nodes)
    grad_writes = _grad_writes(b, recorder, out_nodes, result_leaves)
    outputs = [_result_source(b, t, k, result_leaves) for k, t in enumerate(result_leaves)]
    fresh = _fresh_results(b, result_leaves)
    bases = _view_bases(b, recorder)
    for k, t in enumerate(result_leaves):
        if outputs[k][0] == "out":
            view = _view_source(b, bases, t, result_leaves[:k])
            if view is not None:
                outputs[k] = view
            elif not fresh[k]:
                raise Untraceable(f"a result ({t._data.dtype}{list(t.shape)}) shares memory "
                                  "with an input or another result in a way the JIT cannot "
                                  "replay")
    _check_grad_aliases(recorder, result_leaves)
    grad_results = _live_results(recorder, result_leaves, outputs)
    graph = Graph(b.inputs + b.consts + body, b.inputs, out_nodes)
    return TraceGraph(graph, b.sources, outputs, guards, writebacks, n_results,
                      fresh=fresh, readonly=[not t._data.flags.writeable for t in result_leaves],
                      versions=[t._version for t in result_leaves],
                      checks=entry_checks(recorder, b.tensor_ref, b.grad_of) +
                      _identity_checks(b),
                      grad_writes=grad_writes,
                      version_bumps=b.version_bumps,
                      spent=[_spent(t) if o[0] == "out" and k not in grad_results else None
                             for k, (t, o) in enumerate(zip(result_leaves, outputs))],
                      grad_results=grad_results,
                      grad_inputs=[i for i, s in enumerate(b.sources) if s.rg]
                      if grad_results else [], blocked=frozenset(b.blocked),
                      clamps=frozenset(getattr(recorder, "clamps", ())),
                      randoms=tuple(r for _, r, _ in sorted(
                          getattr(recorder, "randoms", {}).values(), key=lambda e: e[0])))


def _identity_checks(b) -> list:
    """An argument (or a packed list's item) that is also a tensor the function reaches by
    name (a closure, global or module tensor the key pins) was read as the argument: the
    trace holds only while it still is that tensor."""
    checks = []
    for i, t in enumerate(b.flat):
        for k, item in enumerate(getattr(t, "items", (t,))):
            if id(item) not in b.pinned:
                continue
            ref, packed = weakref.ref(item), hasattr(t, "items")
            checks.append(Check(
                lambda flat, i=i, k=k, ref=ref, packed=packed:
                    (flat[i].items[k] if packed else flat[i]) is ref(),
                f"tensor argument {i}{f' item {k}' if packed else ''} is the tensor the "
                "function also reaches by name", aliases=True))
    return checks


def _spent(t):
    node = t._node
    if not t._rg or node is None or not node.requires_grad:
        return None
    return (node.op, tuple(node.shape), node.dtype)


def _live_results(recorder, result_leaves, outputs) -> list:
    """Positions of the results that carry a live autograd graph (the compiled call
    gives them a compiled backward); refuses history elsewhere on what leaves the call
    (views of inputs, tensors updated in place, `.grad` values)."""
    live = []
    for k, (t, out) in enumerate(zip(result_leaves, outputs)):
        node = t._node
        if out[0] in ("out", "view") and t._rg and node is not None and \
                node.requires_grad and node.value is not None:
            live.append(k)
    if live and any(vc[0] != version for n in recorder.nodes if n.requires_grad
                    for vc, version in n.saved):
        raise Untraceable("an in-place update inside the call changed a value its backward "
                          "needs (eager's backward raises for it); the call runs eagerly")
    for entry in recorder.grads.values():
        value = entry[4]
        if entry[3] and value is not None and value._rg:
            raise Untraceable("the call assigns a tensor that requires grad to .grad; the "
                              "JIT cannot replay that yet")
    return live


def _tensors_in_reads(recorder) -> frozenset:
    """Ids of tensors inside the container attributes the call read."""
    found, stack = set(), [v for _, _, v in recorder.attr_reads.values()]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, Tensor):
            found.add(id(v))
    return frozenset(found)


def _result_source(b, t, k, result_leaves):
    """A result that is a tensor from outside the call (an argument, a parameter), or one
    returned twice, is returned as that very object, as eager returns it."""
    if id(t) in b.items:
        raise _unpack("returns")
    for i, a in enumerate(b.flat):
        if a is t:
            return ("arg", i)
    for j in range(k):
        if result_leaves[j] is t:
            return ("same", j)
    pos = b.source_of_tensor.get(id(t))
    if pos is not None and b.sources[pos].kind in ("captured", "grad"):
        return ("captured", pos)
    return ("out", k)


def _view_bases(b, recorder):
    """Where a result's movement ops may start: input nodes, and the final nodes of tensors
    updated in place (both by input position)."""
    input_pos = {id(node): i for i, node in enumerate(b.inputs)}
    finals = {id(u._node): b.source_of_tensor[id(u)] for u in recorder.mutated
              if id(u) in b.source_of_tensor and u._node is not None}
    return input_pos, finals


def _view_source(b, bases, t, earlier):
    """A result made by movement ops (reshape, permute, expand, slice, detach) from an
    input, a tensor updated in place, or an earlier result: ("view", base, ops), replayed
    with the ops' NumPy impls on the base at call time, so it is a view or a copy, shares
    memory and the version counter, exactly as in eager for that call's layout (None if
    it is not such a result)."""
    input_pos, finals = bases
    results = {id(node_of(r)): j for j, r in enumerate(earlier)}
    node, chain = node_of(t), []
    while True:
        mapped = b.mapping.get(id(node))
        base = ("input", input_pos[id(mapped)]) if mapped is not None and \
            id(mapped) in input_pos else ("input", finals[id(node)]) if id(node) in finals \
            else ("result", results[id(node)]) if id(node) in results else None
        if base is not None:
            return ("view", base, tuple(reversed(chain))) if chain else None
        opdef = node.opdef if node.op not in ("input", "const") else None
        if opdef is None or not opdef.has("movement") or len(node.inputs) != 1:
            return None
        chain.append((node.op, dict(node.attrs)))
        node = node.inputs[0]


def _check_grad_aliases(recorder, result_leaves):
    """A value assigned to .grad that shares memory with a result (not the same tensor)
    cannot be replayed: eager returns views of one buffer."""
    values = [e[4] for e in recorder.grads.values() if e[3] and e[4] is not None]
    for v in values:
        for r in result_leaves:
            if r is not v and np.may_share_memory(r._data, v._data):
                raise Untraceable("a result shares memory with a tensor the call assigns to "
                                  ".grad; the JIT cannot replay that yet")


def _grad_writes(b, recorder, out_nodes, result_leaves):
    """`.grad` assignments the call made (zero_grad(), p.grad = ...), replayed after the
    kernel: (owner, None | output index, index of the result that is the same tensor)."""
    writes = []
    outside = b.outside_arrays() + [
        t._data for t in (s.ref() for s in b.sources if s.kind == "captured") if t is not None]
    for t, _, _, written, value in recorder.grads.values():
        if not written:
            continue
        if value is None:
            writes.append((b.tensor_ref(t), None, None, 0))
            continue
        if id(value) not in recorder.created and id(node_of(value)) not in b.recorded or \
                any(np.may_share_memory(value._data, a) for a in outside):
            raise Untraceable("the call assigns a tensor from outside it (or a view of one) to "
                              ".grad; the JIT cannot replay that yet")
        same = next((k for k, r in enumerate(result_leaves) if r is value), None)
        writes.append((b.tensor_ref(t), len(out_nodes), same, value._version))
        out_nodes.append(b.value(node_of(value)))
    return writes


def _fresh_results(b, result_leaves):
    items = [t._data for t in b.items.values()]
    outside = b.outside_arrays()
    outside += [t._data for t in (s.ref() for s in b.sources if s.kind == "captured")
                if t is not None]
    fresh = []
    for k, t in enumerate(result_leaves):
        if any(np.may_share_memory(t._data, a) for a in items):
            raise _unpack("returns a view of")
        others = outside + [r._data for j, r in enumerate(result_leaves) if j != k]
        fresh.append(not any(np.may_share_memory(t._data, a) for a in others))
    return fresh


def _writebacks(b, recorder, out_nodes):
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
        if t._rg and t._node is not None and t._node.requires_grad:
            raise Untraceable("an in-place update in grad mode gives a tensor from outside "
                              "the call autograd history; the JIT cannot replay that yet")
        pos = b.source_of_tensor.get(id(t))
        if pos is None:
            arg = next((i for i, a in enumerate(b.flat) if a is t), None)
            source = Source("arg", arg, shape=t.shape, dtype=t._data.dtype) if arg is not None \
                else b.source_for(t)
            fake = Node("input", (), {}, t.shape, t._data.dtype)
            b.inputs.append(fake)
            b.sources.append(source)
            pos = len(b.inputs) - 1
            b.source_of_tensor[id(t)] = pos
        result.append((len(out_nodes), pos))
        out_nodes.append(b.value(node_of(t)))
        b.version_bumps.append((pos, sum(1 for u, _ in recorder._rebound if u is t)))
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
