"""hybridnet's dtypes: thin named wrappers over NumPy dtypes, spelled as PyTorch does."""

import numpy as np

from compiler import dtypes as _cd


class DType:
    """A tensor element type (`hn.float32`, ...); compares equal to the NumPy dtype."""

    __slots__ = ("name", "np", "is_floating_point", "itemsize")

    def __init__(self, name: str, np_dtype: np.dtype):
        self.name = name
        self.np = np_dtype
        self.is_floating_point = np_dtype.kind == "f"
        self.itemsize = np_dtype.itemsize

    def __repr__(self) -> str:
        return f"hn.{self.name}"

    def __str__(self) -> str:
        return f"hn.{self.name}"

    def __eq__(self, other) -> bool:
        if isinstance(other, DType):
            return other is self
        try:
            return np.dtype(other) == self.np
        except TypeError:
            return False

    def __hash__(self) -> int:
        return hash(self.np)


float32 = DType("float32", _cd.float32)
float64 = DType("float64", _cd.float64)
int32 = DType("int32", _cd.int32)
int64 = DType("int64", _cd.int64)
bool_ = DType("bool", _cd.bool_)

BY_NP = {d.np: d for d in (float32, float64, int32, int64, bool_)}


def to_np(dtype) -> np.dtype:
    """Normalize `dtype` (hn dtype, NumPy dtype or type, or name) to a supported NumPy dtype."""
    if isinstance(dtype, DType):
        return dtype.np
    if dtype is float:
        return _cd.float32
    if dtype is int:
        return _cd.int64
    if dtype is bool:
        return _cd.bool_
    try:
        npd = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}; use one of "
                        f"{', '.join(repr(d) for d in BY_NP.values())}") from None
    if npd not in BY_NP:
        raise TypeError(f"dtype {npd} is not supported; use one of "
                        f"{', '.join(repr(d) for d in BY_NP.values())}")
    return npd


def wrap(np_dtype: np.dtype) -> DType:
    """The hn dtype for a NumPy dtype."""
    return BY_NP[np_dtype]
