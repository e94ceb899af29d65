"""Flatten nested Python containers of tensors into (leaves, spec) and back."""

import collections

import numpy as np

from ..nn.module import Module
from ..tensor import Tensor, version_counter

_STATIC = (int, float, bool, str, bytes, type(None))
_DICTS = (dict, collections.OrderedDict)


class Unsupported(TypeError):
    """An argument or result the JIT cannot describe (the call runs eagerly)."""


class Packed:
    """A list argument of tensors alike (class, shape, dtype, no requires_grad), passed to
    compiled code as one array stacked along a new first dim: a loop over the list is a
    loop over that dim, whose size can be symbolic like any other (dynamic.py), so one
    specialization serves lists of every length. The traced graph reads item k as
    `packed[k]` (build.py); the function itself always gets the caller's list."""

    __slots__ = ("items", "_stacked", "__weakref__")
    _rg = False

    def __init__(self, items):
        self.items = tuple(items)  # (a snapshot: the caller may change the list later)
        self._stacked = None

    @property
    def _data(self):
        """The stacked array (made once per call)."""
        if self._stacked is None:
            self._stacked = np.stack([t._data for t in self.items])
        return self._stacked

    @property
    def shape(self) -> tuple:
        return (len(self.items),) + self.items[0]._data.shape

    @property
    def meta_class(self) -> tuple:
        """What a key records as its class: a list, and its items' class."""
        return ("list", self.items[0].__class__)

    @property
    def _vc(self):
        return _SummedVersion(self.items)


class _SummedVersion:
    """The items' version counters as one (any in-place update of an item changes it), so
    a compiled backward that saved the stacked values raises as eager does when an item
    was modified before it."""

    def __init__(self, items):
        self.items = items

    def __getitem__(self, i):
        return sum(version_counter(t)[0] for t in self.items)


def tensors_of(flat) -> list:
    """The tensors of a flat argument list, a Packed list's items in its place."""
    out = []
    for t in flat:
        if isinstance(t, Packed):
            out.extend(t.items)
        else:
            out.append(t)
    return out


def pack(obj, n=None, cls=None, shape=None, dtype=None, free=()):
    """`obj` as a Packed leaf, or None when it is not a list of tensors alike. With the
    other arguments (a guard's check), only a list of `n` (None: any number) tensors of
    class `cls`, dtype `dtype` and `shape` (but the item dims in `free`)."""
    if type(obj) is not list or not obj:
        return None
    first = obj[0]
    if not isinstance(first, Tensor):
        return None
    if cls is None:
        cls, shape, dtype = first.__class__, first._data.shape, first._data.dtype
    elif n is not None and len(obj) != n:
        return None
    for t in obj:
        if t.__class__ is not cls or t._rg or t._data.dtype != dtype:
            return None
        s = t._data.shape
        if s != shape and (not free or len(s) != len(shape) or any(
                a != b for d, (a, b) in enumerate(zip(s, shape)) if d not in free)):
            return None
    return Packed(obj)


def flatten(obj, leaves=None, module_key=None, packs=False):
    """Tensors become leaves; containers and Python scalars become a hashable spec.
    Modules (the `self` of a traced method) are keyed by `module_key(module)` when given.
    `packs`: a list of tensors alike becomes one Packed leaf."""
    leaves = [] if leaves is None else leaves
    if isinstance(obj, Tensor):
        leaves.append(obj)
        return leaves, ("T",)
    if isinstance(obj, float):  # by bits: 0.0 == -0.0 and nan != nan as keys
        return leaves, ("F", type(obj), obj.hex())
    if isinstance(obj, _STATIC):
        return leaves, ("S", type(obj).__name__, obj)
    if isinstance(obj, Module):  # e.g. `self` of a traced method: keyed by its state
        return leaves, ("M", obj, None if module_key is None else module_key(obj))
    if isinstance(obj, (tuple, list)):  # (subclasses are rebuilt from their items)
        packed = pack(obj) if packs else None
        if packed is not None:
            leaves.append(packed)
            return leaves, ("P",)
        specs = tuple(flatten(item, leaves, module_key, packs)[1] for item in obj)
        kind = "list" if type(obj) is list else type(obj)
        return leaves, ("C", kind, specs)
    if type(obj) in _DICTS:  # (other subclasses may hold state we cannot rebuild)
        keys = tuple(obj.keys())
        specs = tuple(flatten(obj[k], leaves, module_key, packs)[1] for k in keys)
        return leaves, ("D", keys, specs, type(obj))
    raise Unsupported(f"values of type {type(obj).__name__} cannot be traced")


def unflatten(spec, leaves):
    """Rebuild the structure described by `spec` from an iterator of leaves."""
    it = iter(leaves)
    return _build(spec, it)


def _build(spec, it):
    tag = spec[0]
    if tag == "T":
        return next(it)
    if tag == "S":
        return spec[2]
    if tag == "F":
        return spec[1](float.fromhex(spec[2]))
    if tag == "M":
        return spec[1]
    if tag == "P":
        return list(next(it).items)
    if tag == "C":
        items = [_build(s, it) for s in spec[2]]
        kind = spec[1]
        if kind == "list":
            return items
        if kind is tuple:
            return tuple(items)
        return kind(items) if not hasattr(kind, "_fields") else kind(*items)
    return spec[3]((k, _build(s, it)) for k, s in zip(spec[1], spec[2]))
