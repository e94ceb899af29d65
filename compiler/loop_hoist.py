"""Per-step maps hoisted out of loops.

Work a loop's body does on one step's slice of a sequence alone, with no carried value
involved (an RNN's input projection `x_t @ W + b`), is done once before the loop on the
whole sequence: one product over all the steps' rows instead of one small product per
step. The body then reads that result as a new sequence, sliced like the one it came
from. Only maps that hold a product (an op neither elementwise nor movement) are
hoisted: moving elementwise work out of a loop buys nothing.

What it asks of the registry: `Trait.ELEMENTWISE` (applies to stacked operands as it is,
when ranks match), `OpDef.stacked` (movement ops: the attrs that apply them to a stack
along a new leading dim) and `OpDef.row_wise` (matmul with a 2-D right operand: run on
the stacked rows, reshaped to 2-D and back, so the product stays one size-generic GEMM).
"""

from .ir import Graph, Node
from .loop import LoopSpec, is_loop
from .passes.dce import DeadCodeElimination
from .registry import REGISTRY, Trait


def hoist_maps(g: Graph) -> int:
    """Hoist the per-step maps of every loop of `g` (in place); returns how many sequences
    the loops now read instead of recomputing."""
    made = 0
    for loop in [n for n in g.nodes if is_loop(n)]:
        j = 0
        while j < len(loop.attrs["spec"].seqs):
            made += _hoist(g, loop, j)
            j += 1
    if made:
        DeadCodeElimination().run(g)
    return made


def _hoist(g, loop, j) -> int:
    spec = loop.attrs["spec"]
    seq = spec.seqs[j]
    if seq.dim != 0 or seq.width != 1 or abs(seq.stride) != 1:
        return 0
    first = spec.n_carried + spec.n_invariant
    body, base = spec.body, loop.inputs[first + j]
    rows = base.shape[0]
    outer_of = {id(body.inputs[spec.n_carried + i]): loop.inputs[spec.n_carried + i]
                for i in range(spec.n_invariant)}
    s_in = body.inputs[first + j]
    lift = Node("reshape", (base,), {"shape": (rows,) + tuple(s_in.shape)},
                (rows,) + tuple(s_in.shape), s_in.dtype)
    stacked, made = {id(s_in): lift}, [lift]
    computed = set()  # ids of body nodes whose stacked value holds a product
    for node in body.nodes:
        if node.is_source or not any(id(i) in stacked for i in node.inputs):
            continue
        new = _stack(node, rows, stacked, outer_of, made)
        if new is None:
            continue
        stacked[id(node)] = new
        opdef = REGISTRY[node.op]
        if not (opdef.has(Trait.ELEMENTWISE) or opdef.has(Trait.MOVEMENT)) or \
                any(id(i) in computed for i in node.inputs):
            computed.add(id(node))
    frontier = _frontier(body, computed)
    if not frontier:
        return 0
    _rebuild(loop, spec, frontier, stacked, seq)
    at = g.nodes.index(loop)
    g.nodes[at:at] = made
    return len(frontier)


def _stack(node, rows, stacked, outer_of, made):
    """The node computing `node` for every row at once (appended to `made`), or None."""
    opdef = REGISTRY[node.op]
    ins = []
    for i in node.inputs:
        if id(i) in stacked:
            ins.append(stacked[id(i)])
        elif id(i) in outer_of:
            ins.append(outer_of[id(i)])
        elif i.op == "const":
            c = Node("const", (), dict(i.attrs), tuple(i.shape), i.dtype)
            made.append(c)
            ins.append(c)
        else:
            return None  # (a carried value, another sequence, an inner loop's output)
    shape = (rows,) + tuple(node.shape)
    lifted = [id(i) in stacked for i in node.inputs]
    if opdef.has(Trait.ELEMENTWISE):
        if any(up and len(i.shape) != len(node.shape) for up, i in zip(lifted, node.inputs)):
            return None  # (a lower-rank stacked operand would broadcast on the wrong dims)
        new = Node(node.op, tuple(ins), dict(node.attrs), shape, node.dtype)
    elif opdef.stacked is not None and lifted == [True]:
        new = Node(node.op, tuple(ins), opdef.stacked(node.attrs, rows), shape, node.dtype)
    elif opdef.row_wise and lifted == [True, False] and len(node.inputs[1].shape) == 2:
        a = ins[0]
        k = a.shape[-1]
        flat = Node("reshape", (a,), {"shape": (rows * _prod(a.shape[1:-1]), k)},
                    (rows * _prod(a.shape[1:-1]), k), a.dtype)
        prod = Node(node.op, (flat, ins[1]), dict(node.attrs),
                    (flat.shape[0], node.shape[-1]), node.dtype)
        made.extend([flat, prod])
        new = Node("reshape", (prod,), {"shape": shape}, shape, node.dtype)
    else:
        return None
    made.append(new)
    return new


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def _frontier(body, computed) -> list:
    """The body nodes holding a product that something not hoisted reads (in order)."""
    outputs = {id(o) for o in body.outputs}
    users = body.users()
    return [n for n in body.nodes if id(n) in computed and (
        id(n) in outputs or any(id(u) not in computed for u in users.get(id(n), ())))]


def _rebuild(loop, spec, frontier, stacked, seq):
    """The loop reads each frontier node's stacked value as a new sequence."""
    body = spec.body
    replace, fresh = {}, []
    for f in frontier:
        inp = Node("input", (), {}, (1,) + tuple(f.shape), f.dtype)
        fresh.append(inp)
        replace[id(f)] = Node("reshape", (inp,), {"shape": tuple(f.shape)}, tuple(f.shape),
                              f.dtype)
    nodes = list(body.inputs) + fresh
    inputs = {id(i) for i in body.inputs}
    for n in body.nodes:
        if id(n) in inputs:
            continue
        if id(n) in replace:
            nodes.append(replace[id(n)])
            continue
        nodes.append(Node(n.op, tuple(replace.get(id(i), i) for i in n.inputs),
                          dict(n.attrs), tuple(n.shape), n.dtype))
        replace[id(n)] = nodes[-1]
    new_body = Graph(nodes, list(body.inputs) + fresh,
                     [replace.get(id(o), o) for o in body.outputs])
    DeadCodeElimination().run(new_body)
    loop.attrs["spec"] = LoopSpec(new_body, spec.n_carried, spec.n_invariant,
                                  spec.seqs + (seq,) * len(frontier), spec.collects,
                                  spec.trip, spec.picks)
    loop.inputs = tuple(loop.inputs) + tuple(stacked[id(f)] for f in frontier)
