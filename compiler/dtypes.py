"""Dtype categories and PyTorch's type-promotion rules, on NumPy dtypes.

PyTorch promotes by category (bool < integer < floating) and lets a higher
category win regardless of size: int64 + float32 -> float32 (NumPy would say
float64). Zero-dim tensors and Python scalars only raise the category, never the
size, of dimensioned operands.
"""

import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

SUPPORTED = (float32, float64, int32, int64, bool_)
DEFAULT_FLOAT = float32
_CATEGORY = {bool_: 0, int32: 1, int64: 1, float32: 2, float64: 2}


def category(dtype: np.dtype) -> int:
    """0 for bool, 1 for integers, 2 for floating point."""
    return _CATEGORY[dtype]


def is_floating(dtype: np.dtype) -> bool:
    """True for float32 and float64."""
    return dtype.kind == "f"


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype:
    """Promote two dtypes as torch.promote_types does."""
    if a == b:
        return a
    ca, cb = _CATEGORY[a], _CATEGORY[b]
    if ca != cb:
        return a if ca > cb else b
    return np.promote_types(a, b)


def scalar_dtype(value) -> np.dtype:
    """The dtype a Python scalar takes: bool, int64 or the default float."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return int64
    return DEFAULT_FLOAT


def _combine(higher, lower):
    if higher is None:
        return lower
    if lower is None:
        return higher
    if is_floating(higher):
        return higher
    if higher == bool_ or is_floating(lower):
        return promote_types(higher, lower)
    return higher


def result_type(operands) -> np.dtype:
    """Result dtype for `operands`, each a (dtype, priority) pair.

    priority 2: tensor with ndim > 0; 1: zero-dim tensor; 0: Python scalar.
    """
    best = [None, None, None]
    for dtype, prio in operands:
        cur = best[prio]
        best[prio] = dtype if cur is None else promote_types(cur, dtype)
    return _combine(best[2], _combine(best[1], best[0]))


def priority(ndim: int) -> int:
    """A tensor operand's promotion priority: 2 with dims, 1 for 0-d (0: Python scalars)."""
    return 2 if ndim else 1


def with_scalar(dtype: np.dtype, value) -> np.dtype:
    """Result dtype of a tensor of `dtype` with a Python scalar (PyTorch: the scalar's
    category wins only when it is higher)."""
    kind = dtype.kind
    if kind == "f" or isinstance(value, bool):
        return dtype
    if kind in "iu":
        return dtype if isinstance(value, int) else DEFAULT_FLOAT
    return scalar_dtype(value)  # bool tensor with an int or float scalar
