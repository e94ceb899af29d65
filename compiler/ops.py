"""The primitive ops, each declared once: shape/dtype rule, NumPy impl, vjp, traits.

This module holds the sources and elementwise primitives; `compiler.ops_structural`
holds reductions, movement, indexing and matmul. Importing either fills
`REGISTRY`. Everything else users see (relu, softmax, layer_norm, losses, ...) is
a composition of these in `hybridnet.functional`.
"""

import math

import numpy as np

from .errors import DTypeError
from .registry import REGISTRY, OpDef, Trait, broadcast_shapes, register, same_dtype, zeros_like

__all__ = ["REGISTRY", "OpDef", "Trait"]

_EW = frozenset({Trait.ELEMENTWISE, Trait.PURE})
_EWF = _EW | {Trait.FLOAT_ONLY}
_NONE = frozenset()
_IN = frozenset({"in"})
_OUT = frozenset({"out"})
_BOTH = frozenset({"in", "out"})


# ---- sources --------------------------------------------------------------------------


def _input_impl(**attrs):
    raise RuntimeError("an 'input' node takes its value from the caller")


register(OpDef(
    "input", 0, _input_impl, lambda shapes, dtypes, shape, dtype: (tuple(shape), np.dtype(dtype)),
    attrs=("shape", "dtype"), traits=frozenset({Trait.SOURCE}), saves=_NONE,
    doc="A graph input (leaf); its value is given at run time."))

register(OpDef(
    "const", 0, lambda value, dtype: np.asarray(value, dtype=dtype),
    lambda shapes, dtypes, value, dtype: (np.shape(value), np.dtype(dtype)),
    attrs=("value", "dtype"), traits=frozenset({Trait.SOURCE, Trait.PURE}), saves=_NONE,
    doc="A constant scalar built from a literal."))


# ---- elementwise: shape/dtype rules ----------------------------------------------------


def _unary_rule(name, float_only=False, allow_bool=True):
    def infer(shapes, dtypes):
        (dt,) = dtypes
        if float_only and dt.kind != "f":
            raise DTypeError(f"{name}: expected a floating-point input, got {dt}{list(shapes[0])}")
        if not allow_bool and dt.kind == "b":
            raise DTypeError(f"{name}: not supported on bool input {dt}{list(shapes[0])}")
        return tuple(shapes[0]), dt
    return infer


def _binary_rule(name, out_dtype=None, float_only=False, allow_bool=True):
    def infer(shapes, dtypes):
        dt = same_dtype(name, shapes, dtypes)
        if float_only and dt.kind != "f":
            raise DTypeError(f"{name}: expected floating-point inputs, got {dt}")
        if not allow_bool and dt.kind == "b":
            raise DTypeError(f"{name}: not supported on bool inputs")
        return broadcast_shapes(name, shapes, dtypes), (out_dtype or dt)
    return infer


def _where_rule(shapes, dtypes):
    if dtypes[0].kind != "b":
        raise DTypeError(f"where: condition must be bool, got {dtypes[0]}{list(shapes[0])}")
    dt = same_dtype("where", shapes[1:], dtypes[1:])
    return broadcast_shapes("where", shapes, dtypes), dt


def _cast_rule(shapes, dtypes, dtype):
    return tuple(shapes[0]), np.dtype(dtype)


# ---- elementwise: impls that NumPy lacks -----------------------------------------------

_special = None


def _scipy_special():
    global _special
    if _special is None:
        import scipy.special as special
        _special = special
    return _special


def _sigmoid(x):
    """1 / (1 + e**-x), from e = e**-|x| (never overflows; tiny results keep their digits
    for large negative x). NumPy only: importing scipy.special costs 0.4 s."""
    with np.errstate(over="ignore"):
        e = np.asarray(np.exp(-np.abs(x)))
    num = np.where(x >= 0, np.ones((), x.dtype), e)
    np.add(e, 1, out=e)
    return np.divide(num, e, out=num)


def _erf(x):
    return _scipy_special().erf(x).astype(x.dtype, copy=False)


def _sign(x):
    return np.sign(x) if x.dtype.kind != "b" else x.copy()


def _power(a, b):
    if np.result_type(a, b).kind == "b":  # NumPy would answer int8, a dtype we lack
        raise TypeError("pow is not supported on bool inputs")
    return np.power(a, b)


def _pow_refusal(node):
    """Integer powers compile only with a constant exponent of no negative value: NumPy
    raises for a negative one, compiled code would not."""
    if node.dtype.kind not in "iu":
        return None
    expo = node.inputs[1]
    if expo.op == "const" and np.all(np.asarray(expo.attrs["value"]) >= 0):
        return None
    return ("pow: an integer power with an exponent tensor runs eagerly (a negative "
            "exponent raises there, as in NumPy)")


def _cast(x, dtype):
    return x.astype(dtype)


# ---- elementwise: declarations -------------------------------------------------------

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _unary(name, impl, vjp, saves, float_only=True, allow_bool=True, doc="", **facts):
    traits = _EWF if float_only else _EW
    register(OpDef(name, 1, impl, _unary_rule(name, float_only, allow_bool), vjp=vjp,
                   traits=traits, saves=saves, doc=doc, **facts))


_unary("neg", np.negative, (lambda e, g, x, o, a: e("neg", g),), _NONE,
       float_only=False, allow_bool=False, doc="-x", involution=True, zeros="first")
def _quiet(fn):
    """fn under np.errstate(all='ignore'): log(0) = -inf, exp overflow = inf, silently,
    as PyTorch (only for ops whose edge cases NumPy warns about)."""
    def impl(*args):
        with np.errstate(all="ignore"):
            return fn(*args)
    impl.__name__ = getattr(fn, "__name__", "impl")
    return impl


_unary("exp", _quiet(np.exp), (lambda e, g, x, o, a: e("mul", g, o),), _OUT, doc="e**x")
_unary("log", _quiet(np.log), (lambda e, g, x, o, a: e("div", g, x[0]),), _IN, doc="natural log")
_unary("sqrt", _quiet(np.sqrt), (lambda e, g, x, o, a: e("div", g, e("mul", o, 2)),), _OUT)
_unary("sin", np.sin, (lambda e, g, x, o, a: e("mul", g, e("cos", x[0])),), _IN)
_unary("cos", np.cos, (lambda e, g, x, o, a: e("neg", e("mul", g, e("sin", x[0]))),), _IN)
_unary("tanh", np.tanh, (lambda e, g, x, o, a: e("mul", g, e("sub", 1, e("mul", o, o))),), _OUT)
_unary("sigmoid", _sigmoid, (lambda e, g, x, o, a: e("mul", g, e("mul", o, e("sub", 1, o))),),
       _OUT, doc="1 / (1 + exp(-x)), computed without overflow")
_unary("erf", _erf, (lambda e, g, x, o, a: e(
    "mul", g, e("mul", e("exp", e("neg", e("mul", x[0], x[0]))), _TWO_OVER_SQRT_PI)),), _IN)
_unary("abs", np.abs, (lambda e, g, x, o, a: e("mul", g, e("sign", x[0])),), _IN,
       float_only=False)
_unary("sign", _sign, (lambda e, g, x, o, a: zeros_like(e, g),), _NONE, float_only=False)


def _binary(name, impl, vjp, saves, commutative=False, float_only=False, allow_bool=True,
            doc="", **facts):
    traits = _EWF if float_only else _EW
    if commutative:
        traits = traits | {Trait.COMMUTATIVE}
    register(OpDef(name, 2, impl, _binary_rule(name, None, float_only, allow_bool), vjp=vjp,
                   traits=traits, saves=saves, doc=doc, **facts))


def _pow_base_grad(e, g, x, o, a):
    base, expo = x
    t = e("mul", expo, e("pow", base, e("sub", expo, 1)))
    # As PyTorch: 0 where the exponent is 0 (not 0 * inf = nan at base 0).
    return e("mul", g, e("where", e("eq", expo, 0), 0, t))


def _pow_exponent_grad(e, g, x, o, a):
    base, expo = x
    t = e("mul", o, e("log", base))
    # As PyTorch: d/dy x**y is 0 where x == 0 and y >= 0 (not nan).
    safe = e("where", e("eq", base, 0), e("where", e("ge", expo, 0), 0, t), t)
    return e("mul", g, safe)


def _max_grad(first: bool):
    def rule(e, g, x, o, a):
        mine, other = (x[0], x[1]) if first else (x[1], x[0])
        # Ties split the gradient evenly, as PyTorch does.
        return e("where", e("gt", mine, other), g,
                 e("where", e("eq", mine, other), e("mul", g, 0.5), 0))
    return rule


# The identity of IEEE addition is -0.0 (x + 0.0 turns -0.0 into 0.0); of subtraction 0.0.
_binary("add", np.add, (lambda e, g, x, o, a: g, lambda e, g, x, o, a: g), _NONE,
        commutative=True, identity=-0.0, sums=True, zeros="all")
_binary("sub", np.subtract, (lambda e, g, x, o, a: g, lambda e, g, x, o, a: e("neg", g)),
        _NONE, allow_bool=False, identity=0, zeros="all")
_binary("mul", np.multiply, (lambda e, g, x, o, a: e("mul", g, x[1]),
                             lambda e, g, x, o, a: e("mul", g, x[0])), _IN, commutative=True,
        identity=1, zeros="any")
_binary("div", _quiet(np.true_divide), (lambda e, g, x, o, a: e("div", g, x[1]),
                                lambda e, g, x, o, a: e("neg", e("div", e("mul", g, o), x[1]))),
        _BOTH, float_only=True, identity=1, zeros="first")
_binary("pow", _quiet(_power), (_pow_base_grad, _pow_exponent_grad), _BOTH, allow_bool=False,
        identity=1, refuse=_pow_refusal)
_binary("maximum", np.maximum, (_max_grad(True), _max_grad(False)), _IN, commutative=True)
_binary("minimum", np.minimum, (_max_grad(False), _max_grad(True)), _IN, commutative=True)

for _name, _impl, _comm in [("lt", np.less, False), ("le", np.less_equal, False),
                            ("gt", np.greater, False), ("ge", np.greater_equal, False),
                            ("eq", np.equal, True), ("ne", np.not_equal, True)]:
    _traits = _EW | {Trait.COMPARISON} | ({Trait.COMMUTATIVE} if _comm else set())
    register(OpDef(_name, 2, _impl, _binary_rule(_name, np.dtype(np.bool_)),
                   traits=frozenset(_traits), saves=_NONE, doc=f"elementwise {_name}, bool"))

register(OpDef(
    "where", 3, np.where, _where_rule,
    vjp=(None, lambda e, g, x, o, a: e("where", x[0], g, 0),
         lambda e, g, x, o, a: e("where", x[0], 0, g)),
    traits=_EW, saves=_IN, doc="cond ? a : b, elementwise with broadcasting"))

register(OpDef(
    "cast", 1, _cast, _cast_rule, attrs=("dtype",),
    vjp=(lambda e, g, x, o, a: e("cast", g, dtype=str(e.dtype(x[0]))),),
    traits=_EW, saves=_IN, doc="convert to `dtype` (C-style truncation for float -> int)",
    noop_same_type=True))

from . import (  # noqa: E402,F401  (the remaining primitives; loop nodes for compiler.reroll)
    loop,
    ops_conv,
    ops_sort,
    ops_structural,
)
