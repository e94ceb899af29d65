"""The rest of the PyTorch tensor surface real scripts use, composed of primitives:
conversions (`to`, `cpu`, `type`), constructors on a tensor (`new_zeros`, ...),
selection (`narrow`, `masked_fill`, `gather`, `scatter_add`, `index_select`),
rearrangement (`flip`, `roll`, `repeat`, `tile`, `tril`, `triu`), `norm`, products
(`mm`, `bmm`, `t`) and `einsum` (hybridnet.einsum). Each records, differentiates and
traces like any other composition; index tables are constants built per shape.
"""

import builtins
import math

import numpy as np

from compiler.errors import DTypeError, ShapeError

from . import creation
from . import functional as F
from .device import CPU, check_device
from .device import device as Device
from .dispatch import apply
from .shape import _dim, cast, reshape, to
from .tensor import Tensor, literal


def _desc(t) -> str:
    return f"{t.dtype}{list(t.shape)}"


# ---- conversions ----------------------------------------------------------------------

_TYPE_NAMES = {"FloatTensor": "float32", "DoubleTensor": "float64", "LongTensor": "int64",
               "IntTensor": "int32", "BoolTensor": "bool"}


def parse_to(args, kwargs):
    """(device, dtype, copy) from Tensor.to's PyTorch signatures."""
    dev, dt = kwargs.pop("device", None), kwargs.pop("dtype", None)
    copy = bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            dt = a.dtype
        elif isinstance(a, Device) or (isinstance(a, str) and a.split(":")[0] in
                                        ("cpu", "cuda", "mps", "xpu", "meta")):
            dev = a
        elif isinstance(a, int) and not isinstance(a, bool):
            dev = a
        elif isinstance(a, bool) or a is None:
            continue  # (non_blocking, copy given positionally)
        else:
            dt = a
    return dev, dt, copy


def to_(self, *args, **kwargs):
    """`to(dtype)`, `to(device)`, `to(device, dtype)`, `to(other)`: the CPU is the only
    device; the same tensor when nothing changes (unless copy=True)."""
    dev, dt, copy = parse_to(args, dict(kwargs))
    check_device(dev, "to")
    out = self if dt is None else to(self, dt)
    return out.clone() if copy and out is self else out


def cpu(self):
    """The tensor itself: it is on the CPU already."""
    return self


def cuda(self, *args, **kwargs):
    """No CUDA here: raises, saying so."""
    check_device("cuda", "cuda")


def device_of(self):
    """The CPU, where every hybridnet tensor lives."""
    return CPU


def type_(self, dtype=None, non_blocking=False, **kwargs):
    """The type name (`'hybridnet.FloatTensor'`) with no argument, else a conversion to
    `dtype` (an hn dtype or a name like 'torch.DoubleTensor')."""
    if dtype is None:
        rev = {v: k for k, v in _TYPE_NAMES.items()}
        return f"hybridnet.{rev[self._data.dtype.name if self._data.dtype.kind != 'b' else 'bool']}"
    if isinstance(dtype, str):
        short = dtype.rsplit(".", 1)[-1]
        if short in _TYPE_NAMES:
            dtype = _TYPE_NAMES[short]
    return to(self, dtype)


def half(self):
    """float16 is not a hybridnet dtype: raises, saying what to use."""
    raise DTypeError(f"half: float16 tensors are not supported ({_desc(self)}); use float32")


def format_(self, spec: str) -> str:
    """format(t, spec): a one-element tensor formats as its number (`'{:+.2f}'`)."""
    if self._data.size == 1 and spec:
        return format(self.item(), spec)
    return format(str(self), spec)


# ---- constructors from a tensor -------------------------------------------------------


def _like_kwargs(self, dtype, device, requires_grad):
    check_device(device, "new tensor")
    return {"dtype": dtype if dtype is not None else self.dtype, "requires_grad": requires_grad}


def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
    """Zeros of `size` with this tensor's dtype (by default)."""
    return creation.zeros(*size, **_like_kwargs(self, dtype, device, requires_grad))


def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
    """Ones of `size` with this tensor's dtype (by default)."""
    return creation.ones(*size, **_like_kwargs(self, dtype, device, requires_grad))


def new_empty(self, *size, dtype=None, device=None, requires_grad=False):
    """An (zero-filled) tensor of `size` with this tensor's dtype (by default)."""
    return creation.zeros(*size, **_like_kwargs(self, dtype, device, requires_grad))


def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
    """`fill_value` in `size` with this tensor's dtype (by default)."""
    return creation.full(size, fill_value, **_like_kwargs(self, dtype, device, requires_grad))


def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    """A new tensor from `data` with this tensor's dtype (by default)."""
    return creation.tensor(data, **_like_kwargs(self, dtype, device, requires_grad))


# ---- products -------------------------------------------------------------------------


def t(input):
    """Transpose of a tensor of at most 2 dims."""
    if input.ndim > 2:
        raise ShapeError(f"t: expects a tensor with <= 2 dimensions, but got {_desc(input)}; "
                         "use transpose(dim0, dim1) or .mT")
    return input if input.ndim < 2 else input.permute(1, 0)


def mm(input, mat2):
    """Product of two matrices (2-D only, as PyTorch's mm)."""
    if input.ndim != 2 or mat2.ndim != 2:
        raise ShapeError(f"mm: both arguments must be matrices, got {_desc(input)} and "
                         f"{_desc(mat2)}")
    return F.matmul(input, mat2)


def bmm(input, mat2):
    """Batched product of (b, n, m) and (b, m, p)."""
    if input.ndim != 3 or mat2.ndim != 3 or input.shape[0] != mat2.shape[0]:
        raise ShapeError(f"bmm: expected 3-D tensors with the same batch size, got "
                         f"{_desc(input)} and {_desc(mat2)}")
    return F.matmul(input, mat2)


def matrix_trace(input):
    """The sum of the main diagonal of a 2-D tensor (PyTorch's torch.trace(input); given
    a function or module, hn.trace is the JIT instead)."""
    if input.ndim != 2:
        raise ShapeError(f"trace: expected a matrix (2-D), got {_desc(input)}")
    n, m = input.shape
    diag = np.arange(min(n, m), dtype=np.int64) * (m + 1)
    x = input if input._data.dtype.kind in "fc" or input._data.dtype == np.int64 else \
        cast(input, np.dtype(np.int64))
    return F.sum(apply("take", (reshape(x, -1), literal(diag)), {"dim": 0}))


# ---- selection ------------------------------------------------------------------------


def narrow(input, dim, start, length):
    """Elements start..start+length of `dim` (a view)."""
    d = _dim("narrow", input, int(dim))
    size = input.shape[d]
    start = int(start) + (size if int(start) < 0 else 0)
    if not (0 <= start <= size and 0 <= int(length) and start + int(length) <= size):
        raise IndexError(f"narrow: start {start} and length {length} are out of range for "
                         f"dim {d} of {_desc(input)}")
    index = tuple((0, s, 1) if i != d else (start, start + int(length), 1)
                  for i, s in enumerate(input.shape))
    return apply("slice", (input,), {"index": index})


def masked_fill(input, mask, value):
    """`value` where the bool `mask` (broadcast to input) is True, else input."""
    if not isinstance(mask, Tensor) or mask._data.dtype.kind != "b":
        raise DTypeError(f"masked_fill: mask must be a bool tensor, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if isinstance(value, Tensor):
        if value.ndim:
            raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got "
                             f"{_desc(value)}")
        value = cast(value, input._data.dtype)
    else:
        value = input._data.dtype.type(value)
    out = apply("where", (mask, value, input))
    if out.shape != input.shape:
        raise ShapeError(f"masked_fill: mask {_desc(mask)} does not broadcast to input "
                         f"{_desc(input)}")
    return out


def masked_fill_(input, mask, value):
    """masked_fill in place."""
    return input.copy_(masked_fill(input, mask, value))


def _flat_positions(op, input, dim, index):
    """Flat positions in `input` (C order) that `index` (same ndim) picks along `dim`."""
    if not isinstance(index, Tensor) or index._data.dtype.kind not in "iu":
        raise DTypeError(f"{op}: index must be an integer tensor, got "
                         f"{getattr(index, 'dtype', type(index).__name__)}")
    d = _dim(op, input, int(dim))
    if index.ndim != input.ndim or any(i > s for k, (i, s) in
                                       enumerate(zip(index.shape, input.shape)) if k != d):
        raise ShapeError(f"{op}: index {_desc(index)} must have the dims of input "
                         f"{_desc(input)} and be no larger outside dim {d}")
    size = input.shape[d]
    if index.numel() and bool(((index < 0) | (index >= size)).any()):
        bad = index._data[(index._data < 0) | (index._data >= size)].ravel()[0]
        raise IndexError(f"{op}: index {bad} is out of bounds for dim {d} with size {size}")
    strides = [math.prod(input.shape[k + 1:]) for k in range(input.ndim)]
    base = np.zeros(index.shape, np.int64)
    for k, n in enumerate(index.shape):
        if k != d:
            shape = [1] * index.ndim
            shape[k] = n
            base = base + (np.arange(n, dtype=np.int64) * strides[k]).reshape(shape)
    return cast(index, np.dtype(np.int64)) * strides[d] + literal(base)


def gather(input, dim, index):
    """out[i][j] = input[index[i][j]][j] (dim 0), as PyTorch's gather."""
    pos = _flat_positions("gather", input, dim, index)
    return apply("take", (reshape(input, -1), pos), {"dim": 0})


def take_along_dim(input, indices, dim):
    """gather with input and indices broadcast against each other in every dim but
    `dim` (NumPy's take_along_axis, PyTorch's take_along_dim)."""
    if indices.ndim != input.ndim:
        raise ShapeError(f"take_along_dim: input {_desc(input)} and indices "
                         f"{_desc(indices)} must have the same number of dims")
    d = _dim("take_along_dim", input, int(dim))
    try:
        shape = np.broadcast_shapes(*[tuple(1 if k == d else n for k, n in enumerate(t.shape))
                                      for t in (input, indices)])
    except ValueError:
        raise ShapeError(f"take_along_dim: input {_desc(input)} and indices {_desc(indices)} "
                         f"do not broadcast outside dim {d}") from None
    x = input.expand(*[input.shape[k] if k == d else n for k, n in enumerate(shape)])
    idx = indices.expand(*[indices.shape[k] if k == d else n for k, n in enumerate(shape)])
    return gather(x, d, idx)


def scatter_add(input, dim, index, src):
    """A copy of input with src[i][j] added at [index[i][j]][j] (dim 0)."""
    pos = _flat_positions("scatter_add", input, dim, index)
    if src.ndim != index.ndim or any(s < i for s, i in zip(src.shape, index.shape)):
        raise ShapeError(f"scatter_add: src {_desc(src)} must cover index {_desc(index)}")
    if src.shape != index.shape:
        src = apply("slice", (src,), {"index": tuple((0, n, 1) for n in index.shape)})
    src = cast(src, input._data.dtype)
    added = apply("scatter_add", (reshape(src, -1), reshape(pos, -1)),
                  {"dim": 0, "size": input.numel()})
    return input + reshape(added, *input.shape)


def index_select(input, dim, index):
    """The entries of `index` (1-D integers) along `dim`."""
    if not isinstance(index, Tensor) or index.ndim > 1 or index._data.dtype.kind not in "iu":
        raise ShapeError(f"index_select: index must be a 0-D or 1-D integer tensor, got "
                         f"{getattr(index, 'shape', index)!r}")
    d = _dim("index_select", input, int(dim))
    if index.numel() and bool((index < 0).any()):
        raise IndexError(f"index_select: index {int(index._data.min())} is out of range for "
                         f"dim {d} of {_desc(input)} (negative indices are not allowed)")
    return apply("take", (input, reshape(index, -1)), {"dim": d})


# ---- rearrangement --------------------------------------------------------------------


def _along(input, d, positions):
    return apply("take", (input, literal(np.asarray(positions, dtype=np.int64))), {"dim": d})


def flip(input, dims):
    """Reverse the order of elements along `dims`."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = input
    for d in dims:
        d = _dim("flip", input, d)
        out = _along(out, d, np.arange(input.shape[d] - 1, -1, -1))
    return out


def roll(input, shifts, dims=None):
    """Shift elements along `dims` circularly (flattened when dims is None)."""
    if dims is None:
        return reshape(roll(reshape(input, -1), shifts, 0), *input.shape)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise ValueError(f"roll: shifts {shifts} and dims {dims} must have the same length")
    out = input
    for s, d in zip(shifts, dims):
        d = _dim("roll", input, d)
        n = input.shape[d]
        if n:
            out = _along(out, d, (np.arange(n) - int(s)) % n)
    return out


def repeat(input, *sizes):
    """Tile the tensor `sizes` times along each dim (leading new dims allowed)."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) \
        else tuple(int(s) for s in sizes)
    if len(sizes) < input.ndim:
        raise ValueError(f"repeat: {len(sizes)} repeat counts for {_desc(input)}; give at "
                         "least one per dim")
    shape = (1,) * (len(sizes) - input.ndim) + tuple(input.shape)
    x = reshape(input, *[v for s in shape for v in (1, s)])
    x = x.expand(*[v for r, s in zip(sizes, shape) for v in (r, s)])
    return reshape(x, *[r * s for r, s in zip(sizes, shape)])


def tile(input, dims):
    """repeat with missing leading counts taken as 1 (NumPy's tile)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return repeat(input, *((1,) * (input.ndim - len(dims)) + dims))


def _triangle(op, input, diagonal, upper):
    if input.ndim < 2:
        raise ShapeError(f"{op}: input must have at least 2 dims, got {_desc(input)}")
    n, m = input.shape[-2:]
    keep = np.triu(np.ones((n, m), bool), diagonal) if upper else \
        np.tril(np.ones((n, m), bool), diagonal)
    return apply("where", (literal(keep), input, input._data.dtype.type(0)))


def tril(input, diagonal=0):
    """The lower triangle (j <= i + diagonal) of the last two dims; zeros elsewhere."""
    return _triangle("tril", input, int(diagonal), False)


def triu(input, diagonal=0):
    """The upper triangle (j >= i + diagonal) of the last two dims; zeros elsewhere."""
    return _triangle("triu", input, int(diagonal), True)


# ---- scans and orderings --------------------------------------------------------------


SortResult = F.MaxResult  # (values, indices), as torch.return_types.sort / topk


def cumsum(input, dim, dtype=None):
    """Running sum along `dim`; bool and integer inputs sum as int64 (as PyTorch)."""
    x = input
    if dtype is not None:
        x = to(x, dtype)
    elif x._data.dtype.kind in "biu" and x._data.dtype != np.int64:
        x = cast(x, np.dtype(np.int64))
    d = _dim("cumsum", x, int(dim)) if x.ndim else 0
    return apply("cumsum", (x,), {"dim": d})


def argsort(input, dim=-1, descending=False, stable=False):
    """The indices that sort `dim` (stable: equal values keep their order; NaN is
    the largest value)."""
    d = _dim("argsort", input, int(dim)) if input.ndim else 0
    return apply("argsort", (input,), {"dim": d, "descending": bool(descending)})


def sort(input, dim=-1, descending=False, stable=False):
    """(values, indices) sorted along `dim`; values carry the gradient."""
    idx = argsort(input, dim, descending)
    if not input.ndim:
        return SortResult((input.clone(), idx))
    return SortResult((gather(input, dim, idx), idx))


def topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002  (PyTorch's name)
    """The k largest (or smallest) entries along `dim`, as (values, indices)."""
    d = _dim("topk", input, int(dim)) if input.ndim else 0
    size = input.shape[d] if input.ndim else 1
    if not 0 <= int(k) <= size:
        raise IndexError(f"topk: k={k} is out of range for dim {d} of {_desc(input)}")
    idx = argsort(input, d, largest)
    if input.ndim:
        idx = apply("slice", (idx,), {"index": tuple((0, int(k) if i == d else n, 1)
                                                     for i, n in enumerate(idx.shape))})
        return SortResult((gather(input, d, idx), idx))
    return SortResult((input.clone(), idx))


# ---- logical reductions ---------------------------------------------------------------


def any_(input, dim=None, keepdim=False):
    """True where any element (over `dim`, or all) is non-zero; a bool tensor."""
    return F.sum(input != 0, dim, keepdim) > 0


def all_(input, dim=None, keepdim=False):
    """True where every element (over `dim`, or all) is non-zero; a bool tensor."""
    return F.sum(input == 0, dim, keepdim) == 0


# ---- norms ----------------------------------------------------------------------------


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """Vector p-norm over `dim` (all elements by default): p = 2 / 'fro', 1, inf, -inf,
    0 (count of non-zeros) or any other number; the gradient at 0 is 0, as PyTorch's."""
    x = input if dtype is None else to(input, dtype)
    if x._data.dtype.kind != "f":
        raise DTypeError(f"norm: expected a floating-point input, got {_desc(input)}")
    if p in ("fro", 2, 2.0):
        total = F.sum(x * x, dim, keepdim)
        safe = F.where(total > 0, total, 1.0)
        return F.where(total > 0, F.sqrt(safe), 0.0)
    a = F.abs(x)
    if p in (math.inf, "inf"):
        return F.amax(a, () if dim is None else dim, keepdim)
    if p == -math.inf:
        return F.amin(a, () if dim is None else dim, keepdim)
    if p == 0:
        return F.sum(cast(a != 0, x._data.dtype), dim, keepdim)
    if p == 1:
        return F.sum(a, dim, keepdim)
    if isinstance(p, str):
        raise ValueError(f"norm: p={p!r} is not supported (use a number or 'fro')")
    total = F.sum(F.pow(a, float(p)), dim, keepdim)
    safe = F.where(total > 0, total, 1.0)
    return F.where(total > 0, F.pow(safe, 1.0 / float(p)), 0.0)


# ---- einsum ---------------------------------------------------------------------------


def einsum(equation, *operands):
    """Einstein summation for the common cases: any number of operands, each index at
    most once per operand (no diagonals), '...' not supported; pairwise products go
    through matmul."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    if "." in eq:
        raise NotImplementedError("einsum: '...' is not supported yet; write the dims out")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} operand terms in {equation!r} for "
                         f"{len(operands)} operands")
    for term, x in zip(terms, operands):
        if len(term) != x.ndim or len(set(term)) != len(term) or not term.isalpha():
            raise ValueError(f"einsum: term {term!r} does not fit operand {_desc(x)} (one "
                             "letter per dim, no letter twice)")
    if not arrow:
        counts = {c: lhs.count(c) for c in lhs if c.isalpha()}
        out = "".join(sorted(c for c, n in counts.items() if n == 1))
    sizes = {}
    for term, x in zip(terms, operands):
        for c, n in zip(term, x.shape):
            if sizes.setdefault(c, n) != n:
                raise ShapeError(f"einsum: index {c!r} has sizes {sizes[c]} and {n}")
    term, acc = terms[0], operands[0]
    for k in range(1, len(operands)):
        later = set(out).union(*terms[k + 1:])
        term, acc = _pair(term, acc, terms[k], operands[k], later)
    return _finish(term, acc, out)


def _reduce_only(term, x, keep):
    """Sum out the letters of `term` not in `keep`."""
    gone = [i for i, c in enumerate(term) if c not in keep]
    if gone:
        x = F.sum(x, tuple(gone))
        term = "".join(c for c in term if c in keep)
    return term, x


def _pair(ta, a, tb, b, later):
    """The einsum of two terms keeping the letters in `later` (batch, left, right)."""
    ta, a = _reduce_only(ta, a, later | set(tb))
    tb, b = _reduce_only(tb, b, later | set(ta))
    batch = [c for c in ta if c in tb and c in later]
    contract = [c for c in ta if c in tb and c not in later]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    size = {c: n for c, n in zip(ta + tb, tuple(a.shape) + tuple(b.shape))}

    def prod(cs):
        return math.prod(size[c] for c in cs)
    a = reshape(a.permute(*[ta.index(c) for c in batch + left + contract]),
                prod(batch), prod(left), prod(contract))
    b = reshape(b.permute(*[tb.index(c) for c in batch + contract + right]),
                prod(batch), prod(contract), prod(right))
    res = F.matmul(a, b)
    term = "".join(batch + left + right)
    return term, reshape(res, *[size[c] for c in term])


def _finish(term, x, out):
    term, x = _reduce_only(term, x, set(out))
    if builtins.set(out) - set(term):
        raise ValueError(f"einsum: output letters {out!r} must appear in the inputs")
    return x.permute(*[term.index(c) for c in out]) if out else x


# ---- binding --------------------------------------------------------------------------

METHODS = {
    "to": to_, "cpu": cpu, "cuda": cuda, "type": type_, "half": half, "__format__": format_,
    "new_zeros": new_zeros, "new_ones": new_ones, "new_empty": new_empty,
    "new_full": new_full, "new_tensor": new_tensor, "t": t, "mm": mm, "bmm": bmm,
    "narrow": narrow, "masked_fill": masked_fill, "masked_fill_": masked_fill_,
    "gather": gather, "take_along_dim": take_along_dim, "scatter_add": scatter_add,
    "index_select": index_select, "flip": flip, "roll": roll, "repeat": repeat,
    "tile": tile, "tril": tril, "triu": triu, "norm": norm, "any": any_, "all": all_,
    "cumsum": cumsum, "argsort": argsort, "sort": sort, "topk": topk,
    "trace": matrix_trace, "ndimension": lambda self: self.ndim,
    "nelement": lambda self: self.numel(),
    "reshape_as": lambda self, other: reshape(self, *other.shape),
    "is_floating_point": lambda self: self._data.dtype.kind == "f",
    "element_size": lambda self: self._data.dtype.itemsize,
}


def bind(publish):
    """Bind the methods onto Tensor with `publish(name, fn)`; `.device` as a property."""
    for name, fn in METHODS.items():
        publish(name, fn)
    Tensor.device = property(device_of, doc="The device: always the CPU.")
    Tensor.is_cuda = property(lambda self: False, doc="False: no CUDA here.")
