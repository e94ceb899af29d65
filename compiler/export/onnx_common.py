"""Small helpers the ONNX converter modules share (compiler.export.onnx_export and
compiler.export.onnx_more): dtypes and dim normalization."""

import numpy as np

_BOOL, _I32, _I64 = np.dtype(np.bool_), np.dtype(np.int32), np.dtype(np.int64)


def _norm(dim: int, ndim: int) -> int:
    return dim % ndim if ndim else 0


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f"


def _is_bool(dtype) -> bool:
    return np.dtype(dtype) == _BOOL
