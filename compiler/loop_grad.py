"""Gradients of rerolled loops: the backward of a loop node is a loop too.

`split_gradient` used to differentiate the unrolled forward (T copies of the body) and
reroll the forward-plus-backward graph it gave, about three times the nodes of the
forward alone. `loop_joint(graph, wrt, seeded)` rerolls the forward first, then
differentiates it, each loop node by its own rule (JAX's scan transpose, in our IR):

1. The body's joint graph (`autodiff.grad_graph` of one step, every output seeded) is
   split (`partition`) into the step's forward, which also returns the values its
   backward reads, and the step's backward.
2. The loop node then runs the step's forward; the saved values that are not the body's
   own inputs are collected per step as extra outputs (block k for step k). A carried
   input that the backward reads is collected as it enters the step.
3. Its backward is a second loop node over the same trip count in reverse: it carries the
   gradients of the carried values and one sum per invariant input (a weight's
   gradient), reads the saved values, the sequences' slices and the collected outputs'
   gradients backwards, and collects the sequences' gradients, laid out where their
   slices were read (zeros around them).

`compiler.loop_hoist` then moves the products out of both loops as it does for loops
that rerolling made, so a weight's gradient is one product over every step.

What this does not take (`loop_joint` returns None, and the unrolled graph is
differentiated as before): nested loops, sequences whose steps overlap or leave gaps,
and non-float carried values. A picked step's gradient (`Pick`) is added into its
collected output's gradient at that step's block.
"""

import numpy as np

from .autodiff import OwnBackward, SlotsBackward, grad_graph, mark_requires_grad, viewed
from .ir import Graph, Node
from .loop import Collect, LoopSpec, SeqIn, is_loop, is_projection, traced_trip
from .partition import partition
from .passes.manager import optimize
from .reroll import reroll


class LoopUnsupported(Exception):
    """This loop's gradient is not made as a loop (the unrolled graph is differentiated)."""


def loop_joint(graph: Graph, wrt, seeded, blocked=frozenset(), picks=True):
    """The forward-plus-backward graph of `graph` (as `autodiff.grad_graph` makes it)
    with its loops rerolled before differentiating, or None when `graph` has no loop
    whose gradient is made here (see the module docstring). `blocked`: ids of nodes
    recorded without autograd; each that would otherwise carry a gradient is followed
    by a `detach`, so that the rerolled steps block it too. `picks` False: None for a
    loop with picked steps."""
    rerolled, made = reroll(with_detaches(graph, wrt, blocked))
    if not made:
        return None
    position = {id(n): i for i, n in enumerate(graph.inputs)}
    g = rerolled.clone(_own_backward)
    try:
        wrt2 = [g.inputs[position[id(n)]] for n in wrt]
    except KeyError:
        return None  # (a node to differentiate that is no input)
    mark_requires_grad(g, wrt2)
    try:
        for node in list(g.nodes):
            if isinstance(node, LoopGrad) and node.requires_grad:
                if node.attrs["spec"].picks and not picks:
                    return None
                _prepare(g, node)
    except LoopUnsupported:
        return None
    return grad_graph(g, wrt2, seeded).clone()


def with_detaches(graph, wrt, blocked):
    """`graph` with a `detach` after each node of `blocked` (ids of nodes recorded
    without autograd) that would carry a gradient from `wrt` without it (marks
    requires_grad on `graph`, blocked nodes not, as `grad_graph` does)."""
    if not blocked:
        return graph
    mark_requires_grad(graph, wrt)
    cut = {id(n) for n in graph.nodes if id(n) in blocked and n.requires_grad and
           not n.is_source}
    mark_requires_grad(graph, wrt, blocked)  # (as grad_graph leaves them: callers read)
    if not cut:
        return graph
    return graph.clone(lambda node, new: Node("detach", (new,), {}, tuple(node.shape),
                                              node.dtype) if id(node) in cut else None)


def _own_backward(node, copy):
    if is_loop(copy):
        return LoopGrad(copy.op, copy.inputs, copy.attrs, copy.shape, copy.dtype)
    if is_projection(copy) and isinstance(copy.inputs[0], LoopGrad):
        return LoopOutGrad(copy.op, copy.inputs, copy.attrs, copy.shape, copy.dtype)
    return None


class LoopOutGrad(Node, OwnBackward):
    """A loop's output: its gradient goes to the loop's slot `index`."""

    __slots__ = ()

    def route(self, e, g, value_of):
        return [(self.inputs[0], (self.attrs["index"], g))]


class LoopGrad(Node, SlotsBackward):
    """A loop node whose backward is a loop (`plan`, from `_prepare`)."""

    __slots__ = ("plan",)

    def route(self, e, g, value_of):
        return self.plan.backward(self, e, g)


def _floating(node) -> bool:
    return np.issubdtype(node.dtype, np.floating)


def _prepare(g: Graph, loop: LoopGrad) -> None:
    """Make `loop` run its step's forward (collecting the saved values, whose loop_out
    nodes are added to `g`) and give it the plan of its backward."""
    spec = loop.attrs["spec"]
    body = spec.body
    if any(is_loop(n) for n in body.nodes):
        raise LoopUnsupported("a nested loop")
    k, m = spec.n_carried, spec.n_invariant
    if not all(_floating(body.inputs[i]) for i in range(k)):
        raise LoopUnsupported("a carried value that is not a float")
    for s in spec.seqs:
        if abs(s.stride) != s.width:
            raise LoopUnsupported("a sequence whose steps overlap or leave gaps")
    wanted = list(range(k)) + [i for i in range(k, len(body.inputs))
                               if loop.inputs[i].requires_grad and _floating(body.inputs[i])]
    # (a copy: its nodes numbered in execution order, which grad_graph's node order
    # follows; reroll makes the nodes of mapped reads after the steps that use them)
    step = body.clone()
    joint = grad_graph(step, [step.inputs[i] for i in wanted])
    joint, _ = optimize(joint)
    n_out = len(body.outputs)
    split = partition(joint, n_out, n_out)
    fwd, bwd = split.forward, split.backward
    where = {id(n): i for i, n in enumerate(fwd.inputs)}
    saved = fwd.outputs[n_out:]
    kinds, extra, position = [], [], {}
    for s in saved:
        # (a view of a body input is made again in the backward, from the input)
        *chain, v = viewed(s)
        if id(v) not in where:
            chain, v = [], s
        i = where.get(id(v))
        if i is not None and i >= k:
            kinds.append(("input", i, chain))  # (an invariant, or a sequence's slice)
            continue
        if id(v) not in position:
            position[id(v)] = len(extra)
            extra.append(v)
        kinds.append(("step", position[id(v)], chain))
    collects = tuple(Collect(0) if len(s.shape) else Collect(-1) for s in extra)
    new_body = Graph(fwd.nodes, fwd.inputs, list(fwd.outputs[:n_out]) + extra)
    new_spec = LoopSpec(new_body, k, m, spec.seqs, spec.collects + collects, spec.trip,
                        spec.picks)
    loop.attrs = dict(loop.attrs, spec=new_spec)
    base = k + spec.n_collected
    for node in g.nodes:  # (the picked steps' outputs follow the collected ones)
        if isinstance(node, LoopOutGrad) and node.inputs[0] is loop and \
                node.attrs["index"] >= base:
            node.attrs = dict(node.attrs, index=node.attrs["index"] + len(extra))
    outs = []
    for j in range(len(extra)):
        shape, dtype = new_spec.output_types([i.shape for i in loop.inputs])[base + j]
        outs.append(LoopOutGrad("loop_out", (loop,), {"index": base + j}, shape, dtype))
    at = g.nodes.index(loop) + 1
    g.nodes[at:at] = outs
    loop.plan = _Plan(spec, new_spec, wanted, kinds, outs, extra, bwd, traced_trip(loop))


class _Plan:
    """How to build one loop's backward loop (see the module docstring)."""

    def __init__(self, spec, new_spec, wanted, kinds, saved_outs, extra, bwd, trip):
        self.spec, self.new_spec, self.wanted = spec, new_spec, wanted
        self.kinds, self.saved_outs, self.extra = kinds, saved_outs, extra
        self.bwd, self.trip = bwd, trip

    def backward(self, loop, e, slots):
        """(input, gradient) pairs of `loop`'s inputs, from its outputs' gradients
        (`slots`: output index -> gradient)."""
        spec, k, m = self.spec, self.spec.n_carried, self.spec.n_invariant
        body, n_seq0 = spec.body, k + m
        slots = self._with_picks(loop, e, dict(slots))
        b = _BodyBuilder()
        # carried: the carried values' gradients, then one sum per invariant wanted
        inv_wanted = [i for i in self.wanted if k <= i < n_seq0]
        seq_wanted = [i for i in self.wanted if i >= n_seq0]
        carried_in = [b.input(body.inputs[i]) for i in range(k)]
        sums_in = [b.input(loop.inputs[i]) for i in inv_wanted]
        inits = [slots[i] if slots.get(i) is not None else _zeros(e, body.inputs[i])
                 for i in range(k)]
        inits += [_zeros(e, loop.inputs[i]) for i in inv_wanted]
        # invariants the step's backward reads
        invariants, fed = [], {}
        for kind, i, _ in self.kinds:
            if kind == "input" and i < n_seq0 and i not in fed:
                fed[i] = b.input(body.inputs[i])
                invariants.append(loop.inputs[i])
        # sequences, read from the last step: saved values, the forward's slices, and
        # the gradients of the collected outputs
        bases, seqs, read, steps = [], [], [], {}
        for kind, i, chain in self.kinds:
            if kind == "step":
                if i not in steps:
                    out, step = self.saved_outs[i], self.extra[i]
                    collect = self.new_spec.collects[spec.n_collected + i]
                    steps[i] = b.step_input(step, collect)
                    bases.append(out)
                    seqs.append(_backwards_read(collect, step))
                value = steps[i]
            else:
                if i not in fed:
                    fed[i] = b.input(body.inputs[i])
                    bases.append(loop.inputs[i])
                    seqs.append(_mirrored(spec.seqs[i - n_seq0]))
                value = fed[i]
            read.append(b.replay(chain, value))
        seeds = list(carried_in)
        for c, (collect, y) in enumerate(zip(spec.collects, body.outputs[k:])):
            grad = slots.get(k + c)
            if grad is None:
                seeds.append(b.const_zeros(y))
                continue
            seeds.append(b.step_input(y, collect))
            bases.append(grad)
            seqs.append(_backwards_read(collect, y))
        if not seqs and spec.seqs:  # (the trip count comes from a sequence)
            b.input(body.inputs[n_seq0])
            bases.append(loop.inputs[n_seq0])
            seqs.append(_mirrored(spec.seqs[0]))
        grads = dict(zip(self.wanted, b.inline(self.bwd, read + seeds)))
        outputs = [grads[i] for i in range(k)]
        outputs += [b.add(s, grads[i]) for s, i in zip(sums_in, inv_wanted)]
        collects = []
        for i in seq_wanted:
            outputs.append(grads[i])
            collects.append(Collect(spec.seqs[i - n_seq0].dim,
                                    reverse=spec.seqs[i - n_seq0].stride > 0))
        n_carried = k + len(inv_wanted)
        spec_b = LoopSpec(b.graph(outputs), n_carried, len(invariants), seqs, collects,
                          self.trip)
        node = e("loop", *(inits + invariants + bases), spec=spec_b)
        types = spec_b.output_types([i.shape for i in node.inputs])
        result = [(loop.inputs[i], _out(node, i, types)) for i in range(k)]
        result += [(loop.inputs[i], _out(node, k + j, types))
                   for j, i in enumerate(inv_wanted)]
        for j, i in enumerate(seq_wanted):
            got = _out(node, n_carried + j, types)
            result.append((loop.inputs[i], _placed(e, got, spec.seqs[i - n_seq0],
                                                   loop.inputs[i])))
        return result


    def _with_picks(self, loop, e, slots):
        """`slots` with each picked step's gradient added into its collected output's,
        at that step's block (and the picks' own slots gone)."""
        spec, k = self.spec, self.spec.n_carried
        first = k + self.new_spec.n_collected
        types = self.new_spec.output_types([i.shape for i in loop.inputs])
        for p, pick in enumerate(spec.picks):
            grad = slots.pop(first + p, None)
            if grad is None:
                continue
            collect, c = spec.collects[pick.index], k + pick.index
            shape = types[c][0]
            dim = max(collect.dim, 0)
            width = 1 if collect.dim < 0 else grad.shape[dim]
            step = pick.at(self.trip)
            block = self.trip - 1 - step if collect.reverse else step
            if collect.dim < 0:
                grad = e("reshape", grad, shape=(1,) + tuple(grad.shape))
            index = tuple((block * width, (block + 1) * width, 1) if d == dim else (0, n, 1)
                          for d, n in enumerate(shape))
            placed = e("pad_slice", grad, shape=tuple(shape), index=index)
            slots[c] = placed if slots.get(c) is None else e("add", slots[c], placed)
        return slots


def _out(loop, index, types) -> Node:
    shape, dtype = types[index]
    return Node("loop_out", (loop,), {"index": index}, tuple(shape), dtype)


def _zeros(e, like):
    return e("expand", e.const(0, like=like), shape=tuple(like.shape))


def _backwards_read(collect, step):
    """How a backward loop reads, step by step from the last, the blocks of a value
    collected as `collect` from steps of `step`'s shape."""
    width = 1 if collect.dim < 0 else step.shape[collect.dim]
    dim = max(collect.dim, 0)
    if collect.reverse:
        return SeqIn(dim, width, width, 0, 0)
    return SeqIn(dim, width, -width, width, 0)


def _mirrored(seq: SeqIn) -> SeqIn:
    """`seq` read in the opposite order (the same slices, the last step's first)."""
    if seq.stride > 0:
        return SeqIn(seq.dim, seq.width, -seq.stride, seq.gap + seq.width, seq.anchor)
    return SeqIn(seq.dim, seq.width, -seq.stride, seq.gap, seq.anchor - seq.width)


def _placed(e, got, seq, base):
    """The gradient of a sequence's base from its slices' gradients `got` (one block per
    step, in position order): zeros where no step read."""
    if tuple(got.shape) == tuple(base.shape):
        return got
    d = seq.dim
    before = seq.anchor if seq.stride > 0 else seq.gap
    index = tuple((before, before + got.shape[d], 1) if i == d else (0, n, 1)
                  for i, n in enumerate(base.shape))
    return e("pad_slice", got, shape=tuple(base.shape), index=index)


class _BodyBuilder:
    """Builds a backward loop's body graph from copies of nodes."""

    def __init__(self):
        self.inputs, self.nodes = [], []

    def input(self, like) -> Node:
        node = Node("input", (), {}, tuple(like.shape), like.dtype)
        self.inputs.append(node)
        self.nodes.append(node)
        return node

    def step_input(self, step, collect) -> Node:
        """A body input reading one block of a value collected as `collect` from steps
        of `step`'s shape: the step's value."""
        if collect.dim >= 0:
            return self.input(step)
        node = Node("input", (), {}, (1,) + tuple(step.shape), step.dtype)
        self.inputs.append(node)
        self.nodes.append(node)
        return self._add(Node("reshape", (node,), {"shape": tuple(step.shape)},
                              tuple(step.shape), step.dtype))

    def replay(self, chain, value) -> Node:
        """`value` through copies of the movement ops `chain` (outermost first)."""
        for node in reversed(chain):
            value = self._add(Node(node.op, (value,), dict(node.attrs), tuple(node.shape),
                                   node.dtype))
        return value

    def const_zeros(self, like) -> Node:
        zero = self._add(Node("const", (), {"value": 0, "dtype": str(like.dtype)}, (),
                              like.dtype))
        return self._add(Node("expand", (zero,), {"shape": tuple(like.shape)},
                              tuple(like.shape), like.dtype))

    def add(self, a, b) -> Node:
        return self._add(Node("add", (a, b), {}, tuple(a.shape), a.dtype))

    def inline(self, graph, inputs) -> list:
        """Copies of `graph`'s nodes reading `inputs`; its outputs' copies."""
        mapping = {id(i): v for i, v in zip(graph.inputs, inputs)}
        for node in graph.nodes:
            if id(node) in mapping:
                continue
            mapping[id(node)] = self._add(Node(
                node.op, tuple(mapping[id(i)] for i in node.inputs), dict(node.attrs),
                tuple(node.shape), node.dtype))
        return [mapping[id(o)] for o in graph.outputs]

    def _add(self, node) -> Node:
        self.nodes.append(node)
        return node

    def graph(self, outputs) -> Graph:
        # (body inputs come first, in order: the nodes are in execution order)
        rest = [n for n in self.nodes if n.op != "input"]
        return Graph(list(self.inputs) + rest, list(self.inputs), list(outputs))
