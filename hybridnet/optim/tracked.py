"""Optimizer containers the JIT can guard cheaply: versioned groups and state dicts.

Every optimizer owns a version counter. Its parameter groups (`ParamGroup`) and its
state dicts (`StateDict`) bump it on every structural write, so a traced function
that reads an optimizer is guarded by one integer compare. Float hyper-parameters
(`lr`, `momentum`, ...) are the exception: writing a new number there does not bump
the version, because a traced step reads them as runtime inputs of its kernel
(`hyper()`), so a learning-rate schedule never recompiles and is never stale.
User code that reads `group["lr"]` itself while a call is traced has that read
recorded and guarded by value.
"""

import numpy as np

from .._state import STATE
from ..capture import TRACE_HOOKS, VERSION_COUNTERS, active
from ..tensor import wrap

# bumped with every optimizer's own version: a traced call that changes any optimizer's
# structure is noticed (its recording cannot be replayed)
WRITES = [0]
_NUMBER = (int, float)


def bump(version):
    """Note a structural change of the optimizer owning `version`."""
    version[0] += 1
    WRITES[0] += 1


def _is_number(value) -> bool:
    return type(value) in _NUMBER


class VersionedDict(dict):
    """A dict whose every write bumps the version counter it was given (subclasses may
    exempt some writes in `_structural`)."""

    def __init__(self, version, data=()):
        super().__init__(data)
        self._version = version

    def _structural(self, key, value) -> bool:
        return True

    def __setitem__(self, key, value):
        if self._structural(key, value):
            bump(self._version)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key):
        bump(self._version)
        dict.__delitem__(self, key)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def pop(self, *args):
        bump(self._version)
        return dict.pop(self, *args)

    def popitem(self):
        bump(self._version)
        return dict.popitem(self)

    def clear(self):
        bump(self._version)
        dict.clear(self)

    def __ior__(self, other):
        self.update(other)
        return self

    def __reduce__(self):  # copies and pickles are plain dicts
        return (dict, (dict(self),))


class ParamGroup(VersionedDict):
    """A parameter group: writes bump its optimizer's version, except new numbers for the
    hyper-parameter keys the optimizer reads through `hyper`."""

    def __init__(self, data, version, hyper_keys):
        super().__init__(version, data)
        self._hyper = hyper_keys

    def _structural(self, key, value) -> bool:
        return not (key in self._hyper and _same_kind(dict.get(self, key), value))


def _same_kind(old, new) -> bool:
    """A new value a traced step can take as a runtime input without retracing."""
    if _is_number(old) and _is_number(new):
        return True
    if type(old) is tuple and type(new) is tuple and len(old) == len(new):
        return all(_is_number(a) and _is_number(b) for a, b in zip(old, new))
    return False  # (lists too: they can change in place, unseen)


class StateDict(VersionedDict):
    """Optimizer state (per parameter, and the mapping parameter -> state)."""


def hyper(group, key):
    """`group[key]` for the optimizer's own update rule: the number itself when running
    eagerly; while a call is traced, a float64 0-d tensor that the compiled step reads
    afresh from the group at every call (a tuple of them for tuple settings)."""
    value = dict.__getitem__(group, key)
    if not STATE.recorders:
        return value
    rec = active()
    if rec is None:
        return value
    if type(value) is tuple:
        return tuple(_hyper_tensor(rec, group, key, i, v) for i, v in enumerate(value))
    if not _is_number(value):  # (a list of numbers may change in place: not baked in)
        rec.note_item(group, key, value)
        if isinstance(value, list):
            rec.untraceable(f"optimizer setting {key!r} is a list; use a tuple to compile "
                            "the step")
        return value
    return _hyper_tensor(rec, group, key, None, value)


def _hyper_tensor(rec, group, key, index, value):
    if not _is_number(value):
        return value
    t = wrap(np.array(value, dtype=np.float64))
    rec.note_hyper(t, group, key, index)
    return t


# ---- recording what user code reads from a group while a call is traced ---------------------


def _recording_getitem(self, key):
    value = dict.__getitem__(self, key)
    rec = active()
    if rec is not None:
        rec.note_item(self, key, value)
    return value


def _recording_get(self, key, default=None):
    value = dict.get(self, key, default)
    rec = active()
    if rec is not None:
        rec.note_item(self, key, value)
    return value


def _reading_all(method):
    """A dict method that reads every value (items(), iteration, copy...): while a call
    is traced it records a read of every setting."""
    base = getattr(dict, method)

    def hooked(self, *args):
        rec = active()
        if rec is not None:
            for key in self._hyper:
                if key in self:
                    rec.note_item(self, key, dict.__getitem__(self, key))
        return base(self, *args)
    return hooked


_HOOKS = {"__getitem__": _recording_getitem, "get": _recording_get,
          **{m: _reading_all(m) for m in ("items", "values", "keys", "__iter__", "copy",
                                          "__or__", "__eq__", "__repr__")}}
_installed = [0]


def install_read_hooks():
    """While a call is traced, reads of a group's settings by user code are recorded."""
    _installed[0] += 1
    if _installed[0] == 1:
        for name, hook in _HOOKS.items():
            setattr(ParamGroup, name, hook)


def remove_read_hooks():
    _installed[0] -= 1
    if _installed[0] == 0:
        for name in _HOOKS:
            delattr(ParamGroup, name)


TRACE_HOOKS.append((install_read_hooks, remove_read_hooks))
VERSION_COUNTERS.append(WRITES)
