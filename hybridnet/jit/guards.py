"""One generated guard function per specialization: the fast hit test.

`make_guard(...)` writes a small Python function, in the spirit of Dynamo's guard
functions, that checks in one pass everything the specialization's static key says
about a call (argument structure, Python values, tensor shapes, dtypes and
requires_grad flags, which arguments are the same tensor, grad mode, module structure,
what the function reaches by name) and returns the flat tensor list, or None. It is
tried before any key is computed; when it says None the call takes the slow path
(flatten, key, lookup), which is the reference: the guard never accepts a call the key
would send elsewhere, it only rejects some the key would accept (then the slow path
refreshes its cached versions).

`guard.source` holds the generated text.
"""

import functools
import types

from .._state import STATE
from ..nn.module import STRUCTURE_VERSION, Module
from ..optim.optimizer import Optimizer
from ..tensor import Tensor
from .keys import (
    _OPAQUE,
    _structure,
    _user_defined,
    _user_module,
    env_key,
    env_names,
    env_value_key,
    missing_globals,
    module_objects_key,
    same_tensors,
)
from .pytree import pack
from .reads import value_key

_SCALARS = (bool, int, float, str, type(None))


class _Writer:
    def __init__(self):
        self.lines, self.ns, self.flat = [], {"STATE": STATE, "SV": STRUCTURE_VERSION}, []
        self.complex_env = False
        self.modules = set()  # ids of the modules already checked
        self.symbolic = {}  # flat index -> the dims whose sizes are symbolic
        self.packs = False  # lists of tensors alike are one Packed leaf (pytree.pack)
        self.packed = False  # some list was

    def const(self, value, prefix="K") -> str:
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name

    def fail_unless(self, cond: str, depth=1):
        self.lines.append("    " * depth + f"if not ({cond}): return None")

    def bind(self, expr: str) -> str:
        name = f"v{len(self.lines)}"
        self.lines.append(f"    {name} = {expr}")
        return name


def _value(w, var, obj):
    """Checks that `var` holds a value of the same structure as `obj` (flatten's rules)."""
    if isinstance(obj, Tensor):
        d = obj._data
        w.fail_unless(f"{var}.__class__ is {w.const(type(obj), 'C')}")
        data = w.bind(f"{var}._data")
        symbolic = w.symbolic.get(len(w.flat))
        if symbolic:  # (sizes a loop iterates over: any, dynamic.py)
            shape = w.bind(f"{data}.shape")
            sizes = " and ".join([f"len({shape}) == {d.ndim}"] + [
                f"{shape}[{k}] == {s}" for k, s in enumerate(d.shape) if k not in symbolic])
        else:
            sizes = f"{data}.shape == {d.shape!r}"
        w.fail_unless(f"{sizes} and {data}.dtype == "
                      f"{w.const(d.dtype, 'D')} and {var}._rg is {obj._rg}")
        w.flat.append(var)
    elif isinstance(obj, _SCALARS):
        w.fail_unless(f"{var}.__class__ is {w.const(type(obj), 'C')}")
        if isinstance(obj, float):
            w.fail_unless(f"{var}.hex() == {obj.hex()!r}")
        else:
            w.fail_unless(f"{var} == {w.const(obj)}")
    elif isinstance(obj, Module):
        w.fail_unless(f"{var} is {w.const(obj, 'M')}")
        _module(w, obj)
    elif w.packs and pack(obj) is not None:
        _packed(w, var, obj)
    elif isinstance(obj, (tuple, list)):
        w.fail_unless(f"{var}.__class__ is {w.const(type(obj), 'C')} and len({var}) == "
                      f"{len(obj)}")
        for i, item in enumerate(obj):
            _value(w, w.bind(f"{var}[{i}]"), item)
    elif isinstance(obj, dict):
        w.fail_unless(f"{var}.__class__ is dict and tuple({var}) == {w.const(tuple(obj))}")
        for k, item in obj.items():
            _value(w, w.bind(f"{var}[{w.const(k)}]"), item)
    else:  # flatten would have refused it
        raise TypeError(type(obj).__name__)


def _packed(w, var, obj):
    """A list passed packed: its items' class, shape and dtype (its length too, unless the
    packed dim is symbolic), as pytree.pack checks them."""
    d = obj[0]._data
    symbolic = w.symbolic.get(len(w.flat), ())
    n = None if 0 in symbolic else len(obj)
    free = w.const(frozenset(k - 1 for k in symbolic if k > 0))
    packed = w.bind(f"PACK({var}, {n}, {w.const(type(obj[0]), 'C')}, {d.shape!r}, "
                    f"{w.const(d.dtype, 'D')}, {free})")
    w.fail_unless(f"{packed} is not None")
    w.flat.append(packed)
    w.packed = True


def _module(w, module):
    """Structure by one counter; the plain objects it holds by key; what its forwards
    reach by name as for a traced function."""
    if id(module) in w.modules:  # (a forward that reaches its own module by name)
        return
    w.modules.add(id(module))
    w.fail_unless("SV[0] == VER[0]")
    structure = _structure(module)
    if structure[3] or structure[5]:
        live = module_objects_key(module)
        w.fail_unless(f"MOK({w.const(module, 'M')}) == {w.const(live)}")
    for fn in structure[4]:
        _environment(w, fn)


def _reached(w, expr, value, fn):
    """Checks on one value the function reaches by name (keys.env_value_key's rules)."""
    if isinstance(value, Module):
        w.fail_unless(f"{expr} is {w.const(value, 'G')}")
        _module(w, value)
        return
    if isinstance(value, type) and _user_defined(value) or \
            isinstance(value, types.ModuleType) and _user_module(value):
        w.complex_env = True  # class or config-module attributes: the full env key
        return
    if isinstance(value, (types.MethodType, functools.partial)):
        w.complex_env = True  # its function's environment, its `self` or arguments
        return
    if isinstance(value, (Tensor, Optimizer)) or isinstance(value, _OPAQUE) or value is None:
        if isinstance(value, types.FunctionType) and _user_defined(value):
            w.complex_env = True  # a helper: what it reads counts too
            return
        w.fail_unless(f"{expr} is {w.const(value, 'G')}")
        if isinstance(value, Optimizer):
            w.fail_unless(f"{w.const(value, 'G')}._hn_version[0] == {value._hn_version[0]}")
        return
    if isinstance(value, _SCALARS):
        w.fail_unless(f"VK({expr}) == {w.const(value_key(value))}")
        return
    w.complex_env = True  # containers, arrays, plain objects: the full env key


def _environment(w, fn):
    """Checks on what `fn` reaches by name; the full env key where that is not simple."""
    complex_env, w.complex_env = w.complex_env, False
    _reach_all(w, fn)
    if w.complex_env:
        names = env_names(fn)
        w.fail_unless(f"EK({w.const(fn, 'FN')}, {w.const(names)}) == "
                      f"{w.const(env_key(fn, names))}")
    w.complex_env = complex_env


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


def _reach_all(w, fn):
    glb = w.const(fn.__globals__, "GLB")
    for name in env_names(fn):
        _reached(w, f"{glb}.get({name!r})", fn.__globals__.get(name), fn)
    for name in missing_globals(fn):  # (a builtin a new global would shadow)
        w.fail_unless(f"{name!r} not in {glb}")
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        _reached(w, f"{w.const(cell, 'CELL')}.cell_contents", value, fn)
    defaults = fn.__defaults__
    if defaults and all(type(d) in _IMMUTABLE for d in defaults):
        # an immutable tuple of immutable values: the same tuple object, the same defaults
        w.fail_unless(f"{w.const(fn, 'FN')}.__defaults__ is {w.const(defaults, 'DEF')}")
    elif defaults or fn.__kwdefaults__:
        w.complex_env = True


def make_guard(args, kwargs, key, fn=None, module=None, same=None, bound=None,
               symbolic=(), packs=False):
    """The guard function for a specialization first seen on `args`/`kwargs` with static
    `key` (fn: the plain function whose environment is keyed; module: a traced Module;
    symbolic: (flat index, dim) pairs whose sizes any call may have; packs: lists of
    tensors alike are Packed leaves, as flatten(packs=True) makes them).
    Returns (guard, VER cell to refresh with STRUCTURE_VERSION)."""
    w = _Writer()
    w.packs = packs
    w.ns["PACK"] = pack
    for i, d in symbolic:
        w.symbolic.setdefault(i, set()).add(d)
    w.ns.update(VK=value_key, MOK=module_objects_key, EK=env_key, SK=env_value_key,
                VER=[STRUCTURE_VERSION[0]])
    w.fail_unless(f"len(args) == {len(args)}")
    for i, a in enumerate(args):
        _value(w, w.bind(f"args[{i}]"), a)
    if kwargs:
        _value(w, "kwargs", kwargs)
    else:
        w.fail_unless("not kwargs")
    w.fail_unless(f"STATE.grad is {STATE.grad}")
    if same is None and len(w.flat) > 1 and not w.packed:
        w.fail_unless(f"len({{{', '.join(f'id({v})' for v in w.flat)}}}) == {len(w.flat)}")
    if module is not None:
        _module(w, module)
        fn = None  # (its forwards' environments are part of the module's live key)
    if fn is not None:
        _environment(w, fn)
    if bound is not None:  # the `self` of a traced bound method
        w.fail_unless(f"SK({w.const(bound, 'S')}, ()) == {w.const(env_value_key(bound, ()))}")
    w.lines.append(f"    flat = [{', '.join(w.flat)}]")
    if same is not None or w.packed:  # (a packed list's items count one by one)
        w.ns.update(SAME=same_tensors, EXPECTED_SAME=same)
        w.fail_unless("SAME(flat) == EXPECTED_SAME")
    body = "\n".join(w.lines)
    source = f"def guard(args, kwargs):\n{body}\n    return flat\n"
    code = compile(source, "<hn.trace guard>", "exec")
    exec(code, w.ns)  # noqa: S102  (our own generated text, from values, never from files)
    guard = w.ns["guard"]
    guard.source = source
    return guard, w.ns["VER"]
