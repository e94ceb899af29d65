"""The graph edits around loop rerolling (`compiler.reroll`): before the region search,
each step's copies of invariant values are merged and hoisted and per-step scatters into
one gradient are gathered; after it, single steps read back from a collected output
become picked outputs of their loop.
"""

from .ir import Graph, Node
from .loop import Pick, is_loop, is_projection, traced_trip
from .passes.cse import node_key
from .passes.dce import DeadCodeElimination
from .passes.rewrite import rewrite_graph
from .registry import REGISTRY, Trait

MIN_PIECES = 3  # scatter chains of fewer pieces stay as they are


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


def merge_copies(g: Graph) -> None:
    """CSE, except for array constants: each step's copy of an invariant value (a weight's
    transpose) becomes one value, while equal initial states (h = zeros(...) and c =
    zeros(...)) stay apart, as the steps that follow treat them apart."""
    seen = {}

    def first_of(node):
        if not REGISTRY[node.op].has(Trait.PURE) or (node.op == "const" and node.shape):
            return None
        first = seen.setdefault(node_key(node), node)
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
