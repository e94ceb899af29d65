"""hybridnet: define-by-run neural networks whose autograd tape is a compilable IR.

>>> import hybridnet as hn
>>> x = hn.tensor([1.0, 2.0, 3.0], requires_grad=True)
>>> y = (x * x).sum()
>>> y.backward()
>>> x.grad.tolist()
[2.0, 4.0, 6.0]
"""

from compiler import blas as _blas
from compiler.errors import DTypeError, OpError, ShapeError
from compiler.ir import Graph

from . import _methods  # noqa: F401  (binds Tensor methods)
from .autograd import (
                       enable_grad,
                       grad,
                       graph_of,
                       is_grad_enabled,
                       no_grad,
                       record,
                       set_grad_enabled,
)
from .creation import (
                       arange,
                       empty,
                       eye,
                       from_numpy,
                       full,
                       full_like,
                       linspace,
                       manual_seed,
                       ones,
                       ones_like,
                       rand,
                       randint,
                       randn,
                       tensor,
                       zeros,
                       zeros_like,
)
from .dtypes import DType, bool_, float32, float64, int32, int64
from .functional import (
                       abs,
                       add,
                       amax,
                       amin,
                       argmax,
                       argmin,
                       clamp,
                       cos,
                       div,
                       erf,
                       exp,
                       gelu,
                       log,
                       log_softmax,
                       logsumexp,
                       matmul,
                       max,
                       maximum,
                       mean,
                       min,
                       minimum,
                       mm,
                       mul,
                       neg,
                       pow,
                       reciprocal,
                       relu,
                       rsqrt,
                       sigmoid,
                       sign,
                       silu,
                       sin,
                       softmax,
                       sqrt,
                       square,
                       std,
                       sub,
                       sum,
                       tanh,
                       var,
                       where,
)
from .serialize import SerializationError, load_state, save
from .shape import (
                       broadcast_to,
                       cat,
                       chunk,
                       concat,
                       expand,
                       flatten,
                       permute,
                       reshape,
                       split,
                       squeeze,
                       stack,
                       transpose,
                       unsqueeze,
)
from .tensor import Tensor

bool = bool_  # noqa: A001  (PyTorch's spelling: hn.bool)
float = float32  # noqa: A001
double = float64
long = int64
int = int32  # noqa: A001

from . import nn, optim  # noqa: E402
from .export_load import ExportError, LoadedFunction, export, load  # noqa: E402
from .jit import BenchmarkResult, ExplainReport, TracedFunction, benchmark, explain, trace

_blas.configure()  # BLAS threads only for large matrix products (see compiler/blas.py)

__version__ = "0.1.0"

__all__ = [
    "Tensor", "Graph", "DType", "OpError", "ShapeError", "DTypeError", "SerializationError",
    "tensor", "from_numpy", "zeros", "ones", "full", "empty", "zeros_like", "ones_like",
    "full_like", "rand", "randn", "randint", "arange", "linspace", "eye", "manual_seed",
    "float32", "float64", "int32", "int64", "bool", "no_grad", "enable_grad",
    "set_grad_enabled", "is_grad_enabled", "grad", "record", "graph_of", "save", "load_state",
    "nn", "optim", "trace", "explain", "benchmark", "TracedFunction", "ExplainReport",
    "BenchmarkResult", "export", "load", "ExportError", "LoadedFunction",
    "DType", "double", "long", "float", "int",
    "abs", "add", "amax", "amin", "argmax", "argmin", "clamp", "cos", "div", "erf", "exp",
    "gelu", "log", "log_softmax", "logsumexp", "matmul", "max", "maximum", "mean", "min",
    "minimum", "mm", "mul", "neg", "pow", "reciprocal", "relu", "rsqrt", "sigmoid", "sign",
    "silu", "sin", "softmax", "sqrt", "square", "std", "sub", "sum", "tanh", "var", "where",
    "broadcast_to", "cat", "chunk", "concat", "expand", "flatten", "permute", "reshape",
    "split", "squeeze", "stack", "transpose", "unsqueeze",
]
