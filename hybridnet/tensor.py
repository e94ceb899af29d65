"""The eager `Tensor` type, at the bottom of the user layer: a NumPy array plus
autograd state and a link to its tape node.

This module holds the type itself (attributes, conversions, autograd flags) and the
one constructor, `make`, that every tensor is built with. It imports nothing above
`_state`: operators and math methods (`t + u`, `t.exp()`, `t[i]`, `t.backward()`)
are bound onto the type by `hybridnet._methods` once the op modules exist, and a
trace being recorded hears about reads through `STATE.tracer` (the hook table).
"""

import weakref

import numpy as np

from compiler import dtypes as cd

from . import dtypes as hd
from ._state import DATA_ALIASES, STATE, note_untraceable, note_value


class Tensor:
    """An n-dimensional array with autograd, PyTorch-style.

    Build one with `hn.tensor(data)` or a factory (`hn.zeros`, `hn.randn`, ...).

    >>> x = hn.tensor([1.0, 2.0], requires_grad=True)     # doctest: +SKIP
    >>> (x * x).sum().backward(); x.grad                   # doctest: +SKIP
    tensor([2., 4.], dtype=hn.float32)
    """

    __slots__ = ("_data", "_rg", "_grad", "_node", "_vc", "__weakref__")
    __array_ufunc__ = None  # make NumPy defer to our reflected operators

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
        if not STATE.recorders:
            return self.detach()
        grad, STATE.grad = STATE.grad, False  # (no new autograd leaf for an updated tensor)
        try:
            alias = self.detach()
        finally:
            STATE.grad = grad
        key = id(alias)
        DATA_ALIASES[key] = (weakref.ref(alias, lambda _: DATA_ALIASES.pop(key, None)),
                             weakref.ref(self))
        return alias

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
        if STATE.tracer is not None:
            STATE.tracer.note_grad(self, g, False)
        return g

    @grad.setter
    def grad(self, value):
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"assigned grad must be a Tensor or None, got {type(value).__name__}")
        if STATE.tracer is not None:
            STATE.tracer.note_grad(self, value, True)
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
            note_untraceable("the call changes requires_grad of a tensor")
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
            note_value(self, "item", value)
        return value

    def tolist(self):
        """Nested Python lists (a number for a 0-d tensor)."""
        if STATE.recorders:
            note_untraceable("t.tolist() reads every value into Python")
        return self._data.tolist()

    def numpy(self) -> np.ndarray:
        """The values as an ndarray (a view, sharing memory)."""
        if self._rg:
            raise RuntimeError("Can't call numpy() on a Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
        if STATE.recorders:
            note_untraceable("t.numpy() / np.asarray(t) hands the data to NumPy")
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
            note_value(self, "bool", value)
        return value

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self._data.dtype.kind not in "iu" or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be used as an index")
        return int(self.item())

    def __repr__(self) -> str:
        if STATE.recorders:  # (print, str, f-strings: the text holds the values)
            note_untraceable("the call formats a tensor's values as text (print, str, "
                             "repr, an f-string)")
        body = np.array2string(self._data, separator=", ", precision=4, prefix="tensor(")
        extra = [f"dtype={self.dtype}"]
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{self.grad_fn.op}>")
        elif self._rg:
            extra.append("requires_grad=True")
        return f"tensor({body}, {', '.join(extra)})"


_new = object.__new__


def make(data: np.ndarray, requires_grad: bool = False, node=None) -> Tensor:
    """The one tensor constructor: a Tensor around ndarray `data` (not copied)."""
    t = _new(Tensor)
    t._data = data
    t._rg = requires_grad
    t._grad = None
    t._node = node
    t._vc = None
    return t


def init_fields(t, data: np.ndarray, requires_grad: bool = False) -> None:
    """Fill the fields of a tensor Python allocated (`Tensor(...)`, `Parameter(...)`), as
    `make` fills them (keep the two in step)."""
    t._data = data
    t._rg = requires_grad
    t._grad = None
    t._node = None
    t._vc = None


def wrap(data) -> Tensor:
    """A tensor around an array computed outside the op set (a leaf, no history).

    While a call is traced the trace hears of it (`note_created`): a value it cannot
    replay unless it is a literal."""
    t = make(data if data.__class__ is np.ndarray else _as_array(data))
    if STATE.tracer is not None:
        STATE.tracer.note_created(t)
    return t


def literal(data) -> Tensor:
    """A tensor holding a constant built from literals (safe to bake into a trace)."""
    t = make(data if data.__class__ is np.ndarray else _as_array(data))
    if STATE.tracer is not None:
        STATE.tracer.note_literal(t)
    return t


def version_counter(t) -> list:
    """The tensor's shared version counter, created on first use."""
    vc = t._vc
    if vc is None:
        vc = t._vc = [0]
    return vc


def share_version(t, base) -> Tensor:
    """`t`, given base's version counter when its array is a view of base's (NumPy
    decides): an in-place update through either is then seen by both."""
    if np.may_share_memory(t._data, base._data):
        t._vc = version_counter(base)
    return t


def _as_array(data) -> np.ndarray:
    """0-d results (NumPy scalars) and array subclasses become plain ndarrays."""
    arr = np.asarray(data)
    return arr if arr.__class__ is np.ndarray else np.array(arr)


def as_array(data, dtype=None) -> np.ndarray:
    """A new ndarray from `data` with hybridnet's default dtypes: Python floats give
    float32, ints int64, bools bool; NumPy input keeps its (supported) dtype."""
    if dtype is not None and not isinstance(data, Tensor):
        try:
            return np.array(data, dtype=hd.to_np(dtype))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"tensor: cannot build a {dtype} tensor from "
                            f"{type(data).__name__}: {exc}") from None
    if isinstance(data, Tensor):
        return data._data.copy()
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.array(data, copy=True)
        if arr.dtype not in hd.BY_NP:
            raise TypeError(f"tensor: NumPy dtype {arr.dtype} is not supported; use one of "
                            f"{', '.join(repr(d) for d in hd.BY_NP.values())}")
        return arr
    arr = np.array(data)
    kind = arr.dtype.kind
    if kind == "f":
        return arr.astype(cd.DEFAULT_FLOAT)
    if kind in "iu":
        return arr.astype(cd.int64)
    if kind == "b":
        return arr
    raise TypeError(f"tensor: cannot build a tensor from {type(data).__name__} "
                    f"(NumPy sees dtype {arr.dtype}); pass numbers, nested lists or arrays")


