"""Algebraic simplification: rewrite rules that never change a node's shape or dtype.

Each rule looks at one node and returns what should replace it: one of its
operands (only when that operand has exactly the node's shape and dtype) or a new
node of the same type. The algebraic facts come from the op registry (`OpDef.identity`,
`involution`, `compose`, `is_identity`, `noop_same_type`, the COMMUTATIVE and REDUCTION traits),
never from op names. Values that could
change are never touched: `x * 0` (nan, inf) and `x - x` (nan) stay as they are.
"""

import numpy as np

from ..ir import Graph, Node
from ..registry import REGISTRY, Trait
from .rewrite import rewrite_graph


def same_type(a: Node, b: Node) -> bool:
    """True when `a` and `b` have exactly the same shape and dtype."""
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype


def is_const(node: Node, value) -> bool:
    """True for a 'const' whose value (every element, as its dtype) equals `value`."""
    if node.op != "const":
        return False
    arr = REGISTRY["const"].impl(**node.attrs)
    if arr.dtype.kind == "O" or not bool(np.all(arr == value)):
        return False
    if arr.dtype.kind == "f" and value == 0:  # IEEE: the zero's sign matters (-0.0 + 0.0)
        return bool(np.all(np.signbit(arr) == np.signbit(value)))
    return True


def _operand_if_same_type(node: Node, operand: Node) -> Node | None:
    return operand if same_type(operand, node) else None


def _rebuild(node: Node, source: Node, **attrs) -> Node:
    """`node`'s op applied to `source` instead, with `attrs` updated (same type)."""
    return Node(node.op, (source,), {**node.attrs, **attrs}, tuple(node.shape), node.dtype,
                node.requires_grad)


# ---- rules: node -> replacement (an operand or a new node) or None -------------------


def identity_element(node: Node) -> Node | None:
    """x + 0, x - 0, x * 1, x / 1, x ** 1 -> x; also 0 + x, 1 * x (commutative ops)."""
    unit = REGISTRY[node.op].identity
    if unit is None:
        return None
    a, b = node.inputs
    if is_const(b, unit) and same_type(a, node):
        return a
    if REGISTRY[node.op].has(Trait.COMMUTATIVE) and is_const(a, unit):
        return _operand_if_same_type(node, b)
    return None


def involution(node: Node) -> Node | None:
    """neg(neg(x)) -> x."""
    if REGISTRY[node.op].involution and node.inputs[0].op == node.op:
        return _operand_if_same_type(node, node.inputs[0].inputs[0])
    return None


def chain(node: Node) -> Node | None:
    """op(op(x, a1), a2) -> op(x, compose(a2, a1)): reshape and expand chains, permutes."""
    compose = REGISTRY[node.op].compose
    inner = node.inputs[0] if node.inputs else None
    if compose is not None and inner.op == node.op:
        return _rebuild(node, inner.inputs[0], **compose(node.attrs, inner.attrs))
    return None


def noop(node: Node) -> Node | None:
    """reshape/expand to x's shape, cast to x's dtype, a slice of everything, an identity
    permute -> x."""
    opdef = REGISTRY[node.op]
    if opdef.noop_same_type or (opdef.is_identity is not None and opdef.is_identity(node.attrs)):
        return _operand_if_same_type(node, node.inputs[0])
    return None


def empty_reduction(node: Node) -> Node | None:
    """A reduction over dims=() -> x."""
    if REGISTRY[node.op].has(Trait.REDUCTION) and len(node.attrs.get("dims", "?")) == 0:
        return _operand_if_same_type(node, node.inputs[0])
    return None


def _swapped(node: Node, op: str, attrs) -> Node:
    shape = tuple(node.shape[:-2]) + (node.shape[-1], node.shape[-2])
    return Node(op, (node,), dict(attrs), shape, node.dtype)


def transposed_product(node: Node, users) -> Node | None:
    """(a @ b)^T -> b^T @ a^T when the product has no other user: the transposes move
    to the operands (where BLAS reads them as they are, or they cancel against the
    transposes already there, as in the gradient of x @ w.T) instead of copying the
    product transposed. Only without batch broadcasting."""
    swaps = REGISTRY[node.op].swaps_last_two
    if swaps is None or not swaps(node.attrs):
        return None
    prod = node.inputs[0]
    if not REGISTRY[prod.op].transpose_swaps or users.get(id(prod), 0) != 1:
        return None
    a, b = prod.inputs
    if not len(a.shape) == len(b.shape) == len(prod.shape) or a.shape[:-2] != b.shape[:-2]:
        return None
    return Node(prod.op, (_swapped(b, node.op, node.attrs), _swapped(a, node.op, node.attrs)),
                dict(prod.attrs), tuple(node.shape), node.dtype, node.requires_grad)


def scalar_operand(node: Node) -> Node | None:
    """x * expand(c) -> x * c, for c 0-d and any elementwise op whose other operands give
    the shape: the op broadcasts c itself, and no size is written into the graph (a
    gradient seed broadcast over a sequence: code for every length)."""
    opdef = REGISTRY[node.op]
    if not opdef.has(Trait.ELEMENTWISE) or len(node.inputs) < 2:
        return None
    ins = [i.inputs[0] if REGISTRY[i.op].has(Trait.BROADCAST) and i.shape and
           len(i.inputs) == 1 and not i.inputs[0].shape and i.inputs[0].dtype == i.dtype
           else i for i in node.inputs]
    if all(a is b for a, b in zip(ins, node.inputs)):
        return None
    try:
        shape, dtype = opdef.check([i.shape for i in ins], [i.dtype for i in ins],
                                   node.attrs)
    except Exception:  # noqa: BLE001 - the rule just does not apply
        return None
    if tuple(shape) != tuple(node.shape) or np.dtype(dtype) != node.dtype:
        return None
    return Node(node.op, tuple(ins), dict(node.attrs), tuple(node.shape), node.dtype,
                node.requires_grad)


RULES = (identity_element, involution, chain, noop, empty_reduction, scalar_operand)


def rewrite(node: Node, users=None) -> Node | None:
    """The first rule's replacement for `node`, or None when no rule applies (`users`:
    id -> number of uses, for the rules that must not duplicate work)."""
    if REGISTRY[node.op].has(Trait.SOURCE):
        return None
    for rule in RULES:
        new = rule(node)
        if new is not None:
            return new
    if users is not None:
        return transposed_product(node, users)
    return None


def count_users(graph: Graph) -> dict:
    """id(node) -> how many node inputs and graph outputs use it."""
    users = {}
    for n in graph.nodes:
        for i in n.inputs:
            users[id(i)] = users.get(id(i), 0) + 1
    for o in graph.outputs:
        users[id(o)] = users.get(id(o), 0) + 1
    return users


class AlgebraicSimplification:
    """Apply `RULES` to every node, in execution order, until none applies.

    A node replaced by one of its operands is removed (its users and the outputs
    use the operand); a node rebuilt (a composed permute, say) takes its place.
    Operands left unused are for dead code elimination.

    >>> graph, changed = AlgebraicSimplification().run(g)   # doctest: +SKIP
    """

    name = "simplify"

    def run(self, graph: Graph) -> tuple:
        """Simplify in place; returns `(graph, changed)`."""
        users = count_users(graph)
        return rewrite_graph(graph, lambda n: rewrite(n, users), repeat=True)
