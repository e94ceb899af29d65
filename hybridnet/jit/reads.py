"""Guards on the Python-level state a trace read (beyond its arguments).

While a call is traced, reads are recorded where they happen: `.grad` of any tensor
(`Tensor.grad`), settings an optimizer's parameter group hands to user code
(`ParamGroup.__getitem__`), list and dict attributes of modules (a `__getattribute__`
installed on `Module` for the duration of the trace), and every optimizer whose step
ran. `entry_checks` turns them into `Check`s, each a predicate on the flat tensor
arguments of a later call: what the trace assumed on entry still holds. What was not
read is not checked, so a list attribute the function never reads may grow freely.
"""

import weakref

from ..capture import TRACE_HOOKS, VERSION_COUNTERS, active
from ..nn.module import STRUCTURE_VERSION, Module

_MISSING = object()


class Check:
    """One assumption about state the trace read: `holds(flat)`, and what it says.
    `aliases`: it says an argument is a tensor the function also reaches by name."""

    __slots__ = ("holds", "text", "aliases")

    def __init__(self, holds, text: str, aliases: bool = False):
        self.holds = holds
        self.text = text
        self.aliases = aliases

    def __repr__(self) -> str:
        return f"Check({self.text})"


def value_key(value):
    """A hashable stand-in for a Python value read as a constant: numbers by type and exact
    bits, containers by structure, tensors and other objects by identity."""
    if isinstance(value, float):
        return (float, value.hex())
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(value_key(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, value_key(v)) for k, v in value.items()))
    return ("id", id(value))


def _deref(ref):
    return ref() if isinstance(ref, weakref.ref) else ref


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj  # (kept alive by the trace: only plain dicts and lists end up here)


def _grad_check(tref, was_none, where):
    def holds(flat):
        t = tref.resolve(flat)
        return t is not None and (t._grad is None) is was_none
    return Check(holds, f"{where}.grad is {'None' if was_none else 'a tensor'}")


def _grad_is_check(tref, other, where):
    """`t.grad` is still the very tensor `other` names (an argument, or another owner's
    grad): the trace reads both through one input."""
    def holds(flat):
        t = tref.resolve(flat)
        o = other(flat)
        return t is not None and o is not None and t._grad is o
    return Check(holds, f"{where}.grad is the same tensor as when traced")


def _grad_of(tref, flat):
    t = tref.resolve(flat)
    return None if t is None else t._grad


def _item_check(mapping, key, value):
    ref, expected = _weak(mapping), value_key(value)

    def holds(flat):
        d = _deref(ref)
        return d is not None and value_key(dict.get(d, key, _MISSING)) == expected
    return Check(holds, f"param_group[{key!r}] == {value!r}")


def _attr_check(obj, name, value):
    ref, expected = _weak(obj), value_key(value)

    def holds(flat):
        o = _deref(ref)
        return o is not None and value_key(o.__dict__.get(name, _MISSING)) == expected
    return Check(holds, f"{type(obj).__name__}.{name} == {_short(value)}")


def _optimizer_layout(opt):
    """Which groups, holding which parameters (plain lists the version does not see)."""
    return tuple((id(g), tuple(id(p) for p in dict.get(g, "params", ())))
                 for g in opt.param_groups)


def _optimizer_check(opt):
    ref, version = weakref.ref(opt), opt._hn_version[0]
    layout = _optimizer_layout(opt)

    def holds(flat):
        o = ref()
        return o is not None and o._hn_version[0] == version and _optimizer_layout(o) == layout
    return Check(holds, f"{type(opt).__name__} state and settings unchanged (version {version})")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def entry_checks(recorder, tensor_ref, grad_of) -> list:
    """The Checks of a finished recording (see the module docstring). `grad_of`: id(grad
    tensor) -> the owner through whose `.grad` the trace reads it."""
    checks = []
    for t, first_read, value, _, _ in recorder.grads.values():
        if not first_read:
            continue
        where = f"{type(t).__name__}{list(t.shape)}"
        checks.append(_grad_check(tensor_ref(t), value is None, where))
        if value is None:
            continue
        value_ref = tensor_ref(value)
        if value_ref.ref is None:  # the grad was an argument of the call
            checks.append(_grad_is_check(tensor_ref(t), value_ref.resolve, where))
        elif grad_of.get(id(value)) is not t:  # shared with another owner's grad
            main = tensor_ref(grad_of[id(value)])
            checks.append(_grad_is_check(
                tensor_ref(t), lambda flat, main=main: _grad_of(main, flat), where))
    for mapping, key, value in recorder.item_reads.values():
        if key in getattr(mapping, "_hyper", ()):  # other keys: the optimizer's version
            checks.append(_item_check(mapping, key, value))
    for obj, name, value in recorder.attr_reads.values():
        checks.append(_attr_check(obj, name, value))
    for opt in recorder.optimizers.values():
        checks.append(_optimizer_check(opt))
    return checks


# ---- recording container attributes of modules while a call is traced ---------------------


def _recording_getattribute(self, name):
    value = object.__getattribute__(self, name)
    if type(value) in (list, dict) and name not in _TABLES and name[:3] != "_hn":
        rec = active()
        if rec is not None and object.__getattribute__(self, "__dict__").get(name) is value:
            rec.note_attr(self, name, value)
    return value


_TABLES = ("_parameters", "_buffers", "_modules", "__dict__")
_installed = [0]


def _install():
    _installed[0] += 1
    if _installed[0] == 1:
        Module.__getattribute__ = _recording_getattribute


def _remove():
    _installed[0] -= 1
    if _installed[0] == 0:
        del Module.__getattribute__


TRACE_HOOKS.append((_install, _remove))
VERSION_COUNTERS.append(STRUCTURE_VERSION)

__all__ = ["Check", "entry_checks", "value_key"]
