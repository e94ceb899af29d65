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
from runtime import heap as _heap

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
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    linspace,
    manual_seed,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    tensor,
    zeros,
    zeros_like,
)
from .device import accelerator, backends, cuda, device
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
from .tensor_ops import (
    argsort,
    bmm,
    cumsum,
    einsum,
    flip,
    gather,
    index_select,
    masked_fill,
    narrow,
    norm,
    roll,
    scatter_add,
    sort,
    take_along_dim,
    topk,
    tril,
    triu,
)
from .tensor_ops import t as _t
from .threads import (
    are_deterministic_algorithms_enabled,
    get_num_threads,
    set_num_threads,
    use_deterministic_algorithms,
)


def is_tensor(obj) -> bool:
    """True for a hybridnet Tensor."""
    return isinstance(obj, Tensor)


def numel(input) -> int:
    """The number of elements of `input`."""
    return input.numel()


def clone(input):
    """A copy of `input` that records (gradients flow back)."""
    return input.clone()


t = _t

bool = bool_  # noqa: A001  (PyTorch's spelling: hn.bool)
float = float32  # noqa: A001
double = float64
long = int64
int = int32  # noqa: A001

from . import (  # noqa: E402
    distributions,
    nn,
    onnx,
    optim,
    utils,  # noqa: E402
)
from .export_load import ExportError, LoadedFunction, export, load  # noqa: E402
from .jit import BenchmarkResult, ExplainReport, TracedFunction, benchmark, explain, trace

_blas.configure()  # BLAS threads only for large matrix products (see compiler/blas.py)
_heap.tune()  # malloc keeps freed memory instead of page-faulting it back (runtime/heap.py)

__version__ = "0.1.0"

__all__ = [
    "Tensor", "Graph", "DType", "OpError", "ShapeError", "DTypeError", "SerializationError",
    "tensor", "from_numpy", "zeros", "ones", "full", "empty", "zeros_like", "ones_like",
    "full_like", "rand", "randn", "randint", "arange", "linspace", "eye", "manual_seed",
    "float32", "float64", "int32", "int64", "bool", "no_grad", "enable_grad",
    "set_grad_enabled", "is_grad_enabled", "grad", "record", "graph_of", "save", "load_state",
    "set_num_threads", "get_num_threads", "use_deterministic_algorithms",
    "are_deterministic_algorithms_enabled", "onnx",
    "nn", "optim", "utils", "trace", "explain", "benchmark", "TracedFunction", "ExplainReport",
    "distributions",
    "BenchmarkResult", "export", "load", "ExportError", "LoadedFunction",
    "DType", "double", "long", "float", "int",
    "abs", "add", "amax", "amin", "argmax", "argmin", "clamp", "cos", "div", "erf", "exp",
    "gelu", "log", "log_softmax", "logsumexp", "matmul", "max", "maximum", "mean", "min",
    "minimum", "mm", "mul", "neg", "pow", "reciprocal", "relu", "rsqrt", "sigmoid", "sign",
    "silu", "sin", "softmax", "sqrt", "square", "std", "sub", "sum", "tanh", "var", "where",
    "broadcast_to", "cat", "chunk", "concat", "expand", "flatten", "permute", "reshape",
    "split", "squeeze", "stack", "transpose", "unsqueeze",
    "rand_like", "randn_like", "empty_like", "randint_like", "device", "cuda", "accelerator",
    "backends", "bmm", "einsum", "flip", "gather", "index_select", "masked_fill", "narrow",
    "norm", "roll", "scatter_add", "take_along_dim", "tril", "triu", "t", "is_tensor",
    "numel", "clone", "argsort", "cumsum", "sort", "topk",
]
