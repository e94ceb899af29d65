"""Split a forward+backward graph (`autodiff.grad_graph`) into the forward, which runs
when the function is called, and the backward, which runs when gradients are asked for.

The backward is every node that depends on a seed gradient; the forward is the rest.
Forward values the backward reads are *saved*: extra outputs of the forward graph and
extra inputs of the backward one (constants are copied instead).

Recompute policy (`_recompute`): a saved value made by an elementwise op from values that
are saved anyway, constants, or intermediates of the call is computed again in the
backward instead, when that saves no more elements than before (as `1 - tanh(u)**2` from
`tanh(u)**2`, gelu's terms from its input): the backward fuses it into its own loops.
Off by default (`HYBRIDNET_RECOMPUTE=1` turns it on): with the Numba backend the bigger
backward costs more compile time than the memory it saves (an unrolled 24-step RNN: 72
values recomputed, the backward kernel 1,074 -> 1,245 lines, compile 15.7 -> 23.5 s).
Never from the call's inputs or results, which code outside may update in place.
"""

from dataclasses import dataclass

from .autodiff import viewed
from .ir import Graph, Node, collect
from .registry import REGISTRY, Trait


@dataclass
class Split:
    """`forward`: inputs -> (outputs..., saved...); `backward`: (saved..., seeds...) ->
    gradients; `saved`: how many forward outputs are saved values; `recomputed`: the
    forward values the backward computes again instead of reading them saved."""

    forward: Graph
    backward: Graph
    saved: int
    recomputed: list = None


def partition(joint: Graph, n_outputs: int, n_seeds: int, recompute: bool = False) -> Split:
    """Split `joint` (inputs: the forward's, then `n_seeds` seeds; outputs: `n_outputs`
    forward outputs, then gradients) into its forward and backward graphs (`recompute`:
    apply the recompute policy)."""
    seeds = joint.inputs[len(joint.inputs) - n_seeds:]
    late = {id(s) for s in seeds}
    for node in joint.nodes:  # (execution order: inputs first)
        if any(id(i) in late for i in node.inputs):
            late.add(id(node))
    grads = joint.outputs[n_outputs:]
    saved, seen = [], set()

    def save(node):  # (a forward value, not a constant)
        if id(node) not in seen:
            seen.add(id(node))
            saved.append(node)

    for node in joint.nodes:
        if id(node) in late:
            for i in node.inputs:
                if id(i) not in late and not _constant(i):
                    save(i)
    for g in grads:
        if id(g) not in late and not _constant(g):
            save(g)
    saved = _views_of_inputs(joint, saved, late, n_seeds)
    before = set(late)
    if recompute:
        saved = _recompute(joint, saved, late, n_outputs)
    recomputed = [n for n in joint.nodes if id(n) in late and id(n) not in before]
    outputs = list(joint.outputs[:n_outputs]) + saved
    inputs = joint.inputs[:len(joint.inputs) - n_seeds]
    needed = {id(n) for n in collect(outputs)}
    # (in the joint graph's own order: passes make nodes newer than their users, so the
    # creation order is no execution order)
    forward = Graph(_with_inputs([n for n in joint.nodes if id(n) in needed], inputs),
                    inputs, outputs)
    return Split(forward, _backward(joint, late, saved, seeds, grads), len(saved), recomputed)


def _views_of_inputs(joint, saved, late, n_seeds) -> list:
    """Saved views of the call's inputs (a weight's transpose) made again in the backward
    (`late`, updated) from the input, which is saved instead: eager's vjps read a view
    of the input's buffer when the backward runs, so a change made to it between (through
    NumPy, which no version counter sees) reaches the gradient as in eager."""
    own = {id(n) for n in joint.inputs[:len(joint.inputs) - n_seeds]}
    out, seen = [], set()
    for node in saved:
        chain = list(viewed(node))
        if len(chain) > 1 and id(chain[-1]) in own:
            late.update(id(v) for v in chain[:-1])
            node = chain[-1]
        if id(node) not in seen:
            seen.add(id(node))
            out.append(node)
    order = {id(n): k for k, n in enumerate(joint.nodes)}
    return sorted(out, key=lambda n: order[id(n)])


def _size(node) -> int:
    n = 1
    for d in node.shape:
        n *= d
    return n


def _rooted(node, fixed) -> bool:
    """Is `node` one of `fixed`, or a view of one (through movement ops)?"""
    return any(id(v) in fixed for v in viewed(node))


def _recompute(joint, saved, late, n_outputs) -> list:
    """Move cheap elementwise saved values into the backward (`late`, updated) where that
    saves no more elements; returns the new saved list (see the module docstring)."""
    fixed = {id(n) for n in joint.inputs} | {id(n) for n in joint.outputs[:n_outputs]}
    grads = {id(g) for g in joint.outputs[n_outputs:]}
    changed = True
    while changed:
        changed = False
        current = {id(n) for n in saved}
        for s in reversed(list(saved)):
            opdef = REGISTRY[s.op]
            if id(s) in fixed or id(s) in grads or not (
                    opdef.has(Trait.ELEMENTWISE) and opdef.has(Trait.PURE)):
                continue
            extra = [i for i in dict.fromkeys(s.inputs, None)
                     if i.op != "const" and id(i) not in current]
            if any(_rooted(i, fixed) for i in extra) or \
                    sum(_size(i) for i in extra) > _size(s) or len(extra) > 1:
                continue
            late.add(id(s))
            saved = [n for n in saved if n is not s]
            position = len(saved)
            saved[position:position] = extra
            current = {id(n) for n in saved}
            changed = True
    order = {id(n): k for k, n in enumerate(joint.nodes)}
    return sorted(saved, key=lambda n: order[id(n)])


def _with_inputs(nodes, inputs):
    have = {id(n) for n in nodes}
    return [n for n in inputs if id(n) not in have] + nodes


def _backward(joint, late, saved, seeds, grads) -> Graph:
    """The late nodes, reading fresh inputs where they read saved forward values."""
    copy = {}
    for node in saved:
        copy[id(node)] = Node("input", (), {}, node.shape, node.dtype)
    for s in seeds:
        copy[id(s)] = s
    nodes = [copy[id(n)] for n in saved] + list(seeds)
    for node in joint.nodes:
        if id(node) in late and id(node) not in copy:
            inputs = tuple(copy.get(id(i)) or _const(i, copy, nodes) for i in node.inputs)
            new = Node(node.op, inputs, dict(node.attrs), node.shape, node.dtype)
            copy[id(node)] = new
            nodes.append(new)
    outputs = [copy.get(id(g)) or _const(g, copy, nodes) for g in grads]
    inputs = [copy[id(n)] for n in saved] + list(seeds)
    return Graph(nodes, inputs, outputs)


def _constant(node) -> bool:
    """A constant, or a view of one (zeros expanded to a gradient's shape)."""
    while node.op != "const":
        if not REGISTRY[node.op].has(Trait.MOVEMENT) or len(node.inputs) != 1:
            return False
        node = node.inputs[0]
    return True


def _const(node, copy, nodes) -> Node:
    """A constant the backward needs (or a gradient that is a constant), or a view of
    one: copied."""
    if id(node) in copy:
        return copy[id(node)]
    if not _constant(node):
        raise ValueError(f"partition: {node.op} {node.type_str()} is neither saved nor late")
    inputs = tuple(_const(i, copy, nodes) for i in node.inputs)
    new = copy[id(node)] = Node(node.op, inputs, dict(node.attrs), node.shape, node.dtype)
    nodes.append(new)
    return new
