"""The graph edits around loop rerolling (`compiler.reroll`): before the region search,
each step's copies of invariant values are merged and hoisted and per-step scatters into
one gradient are gathered; while a loop node is made, the cats that join its steps' values
take its collected outputs; after it, single steps read back from a collected output
become picked outputs of their loop.
"""

from .ir import Graph, Node
from .loop import Collect, Pick, is_loop, is_projection, traced_trip
from .passes.cse import attrs_key, node_key
from .passes.dce import DeadCodeElimination
from .passes.rewrite import rewrite_graph
from .registry import REGISTRY, Trait

MIN_PIECES = 3  # scatter chains of fewer pieces stay as they are
MIN_RUN = 3  # a cat of fewer consecutive steps keeps them apart (reroll.MIN_TRIPS)


def is_slice(node) -> bool:
    """Does `node` read a window of its operand (registry fact `window`)?"""
    return REGISTRY[node.op].window == "read"


def _sums(node) -> bool:
    return REGISTRY[node.op].sums and len(node.inputs) == 2


def moving_dim(indexes):
    """The one dim along which window indexes ((start, stop, step) per dim, one per step)
    differ, all with step 1, the others alike; else None."""
    moving = [d for d in range(len(indexes[0])) if len({ix[d] for ix in indexes}) > 1]
    if len(moving) != 1:
        return None
    d = moving[0]
    if any(ix[d][2] != 1 for ix in indexes) or \
            any(ix[e] != indexes[0][e] for ix in indexes for e in range(len(ix)) if e != d):
        return None
    return d


# id(node) -> (node, its attributes' key): region searches ask the same nodes again (the
# node is kept, so an id is never another node's while its entry lives; compiler.reroll
# clears it when its outermost call ends)
ATTR_KEYS = {}


def cached_attrs_key(node) -> tuple:
    """passes.cse.attrs_key(node), kept in ATTR_KEYS."""
    hit = ATTR_KEYS.get(id(node))
    if hit is None or hit[0] is not node:
        hit = ATTR_KEYS[id(node)] = (node, attrs_key(node))
    return hit[1]


def merge_copies(g: Graph) -> None:
    """CSE, except for array constants: each step's copy of an invariant value (a weight's
    transpose) becomes one value, while equal initial states (h = zeros(...) and c =
    zeros(...)) stay apart, as the steps that follow treat them apart."""
    seen = {}

    def first_of(node):
        if not REGISTRY[node.op].has(Trait.PURE) or (node.op == "const" and node.shape):
            return None
        first = seen.setdefault(node_key(node, cached_attrs_key), node)
        return None if first is node else first
    rewrite_graph(g, first_of)


def hoist_invariants(g: Graph) -> None:
    """Move pure values computed from inputs and scalar constants only (and not from
    slices, which may be a loop's per-step reads) to the front, so a step's copy of them
    (merged by CSE into the first step) does not make the first step differ."""
    fixed = set()
    front, rest = [], []
    for node in g.nodes:
        opdef = REGISTRY[node.op]
        if node.is_source:
            # (array constants are often a loop's initial state, h = zeros(...): what the
            # first step computes from them stays in the first step)
            if node.op != "const" or not node.shape:
                fixed.add(id(node))
            front.append(node)
        elif opdef.has(Trait.PURE) and not is_slice(node) and \
                all(id(i) in fixed for i in node.inputs):
            fixed.add(id(node))
            front.append(node)
        else:
            rest.append(node)
    g.nodes = front + rest


def gather_scatters(g: Graph) -> None:
    """A chain acc + pad_slice(g1) + pad_slice(g2) + ... whose pieces tile one dim (the
    gradient of x[t] summed over the steps) becomes acc + the cat of the pieces: the
    steps then each yield their piece, which the loop collects, instead of each adding a
    full-size array (that made every step differ, and cost T^2 work)."""
    users = g.users()
    single = {id(n) for n in g.nodes if len(users.get(id(n), ())) == 1}
    outputs = {id(o) for o in g.outputs}
    inner = set()  # adds whose one user adds a piece to them: inside a chain, not its end
    for node in g.nodes:
        if _sums(node):
            a, b = node.inputs
            for piece, rest in ((b, a), (a, b)):
                if _is_pad(piece, single) and _sums(rest) and id(rest) in single and \
                        id(rest) not in outputs:
                    inner.add(id(rest))
    replace = {}
    for node in g.nodes:
        if id(node) in inner:
            continue
        chain = _scatter_chain(node, single, outputs)
        if chain is None:
            continue
        init, pieces, d = chain
        pieces.sort(key=lambda p: p.attrs["index"][d][0])
        spans = [p.attrs["index"][d] for p in pieces]
        if any(a[1] != b[0] for a, b in zip(spans, spans[1:])) or \
                any(step != 1 for _, _, step in spans):
            continue  # (gaps or overlaps)
        full = pieces[0].attrs["shape"]
        shape = list(pieces[0].inputs[0].shape)
        shape[d] = spans[-1][1] - spans[0][0]
        dtype = pieces[0].dtype
        joined = Node("cat", tuple(p.inputs[0] for p in pieces), {"dim": d}, tuple(shape), dtype)
        new = [joined]
        if tuple(shape) != tuple(full):
            # (the other dims as the pieces have them: all alike, moving_dim checked)
            index = tuple((spans[0][0], spans[-1][1], 1) if e == d else other
                          for e, other in enumerate(pieces[0].attrs["index"]))
            new.append(Node("pad_slice", (joined,), {"shape": tuple(full), "index": index},
                            tuple(full), dtype))
        if init is not None:
            new.append(Node("add", (init, new[-1]), {}, tuple(full), dtype))
        replace[id(node)] = new
    if not replace:
        return
    nodes = []
    final = {}
    for n in g.nodes:
        n.inputs = tuple(final.get(id(i), i) for i in n.inputs)
        if id(n) in replace:
            nodes.extend(replace[id(n)])
            final[id(n)] = replace[id(n)][-1]
        else:
            nodes.append(n)
    g.nodes = nodes
    g.outputs = [final.get(id(o), o) for o in g.outputs]
    DeadCodeElimination().run(g)


def _scatter_chain(node, single, outputs):
    """(initial value or None, pad_slice pieces, dim) when `node` ends a chain of at least
    MIN_PIECES adds of pad_slices into one shape that differ along one dim only."""
    if not _sums(node):
        return None
    pieces, cur = [], node
    while _sums(cur):
        a, b = cur.inputs
        piece, rest = (b, a) if _is_pad(b, single) else (a, b) if _is_pad(a, single) else \
            (None, None)
        if piece is None:
            break
        pieces.append(piece)
        cur = rest
        if not _sums(cur) or id(cur) not in single or id(cur) in outputs:
            break
    init = cur
    if _is_pad(init, single) and init.attrs.get("shape") == pieces[-1].attrs.get("shape"):
        pieces.append(init)
        init = None
    if len(pieces) < MIN_PIECES or len({p.attrs["shape"] for p in pieces}) != 1:
        return None
    d = moving_dim([p.attrs["index"] for p in pieces])
    if d is None:
        return None
    if init is not None and tuple(init.shape) != tuple(node.shape):
        return None
    return init, pieces, d


def _is_pad(node, single) -> bool:
    return REGISTRY[node.op].window == "write" and id(node) in single


def pick_single_steps(g: Graph) -> None:
    """A slice reading one step's block back from a collected output (a step the loops
    left unrolled reads it) becomes a picked output of the loop, counted from the nearer
    end: its index then does not depend on the trip count."""
    loops = {}
    for n in g.nodes:
        if is_projection(n) and is_loop(n.inputs[0]):
            loops[id(n)] = n
    replace = {}
    for n in g.nodes:
        src = n.inputs[0] if is_slice(n) else None
        if src is None or id(src) not in loops:
            continue
        loop = src.inputs[0]
        spec = loop.attrs["spec"]
        c = src.attrs["index"] - spec.n_carried
        if not 0 <= c < spec.n_collected or spec.collects[c].dim < 0:
            continue
        k = _step_of(n, spec, c, src)
        if k is None:
            continue
        trips = traced_trip(loop)
        pick = Pick(c, trips - 1 - k, True) if 2 * k >= trips else Pick(c, k)
        picks = list(spec.picks)
        if pick not in picks:
            picks.append(pick)
            loop.attrs["spec"] = spec.with_picks(picks)
        index = spec.n_carried + spec.n_collected + picks.index(pick)
        replace[id(n)] = Node("loop_out", (loop,), {"index": index}, tuple(n.shape), n.dtype)
    if not replace:
        return
    nodes = []
    for n in g.nodes:
        n.inputs = tuple(replace.get(id(i), i) for i in n.inputs)
        nodes.append(replace.get(id(n), n))
    g.nodes = nodes
    g.outputs = [replace.get(id(o), o) for o in g.outputs]
    DeadCodeElimination().run(g)


def _step_of(node, spec, c, src):
    """The step whose block along the collect dim `node` (a slice of collected output c)
    reads exactly, or None."""
    collect = spec.collects[c]
    width = spec.body.outputs[spec.n_carried + c].shape[collect.dim]
    index = node.attrs["index"]
    for d, (a, b, step) in enumerate(index):
        whole = (a, b, step) == (0, src.shape[d], 1)
        if d != collect.dim and not whole:
            return None
    a, b, step = index[collect.dim]
    if step != 1 or b - a != width or a % width:
        return None
    block = a // width
    trips = src.shape[collect.dim] // width
    return trips - 1 - block if collect.reverse else block


# ---- the collected outputs of a new loop node (compiler.reroll._rewrite) --------------


def layouts_of(g, steps, collected, members) -> dict:
    """How each collected value is laid out: along the dim of a cat that joins every
    step's value in order (or in reverse), else of one that joins a run of at least
    MIN_RUN of them (the states before each step, h0 then h1 .. h[T-1]), else along
    dim 0 (a new axis for 0-d values)."""
    layouts = {}
    cats = [n for n in g.nodes if REGISTRY[n.op].joins and id(n) not in members]
    for j in collected:
        shape = steps[0][j].shape
        layouts[j] = Collect(0) if len(shape) else Collect(-1)
        step_of = {id(step[j]): k for k, step in enumerate(steps)}
        runs = [(_longest_run(n.inputs, step_of) or n.attrs["dim"] == 0 and
                 len(shape) and _longest_run(n.inputs, _stacked(n, step_of)), n)
                for n in cats]
        runs = [(run, n) for run, n in runs if run]
        if runs:
            (_, a, b, rev), cat = max(runs, key=lambda rn: rn[0][2] - rn[0][1])
            layouts[j] = Collect(cat.attrs["dim"], rev)
    return layouts


def _longest_run(inputs, step_of):
    """(position, first step, last step + 1, reversed) of the longest run of inputs that
    are consecutive steps' values (in order, or in reverse), at least MIN_RUN long."""
    best, i, n = None, 0, len(inputs)
    while i < n:
        k = step_of.get(id(inputs[i]))
        nxt = step_of.get(id(inputs[i + 1])) if k is not None and i + 1 < n else None
        d = 0 if nxt is None else 1 if nxt == k + 1 else -1 if nxt == k - 1 else 0
        if not d:
            i += 1
            continue
        j = i + 1
        while j < n and step_of.get(id(inputs[j])) == k + d * (j - i):
            j += 1
        if j - i >= MIN_RUN and (best is None or j - i > best[2] - best[1]):
            lo = k if d > 0 else k - (j - i - 1)
            best = (i, lo, lo + j - i, d < 0)
        i = j
    return best


def replace_cats(g, steps, column_of, layouts, members, made) -> dict:
    """Cats that join a run of a collected value's steps in its layout take the loop's
    output (or the slice of it that holds those steps: new nodes appended to `made`)
    instead (id(cat) -> its replacement when nothing else is left to join)."""
    whole, trips = {}, len(steps)
    for n in g.nodes:
        if not REGISTRY[n.op].joins or id(n) in members:
            continue
        for j, out in column_of.items():
            layout = layouts[j]
            if layout.dim != n.attrs["dim"] or layout.dim < 0:
                continue
            step_of = {id(step[j]): k for k, step in enumerate(steps)}
            run, stacked = _longest_run(n.inputs, step_of), False
            if run is None and layout.dim == 0:  # (a stack: a cat of each value with a
                run, stacked = _longest_run(n.inputs, _stacked(n, step_of)), True  # 1 ahead)
            if run is None or run[3] != layout.reverse:
                continue
            at, a, b, _ = run
            part = out
            if (a, b) != (0, trips):
                part = _blocks(out, layout, a, b, trips, steps[0][j])
                made.append(part)
            if stacked:
                shape = (b - a,) + tuple(steps[0][j].shape)
                part = Node("reshape", (part,), {"shape": shape}, shape, part.dtype)
                made.append(part)
            n.inputs = n.inputs[:at] + (part,) + n.inputs[at + b - a:]
        if len(n.inputs) == 1 and is_projection(n.inputs[0]):
            whole[id(n)] = n.inputs[0]
    return whole


def _stacked(cat, step_of) -> dict:
    """id(input) -> step, for the inputs of `cat` (along dim 0) that regroup a step's
    value with a leading 1 (hn.stack's pieces: a run of them is the collected output's
    rows, regrouped)."""
    return {id(i): step_of[id(i.inputs[0])] for i in cat.inputs
            if REGISTRY[i.op].regroups and id(i.inputs[0]) in step_of and
            tuple(i.shape) == (1,) + tuple(i.inputs[0].shape)}


def _blocks(out, layout, a, b, trips, node) -> Node:
    """A slice of collected output `out` holding steps a .. b-1 (in its layout's order)."""
    lo, hi = (trips - b, trips - a) if layout.reverse else (a, b)
    w = node.shape[layout.dim]
    index = tuple((lo * w, hi * w, 1) if d == layout.dim else (0, s, 1)
                  for d, s in enumerate(out.shape))
    shape = tuple(e[1] - e[0] for e in index)
    return Node("slice", (out,), {"index": index}, shape, node.dtype)


def block_of(out, layout, k, trips, node) -> list:
    """Nodes reading step k's value back from a collected output."""
    b = trips - 1 - k if layout.reverse else k
    if layout.dim < 0:
        index = ((b, b + 1, 1),) + tuple((0, s, 1) for s in out.shape[1:])
        piece = Node("slice", (out,), {"index": index}, (1,) + tuple(node.shape), node.dtype)
        return [piece, Node("reshape", (piece,), {"shape": tuple(node.shape)},
                            tuple(node.shape), node.dtype)]
    w = node.shape[layout.dim]
    index = tuple((b * w, (b + 1) * w, 1) if d == layout.dim else (0, s, 1)
                  for d, s in enumerate(out.shape))
    return [Node("slice", (out,), {"index": index}, tuple(node.shape), node.dtype)]
