"""Reverse-mode autodiff over nodes, with the registry's vjp rules.

The engine is written against callbacks, so the same walk runs eager backward
(values are NumPy-backed tensors), higher-order gradients (values are tensors
with history) and symbolic backward graphs (`grad_graph`: values are graph nodes,
built by `compiler.emitter.GraphEmitter`).
"""

from .emitter import GraphEmitter
from .ir import Graph, Node, collect
from .registry import REGISTRY, Trait, sum_to


def reachable(roots, stop=frozenset()) -> list:
    """Nodes that require grad and reach `roots`, every node before its inputs (a reverse
    topological order: the walk never relies on creation order, which passes break).
    The inputs of nodes in `stop` (ids) are not walked."""
    order, seen = [], set()
    for root in roots:
        if not root.requires_grad or id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(() if id(root) in stop else root.inputs))]
        while stack:
            node, pending = stack[-1]
            for inp in pending:
                if inp.requires_grad and id(inp) not in seen:
                    seen.add(id(inp))
                    stack.append((inp, iter(() if id(inp) in stop else inp.inputs)))
                    break
            else:
                stack.pop()
                order.append(node)  # after all its inputs: post-order
    order.reverse()
    return order


class OwnBackward:
    """A node that brings its own backward instead of a registry vjp: a compiled call
    (many outputs, one backward) and its per-output projections.

    `merge(e, old, g)`: the pending gradient after `g` arrives (old: None or what came
    before); `route(e, g, value_of)`: (input node, gradient) pairs for the node's inputs;
    `release()`: free its saved values after a backward without retain_graph.
    """

    __slots__ = ()

    def merge(self, e, old, g):
        return g if old is None else e("add", old, g)

    def route(self, e, g, value_of):
        raise NotImplementedError

    def release(self):
        """Free what the backward read (backward without retain_graph walked it)."""
        raise NotImplementedError


class SlotsBackward(OwnBackward):
    """An OwnBackward node with many outputs: each output's gradient arrives as
    `(index, grad)` and they gather into one dict, index -> gradient (a compiled call,
    a loop node)."""

    __slots__ = ()

    def merge(self, e, old, g):
        index, grad = g
        slots = {} if old is None else old
        prev = slots.get(index)
        slots[index] = grad if prev is None else e("add", prev, grad)
        return slots


def _input_grads(node, opdef, e, g, ins, out):
    attrs = node.attrs
    if not isinstance(opdef.vjp, tuple):
        return opdef.vjp(e, g, ins, out, attrs)
    grads = []
    for inp, rule in zip(node.inputs, opdef.vjp):
        if rule is None or not inp.requires_grad:
            grads.append(None)
            continue
        gi = rule(e, g, ins, out, attrs)
        if Trait.ELEMENTWISE in opdef.traits and tuple(gi.shape) != tuple(inp.shape):
            gi = sum_to(e, gi, inp.shape)
        grads.append(gi)
    return grads


def backward(roots, root_grads, e, value_of, sink, check=None, stop=frozenset()) -> list:
    """Propagate `root_grads` from `roots` back through the graph.

    e: the op emitter; value_of(node): the value a vjp sees for node;
    sink(node, grad): receives each node's total gradient (leaves stop there, and so do
    the nodes whose ids are in `stop`); check(node): raises if node's saved values are
    gone or were modified. Returns the nodes visited, latest first.
    """
    pending = {}
    for root, g in zip(roots, root_grads):
        _accumulate(pending, e, root, g)
    order = reachable(roots, stop)
    for node in order:
        g = pending.pop(id(node), None)
        if g is None:
            continue
        g = e.settle(g)
        sink(node, g)
        if id(node) in stop:
            continue
        if isinstance(node, OwnBackward):
            if check is not None:
                check(node)
            for inp, gi in node.route(e, g, value_of):
                if gi is not None and inp.requires_grad:
                    _accumulate(pending, e, inp, gi)
            continue
        opdef = REGISTRY[node.op]
        if Trait.SOURCE in opdef.traits or not opdef.differentiable:
            continue
        if check is not None:
            check(node)
        if opdef.window == "read" and e.in_place and not isinstance(node.inputs[0], OwnBackward):
            _accumulate_window(pending, e, node, g)
            continue
        ins = [value_of(i) for i in node.inputs]
        out = value_of(node) if "out" in opdef.saves else None
        grads = _input_grads(node, opdef, e, g, ins, out)
        for inp, gi in zip(node.inputs, grads):
            if gi is not None and inp.requires_grad:
                _accumulate(pending, e, inp, gi)
    return order


def _accumulate(pending, e, node, g):
    old = pending.get(id(node))
    if isinstance(node, OwnBackward):
        pending[id(node)] = node.merge(e, old, g)
    else:
        pending[id(node)] = g if old is None else e.accumulate(old, g)


def _accumulate_window(pending, e, node, g):
    """The gradient of a window read (x[t], a gate of a chunk) added into the window of
    its input's pending gradient, in one buffer: the vjp would make zeros of the whole
    input per read (an LSTM's input projections: one (T, B, 4H) buffer per step) and
    add them, T^2 work where this is T."""
    inp = node.inputs[0]
    if inp.requires_grad:
        pending[id(inp)] = e.add_window(pending.get(id(inp)), g, tuple(inp.shape),
                                        node.attrs["index"])


def mark_requires_grad(graph, wrt, blocked=frozenset()) -> None:
    """Set `requires_grad` on the nodes of `graph` that depend differentiably on `wrt`
    (and clear it elsewhere): what `backward` walks. Nodes whose ids are in `blocked`
    never require grad (ops recorded under no_grad). A node that brings its own backward
    (`OwnBackward`: a loop node, compiler.loop_grad) is differentiable."""
    wanted = {id(n) for n in wrt}
    for node in graph.nodes:
        if node.is_source:
            node.requires_grad = id(node) in wanted
        else:
            node.requires_grad = id(node) not in blocked and (
                isinstance(node, OwnBackward) or REGISTRY[node.op].differentiable) and \
                any(i.requires_grad for i in node.inputs)


def viewed(node):
    """`node`, then each value it views through single-input movement ops (x.T.reshape
    yields the reshape, the permute, then x): whose buffer a read of `node` reads."""
    while True:
        yield node
        if node.is_source or not REGISTRY[node.op].has(Trait.MOVEMENT) or \
                len(node.inputs) != 1:
            return
        node = node.inputs[0]


def inputs_read_by_vjps(graph) -> list:
    """Positions of the inputs of `graph` (marked by `mark_requires_grad`) whose values a
    vjp reads, directly or through movement ops: eager autograd checks their versions."""
    position = {id(n): i for i, n in enumerate(graph.inputs)}
    found = set()
    for node in graph.nodes:
        if node.is_source or not node.requires_grad or "in" not in REGISTRY[node.op].saves:
            continue
        for inp in node.inputs:
            found.update(position[id(v)] for v in viewed(inp) if id(v) in position)
    return sorted(found)


def outputs_read_by_vjps(graph) -> list:
    """Positions of the outputs of `graph` (marked by `mark_requires_grad`) whose own
    values a vjp reads: the output of an op that saves its result (tanh, exp), or an
    input of one that saves its inputs (mul). Eager autograd checks their versions, so a
    result updated in place before backward() raises."""
    read = set()
    for node in graph.nodes:
        if node.is_source or not node.requires_grad:
            continue
        saves = REGISTRY[node.op].saves
        if "out" in saves:
            read.add(id(node))
        if "in" in saves:
            read.update(id(inp) for inp in node.inputs)
    return [k for k, out in enumerate(graph.outputs) if id(out) in read]


def reaching(graph, wrt, seeded, blocked=frozenset()) -> list:
    """Per node of `wrt`: the positions in `seeded` (output indices of `graph`) whose
    outputs depend on it differentiably (what eager backward from those outputs would
    reach). Marks `requires_grad` on `graph`'s nodes."""
    mark_requires_grad(graph, wrt, blocked)
    found = [set() for _ in wrt]
    position = {id(n): j for j, n in enumerate(wrt)}
    for slot, k in enumerate(seeded):
        for node in reachable([graph.outputs[k]]):
            j = position.get(id(node))
            if j is not None:
                found[j].add(slot)
    return found


def grad_graph(graph, wrt=None, seeded=None, blocked=frozenset()) -> Graph:
    """Forward and backward of `graph` as one graph (symbolic reverse mode).

    Its inputs are `graph`'s inputs, then one seed gradient per seeded output (the
    gradient of the final loss with respect to that output; `seeded`: output positions,
    default all); its outputs are `graph`'s outputs, then the gradient with respect to
    each node of `wrt` (default: the inputs that require grad), zeros where it does not
    depend on them. The vjp rules are the eager ones, run by a `GraphEmitter`. Marks
    `requires_grad` on `graph`'s nodes (`blocked`: nodes that never do, see
    mark_requires_grad).
    """
    wrt = [n for n in graph.inputs if n.requires_grad] if wrt is None else list(wrt)
    mark_requires_grad(graph, wrt, blocked)
    e = GraphEmitter()
    roots = list(graph.outputs) if seeded is None else [graph.outputs[k] for k in seeded]
    seeds = [Node("input", (), {}, o.shape, o.dtype) for o in roots]
    found = {}
    wanted = {id(n) for n in wrt}

    def sink(node, g):
        if id(node) in wanted:
            found[id(node)] = g

    backward(roots, seeds, e, lambda n: n, sink)
    grads = [found.get(id(n)) or e("expand", e.const(0, like=n), shape=tuple(n.shape))
             for n in wrt]
    grads = [g if g.dtype == n.dtype else e("cast", g, dtype=str(n.dtype))
             for g, n in zip(grads, wrt)]
    outputs = list(graph.outputs) + grads
    inputs = list(graph.inputs) + seeds
    used = {id(n) for n in collect(outputs)}
    nodes = [n for n in inputs if id(n) not in used] + collect(outputs)
    return Graph(nodes, inputs, outputs)
