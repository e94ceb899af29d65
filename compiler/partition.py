"""Split a forward+backward graph (`autodiff.grad_graph`) into the forward, which runs
when the function is called, and the backward, which runs when gradients are asked for.

The backward is every node that depends on a seed gradient; the forward is the rest.
Forward values the backward reads are *saved*: extra outputs of the forward graph and
extra inputs of the backward one (constants are copied instead). Saving is the simple
policy for now: recomputing cheap elementwise values in the backward instead of saving
them is a later refinement.
"""

from dataclasses import dataclass

from .autodiff import grad_graph
from .ir import Graph, Node, collect
from .passes.manager import optimize


@dataclass
class Split:
    """`forward`: inputs -> (outputs..., saved...); `backward`: (saved..., seeds...) ->
    gradients; `saved`: how many forward outputs are saved values."""

    forward: Graph
    backward: Graph
    saved: int


def partition(joint: Graph, n_outputs: int, n_seeds: int) -> Split:
    """Split `joint` (inputs: the forward's, then `n_seeds` seeds; outputs: `n_outputs`
    forward outputs, then gradients) into its forward and backward graphs."""
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
                if id(i) not in late and i.op != "const":
                    save(i)
    for g in grads:
        if id(g) not in late and g.op != "const":
            save(g)
    outputs = list(joint.outputs[:n_outputs]) + saved
    inputs = joint.inputs[:len(joint.inputs) - n_seeds]
    needed = {id(n) for n in collect(outputs)}
    # (in the joint graph's own order: passes make nodes newer than their users, so the
    # creation order is no execution order)
    forward = Graph(_with_inputs([n for n in joint.nodes if id(n) in needed], inputs),
                    inputs, outputs)
    return Split(forward, _backward(joint, late, saved, seeds, grads), len(saved))


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


def _const(node, copy, nodes) -> Node:
    """A constant the backward needs (or a gradient that is a constant): copied."""
    if node.op != "const":
        raise ValueError(f"partition: {node.op} {node.type_str()} is neither saved nor late")
    new = copy[id(node)] = Node("const", (), dict(node.attrs), node.shape, node.dtype)
    nodes.append(new)
    return new


def split_gradient(graph: Graph, wrt, seeded=None) -> tuple:
    """Forward and backward of `graph` with respect to the nodes `wrt` (seeding the
    outputs at positions `seeded`, default all), optimized together (constant folding,
    simplification and CSE see both; dead values go), then split: returns
    `(Split, pass report)`."""
    joint = grad_graph(graph, wrt, seeded)
    optimized, report = optimize(joint)
    n_seeds = len(graph.outputs) if seeded is None else len(seeded)
    return partition(optimized, len(graph.outputs), n_seeds), report
