"""Loop rerolling: a region recorded several times in a row becomes one `loop` node.

Tracing a Python loop records its body once per step. `reroll(graph)` finds the
longest run of nodes that repeats with some period (the same ops, attributes and
types, step after step), checks its dataflow, and replaces it by a loop node
(`compiler.loop`) whose body graph is one step. Each input of a step's node is then
one of:

- internal: a node of the same step;
- carried: a node of the previous step (the first step reads an initial value);
- invariant: the same value outside the region at every step (weights);
- a sequence: a slice of one outside value whose start moves by a fixed stride from
  step to step (`x[t]`, `x[:, t:t+1]`, or a value an earlier loop collected, read
  back in reverse by a backward loop), or single-input maps of such a slice made
  before the steps (a backward's per-step gradient slices, reshaped: the step maps it).

Values of a step used after the region are collected: the loop writes step k's value
into block k of one output, laid out as the `cat` that used them builds it (a cat of
a run of them, `stack([h0] + hs[:-1])`, reads the slice that holds it); other uses read
their block back with a `slice`. Anything else (a step reading the step before
last, a per-step constant) leaves the region unrolled: rerolling never changes what
the graph computes, only how it is laid out. Invariant pure values (a weight's
transpose) are hoisted out of the steps first, so every step looks alike.
"""

from collections import Counter

from .ir import Graph, Node
from .loop import LoopSpec, SeqIn
from .passes.dce import DeadCodeElimination
from .passes.manager import optimize
from .registry import REGISTRY, Trait
from .reroll_edits import (
    ATTR_KEYS,
    block_of,
    cached_attrs_key,
    gather_scatters,
    hoist_invariants,
    is_slice,
    layouts_of,
    merge_copies,
    moving_dim,
    pick_single_steps,
    replace_cats,
)
from .reroll_peel import absorb_front

MIN_TRIPS = 3  # fewer repetitions stay unrolled
MIN_NODES = 8  # nor are regions of fewer nodes rerolled
MIN_WORK = 4  # nor steps of fewer nodes (slices aside): a loop costs a call per step
MAX_PERIODS = 8  # candidate periods tried per region search
MAX_LOOPS = 8  # loops made per graph
MAX_MAPS = 4  # maps applied to a sequence's read before the steps (see _mapped_read)


def reroll(graph: Graph) -> tuple:
    """A copy of `graph` with its repeated regions as loop nodes; returns (graph, loops),
    `loops` the number of loop nodes made (0: the copy computes as `graph` does)."""
    outermost = not _OUTER[0]
    _OUTER[0] = True
    try:
        return _reroll(graph)
    finally:
        if outermost:  # (nested bodies reroll inside: the keys live until the end)
            ATTR_KEYS.clear()
            _SIGNATURES.clear()
            _INTERNED.clear()
            _OUTER[0] = False


def _reroll(graph: Graph) -> tuple:
    g = graph.clone()
    merge_copies(g)
    g, _ = DeadCodeElimination().run(g)
    hoist_invariants(g)
    gather_scatters(g)
    made = 0
    while made < MAX_LOOPS:
        region = _find_region(g)
        if region is None:
            break
        loop = _rewrite(g, region)
        if absorb_front(g, loop):
            DeadCodeElimination().run(g)
        loop.attrs["spec"].raw_body = None  # (only absorb_front reads it)
        made += 1
    if made:
        pick_single_steps(g)
    return g, made


def has_loops(graph: Graph) -> bool:
    """True when `graph` holds a loop node."""
    return any(REGISTRY[n.op].has(Trait.CONTROL) for n in graph.nodes)


# ---- finding a region -------------------------------------------------------------------


def _signature(node) -> int:
    """What two steps' copies of a node share: op, attributes (a slice's starts aside),
    type, and its operands' types, as a number (kept per node while a reroll runs: a
    rewrite keeps every operand's type)."""
    hit = _SIGNATURES.get(id(node))
    if hit is None or hit[0] is not node:
        sig = _signature_of(node)
        hit = _SIGNATURES[id(node)] = (node, _INTERNED.setdefault(sig, len(_INTERNED)))
    return hit[1]


def _signature_of(node) -> tuple:
    if is_slice(node):
        attrs = tuple((b - a, c) for a, b, c in node.attrs["index"])
    else:
        attrs = cached_attrs_key(node)
    ins = tuple((tuple(i.shape), i.dtype.str) for i in node.inputs)
    return (node.op, attrs, tuple(node.shape), node.dtype.str, ins)


def _candidates(ids) -> list:
    """(coverage, start, period, length) of periodic runs, best first: positions
    start .. start + length - 1 repeat with the period."""
    where = {}
    for i, s in enumerate(ids):
        where.setdefault(s, []).append(i)
    gaps = Counter()
    for positions in where.values():
        gaps.update(b - a for a, b in zip(positions, positions[1:]))
    periods = [p for p, c in gaps.most_common(MAX_PERIODS) if c >= MIN_TRIPS - 1]
    found, n = [], len(ids)
    for p in periods:
        i = 0
        while i < n - p:
            if ids[i] != ids[i + p]:
                i += 1
                continue
            j = i
            while j < n - p and ids[j] == ids[j + p]:
                j += 1
            length = j - i + p
            if length // p >= MIN_TRIPS and length >= MIN_NODES:
                found.append(((length // p) * p, i, p, length))
            i = j
    found.sort(key=lambda c: (-c[0], c[2]))
    return found


def _rotations(seq, start, p, length) -> list:
    """Where in the run a step may begin: offsets whose step boundary the fewest values
    cross (the fewest carried values), measured on two steps mid-run, and offsets just
    before a slice (a step's read of its sequence)."""
    s0 = start + max(0, (length // p) // 2 - 1) * p
    window = seq[s0:min(s0 + 2 * p, start + length)]
    pos = {id(n): i for i, n in enumerate(window, s0)}
    last = {}
    for b, node in enumerate(window, s0):
        for inp in node.inputs:
            a = pos.get(id(inp))
            if a is not None and b - a <= p:
                last[a] = max(last.get(a, b), b)
    diff = [0] * (p + 1)
    for a, b in last.items():
        lo, hi = max(0, a - s0 - p + 1), min(p, b - s0 - p + 1)
        if lo < hi:
            diff[lo] += 1
            diff[hi] -= 1
    counts, running = [], 0
    for r in range(p):
        running += diff[r]
        counts.append(running)
    low = min(counts)
    best = [r for r in range(p) if counts[r] == low][:2]
    heads = [r for r in range(p) if s0 + p + r < len(seq) and is_slice(seq[s0 + p + r])]
    return list(dict.fromkeys(best + heads[:4]))


class _Region:
    """A validated region: `steps[k][j]` is node j of step k."""

    def __init__(self, steps):
        self.steps = steps
        self.period, self.trips = len(steps[0]), len(steps)
        self.carried = []  # (j of the value carried, its initial node)
        self.slots = {}  # (j, q) -> ("in", j2) | ("carry", c) | ("inv", node) | ("seq", s)
        self.seq_nodes = {}  # j -> sequence index (a slice node of the step itself)
        self.seqs = []  # (base node, SeqIn)


# Steps dropped at the front and at the back of a periodic run, fewest first.
_TRIMS = sorted(((f, b) for f in range(4) for b in range(4)), key=lambda t: (sum(t), t))


def _find_region(g: Graph):
    """The best region to reroll: of the longest periodic run that has one, the step
    rotation and trim that leave the most nodes in the loop (then the fewest carried)."""
    seq = [n for n in g.nodes if not n.is_source]
    ids = [_signature(n) for n in seq]
    for _, start, p, length in _candidates(ids)[:MAX_PERIODS * 2]:
        best = None
        for r in _rotations(seq, start, p, length):
            for front, back in _TRIMS:  # (the first and last steps often differ a little)
                s, k = start + r + front * p, (length - r) // p - front - back
                if k < MIN_TRIPS or (best is not None and k * p < best[0]):
                    continue
                region = _validate([seq[s + i * p: s + (i + 1) * p] for i in range(k)])
                if region is not None:
                    score = (k * p, -len(region.carried))
                    if best is None or score > best[:2]:
                        best = score + (region,)
                    break
        if best is not None:
            _lift(g, best[2])
            return best[2]
    return None


def _progression(nodes):
    """(base, SeqIn) when `nodes` (one per step) are slices of one base whose start moves
    by a fixed stride along one dim; else None."""
    if not all(is_slice(n) for n in nodes) or any(n.inputs[0] is not nodes[0].inputs[0]
                                                   for n in nodes):
        return None
    base = nodes[0].inputs[0]
    index = [n.attrs["index"] for n in nodes]
    d = moving_dim(index)
    if d is None:
        return None
    starts = [ix[d][0] for ix in index]
    stride = starts[1] - starts[0]
    if stride == 0 or any(b - a != stride for a, b in zip(starts, starts[1:])):
        return None
    width, size = index[0][d][1] - starts[0], base.shape[d]
    if stride > 0:
        seq = SeqIn(d, width, stride, starts[0], size - (starts[-1] + width))
    else:
        seq = SeqIn(d, width, stride, size - starts[0], starts[-1])
    return base, seq


def _rest(node, seq):
    """The index a step's slice (`node`) applies to its sequence's step slice besides the
    moving dim (x[t, B:] restricts dim 1 too), or None when it takes the whole of them."""
    index = tuple((0, seq.width, 1) if e == seq.dim else bounds
                  for e, bounds in enumerate(node.attrs["index"]))
    whole = all(bounds == (0, s, 1) for e, (bounds, s) in
                enumerate(zip(index, node.inputs[0].shape)) if e != seq.dim)
    return None if whole else index


def _validate(steps):
    """The region if its dataflow reroll as a loop (see the module docstring), else None."""
    r = _Region(steps)
    pos = {id(n): (k, j) for k, step in enumerate(steps) for j, n in enumerate(step)}
    for j in range(r.period):
        column = [step[j] for step in steps]
        if is_slice(column[0]) and len({repr(n.attrs["index"]) for n in column}) > 1:
            found = _progression(column)
            if found is None or id(found[0]) in pos:
                return None
            r.seq_nodes[j] = (_add_seq(r, found), _rest(column[0], found[1]))
            continue
        if any(not _same_attrs(n, column[0]) for n in column[1:]):
            return None
        for q in range(len(column[0].inputs)):
            slot = _classify(r, pos, [n.inputs[q] for n in column])
            if slot is None:
                return None
            r.slots[(j, q)] = slot
    work = r.period - len(r.seq_nodes)  # (a run of slices alone is no loop)
    if work < MIN_WORK or work * r.trips < MIN_NODES:
        return None
    for j2, init in r.carried:
        out = steps[0][j2]
        if tuple(init.shape) != tuple(out.shape) or init.dtype != out.dtype:
            return None
    return r


def _lift(g, r) -> None:
    """Take into the steps the per-step maps applied after the region (`hn.stack`'s
    unsqueeze of each step's output): a node used once outside by each step's copy of a
    value, the same op on each, otherwise reading sources only."""
    users = g.users()
    members = {id(n) for step in r.steps for n in step}
    j = 0
    while j < len(r.steps[0]):
        column = [step[j] for step in r.steps]
        us = _map_users(users, members, column)
        if us is not None and len({id(u) for u in us}) == len(us) and _maps(us, column):
            q = us[0].inputs.index(column[0])
            for k, u in enumerate(us):
                r.steps[k].append(u)
                members.add(id(u))
            new = len(r.steps[0]) - 1
            for p, inp in enumerate(us[0].inputs):
                r.slots[(new, p)] = ("in", j) if p == q else ("inv", inp)
        j += 1


def _map_users(users, members, column):
    """Per step, its one outside user of the signature step 0's first outside user has
    (a value may have other outside users too: the backward reading it), or None."""
    outs = [[u for u in users.get(id(n), ()) if id(u) not in members] for n in column]
    if not all(outs):
        return None
    sig = _signature(outs[0][0])
    chosen = []
    for o in outs:
        alike = [u for u in o if _signature(u) == sig]
        if len(alike) != 1:
            return None
        chosen.append(alike[0])
    return chosen


def _maps(us, column) -> bool:
    first = us[0]
    if column[0] not in first.inputs or first.inputs.count(column[0]) != 1:
        return False
    q = first.inputs.index(column[0])
    sig = _signature(first)
    for u, n in zip(us, column):
        if _signature(u) != sig or not _same_attrs(u, first) or u.inputs[q] is not n:
            return False
        if any(p != q and (not i.is_source or i is not first.inputs[p])
               for p, i in enumerate(u.inputs)):
            return False
    return True


def _same_attrs(a, b) -> bool:
    return a is b or cached_attrs_key(a) == cached_attrs_key(b)


_SIGNATURES = {}  # id(node) -> (node, its _signature), as reroll_edits.ATTR_KEYS
_INTERNED = {}  # signature -> its number
_OUTER = [False]  # (inside a reroll call)


def _add_seq(r, found) -> int:
    for i, (base, seq) in enumerate(r.seqs):
        if base is found[0] and seq == found[1]:
            return i
    r.seqs.append(found)
    return len(r.seqs) - 1


def _classify(r, pos, column):
    """The slot kind of one operand position across the steps (None: no loop)."""
    where = [pos.get(id(v)) for v in column]
    if all(w is not None and w[0] == k for k, w in enumerate(where)):
        if len({w[1] for w in where}) == 1:
            return ("in", where[0][1])
        return None
    if where[0] is None and all(w is not None and w[0] == k - 1
                                for k, w in enumerate(where) if k):
        j2s = {w[1] for w in where[1:]}
        if len(j2s) != 1:
            return None
        key = (j2s.pop(), column[0])
        for c, (j2, init) in enumerate(r.carried):
            if j2 == key[0] and init is key[1]:
                return ("carry", c)
        r.carried.append(key)
        return ("carry", len(r.carried) - 1)
    if any(w is not None for w in where):
        return None
    if all(v is column[0] for v in column):
        return ("inv", column[0])
    found = _progression(column)
    if found is None:
        return _mapped_read(r, column)
    if _rest(column[0], found[1]) is not None:
        return None
    return ("seq", _add_seq(r, found))


def _mapped_read(r, column):
    """A step's read of its sequence made before the steps (a backward's per-step
    gradient slices, reshaped, all made at once by cat's vjp): per step, a chain of
    single-input pure maps (the same ops and attributes) applied to a slice of a
    sequence. The step then reads the sequence and applies the maps itself."""
    maps = []
    while all(not n.is_source and len(n.inputs) == 1 and not is_slice(n) and
              REGISTRY[n.op].has(Trait.PURE) and  # (a signature holds the attributes)
              _signature(n) == _signature(column[0]) for n in column):
        maps.append(column[0])
        column = [n.inputs[0] for n in column]
        if len(maps) > MAX_MAPS:
            return None
    found = _progression(column) if maps else None
    if found is None or _rest(column[0], found[1]) is not None:
        return None
    return ("mapped", (_add_seq(r, found), tuple(maps[::-1])))


# ---- rewriting ----------------------------------------------------------------------------


def _rewrite(g: Graph, r: _Region) -> Node:
    steps, trips = r.steps, r.trips
    members = {id(n) for step in steps for n in step}
    users = g.users()
    outputs = {id(o) for o in g.outputs}
    # values used after the region: (k, j) -> node
    outside = set()
    for k, step in enumerate(steps):
        for j, n in enumerate(step):
            if id(n) in outputs or any(id(u) not in members for u in users.get(id(n), ())):
                outside.add((k, j))
    finals = {j2: c for c, (j2, _) in enumerate(r.carried)}
    collected = sorted({j for k, j in outside if not (k == trips - 1 and j in finals)})
    layouts = layouts_of(g, steps, collected, members)
    body, invariants, raw = _body(r, collected)
    spec = LoopSpec(body, len(r.carried), len(invariants), [s for _, s in r.seqs],
                    [layouts[j] for j in collected], trips)
    spec.raw_body = raw  # (one step as recorded, before passes: compiler.reroll_peel)
    inputs = tuple([init for _, init in r.carried] + invariants + [b for b, _ in r.seqs])
    loop = Node("loop", inputs, {"spec": spec}, (), "bool")
    types = spec.output_types([i.shape for i in inputs])
    outs = [Node("loop_out", (loop,), {"index": i}, shape, dtype)
            for i, (shape, dtype) in enumerate(types)]
    new_nodes = [loop] + outs
    replace = {}
    for k, j in outside:
        if k == trips - 1 and j in finals:
            replace[id(steps[k][j])] = outs[finals[j]]
    column_of = {j: outs[len(r.carried) + i] for i, j in enumerate(collected)}
    joined = []  # (after the steps' blocks, which may become projections: pick_single_steps)
    whole = replace_cats(g, steps, column_of, layouts, members, joined)
    for k, j in sorted(outside):
        n = steps[k][j]
        if id(n) in replace:
            continue
        block = block_of(column_of[j], layouts[j], k, trips, n)
        new_nodes.extend(block)
        replace[id(n)] = block[-1]
    new_nodes += joined
    first = next(i for i, n in enumerate(g.nodes) if id(n) in members)
    rest = []
    for n in g.nodes[first:]:
        if id(n) in members:
            continue
        if id(n) in whole:
            replace[id(n)] = whole[id(n)]
            continue
        n.inputs = tuple(replace.get(id(i), i) for i in n.inputs)
        rest.append(n)
    g.nodes = [n for n in g.nodes[:first] if id(n) not in members] + new_nodes + rest
    g.outputs = [replace.get(id(o), o) for o in g.outputs]
    DeadCodeElimination().run(g)
    return loop


def _body(r, collected) -> tuple:
    """The body graph (one step, from step 0's nodes) and the loop's invariant inputs."""
    step = r.steps[0]
    carried = [Node("input", (), {}, tuple(init.shape), init.dtype) for _, init in r.carried]
    invariants, inv_nodes = [], {}
    seqs = [Node("input", (), {}, _step_shape(b, s), b.dtype) for b, s in r.seqs]
    consts = {}
    clones, reads = [], []  # (reads: the maps of "mapped" slots, before every clone)
    for j, n in enumerate(step):
        if j in r.seq_nodes:
            which, rest = r.seq_nodes[j]
            clones.append(seqs[which] if rest is None else Node(
                "slice", (seqs[which],), {"index": rest}, tuple(n.shape), n.dtype))
            continue
        ins = []
        for q, _ in enumerate(n.inputs):
            kind, what = r.slots[(j, q)]
            if kind == "in":
                ins.append(clones[what])
            elif kind == "carry":
                ins.append(carried[what])
            elif kind == "seq":
                ins.append(seqs[what])
            elif kind == "mapped":
                ins.append(_apply_maps(seqs[what[0]], what[1], reads))
            elif what.op == "const":
                ins.append(consts.setdefault(id(what), Node(
                    "const", (), dict(what.attrs), tuple(what.shape), what.dtype)))
            else:
                if id(what) not in inv_nodes:
                    inv_nodes[id(what)] = Node("input", (), {}, tuple(what.shape), what.dtype)
                    invariants.append(what)
                ins.append(inv_nodes[id(what)])
        clones.append(Node(n.op, tuple(ins), dict(n.attrs), tuple(n.shape), n.dtype))
    inputs = carried + [inv_nodes[id(v)] for v in invariants] + seqs
    outputs = [clones[j2] for j2, _ in r.carried] + [clones[j] for j in collected]
    nodes = inputs + list(consts.values()) + reads + [c for c in clones if c.op != "input"]
    raw = Graph(nodes, inputs, outputs)
    body, _ = optimize(reroll(raw)[0])  # (nested repetitions)
    return body, invariants, raw


def _apply_maps(node, maps, made) -> Node:
    """The recorded single-input `maps` (first first) applied to `node` in the body (the
    new nodes appended to `made`)."""
    for m in maps:
        node = Node(m.op, (node,), dict(m.attrs), tuple(m.shape), m.dtype)
        made.append(node)
    return node


def _step_shape(base, seq) -> tuple:
    return tuple(seq.width if d == seq.dim else s for d, s in enumerate(base.shape))


__all__ = ["reroll", "has_loops", "MIN_TRIPS"]
