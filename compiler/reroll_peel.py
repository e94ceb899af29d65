"""A loop takes in the steps peeled off its front (compiler.reroll).

The first steps of a loop recorded from a backward pass often differ from the others
only because a carried value does not exist yet: the last forward step's state gets no
gradient from a later step, a gradient accumulator starts as its first contribution
instead of a sum. Rerolling leaves those steps unrolled in front of the loop ("peeled"),
and a long body peeled two or three times is most of a language model's machine code.

`absorb_front(g, loop)` tries k = 1, 2, 3 more steps: it instantiates the body for the
k steps before the loop's first, from zero carried values, simplifying with the algebra
of zeros the registry declares (`OpDef.zeros`: x * 0 and x @ 0 are 0, a movement or sum
of 0 is 0; `OpDef.identity`: x + 0 is x), and compares each instantiated value with the
graph's nodes by structure (op, attributes, type and operands, hash-consed). When the
k-th step's carried values are structurally the loop's initial values, the loop starts
from zeros instead and runs k more steps (its sequences start k steps earlier); values
the peeled steps gave to the rest of the graph are read from the loop's collected
outputs, and the peeled nodes die.

What changes: the loop computes 0 * x and 0 @ w where eager skipped the term. That
differs from eager only when x or w holds inf or NaN (then eager's result is itself
non-finite in practice), and in the sign of an exact zero, as JAX's scan, which
transposes with zero carries, does too.
"""

import numpy as np

from .ir import Node
from .loop import LoopSpec, SeqIn, is_loop
from .passes.cse import attr_key
from .registry import REGISTRY

MAX_PEEL = 3


class _Zero:
    """A symbolic zero of a type (no node: it must vanish by the zero algebra)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class _Keys:
    """Structural keys of nodes (hash-consed integers, computed on demand): equal keys,
    equal values."""

    def __init__(self):
        self.table, self.key_of = {}, {}

    def of(self, node) -> int:
        """The key of `node` (and of every input it reaches that has none yet)."""
        stack = [node]
        while stack:
            top = stack[-1]
            if id(top) in self.key_of:
                stack.pop()
                continue
            missing = [i for i in top.inputs if id(i) not in self.key_of]
            if missing and top.op != "input" and not is_loop(top):
                stack.extend(missing)
                continue
            stack.pop()
            self.add(top)
        return self.key_of[id(node)]

    def add(self, node) -> int:
        """Key `node`, whose inputs have keys."""
        if node.op == "input" or is_loop(node):
            sig = ("node", id(node))
        elif node.op == "const":
            sig = ("const", attr_key(node.attrs.get("value")), tuple(node.shape),
                   node.dtype.str)
        else:
            sig = (node.op, tuple(sorted((k, attr_key(v)) for k, v in node.attrs.items())),
                   tuple(node.shape), node.dtype.str,
                   tuple(self.key_of[id(i)] for i in node.inputs))
        key = self.table.setdefault(sig, len(self.table))
        self.key_of[id(node)] = key
        return key


def absorb_front(g, loop) -> bool:
    """Take the steps peeled off `loop`'s front into it (see the module docstring); True
    when it did (g is then edited; DCE removes the peeled nodes)."""
    spec = loop.attrs["spec"]
    nc, ni = spec.n_carried, spec.n_invariant
    inits, bases = loop.inputs[:nc], loop.inputs[nc + ni:]
    if not nc or not spec.seqs or spec.picks or any(i.dtype.kind != "f" for i in inits):
        return False
    keys = _Keys()
    want = [keys.of(i) for i in inits]
    for k in range(1, MAX_PEEL + 1):
        reads = [_Reads(s, b, k) for s, b in zip(spec.seqs, bases)]
        if any(r.seq is None for r in reads):
            return False
        steps = _instantiate(spec, loop, reads, k, keys)
        if steps is None:
            continue
        if all(_is(v, init, w, keys) for v, init, w in zip(steps[-1][:nc], inits, want)):
            return _rewrite(g, loop, reads, steps, keys)
    return False


def _is(value, init, key, keys) -> bool:
    """Is the instantiated `value` the loop's initial value `init` (key `key`)?"""
    if isinstance(value, _Zero):
        return init.op == "const" and not np.any(np.asarray(init.attrs["value"]))
    return keys.of(value) == key


class _Reads:
    """How a sequence is read once the loop starts k steps earlier. Steps before the
    base's first window (or after its last, read backwards) read zeros: a backward
    loop's body reads the step after its own (t + 1), which the last step lacks; the
    base then gets zero windows `pad` long joined on (`front` or at the end), and `seq`
    is the sequence over the padded base (None when a step would straddle its edge)."""

    def __init__(self, seq, base, k):
        self.base, self.k, self.size = base, k, base.shape[seq.dim]
        first = seq.start(self.size, 0)
        starts = [first + (j - k) * seq.stride for j in range(k + 1)]
        self.outside = [s + seq.width <= 0 or s >= self.size for s in starts[:k]]
        inside = [0 <= s and s + seq.width <= self.size for s in starts[:k]]
        self.seq, self.pad, self.front = None, 0, seq.stride > 0
        if not all(o or i for o, i in zip(self.outside, inside)):
            return
        if seq.stride > 0:
            self.pad = max(0, -starts[0])
            anchor = starts[0] + self.pad
        else:
            self.pad = max(0, starts[0] + seq.width - self.size)
            anchor = self.size + self.pad - starts[0]
        self.seq = SeqIn(seq.dim, seq.width, seq.stride, anchor, seq.gap)
        self.starts, self.old = starts, seq

    def read(self, j):
        """Step j's window: a slice of the base, or a zero outside it."""
        seq = self.old
        shape = tuple(seq.width if d == seq.dim else s for d, s in enumerate(self.base.shape))
        if self.outside[j]:
            return _Zero(shape, self.base.dtype)
        start = self.starts[j]
        index = tuple((start, start + seq.width, 1) if d == seq.dim else (0, s, 1)
                      for d, s in enumerate(self.base.shape))
        return Node("slice", (self.base,), {"index": index}, shape, self.base.dtype)

    def padded(self) -> list:
        """The new nodes of the base the new loop reads, ending with that base (`base`
        joined with zero windows), or just `[base]`."""
        if not self.pad:
            return [self.base]
        dim = self.old.dim
        shape = tuple(self.pad if d == dim else s for d, s in enumerate(self.base.shape))
        zeros = _zeros_const(_Zero(shape, self.base.dtype))
        parts = (zeros, self.base) if self.front else (self.base, zeros)
        out = tuple(self.size + self.pad if d == dim else s
                    for d, s in enumerate(self.base.shape))
        return [zeros, Node("cat", parts, {"dim": dim}, out, self.base.dtype)]


def _instantiate(spec, loop, reads, k, keys):
    """Per new step (earliest first): the body's outputs (nodes or _Zero), or None when
    a zero reaches an op whose zero algebra is unknown."""
    nc, ni = spec.n_carried, spec.n_invariant
    body = getattr(spec, "raw_body", None) or spec.body  # (as recorded, like the peeled)
    invariants = loop.inputs[nc:nc + ni]
    carried = [_Zero(i.shape, i.dtype) for i in loop.inputs[:nc]]
    steps = []
    for j in range(k):
        env = {}
        for b_in, value in zip(body.inputs, carried + list(invariants)):
            env[id(b_in)] = value
        for b_in, r in zip(body.inputs[nc + ni:], reads):
            window = r.read(j)
            env[id(b_in)] = window if isinstance(window, _Zero) else _add(keys, window)
        for node in body.nodes:
            if id(node) in env:
                continue
            value = _apply(node, [env[id(i)] for i in node.inputs], keys)
            if value is None:
                return None
            env[id(node)] = value
        outs = [env[id(o)] for o in body.outputs]
        steps.append(outs)
        carried = outs[:nc]
    return steps


def _add(keys, node):
    keys.of(node)
    return node


def _apply(node, ins, keys):
    """The body node `node` on instantiated operands `ins`."""
    zeros = [isinstance(v, _Zero) for v in ins]
    if any(zeros):
        return _on_zeros(node, ins, zeros)
    if node.op == "const":
        return _add(keys, node)
    new = Node(node.op, tuple(ins), dict(node.attrs), tuple(node.shape), node.dtype)
    return _add(keys, new)


def _on_zeros(node, ins, zeros):
    opdef = REGISTRY[node.op]
    zero = _Zero(node.shape, node.dtype)
    rule = opdef.zeros
    if rule == "any" or (rule == "first" and zeros[0] and not any(zeros[1:])) or \
            (rule == "all" and all(zeros)):
        return zero
    if opdef.identity is not None and len(ins) == 2 and zeros == [False, True] and \
            float(opdef.identity) == 0 and _same_type(ins[0], node):
        return ins[0]  # x + 0, x - 0
    if opdef.sums and zeros == [True, False] and _same_type(ins[1], node):
        return ins[1]  # 0 + x
    return None


def _same_type(value, node) -> bool:
    return tuple(value.shape) == tuple(node.shape) and value.dtype == node.dtype


# ---- rewriting ---------------------------------------------------------------------------


def _rewrite(g, loop, reads, steps, keys) -> bool:
    spec = loop.attrs["spec"]
    nc, ni, k = spec.n_carried, spec.n_invariant, len(steps)
    zeros = [_zeros_const(i) for i in loop.inputs[:nc]]
    padded = [r.padded() for r in reads]
    bases = [p[-1] for p in padded]
    new_spec = LoopSpec(spec.body, nc, ni, [r.seq for r in reads], spec.collects,
                        spec.trip + k, spec.picks)
    new_loop = Node("loop", tuple(zeros) + loop.inputs[nc:nc + ni] + tuple(bases),
                    {"spec": new_spec}, (), "bool")
    types = new_spec.output_types([i.shape for i in new_loop.inputs])
    outs = [Node("loop_out", (new_loop,), {"index": i}, shape, dtype)
            for i, (shape, dtype) in enumerate(types)]
    added = zeros + [n for p in padded if len(p) > 1 for n in p] + [new_loop] + outs
    replace = {}
    trip = new_spec.trip_of([b.shape for b in new_loop.inputs[nc + ni:]])
    old_outs = [n for n in g.nodes if n.op == "loop_out" and n.inputs[0] is loop]
    for old in old_outs:
        i = old.attrs["index"]
        if i < nc or i >= nc + spec.n_collected:
            replace[id(old)] = outs[i]
            continue
        collect = spec.collects[i - nc]
        piece = _blocks(outs[i], collect, 0 if collect.reverse else k, trip - k, trip)
        added.append(piece)
        replace[id(old)] = piece
    by_key = {}
    for node in _peeled(g, loop):
        by_key.setdefault(keys.of(node), node)
    for j, step in enumerate(steps):
        for c, value in enumerate(step[nc:nc + spec.n_collected]):
            existing = None if isinstance(value, _Zero) else by_key.get(keys.of(value))
            if existing is None or existing.op in ("input", "const") or existing is value:
                continue
            collect = spec.collects[c]
            b = trip - 1 - j if collect.reverse else j
            piece = _blocks(outs[nc + c], collect, b, 1, trip, tuple(existing.shape))
            added.append(piece)
            replace[id(existing)] = piece
    return _commit(g, loop, added, replace)


def _peeled(g, loop) -> list:
    """The nodes the loop's initial values come from that its other inputs do not, and
    their users two levels down (where a peeled step's other values are)."""
    nc = loop.attrs["spec"].n_carried
    before = _ancestors(loop.inputs[nc:])
    region = [n for n in _ancestors(loop.inputs[:nc]).values() if id(n) not in before]
    users = g.users()
    found = {id(n): n for n in region}
    for _ in range(2):
        for n in list(found.values()):
            for u in users.get(id(n), ()):
                if u is not loop and not is_loop(u):
                    found.setdefault(id(u), u)
    return list(found.values())


def _ancestors(nodes) -> dict:
    seen, stack = {}, list(nodes)
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen[id(n)] = n
            stack.extend(n.inputs)
    return seen


def _blocks(out, collect, first, count, trip, shape=None) -> Node:
    """Blocks [first, first + count) of a collected output (a step's own shape when
    `shape`, for a single block)."""
    dim = 0 if collect.dim < 0 else collect.dim
    w = out.shape[dim] // trip
    index = tuple((first * w, (first + count) * w, 1) if d == dim else (0, s, 1)
                  for d, s in enumerate(out.shape))
    sliced = tuple((first + count) * w - first * w if d == dim else s
                   for d, s in enumerate(out.shape))
    node = Node("slice", (out,), {"index": index}, sliced, out.dtype)
    if shape is not None and tuple(shape) != sliced:
        return Node("reshape", (node,), {"shape": tuple(shape)}, tuple(shape), out.dtype)
    return node


def _zeros_const(like) -> Node:
    value = np.full(like.shape, -0.0, dtype=like.dtype)  # (x + -0.0 is x, as in IEEE)
    return Node("const", (), {"value": value, "dtype": str(like.dtype)}, tuple(like.shape),
                like.dtype)


def _commit(g, loop, added, replace) -> bool:
    """Put the new nodes where the old loop was, redirect uses, and keep the graph in
    execution order, each loop's projections right after it, as lowering expects (False,
    with g as it was, when the redirections would make a cycle)."""
    at = g.nodes.index(loop)
    kept = [n for n in g.nodes if id(n) not in replace]
    at = sum(1 for n in g.nodes[:at] if id(n) not in replace)
    nodes = kept[:at] + added + kept[at + 1:]
    saved = {id(n): n.inputs for n in nodes}
    for n in nodes:
        n.inputs = tuple(_final(replace, i) for i in n.inputs)
    order = nodes if _in_order(nodes) else _topological(nodes)
    if order is None:
        for n in nodes:
            n.inputs = saved[id(n)]
        return False
    g.nodes = _projections_after_loops(order)
    g.outputs = [_final(replace, o) for o in g.outputs]
    return True


def _in_order(nodes) -> bool:
    seen = set()
    for n in nodes:
        if any(id(i) not in seen for i in n.inputs):
            return False
        seen.add(id(n))
    return True


def _projections_after_loops(order) -> list:
    """`order` with every loop_out moved to right after its loop (valid: it reads only
    the loop)."""
    outs = {}
    for n in order:
        if n.op == "loop_out":
            outs.setdefault(id(n.inputs[0]), []).append(n)
    result = []
    for n in order:
        if n.op == "loop_out":
            continue
        result.append(n)
        result.extend(sorted(outs.get(id(n), ()), key=lambda o: o.attrs["index"]))
    return result


def _final(replace, node):
    seen = 0
    while id(node) in replace and seen < 64:
        node, seen = replace[id(node)], seen + 1
    return node


def _topological(nodes):
    """`nodes` in an order where each follows its inputs (the given order where it can),
    or None on a cycle."""
    index = {id(n): i for i, n in enumerate(nodes)}
    state, order = {}, []
    for root in nodes:
        if id(root) in state:
            continue
        stack = [(root, 0)]
        while stack:
            node, pos = stack.pop()
            if pos == 0:
                if state.get(id(node)) == 2:
                    continue
                state[id(node)] = 1
            ins = [i for i in node.inputs if id(i) in index]
            if pos < len(ins):
                stack.append((node, pos + 1))
                nxt = ins[pos]
                if state.get(id(nxt)) == 1:
                    return None
                if state.get(id(nxt)) != 2:
                    stack.append((nxt, 0))
                continue
            state[id(node)] = 2
            order.append(node)
    return order
