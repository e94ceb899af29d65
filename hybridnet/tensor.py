"""The eager `Tensor`: a NumPy array plus autograd state and a link to its tape node.

Operators and core methods live here; the math (exp, softmax, reductions, shape
ops...) is in `hybridnet.functional` and bound as methods in `hybridnet._methods`.
"""

import numpy as np

from . import dtypes as hd
from ._state import STATE
from .dispatch import binary, unary


class Tensor:
    """An n-dimensional array with autograd, PyTorch-style.

    Build one with `hn.tensor(data)` or a factory (`hn.zeros`, `hn.randn`, ...).

    >>> x = hn.tensor([1.0, 2.0], requires_grad=True)     # doctest: +SKIP
    >>> (x * x).sum().backward(); x.grad                   # doctest: +SKIP
    tensor([2., 4.], dtype=hn.float32)
    """

    __slots__ = ("_data", "_rg", "_grad", "_node", "_vc", "__weakref__")
    __array_ufunc__ = None  # make NumPy defer to our reflected operators

    def __init__(self, data, dtype=None, requires_grad=False):
        from .creation import tensor
        t = tensor(data, dtype=dtype, requires_grad=requires_grad)
        self._data, self._rg, self._grad, self._node, self._vc = t._data, t._rg, None, None, None

    @classmethod
    def _wrap(cls, data, requires_grad=False, node=None):
        t = object.__new__(cls)
        t._data = data if data.__class__ is np.ndarray else _as_array(data)
        t._rg = requires_grad
        t._grad = None
        t._node = node
        t._vc = None
        return t

    # ---- attributes -------------------------------------------------------------------

    @property
    def shape(self) -> tuple:
        """The shape, as a tuple of ints."""
        return self._data.shape

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return self._data.ndim

    @property
    def dtype(self):
        """The element type (`hn.float32`, ...)."""
        return hd.BY_NP[self._data.dtype]

    @property
    def data(self) -> "Tensor":
        """The same values, detached from autograd (shares memory)."""
        return self.detach()

    @data.setter
    def data(self, value):
        arr = value._data if isinstance(value, Tensor) else np.asarray(value)
        self._data = arr
        self._node = None
        self._vc = None

    @property
    def grad(self):
        """The accumulated gradient (a Tensor) or None."""
        g = self._grad
        if STATE.recorders:
            _note_grad(self, g, False)
        return g

    @grad.setter
    def grad(self, value):
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"assigned grad must be a Tensor or None, got {type(value).__name__}")
        if STATE.recorders:
            _note_grad(self, value, True)
        self._grad = value

    @property
    def _version(self) -> int:
        """How many in-place updates this tensor (or a view sharing it) has had."""
        return 0 if self._vc is None else self._vc[0]

    @property
    def requires_grad(self) -> bool:
        """Whether gradients are computed for this tensor."""
        return self._rg

    @requires_grad.setter
    def requires_grad(self, flag: bool):
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Set requires_grad in place; only floating-point leaves may require grad."""
        if requires_grad and self._data.dtype.kind != "f":
            raise RuntimeError(f"only floating-point tensors can require gradients; this one "
                               f"is {self.dtype} with shape {list(self.shape)}")
        if not self.is_leaf and not requires_grad:
            raise RuntimeError("requires_grad can only be turned off on leaf tensors; "
                               "use .detach() for a non-leaf")
        if STATE.recorders:
            _note_untraceable("the call changes requires_grad of a tensor")
        self._rg = bool(requires_grad)
        if self._node is not None and self._node.op == "input":
            self._node.requires_grad = self._rg
        return self

    @property
    def grad_fn(self):
        """The tape node that produced this tensor, or None for leaves."""
        node = self._node
        if node is None or not node.requires_grad or node.op in ("input", "const"):
            return None
        return node

    @property
    def is_leaf(self) -> bool:
        """True for tensors not produced by a differentiable op (as in PyTorch)."""
        return self.grad_fn is None

    def numel(self) -> int:
        """Number of elements."""
        return self._data.size

    def size(self, dim=None):
        """The shape, or one dim's size."""
        return self._data.shape if dim is None else self._data.shape[dim]

    def dim(self) -> int:
        """Number of dims."""
        return self._data.ndim

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    def __hash__(self) -> int:
        return id(self)

    # ---- conversion -------------------------------------------------------------------

    def item(self):
        """The single value as a Python number."""
        if self._data.size != 1:
            raise ValueError(f"item(): a tensor with {self._data.size} elements "
                             f"(shape {list(self.shape)}) cannot be converted to a scalar")
        value = self._data.item()
        if STATE.recorders:
            _note_value(self, "item", value)
        return value

    def tolist(self):
        """Nested Python lists (a number for a 0-d tensor)."""
        if STATE.recorders:
            _note_untraceable("t.tolist() reads every value into Python")
        return self._data.tolist()

    def numpy(self) -> np.ndarray:
        """The values as an ndarray (a view, sharing memory)."""
        if self._rg:
            raise RuntimeError("Can't call numpy() on a Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
        if STATE.recorders:
            _note_untraceable("t.numpy() / np.asarray(t) hands the data to NumPy")
        return self._data

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        if dtype is not None and arr.dtype != dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self._data.size} values "
                               f"(shape {list(self.shape)}) is ambiguous")
        value = bool(self._data)
        if STATE.recorders:
            _note_value(self, "bool", value)
        return value

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self._data.dtype.kind not in "iu" or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be used as an index")
        return int(self.item())

    def detach(self) -> "Tensor":
        """The same values with no history (shares memory and version counter)."""
        from .dispatch import apply, version_counter
        if STATE.recorders:  # keep the dataflow visible to recording and tracing
            t = apply("detach", (self,))
        else:
            t = Tensor._wrap(self._data)
        t._vc = version_counter(self)
        return t

    def __repr__(self) -> str:
        body = np.array2string(self._data, separator=", ", precision=4, prefix="tensor(")
        extra = [f"dtype={self.dtype}"]
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{self.grad_fn.op}>")
        elif self._rg:
            extra.append("requires_grad=True")
        return f"tensor({body}, {', '.join(extra)})"

    # ---- operators --------------------------------------------------------------------

    def __add__(self, other):
        return binary("add", self, other)

    def __radd__(self, other):
        return binary("add", self, other)  # commutative: keeps the fast path

    def __sub__(self, other):
        return binary("sub", self, other)

    def __rsub__(self, other):
        return binary("sub", other, self)

    def __mul__(self, other):
        return binary("mul", self, other)

    def __rmul__(self, other):
        return binary("mul", self, other)  # commutative: keeps the fast path

    def __truediv__(self, other):
        return binary("div", self, other)

    def __rtruediv__(self, other):
        return binary("div", other, self)

    def __pow__(self, other):
        return binary("pow", self, other)

    def __rpow__(self, other):
        return binary("pow", other, self)

    def __matmul__(self, other):
        from .functional import matmul
        return matmul(self, other)

    def __rmatmul__(self, other):
        from .functional import matmul
        return matmul(other, self)

    def __neg__(self):
        return unary("neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return unary("abs", self)

    def __lt__(self, other):
        return binary("lt", self, other)

    def __le__(self, other):
        return binary("le", self, other)

    def __gt__(self, other):
        return binary("gt", self, other)

    def __ge__(self, other):
        return binary("ge", self, other)

    def __eq__(self, other):
        if not isinstance(other, (Tensor, int, float, bool, np.generic, np.ndarray)):
            return NotImplemented
        return binary("eq", self, other)

    def __ne__(self, other):
        if not isinstance(other, (Tensor, int, float, bool, np.generic, np.ndarray)):
            return NotImplemented
        return binary("ne", self, other)

    def __invert__(self):
        if self._data.dtype.kind != "b":
            raise TypeError(f"~ is only defined for bool tensors, got {self.dtype}")
        return binary("eq", self, False)

    def __and__(self, other):
        return _logical(self, other, "&")

    def __or__(self, other):
        return _logical(self, other, "|")

    # in-place operators
    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    def __getitem__(self, index):
        from .indexing import getitem
        return getitem(self, index)

    def __setitem__(self, index, value):
        from .indexing import setitem
        setitem(self, index, value)


def _as_array(data) -> np.ndarray:
    """0-d results (NumPy scalars) and array subclasses become plain ndarrays."""
    arr = np.asarray(data)
    return arr if arr.__class__ is np.ndarray else np.array(arr)


def _note_grad(t, value, write):
    from .capture import note_grad
    note_grad(t, value, write)


def _note_value(t, kind, value):
    from .capture import note_value
    note_value(t, kind, value)


def _note_untraceable(reason):
    from .capture import note_untraceable
    note_untraceable(reason)


def _logical(a, b, symbol):
    """Bool `&`/`|` as `where` (so they are recorded like every other op)."""
    from .dispatch import apply
    if not isinstance(b, Tensor):
        from .capture import literal
        b = literal(np.asarray(b))
    if a._data.dtype.kind != "b" or b._data.dtype.kind != "b":
        raise TypeError(f"{symbol} is only defined for bool tensors, got "
                        f"{a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    if symbol == "&":
        return apply("where", (a, b, np.bool_(False)))
    return apply("where", (a, np.bool_(True), b))


def _register_tensor_class():
    from . import dispatch
    dispatch.Tensor = Tensor


_register_tensor_class()
