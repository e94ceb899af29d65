"""Matrix products leave rerolled loops: one product over every step instead of one per step.

A rerolled RNN's loop multiplies a (batch, k) slice by a weight in every step. Those
products are small, so BLAS runs them far below its speed, and many of them need no
carried value at all. Like eager's fused LSTM (hybridnet.nn.fused_lstm), and XLA's
while-loop invariant code motion, three rewrites move them out of the loop node:

1. **Inputs** (`_hoist_inputs`): `a @ w`, `a` a sequence slice (x[t], or it reshaped to
   rows by its last dim) and `w` invariant, is one product of the whole sequence before
   the loop, sliced per step like `x`: the input projection of every RNN step.
2. **Collected outputs** (`_sink_collects`): a collected `a @ w` (w invariant, the value
   used nowhere else in the body) is `cat(a) @ w` after the loop: the input gradient of
   a backward loop.
3. **Accumulators** (`_sink_accumulators`): a carried `acc + a @ b` (acc read by nothing
   else, the sum read by nothing else) ends as `acc0 + cat(a, dim 1) @ cat(b, dim 0)`:
   the weight gradients of a backward loop, one product whose inner dimension runs over
   every step (`a` a transposed value is collected untransposed).

Products are matched on the `matmul` op of 2-D operands (their rows independent: the
rewrites are exact up to the order of float additions inside BLAS). Only top-level loops
are rewritten; their bodies are copied (a spec may be shared with another graph).
"""

import math

from .ir import Graph, Node
from .loop import Collect, LoopSpec, is_loop
from .passes.dce import DeadCodeElimination
from .registry import REGISTRY, Trait

PRODUCT = "matmul"  # (the op the rewrites build; they match OpDef facts, not names)


def hoist_products(g: Graph) -> int:
    """Rewrite every top-level loop of `g` (edited in place); the number of products
    moved out of loops."""
    moved = 0
    for loop in [n for n in g.nodes if is_loop(n)]:
        edit = _Edit(loop, [n for n in g.nodes if n.op == "loop_out" and n.inputs[0] is loop])
        count = edit.hoist_inputs() + edit.sink_collects() + edit.sink_accumulators()
        if count:
            edit.commit(g)
            moved += count
    if moved:
        DeadCodeElimination().run(g)
    return moved


def _node(op, inputs, attrs, shape, dtype) -> Node:
    return Node(op, tuple(inputs), attrs, tuple(shape), dtype)


def _reshape(x, shape) -> Node:
    shape = tuple(shape)
    return x if tuple(x.shape) == shape else _node("reshape", (x,), {"shape": shape}, shape,
                                                   x.dtype)


def _matmul(a, b) -> Node:
    return _node(PRODUCT, (a, b), {}, (a.shape[0], b.shape[1]), a.dtype)


def _transpose(x) -> Node:
    return _node("permute", (x,), {"dims": (1, 0)}, x.shape[::-1], x.dtype)


def _is_transpose(node) -> bool:
    swaps = REGISTRY[node.op].swaps_last_two
    return swaps is not None and len(node.shape) == 2 and swaps(node.attrs)


def _regrouped(node):
    """The operand of a reshape, else the node itself."""
    return node.inputs[0] if REGISTRY[node.op].regroups else node


def _is_product(node) -> bool:
    a, b = node.inputs if REGISTRY[node.op].product and len(node.inputs) == 2 else (None, None)
    return a is not None and len(a.shape) == 2 and len(b.shape) == 2 and \
        a.dtype == b.dtype == node.dtype and node.dtype.kind == "f"


class _Edit:
    """A loop node being rewritten: a copy of its body, its inputs and outputs by role,
    and the outer nodes to put before and after it."""

    def __init__(self, loop, projections):
        spec = loop.attrs["spec"]
        self.loop, self.spec, self.projections = loop, spec, projections
        nc, ni = spec.n_carried, spec.n_invariant
        body = spec.body.clone()
        self.body = body
        self.carried = list(zip(body.inputs[:nc], body.outputs[:nc], loop.inputs[:nc]))
        self.invariants = dict(zip(map(id, body.inputs[nc:nc + ni]), loop.inputs[nc:nc + ni]))
        self.inv_inputs = list(zip(body.inputs[nc:nc + ni], loop.inputs[nc:nc + ni]))
        self.seqs = list(zip(body.inputs[nc + ni:], spec.seqs, loop.inputs[nc + ni:]))
        self.collects = list(zip(body.outputs[nc:], spec.collects))
        self.before, self.after = [], []  # outer nodes to put before and after the loop
        self.removed = set()  # carried positions that left the loop
        # collected position -> ("product", w): a @ w of the value collected there; or
        # ("sum", carried j, transposed): j's final value from this and the next position
        self.sunk = {}
        self.users = None
        self._users()

    def _users(self):
        self.users = self.body.users()
        for o in self.body.outputs:
            self.users.setdefault(id(o), []).append(None)  # (an output use)

    def _outer(self, value):
        """An outer node for a body value computed from invariants alone (its pure
        computation copied before the loop), else None."""
        if id(value) in self.invariants:
            return self.invariants[id(value)]
        if value.is_source:  # (an input other than an invariant: carried, a sequence)
            if value.op == "input":
                return None
            copy = _node(value.op, (), dict(value.attrs), value.shape, value.dtype)
        elif is_loop(value) or not REGISTRY[value.op].has(Trait.PURE):
            return None
        else:
            ins = [self._outer(i) for i in value.inputs]
            if any(i is None for i in ins):
                return None
            copy = _node(value.op, ins, dict(value.attrs), value.shape, value.dtype)
        self.before.append(copy)
        self.invariants[id(value)] = copy
        return copy

    # -- 1. products of a sequence ------------------------------------------------------

    def hoist_inputs(self) -> int:
        count = 0
        for node in list(self.body.nodes):
            if not _is_product(node):
                continue
            found = self._sequence_rows(node.inputs[0])
            if found is None:
                continue
            w = self._outer(node.inputs[1])
            if w is None:
                continue
            seq_in, seq, base = found
            k, n = w.shape
            flat = _reshape(base, (math.prod(base.shape) // k, k))
            product = _matmul(flat, w)
            whole = _reshape(product, tuple(base.shape[:-1]) + (n,))
            self.before.extend(_fresh([flat, product, whole], [base] + self.before))
            step_in = Node("input", (), {}, tuple(seq_in.shape[:-1]) + (n,), node.dtype)
            self.seqs.append((step_in, seq, whole))
            rows = _reshape(step_in, node.shape)
            self._replace(node, [rows] if rows is not step_in else [], rows)
            count += 1
        return count

    def _sequence_rows(self, a):
        """(body input, SeqIn, base) when `a` is a sequence slice or it reshaped to rows
        by its last dim (so each row of `a` is a row of the base), else None."""
        src = _regrouped(a)
        for seq_in, seq, base in self.seqs:
            if src is seq_in and seq.dim != len(base.shape) - 1 and \
                    seq_in.shape[-1] == a.shape[-1] and base.dtype == a.dtype:
                return seq_in, seq, base
        return None

    def _replace(self, old, new_nodes, value):
        nodes = self.body.nodes
        at = nodes.index(old)
        self.body.nodes = nodes[:at] + list(new_nodes) + nodes[at + 1:]
        for n in self.body.nodes:
            if old in n.inputs:
                n.inputs = tuple(value if i is old else i for i in n.inputs)
        self.body.outputs = [value if o is old else o for o in self.body.outputs]
        self.carried = [(i, value if o is old else o, x) for i, o, x in self.carried]
        self.collects = [(value if o is old else o, c) for o, c in self.collects]
        self._users()

    # -- 2. collected products ----------------------------------------------------------

    def sink_collects(self) -> int:
        count = 0
        for pos, (out, collect) in enumerate(self.collects):
            product = _regrouped(out)
            if not _is_product(product) or self._uses(out) != 1 or \
                    self._uses(product) != 1 or collect.dim == len(out.shape) - 1 or \
                    out.shape[-1] != product.shape[-1]:
                continue
            w = self._outer(product.inputs[1])
            if w is None:
                continue
            a = product.inputs[0]
            regrouped = _reshape(a, tuple(out.shape[:-1]) + (a.shape[-1],))
            if regrouped is not a:  # (rows regrouped: a's rows regrouped alike)
                self.body.nodes.insert(self.body.nodes.index(out), regrouped)
                a = regrouped
            self.collects[pos] = (a, collect)
            self.sunk[pos] = ("product", w)
            self._users()
            count += 1
        return count

    def _uses(self, node) -> int:
        return len(self.users.get(id(node), ()))

    # -- 3. accumulated products --------------------------------------------------------

    def sink_accumulators(self) -> int:
        count = 0
        for j, (inp, out, _) in enumerate(self.carried):
            if j in self.removed or not REGISTRY[out.op].sums or self._uses(inp) != 1 or \
                    self._uses(out) != 1 or out.dtype != inp.dtype:
                continue
            a, b = out.inputs
            term = b if a is inp else a if b is inp else None
            if term is None or term is inp or not _is_product(term) or \
                    self._uses(term) != 1 or tuple(term.shape) != tuple(inp.shape):
                continue
            left, right = term.inputs
            # (in the order of a sequence read from its end, when an operand is one: the
            # collected copy of it is then its base, commit's _reused)
            rev = self._backwards(left.inputs[0] if _is_transpose(left) else left) or \
                self._backwards(right)
            lcol = (left.inputs[0], Collect(0, rev)) if _is_transpose(left) else \
                (left, Collect(1, rev))
            self.collects.append(lcol)
            self.collects.append((right, Collect(0, rev)))
            self.removed.add(j)
            self.sunk[len(self.collects) - 2] = ("sum", j, _is_transpose(left))
            self._users()
            count += 1
        return count

    def _backwards(self, node) -> bool:
        """Is `node` (or what it regroups) a sequence's slice read from its end?"""
        src = _regrouped(node)
        return any(src is seq_in and seq.stride < 0 for seq_in, seq, _ in self.seqs)

    def _reused(self, pos):
        """An outer value equal to the value collected at `pos`: the base of the
        sequence collected unchanged (or regrouped) in the order of its slices, else
        None."""
        out, collect = self.collects[pos]
        src = _regrouped(out)
        for seq_in, seq, base in self.seqs:
            if src is seq_in and seq.dim == 0 and collect.dim == 0 and \
                    abs(seq.stride) == seq.width and collect.reverse == (seq.stride < 0) and \
                    (seq.anchor, seq.gap) == ((0, 0) if seq.stride > 0 else (seq.width, 0)):
                return base
        return None

    # -- committing ---------------------------------------------------------------------

    def commit(self, g):
        """Build the new loop node and its projections; put them and the outer nodes in
        place of the old loop in `g`, and redirect the old projections' users."""
        kept = [c for j, c in enumerate(self.carried) if j not in self.removed]
        alias = {} if self.spec.picks else self._aliases()
        real = [pos for pos in range(len(self.collects)) if pos not in alias]
        used = self._used_invariants([self.collects[pos][0] for pos in real])
        inv = [(i, x) for i, x in self.inv_inputs if id(i) in used]
        inputs = [i for i, _, _ in kept] + [i for i, _ in inv] + [i for i, _, _ in self.seqs]
        outputs = [o for _, o, _ in kept] + [self.collects[pos][0] for pos in real]
        body = self.body
        nodes = [n for n in body.nodes if n.op != "input"]
        body = Graph.from_outputs(outputs)
        order = {id(n): i for i, n in enumerate(nodes)}
        body = Graph(inputs + sorted((n for n in body.nodes if n.op != "input"),
                                     key=lambda n: order[id(n)]), inputs, outputs)
        spec = LoopSpec(body, len(kept), len(inv), [s for _, s, _ in self.seqs],
                        [self.collects[pos][1] for pos in real], self.spec.trip,
                        self.spec.picks)
        outer_in = [x for _, _, x in kept] + [x for _, x in inv] + [b for _, _, b in self.seqs]
        loop = Node("loop", tuple(outer_in), {"spec": spec}, (), "bool")
        types = spec.output_types([i.shape for i in outer_in])
        outs = [_node("loop_out", (loop,), {"index": i}, s, d) for i, (s, d) in enumerate(types)]
        col = {pos: outs[len(kept) + r] for r, pos in enumerate(real)}
        for pos, (how, what) in sorted(alias.items()):
            col[pos] = col[what] if how == "dup" else self._regroup_after(
                what, self.collects[pos][0].shape)
        replace = self._replacements(outs, len(kept), col, len(real))
        _splice(g, self.loop, self.before + [loop] + outs + self.after, replace)

    def _aliases(self) -> dict:
        """Collected positions the loop need not write: pos -> ("dup", an earlier
        position collecting the same value alike) or ("seq", the outer value it equals,
        `_reused`)."""
        alias, seen = {}, {}
        for pos, (out, collect) in enumerate(self.collects):
            key = (id(out), collect)
            base = self._reused(pos)
            if key in seen:
                alias[pos] = ("dup", seen[key])
            elif base is not None:
                alias[pos] = ("seq", base)
            else:
                seen[key] = pos
        return alias

    def _used_invariants(self, collected) -> set:
        used = set()
        kept = [o for j, (_, o, _) in enumerate(self.carried) if j not in self.removed]
        for n in Graph.from_outputs(kept + list(collected)).nodes:
            used.add(id(n))
        return used

    def _replacements(self, outs, n_kept, col, n_col) -> dict:
        """id(old projection) -> its replacement (`col`: collected position -> the outer
        value of it; `n_col` collected outputs in the new loop); the sunk products'
        outer nodes are added to `self.after`."""
        spec, nc = self.spec, self.spec.n_carried
        n_col_old = len(spec.collects)
        kept = [j for j in range(nc) if j not in self.removed]
        value = {j: outs[k] for k, j in enumerate(kept)}
        for c in range(n_col_old):
            value[nc + c] = col[c]
        for p in range(len(spec.picks)):
            value[nc + n_col_old + p] = outs[n_kept + n_col + p]
        for pos, how in self.sunk.items():
            if how[0] == "product":
                value[nc + pos] = self._sunk_product(col[pos], how[1])
                for p, pick in enumerate(spec.picks):  # (one step of it: its product)
                    if pick.index == pos:
                        one = outs[n_kept + n_col + p]
                        value[nc + n_col_old + p] = self._sunk_product(one, how[1])
            else:
                _, j, transposed = how
                left = col[pos]
                left = self._add_after(_transpose(left)) if transposed else left
                right = col[pos + 1]
                init = self.carried[j][2]
                total = self._add_after(_matmul(left, right))
                value[j] = self._add_after(_node("add", (init, total), {}, init.shape,
                                                 init.dtype))
        return {id(n): value[n.attrs["index"]] for n in self.projections}

    def _sunk_product(self, col, w):
        rows = _reshape(col, (math.prod(col.shape) // w.shape[0], w.shape[0]))
        if rows is not col:
            self.after.append(rows)
        product = self._add_after(_matmul(rows, w))
        shape = tuple(col.shape[:-1]) + (w.shape[1],)
        whole = _reshape(product, shape)
        return whole if whole is product else self._add_after(whole)

    def _regroup_after(self, base, step_shape):
        """`base` in the shape of its steps' values collected along dim 0."""
        rest = tuple(step_shape[1:])
        whole = _reshape(base, (math.prod(base.shape) // max(math.prod(rest), 1),) + rest)
        return whole if whole is base else self._add_after(whole)

    def _add_after(self, node):
        self.after.append(node)
        return node


def _fresh(nodes, existing) -> list:
    """The nodes of `nodes` (in order, once each) that are not in `existing`."""
    seen = {id(n) for n in existing}
    out = []
    for n in nodes:
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    return out


def _splice(g, loop, new_nodes, replace):
    """Put `new_nodes` where `loop` and its projections were; redirect their users."""
    old = {id(loop)} | set(replace)
    at = g.nodes.index(loop)
    rest = [n for n in g.nodes[at + 1:] if id(n) not in old]
    for n in rest:
        n.inputs = tuple(replace.get(id(i), i) for i in n.inputs)
    g.nodes = g.nodes[:at] + new_nodes + rest
    g.outputs = [replace.get(id(o), o) for o in g.outputs]

