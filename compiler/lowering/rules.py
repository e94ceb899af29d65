"""The Numba backend's lowering table: one scalar-expression rule per elementwise op.

Each rule takes the operand expressions (strings), the node and the codegen
context, and returns a Python expression Numba compiles. Constants are typed
globals (np.float32(0.5), never a bare 0.5 that Numba would widen to float64).
Float32 transcendentals use `compiler.lowering.mathlib` (vectorizable
polynomials) when it provides them; float64 uses libm through NumPy.
"""

import numpy as np

from ..registry import REGISTRY

_MATHLIB = ("exp", "log", "tanh", "sigmoid", "erf")


def _bin(symbol):
    return lambda a, node, ctx: f"({a[0]} {symbol} {a[1]})"


def _bool_or(symbol, logical):
    """NumPy's bool + bool is `or`, bool * bool `and` (Numba would add them as ints)."""
    def rule(a, node, ctx):
        if node.dtype.kind == "b":
            return f"({a[0]} {logical} {a[1]})"
        return f"({a[0]} {symbol} {a[1]})"
    return rule


def _fn(name):
    def rule(a, node, ctx):
        return f"{ctx.math(name, node.dtype)}({a[0]})"
    return rule


def _sigmoid(a, node, ctx):
    fast = ctx.math("sigmoid", node.dtype, optional=True)
    if fast:
        return f"{fast}({a[0]})"
    one = ctx.const(1, node.dtype)
    return f"({one} / ({one} + {ctx.math('exp', node.dtype)}(-{a[0]})))"


def _maximum(a, node, ctx):
    return f"({a[0]} if ({a[0]} > {a[1]} or {a[0]} != {a[0]}) else {a[1]})"


def _minimum(a, node, ctx):
    return f"({a[0]} if ({a[0]} < {a[1]} or {a[0]} != {a[0]}) else {a[1]})"


def _cast(a, node, ctx):
    if node.dtype.kind == "b":
        return f"({a[0]} != 0)"
    return f"np.{node.dtype.name}({a[0]})"


def _sign(a, node, ctx):
    if node.dtype.kind == "b":
        return a[0]
    zero, one = ctx.const(0, node.dtype), ctx.const(1, node.dtype)
    return (f"({one} if {a[0]} > {zero} else (-{one} if {a[0]} < {zero} else "
            f"({a[0]} if {a[0]} != {a[0]} else {zero})))")


def _abs(a, node, ctx):
    if node.dtype.kind == "b":
        return a[0]
    return f"abs({a[0]})"


RULES = {
    "add": _bool_or("+", "or"), "sub": _bin("-"), "mul": _bool_or("*", "and"),
    "div": _bin("/"),
    "pow": _bin("**"),
    "lt": _bin("<"), "le": _bin("<="), "gt": _bin(">"), "ge": _bin(">="),
    "eq": _bin("=="), "ne": _bin("!="),
    "maximum": _maximum, "minimum": _minimum,
    "neg": lambda a, node, ctx: f"(-{a[0]})",
    "exp": _fn("exp"), "log": _fn("log"), "sqrt": _fn("sqrt"), "sin": _fn("sin"),
    "cos": _fn("cos"), "tanh": _fn("tanh"), "erf": _fn("erf"), "sigmoid": _sigmoid,
    "abs": _abs, "sign": _sign,
    "where": lambda a, node, ctx: f"({a[1]} if {a[0]} else {a[2]})",
    "cast": _cast,
    "detach": lambda a, node, ctx: a[0],
    "expand": lambda a, node, ctx: a[0],
}

# Reductions, by the combine and initial kinds their OpDef declares.
COMBINE = {
    "add": "{acc} + {v}",
    "max": "{v} if ({v} > {acc} or {v} != {v}) else {acc}",
    "min": "{v} if ({v} < {acc} or {v} != {v}) else {acc}",
}


def is_reduction(node) -> bool:
    """A value-folding reduction (sum, max, min) the loop lowering accumulates."""
    return REGISTRY[node.op].combine is not None


def combine_code(node) -> str:
    """The accumulate expression template ({acc}, {v}) for reduction `node`."""
    return COMBINE[REGISTRY[node.op].combine]


def reduce_identity(node, dtype: np.dtype):
    """The initial accumulator for reduction `node` on `dtype`."""
    kind = REGISTRY[node.op].initial
    if kind == "zero":
        return dtype.type(0)
    if dtype.kind == "f":
        return dtype.type(-np.inf if kind == "lowest" else np.inf)
    if dtype.kind == "b":
        return np.bool_(kind == "highest")
    info = np.iinfo(dtype)
    return dtype.type(info.min if kind == "lowest" else info.max)


def libm_name(name: str) -> str:
    """The NumPy/math spelling Numba compiles for `name` (a libm call)."""
    return "math.erf" if name == "erf" else f"np.{name}"
