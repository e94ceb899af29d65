"""Reverse-mode autodiff over nodes, with the registry's vjp rules.

The engine is written against callbacks, so the same walk runs eager backward
(values are NumPy-backed tensors), higher-order gradients (values are tensors
with history) and, later, symbolic backward graphs (values are graph values).
"""

from .registry import REGISTRY, Trait, sum_to


def reachable(roots) -> list:
    """Nodes that require grad and reach `roots`, latest first (reverse execution order)."""
    seen, stack, found = set(), [r for r in roots if r.requires_grad], []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        stack.extend(i for i in node.inputs if i.requires_grad)
    found.sort(key=lambda n: n.seq, reverse=True)
    return found


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


def backward(roots, root_grads, e, value_of, sink, check=None) -> list:
    """Propagate `root_grads` from `roots` back through the graph.

    e: the op emitter; value_of(node): the value a vjp sees for node;
    sink(node, grad): receives each node's total gradient (leaves stop there);
    check(node): raises if node's saved values are gone or were modified.
    Returns the nodes visited, latest first.
    """
    pending = {}
    for root, g in zip(roots, root_grads):
        _accumulate(pending, e, root, g)
    order = reachable(roots)
    for node in order:
        g = pending.pop(id(node), None)
        if g is None:
            continue
        sink(node, g)
        opdef = REGISTRY[node.op]
        if Trait.SOURCE in opdef.traits or not opdef.differentiable:
            continue
        if check is not None:
            check(node)
        ins = [value_of(i) for i in node.inputs]
        out = value_of(node) if "out" in opdef.saves else None
        grads = _input_grads(node, opdef, e, g, ins, out)
        for inp, gi in zip(node.inputs, grads):
            if gi is not None and inp.requires_grad:
                _accumulate(pending, e, inp, gi)
    return order


def _accumulate(pending, e, node, g):
    old = pending.get(id(node))
    pending[id(node)] = g if old is None else e("add", old, g)
