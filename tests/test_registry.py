"""The op registry is complete and self-consistent, every primitive has a test case and
a lowering (the layering rules are in test_layering.py)."""

import inspect
import os

import numpy as np
import pytest
from test_primitives import CASES, GRAD_CASES

from compiler.errors import DTypeError, OpError
from compiler.ops import REGISTRY, Trait
from compiler.registry import OpDef, get, register

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = sorted(REGISTRY)
KNOWN_TRAITS = {v for k, v in vars(Trait).items() if k.isupper()}
SOURCES = {n for n, d in REGISTRY.items() if d.has(Trait.SOURCE)}
COMPARISONS = {n for n, d in REGISTRY.items() if d.has(Trait.COMPARISON)}
# Structured control flow that passes make after autodiff (loop nodes, tested by
# test_reroll.py on rerolled graphs rather than by the per-primitive tables).
CONTROL = {n for n, d in REGISTRY.items() if d.has(Trait.CONTROL)}
# The only primitives allowed to have no gradient at all, besides comparisons and sources
# (detach stops gradients by definition).
NOT_DIFFERENTIABLE = {"argmax", "argmin", "argsort", "detach"} | COMPARISONS | SOURCES | CONTROL


def _params(fn) -> set:
    return set(inspect.signature(fn).parameters)


@pytest.mark.parametrize("name", OPS)
def test_primitive_is_fully_declared(name):
    op = REGISTRY[name]
    assert isinstance(op, OpDef) and op.name == name
    assert callable(op.impl) and callable(op.infer)
    assert op.doc.strip() or op.name.strip()
    assert op.traits and set(op.traits) <= KNOWN_TRAITS, op.traits
    assert set(op.saves) <= {"in", "out"}
    assert isinstance(op.attrs, tuple) and all(isinstance(a, str) for a in op.attrs)
    # the shape rule and impl take exactly the declared attributes by name
    assert set(op.attrs) <= _params(op.infer)
    if name != "input":
        assert set(op.attrs) <= _params(op.impl) or any(
            p.kind == p.VAR_KEYWORD for p in inspect.signature(op.impl).parameters.values())
    assert op.arity >= -1
    if op.has(Trait.SOURCE):
        assert op.arity == 0
    if name in NOT_DIFFERENTIABLE:
        assert op.vjp is None and not op.differentiable
    elif op.arity == -1:
        assert callable(op.vjp), "a variadic op's vjp is one callable returning a tuple"
    else:
        assert isinstance(op.vjp, tuple) and len(op.vjp) == op.arity, op.vjp
        assert all(r is None or callable(r) for r in op.vjp)
        assert any(r is not None for r in op.vjp)


def test_the_non_differentiable_primitives_are_exactly_the_expected_ones():
    assert {n for n, d in REGISTRY.items() if d.vjp is None} == NOT_DIFFERENTIABLE
    assert COMPARISONS == {"lt", "le", "gt", "ge", "eq", "ne"}


def test_every_primitive_has_a_test_case():
    missing = set(REGISTRY) - SOURCES - CONTROL - {c.op for c in CASES}
    assert not missing, f"primitives without a case in test_primitives.CASES: {missing}"
    unknown = {c.op for c in CASES} - set(REGISTRY)
    assert not unknown


def test_the_control_ops_are_the_loop_nodes():
    assert CONTROL == {"loop", "loop_out"}


def test_every_differentiable_primitive_has_a_gradient_case():
    differentiable = {n for n, d in REGISTRY.items() if d.differentiable}
    missing = differentiable - {c.op for c in GRAD_CASES}
    assert not missing, f"no finite-difference case for {missing}"


def test_every_elementwise_primitive_has_a_0d_and_a_size0_case():
    for name, op in REGISTRY.items():
        if op.has(Trait.ELEMENTWISE) and name != "cast":
            names = {c.name for c in CASES if c.op == name}
            assert "0d" in names and "size0" in names, name


@pytest.mark.parametrize("name", OPS)
def test_traits_describe_behaviour(name):
    """Probe each rule with the trait's promise (passes query traits, never names)."""
    op = REGISTRY[name]
    if op.has(Trait.FLOAT_ONLY):
        shapes = [(2,)] * op.arity
        with pytest.raises(DTypeError, match=name):
            op.check(shapes, [np.dtype(np.int64)] * op.arity, {})
        assert op.check(shapes, [np.dtype(np.float32)] * op.arity, {}) == (
            (2,), np.dtype(np.float32))
    if op.has(Trait.COMPARISON):
        assert op.check([(3, 1), (4,)], [np.dtype(np.float32)] * 2, {}) == (
            (3, 4), np.dtype(np.bool_))
    if op.has(Trait.REDUCTION):
        assert {"dims", "dim"} & set(op.attrs) and "keepdim" in op.attrs
    if op.has(Trait.ELEMENTWISE) and op.arity == 2:
        dt = np.dtype(np.float32)
        assert op.check([(2, 1, 3), (4, 1)], [dt, dt], {})[0] == (2, 4, 3)
        with pytest.raises(OpError, match=name):
            op.check([(2,), (3,)], [dt, dt], {})
    if op.arity >= 0:
        with pytest.raises(OpError, match=name):
            op.check([(1,)] * (op.arity + 1), [np.dtype(np.float32)] * (op.arity + 1), {})


def test_registry_lookup_and_duplicates_raise_clear_errors():
    with pytest.raises(OpError, match="unknown op 'no_such_op'"):
        get("no_such_op")
    assert get("add") is REGISTRY["add"]
    with pytest.raises(ValueError, match="registered twice"):
        register(REGISTRY["add"])


# ---- layering --------------------------------------------------------------------------


def test_every_op_has_a_lowering_in_the_numba_backend():
    """Lowering completeness (as JAX's register_lowering per primitive): every registry op
    is a source, an elementwise rule, a whole-node rule, or a value-folding reduction the
    loop lowering accumulates from the combine/initial kinds its OpDef declares."""
    from compiler.lowering.node_rules import NODE_RULES
    from compiler.lowering.rules import COMBINE, RULES
    missing = []
    for name, opdef in REGISTRY.items():
        if opdef.has(Trait.SOURCE) or name in RULES or name in NODE_RULES:
            continue
        if opdef.has(Trait.REDUCTION) and opdef.combine in COMBINE and opdef.initial:
            continue
        missing.append(name)
    assert not missing, f"ops without a numba lowering: {missing}"


def test_reductions_declare_their_kind():
    for name, opdef in REGISTRY.items():
        if not opdef.has(Trait.REDUCTION):
            assert opdef.combine is None, name
        elif opdef.has(Trait.ARG_REDUCTION):
            assert opdef.combine is None, name
        else:
            assert opdef.combine in ("add", "max", "min"), name
            assert opdef.initial in ("zero", "lowest", "highest"), name
