"""Flatten nested Python containers of tensors into (leaves, spec) and back."""

import collections

from ..nn.module import Module
from ..tensor import Tensor

_STATIC = (int, float, bool, str, bytes, type(None))
_DICTS = (dict, collections.OrderedDict)


class Unsupported(TypeError):
    """An argument or result the JIT cannot describe (the call runs eagerly)."""


def flatten(obj, leaves=None, module_key=None):
    """Tensors become leaves; containers and Python scalars become a hashable spec.
    Modules (the `self` of a traced method) are keyed by `module_key(module)` when given."""
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
        specs = tuple(flatten(item, leaves, module_key)[1] for item in obj)
        kind = "list" if type(obj) is list else type(obj)
        return leaves, ("C", kind, specs)
    if type(obj) in _DICTS:  # (other subclasses may hold state we cannot rebuild)
        keys = tuple(obj.keys())
        specs = tuple(flatten(obj[k], leaves, module_key)[1] for k in keys)
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
    if tag == "C":
        items = [_build(s, it) for s in spec[2]]
        kind = spec[1]
        if kind == "list":
            return items
        if kind is tuple:
            return tuple(items)
        return kind(items) if not hasattr(kind, "_fields") else kind(*items)
    return spec[3]((k, _build(s, it)) for k, s in zip(spec[1], spec[2]))
