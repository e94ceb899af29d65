"""Math on tensors, composed from the registry's primitives.

Each public function here is also a Tensor method (see `hybridnet._methods`).
Composites (relu, gelu, softmax, logsumexp, var, ...) are written with
primitives only, so they get gradients, recording and, later, fusion for free.
"""

import builtins
import math

import numpy as np

from compiler import dtypes as cd
from compiler.errors import DTypeError, ShapeError
from compiler.ops import REGISTRY

from . import fused as _fused
from .dispatch import NO_ATTRS, apply, as_operand, binary_op, cast, promote, run, unary_op
from .dtypes import to_np
from .shape import squeeze
from .tensor import Tensor, literal

# ---- elementwise ---------------------------------------------------------------------


def _doc(op, doc: str):
    """A dispatch entry point (`unary_op`/`binary_op`) published here, with its user docs
    (and a name pickle finds)."""
    op.__doc__ = doc
    op.__module__, op.__qualname__ = __name__, op.__name__
    return op


exp = _doc(unary_op("exp"), "e ** input.")
log = _doc(unary_op("log"), "Natural logarithm; log(0) = -inf.")
sqrt = _doc(unary_op("sqrt"), "Square root.")
sin = _doc(unary_op("sin"), "Sine.")
cos = _doc(unary_op("cos"), "Cosine.")
tanh = _doc(unary_op("tanh"), "Hyperbolic tangent.")
sigmoid = _doc(unary_op("sigmoid"), "Logistic sigmoid, computed without overflow.")
erf = _doc(unary_op("erf"), "Gauss error function.")
abs = _doc(unary_op("abs"), "Absolute value.")  # noqa: A001  (PyTorch's name)
neg = _doc(unary_op("neg"), "-input.")
sign = _doc(unary_op("sign"), "-1, 0 or 1 (gradient zero).")
mul = _doc(binary_op("mul"), "input * other.")
div = _doc(binary_op("div"), "input / other (true division).")
maximum = _doc(binary_op("maximum"),
               "Elementwise max; on ties the gradient is split evenly, as in PyTorch.")
minimum = _doc(binary_op("minimum"), "Elementwise min.")
_add, _sub, _pow = binary_op("add"), binary_op("sub"), binary_op("pow")


def pow(input, exponent):  # noqa: A001
    """input ** exponent (tensors or scalars)."""
    return _pow(input, exponent)


def rsqrt(input):
    """1 / sqrt(input)."""
    return 1.0 / sqrt(input)


def square(input):
    """input * input."""
    return input * input


def reciprocal(input):
    """1 / input."""
    return 1.0 / input


def add(input, other, *, alpha=1):
    """input + alpha * other."""
    return _add(input, other if alpha == 1 else other * alpha)


def sub(input, other, *, alpha=1):
    """input - alpha * other."""
    return _sub(input, other if alpha == 1 else other * alpha)


def where(condition, input, other):
    """condition ? input : other, with broadcasting and promotion of input/other."""
    cond = as_operand(condition, "where")
    if not isinstance(cond, Tensor) or cond._data.dtype.kind != "b":
        raise DTypeError(f"where: condition must be a bool tensor, got {_desc(cond)}")
    a, b = as_operand(input, "where"), as_operand(other, "where")
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = literal(np.asarray(a, dtype=cd.scalar_dtype(a)))  # two scalars, as PyTorch
    a, b = promote("where", (a, b))
    return apply("where", (cond, a, b))


def bitwise_and(input, other):
    """input & other, for bool tensors (recorded as `where`, like every other op)."""
    a, b = _bool_operands("&", input, other)
    return apply("where", (a, b, np.bool_(False)))


def bitwise_or(input, other):
    """input | other, for bool tensors."""
    a, b = _bool_operands("|", input, other)
    return apply("where", (a, np.bool_(True), b))


def _bool_operands(symbol, a, b):
    if not isinstance(b, Tensor):
        b = literal(np.asarray(b))
    if a._data.dtype.kind != "b" or b._data.dtype.kind != "b":
        raise TypeError(f"{symbol} is only defined for bool tensors, got "
                        f"{a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    return a, b


def clamp(input, min=None, max=None):  # noqa: A002
    """Clamp into [min, max]; the gradient is 1 inside, including the bounds."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    out = input
    if min is not None:
        out = where(out < min, _like(min, out), out)
    if max is not None:
        out = where(out > max, _like(max, out), out)
    return out


def relu(input):
    """max(input, 0), gradient 0 at 0."""
    fast = _fused.relu(input, _relu)
    return _relu(input) if fast is None else fast


def _relu(input):
    return where(input > 0, input, 0.0 if input._data.dtype.kind == "f" else 0)


def gelu(input, approximate: str = "none"):
    """GELU: exact (erf) by default, or the tanh approximation with approximate='tanh'."""
    if approximate == "tanh":
        inner = (input + 0.044715 * input * input * input) * math.sqrt(2.0 / math.pi)
        return 0.5 * input * (1.0 + tanh(inner))
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * input * (1.0 + erf(input * (1.0 / math.sqrt(2.0))))


def silu(input):
    """input * sigmoid(input)."""
    return input * sigmoid(input)


def _like(value, t):
    return value if not isinstance(value, Tensor) else cast(value, t._data.dtype)


def _desc(x) -> str:
    if isinstance(x, Tensor):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


# ---- reductions ----------------------------------------------------------------------


def normalize_dims(op: str, t, dim) -> tuple:
    """dim (None, int, or sequence; negatives allowed) -> sorted non-negative tuple."""
    ndim = t._data.ndim
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    lim = builtins.max(ndim, 1)  # a 0-d tensor accepts dim 0 and -1, as in PyTorch
    out = []
    for d in dims:
        d = int(d)
        if not -lim <= d < lim:
            raise ShapeError(f"{op}: dim {d} is out of range for a tensor of shape "
                             f"{list(t.shape)} (expected {-lim}..{lim - 1})")
        out.append(d % lim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: dim {dims} repeats a dim")
    return tuple(sorted(out)) if ndim else ()


def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    """Sum over dim (all dims by default); bool and int32 inputs sum as int64."""
    x = input
    if dim is None and dtype is None and x.__class__ is Tensor and x._data.dtype.kind == "f":
        data = x._data  # (the common call, x.sum(), straight to `run`: 1.9x -> 1.4x torch's)
        return run(_SUM, (x,), (data,), {"dims": _ALL_DIMS[data.ndim], "keepdim": bool(keepdim)},
                   x._rg)
    if dtype is not None:
        x = cast(x, to_np(dtype))
    elif x._data.dtype.kind in "bi" and x._data.dtype != cd.int64:
        x = cast(x, cd.int64)
    return apply("sum", (x,), {"dims": normalize_dims("sum", x, dim), "keepdim": bool(keepdim)})


_SUM = REGISTRY["sum"]
_ALL_DIMS = [tuple(range(n)) for n in range(65)]


def _count(t, dims) -> int:
    return math.prod(t._data.shape[d] for d in dims)


def mean(input, dim=None, keepdim=False):
    """Mean over dim; floating-point inputs only (as PyTorch)."""
    _need_float("mean", input)
    dims = normalize_dims("mean", input, dim)
    total = apply("sum", (input,), {"dims": dims, "keepdim": bool(keepdim)})
    n = _count(input, dims)
    return total / n if n else total * float("nan")


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance with Bessel's correction by default (correction=1, or unbiased=True)."""
    _need_float("var", input)
    if correction is None:
        correction = 1 if unbiased is None else int(bool(unbiased))
    dims = normalize_dims("var", input, dim)
    centered = input - mean(input, dims, keepdim=True)
    total = apply("sum", (centered * centered,), {"dims": dims, "keepdim": bool(keepdim)})
    dof = _count(input, dims) - correction
    return total / dof if dof > 0 else total / 0.0


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Standard deviation: sqrt(var(...))."""
    return sqrt(var(input, dim, unbiased, keepdim, correction=correction))


def amax(input, dim=(), keepdim=False):
    """Max over dim (all dims when dim is () or None); ties share the gradient."""
    dims = normalize_dims("amax", input, None if dim == () else dim)
    return apply("max", (input,), {"dims": dims, "keepdim": bool(keepdim)})


def amin(input, dim=(), keepdim=False):
    """Min over dim (all dims when dim is () or None)."""
    dims = normalize_dims("amin", input, None if dim == () else dim)
    return apply("min", (input,), {"dims": dims, "keepdim": bool(keepdim)})


def _one_dim(op, t, dim) -> int:
    (d,) = normalize_dims(op, t, int(dim)) or (0,)
    return d


def argmax(input, dim=None, keepdim=False):
    """Index of the first max (over the flattened tensor when dim is None), int64."""
    d = None if dim is None else _one_dim("argmax", input, dim)
    return apply("argmax", (input,), {"dim": d, "keepdim": bool(keepdim)})


def argmin(input, dim=None, keepdim=False):
    """Index of the first min, int64."""
    d = None if dim is None else _one_dim("argmin", input, dim)
    return apply("argmin", (input,), {"dim": d, "keepdim": bool(keepdim)})


class MaxResult(tuple):
    """(values, indices), as PyTorch's torch.return_types.max."""

    @property
    def values(self):
        return self[0]

    @property
    def indices(self):
        return self[1]


def _select_reduce(name, input, dim, keepdim, other):
    if isinstance(other, Tensor):
        return (maximum if name == "max" else minimum)(input, other)
    if dim is None:
        return (amax if name == "max" else amin)(input)
    d = _one_dim(name, input, dim)
    idx = apply("arg" + name, (input,), {"dim": d, "keepdim": True})
    # The gradient goes to the selected index only, as PyTorch's max(dim) does.
    if input.ndim:
        hit = apply("eq", (arange_like(input, d), idx))
        picked = where(hit, input, _identity(name, input))
        values = apply(name, (picked,), {"dims": (d,), "keepdim": bool(keepdim)})
    else:
        values = apply(name, (input,), {"dims": (), "keepdim": False})  # a new tensor, not input
    if not keepdim and input.ndim:
        idx = squeeze(idx, d)
    return MaxResult((values, idx))


def _identity(name, t):
    kind = t._data.dtype.kind
    if kind == "f":
        return -math.inf if name == "max" else math.inf
    if kind == "b":
        return name != "max"
    info = np.iinfo(t._data.dtype)
    return int(info.min if name == "max" else info.max)


def arange_like(t, dim) -> Tensor:
    """int64 positions along `dim`, shaped to broadcast against t."""
    shape = [1] * t.ndim
    shape[dim] = t.shape[dim]
    return literal(np.arange(t.shape[dim], dtype=np.int64).reshape(shape))


def max(input, dim=None, keepdim=False, *, other=None):  # noqa: A001
    """max(): 0-d max; max(dim): (values, indices); max(other): elementwise maximum."""
    if isinstance(dim, Tensor):
        dim, other = None, dim
    return _select_reduce("max", input, dim, keepdim, other)


def min(input, dim=None, keepdim=False, *, other=None):  # noqa: A001
    """min(): 0-d min; min(dim): (values, indices); min(other): elementwise minimum."""
    if isinstance(dim, Tensor):
        dim, other = None, dim
    return _select_reduce("min", input, dim, keepdim, other)


def logsumexp(input, dim=None, keepdim=False):
    """log(sum(exp(input))) over dim, stable for large values and all -inf rows."""
    _need_float("logsumexp", input)
    dims = normalize_dims("logsumexp", input, dim)
    m = _shift(input, dims)
    m = where(abs(m) < math.inf, m, 0.0)  # an inf max would make inf - inf = nan
    total = apply("sum", (exp(input - m),), {"dims": dims, "keepdim": True})
    out = log(total) + m
    return out if keepdim else _squeeze_dims(out, dims)


def softmax(input, dim=None, dtype=None):
    """exp(x - max) / sum(exp(x - max)) along dim (one dim, as PyTorch)."""
    x = _softmax_input("softmax", input, dim, dtype)
    dims = normalize_dims("softmax", x, _one_dim("softmax", x, dim))  # () for a 0-d x
    e = exp(x - _shift(x, dims))
    return e / apply("sum", (e,), {"dims": dims, "keepdim": True})


def _shift(x, dims):
    """The detached max over dims (keepdim), or 0 when a reduced dim has size 0."""
    if _count(x, dims) == 0:
        return literal(np.zeros((), x._data.dtype))
    return amax(x.detach(), dims, keepdim=True)


def log_softmax(input, dim=None, dtype=None):
    """(x - max) - log(sum(exp(x - max))) along dim (accurate for large |x|, as PyTorch)."""
    x = _softmax_input("log_softmax", input, dim, dtype)
    dims = normalize_dims("log_softmax", x, _one_dim("log_softmax", x, dim))
    m = _shift(x, dims)
    shifted = x - where(abs(m) < math.inf, m, 0.0)  # an inf max would make inf - inf = nan
    return shifted - log(apply("sum", (exp(shifted),), {"dims": dims, "keepdim": True}))


def _softmax_input(op, input, dim, dtype):
    if dim is None:
        raise TypeError(f"{op}: pass dim= explicitly (implicit dim is deprecated in PyTorch)")
    if dtype is not None:
        return cast(input, to_np(dtype))
    return input if input._data.dtype.kind == "f" else cast(input, cd.DEFAULT_FLOAT)


def _need_float(op, t):
    if t._data.dtype.kind != "f":
        raise DTypeError(f"{op}(): expected a floating-point input, got {t.dtype} "
                         f"with shape {list(t.shape)}")


def _squeeze_dims(t, dims):
    shape = tuple(s for i, s in enumerate(t.shape) if i not in dims)
    return apply("reshape", (t,), {"shape": shape})


# ---- matmul ---------------------------------------------------------------------------


def matmul(input, other):
    """Matrix product with NumPy/PyTorch semantics for 1-D and batched inputs."""
    if isinstance(input, Tensor) and isinstance(other, Tensor):
        da, db = input._data, other._data
        if da.ndim >= 2 and db.ndim >= 2 and da.dtype is db.dtype and da.dtype.kind != "b":
            return run(_MATMUL, (input, other), (da, db), NO_ATTRS, input._rg or other._rg)
    a, b = as_operand(input, "matmul"), as_operand(other, "matmul")
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or not a.ndim or not b.ndim:
        raise ShapeError(f"matmul: both arguments need at least 1 dim, got {_desc(a)} "
                         f"and {_desc(b)}")
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else -1]:
        raise ShapeError(f"matmul: shapes cannot be multiplied: {_desc(a)} @ {_desc(b)}")
    a, b = promote("matmul", (a, b))
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    out = apply("matmul", (a2, b2))
    if a.ndim == 1 or b.ndim == 1:
        shape = out.shape[:-2] + ((out.shape[-2],) if a.ndim > 1 else ()) + (
            (out.shape[-1],) if b.ndim > 1 else ())
        out = out.reshape(shape)
    return out


mm = matmul
_MATMUL = REGISTRY["matmul"]
