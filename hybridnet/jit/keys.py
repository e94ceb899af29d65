"""The static part of a traced call's guard key: what is checked before any trace runs.

Tensor arguments by shape, dtype and requires_grad; Python values by exact bits;
container structure; which arguments are the same object; grad mode; modules by
structure; and what the function reaches by name: globals, closure cells, defaults,
attributes of plain objects and the same for helper functions beside it. Trace-specific
reads (`.grad`, optimizer settings, container attributes of modules) are checked per
trace instead (`reads.py`).
"""

import dis
import functools
import hashlib
import sys
import types
import weakref

import numpy as np

from ..nn.module import STRUCTURE_VERSION, Module
from ..optim.optimizer import Optimizer
from ..tensor import Tensor
from .pytree import Unsupported, flatten, tensors_of
from .reads import value_key


def same_tensors(flat):
    """None when every tensor argument (a packed list's items included) is a distinct
    object, else which repeat which (a trace reads a tensor passed twice from one input)."""
    flat = tensors_of(flat)
    if len(flat) < 2 or len({id(t) for t in flat}) == len(flat):
        return None
    first = {}
    return tuple(first.setdefault(id(t), i) for i, t in enumerate(flat))


_MODULE_TABLES = ("_parameters", "_buffers", "_modules", "_non_persistent", "training")
_SIMPLE = (int, float, bool, str, bytes, type(None))


def module_key(module, seen=()):
    """Module identity, structure, training flags and plain Python attributes (cached until
    any module attribute is set), each parameter's and buffer's shape, dtype and
    requires_grad, the attributes of plain objects a module holds (read per call: they
    change without a module setattr), and what the modules' `forward`s reach by name.
    List and dict attributes are keyed by identity only: a trace that reads one checks
    its contents (reads.py), one that does not may let it grow."""
    cached = _structure(module)
    metas = tuple((t._data.shape, t._data.dtype, t._rg) for t in cached[2])
    return cached[1], metas, module_live_key(module, seen)


def _structure(module):
    cached = module.__dict__.get("_hn_structure")
    if cached is not None and cached[0] == STRUCTURE_VERSION[0]:
        return cached
    mods = tuple((id(m), m.training) for m in module.modules())
    params = [p for _, p in module.named_parameters()]
    bufs = [b for _, b in module.named_buffers()]
    attrs, live = [], []
    for m in module.modules():
        for name, value in m.__dict__.items():
            if name.startswith("_hn") or name in _MODULE_TABLES:
                continue
            if isinstance(value, (list, dict)):
                attrs.append((id(m), name, id(value)))
            elif isinstance(value, _SIMPLE) or (isinstance(value, tuple) and all(
                    isinstance(v, _SIMPLE) for v in value)):
                attrs.append((id(m), name, env_value_key(value, ())))
            else:
                live.append((m, name))
    forwards, classes = [], []
    for m in module.modules():
        fn = getattr(type(m), "forward", None)
        fns = ((fn,) if isinstance(fn, types.FunctionType) else ()) + class_functions(type(m))
        forwards.extend(f for f in fns if f not in forwards)
        if _user_defined(type(m)) and type(m) not in classes:
            classes.append(type(m))
    ids = (mods, tuple(id(t) for t in params), tuple(id(t) for t in bufs), tuple(attrs))
    cached = (STRUCTURE_VERSION[0], ids, params + bufs, tuple(live), tuple(forwards),
              tuple(classes))
    object.__setattr__(module, "_hn_structure", cached)
    return cached


def module_live_key(module, seen=()):
    """The per-call part of a module's key: plain objects it holds, what forwards reach."""
    seen = seen + (module,)
    env = tuple(env_key(fn, env_names(fn), seen) for fn in _structure(module)[4])
    return module_objects_key(module, seen), env


def module_objects_key(module, seen=()):
    """The plain objects (configs, NumPy arrays...) the module tree holds and the class
    attributes of its user-defined classes, by key."""
    cached = _structure(module)
    seen = seen + (module,) if not seen or seen[-1] is not module else seen
    return (tuple(env_value_key(m.__dict__.get(name), seen) for m, name in cached[3]),
            tuple(_attrs_key(class_attrs(c), seen + (c,), None) for c in cached[5]))


def missing_globals(fn) -> tuple:
    """The names `fn`'s code may load as globals that its module does not define now
    (builtins such as `len`): a global defined later under such a name changes what the
    code reads."""
    code = getattr(fn, "__code__", None)
    glb = getattr(fn, "__globals__", None)
    if code is None or glb is None:
        return ()
    return tuple(n for n in _global_loads(code) if n not in glb)


def env_names(fn):
    """The global names the function's code mentions (nested comprehensions, lambdas and
    inner functions included)."""
    code = getattr(fn, "__code__", None)
    glb = getattr(fn, "__globals__", None)
    if code is None or glb is None:
        return ()
    return tuple(n for n in _global_loads(code) if n in glb)


@functools.lru_cache(maxsize=4096)
def _global_loads(code) -> tuple:
    """The names of `code` (and of the code nested in it) that may name a global: every
    co_names entry but those only ever used as attributes (`x.data` must not make a
    global `data` part of the key; `import cfg` inside the function must)."""
    names, stack = [], [code]
    while stack:
        c = stack.pop()
        attrs, other = set(), set()
        for ins in dis.get_instructions(c):
            if ins.opname in _ATTRIBUTE_OPS:
                attrs.add(ins.argval)
            elif isinstance(ins.argval, str):
                other.add(ins.argval)  # (LOAD_GLOBAL, LOAD_NAME, IMPORT_NAME, ...)
        names.extend(n for n in c.co_names if n not in names and (n in other or
                                                                     n not in attrs))
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return tuple(names)


# Opcodes whose name operand is an attribute, never a global (x.data, x.add_(...)).
_ATTRIBUTE_OPS = frozenset({"LOAD_ATTR", "STORE_ATTR", "DELETE_ATTR", "LOAD_METHOD",
                            "LOAD_SUPER_ATTR"})


def env_key(fn, names, seen=()):
    """What the function reads by global name, closure or default argument: identities of
    tensors and modules, the values of Python scalars and containers of them and of the
    plain attributes of other objects (baked into a trace as constants, so a new value must
    trace anew), and the same for helper functions defined beside it."""
    glb = fn.__globals__
    seen = seen + (fn,)
    parts = []
    for name in names:
        key = env_value_key(glb.get(name), seen, glb)
        if key is not None:
            parts.append((name, key))
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        key = env_value_key(value, seen, glb)
        if key is not None:
            parts.append(key)
    for defaults in (fn.__defaults__, fn.__kwdefaults__):
        if defaults:
            parts.append(("defaults", env_value_key(defaults, seen, glb)))
    return tuple(parts)


_ENV_VALUES = (int, float, bool, str, tuple, list, dict, type(None))
_OPAQUE = (type, types.ModuleType, types.BuiltinFunctionType, types.MethodType,
           functools.partial, types.FunctionType)
_ARRAY_BYTES = 1 << 20  # NumPy arrays up to this size are keyed by content
_DEPTH = 16  # how deep helpers and objects are followed; deeper ones count by identity


def env_value_key(value, seen, glb=None):
    """The key part for one value the function reaches."""
    if isinstance(value, Tensor):
        return id(value)
    if isinstance(value, _SIMPLE):
        return value_key(value)
    if any(value is x for x in seen):
        return ("seen", id(value))
    if isinstance(value, Module):
        return module_key(value, seen)
    if isinstance(value, Optimizer):  # settings and state: versioned (optim/tracked.py)
        return ("opt", id(value), value._hn_version[0])
    if isinstance(value, _ENV_VALUES):
        return _container_key(value, seen + (value,), glb)
    if isinstance(value, (np.ndarray, np.generic)):
        return _array_key(value)
    if len(seen) > _DEPTH:
        return ("id", id(value))
    inner = getattr(value, "_hn_traced_fn", None) if not isinstance(value, type) else None
    if inner is not None:  # a traced helper: what it reads counts too
        if inner.module is not None:
            return module_key(inner.module, seen)
        value = inner.fn
    if isinstance(value, types.FunctionType) and _user_defined(value):
        # a helper function: what it reads counts too
        return ("fn", id(value), env_key(value, env_names(value), seen))
    if isinstance(value, type) and _user_defined(value):
        inner_seen = seen + (value,)
        return ("cls", id(value), _attrs_key(class_attrs(value), inner_seen, glb),
                _functions_key(value, inner_seen))
    if isinstance(value, types.ModuleType) and _user_module(value):
        return ("mod", id(value), tuple(  # a config module: its plain settings
            (k, env_value_key(v, seen + (value,), glb)) for k, v in vars(value).items()
            if not k.startswith("_") and isinstance(v, _SIMPLE + (tuple, np.generic))))
    if isinstance(value, functools.partial):  # what its function reads, and its arguments
        inner_seen = seen + (value,)
        return ("partial", env_value_key(value.func, inner_seen, glb),
                _container_key(value.args, inner_seen, glb),
                _container_key(dict(value.keywords), inner_seen, glb))
    if isinstance(value, types.MethodType):  # its function's environment and its `self`
        inner_seen = seen + (value,)
        return ("method", env_value_key(value.__func__, inner_seen, glb),
                env_value_key(value.__self__, inner_seen, glb))
    if isinstance(value, _OPAQUE):
        return ("id", id(value))  # other libraries' functions, classes, builtins: identity
    inner_seen = seen + (value,)
    return ("obj", id(value), _attrs_key(_attributes(value), inner_seen, glb),
            _attrs_key(class_attrs(type(value)), inner_seen, glb),
            _functions_key(type(value), inner_seen))


def _container_key(value, seen, glb):
    try:
        leaves, spec = flatten(value, module_key=module_key)
        return (spec, tuple(id(t) for t in leaves))
    except Unsupported:  # (NumPy values, objects inside): element by element
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return (type(value), tuple((k, env_value_key(v, seen, glb)) for k, v in items))


def _functions_key(cls, seen):
    """What the methods (and properties) of a user-defined class reach by name."""
    return tuple(env_key(f, env_names(f), seen) for f in class_functions(cls))


def class_functions(cls) -> tuple:
    """The functions of the user-defined classes in `cls`'s MRO: methods, static and class
    methods, property getters and setters."""
    found = []
    for c in getattr(cls, "__mro__", ()):
        if not _user_defined(c):
            continue
        for v in vars(c).values():
            if isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            fns = (v.fget, v.fset) if isinstance(v, property) else (v,)
            found.extend(f for f in fns if isinstance(f, types.FunctionType) and
                         f not in found)
    return tuple(found)


def class_attrs(cls) -> dict:
    """Plain class attributes (not functions or descriptors) of the user-defined classes in
    `cls`'s MRO, the subclass's first."""
    attrs = {}
    for c in _user_classes(cls):
        for k, v in vars(c).items():
            if k.startswith("__") or k in attrs or callable(v) or \
                    isinstance(v, (staticmethod, classmethod, property)):
                continue
            attrs[k] = v
    return attrs


_USER_MRO = weakref.WeakKeyDictionary()  # class -> (its __mro__, the user classes in it)


def _user_classes(cls) -> tuple:
    """The user-defined classes of `cls`'s MRO (cached while the MRO stays the same)."""
    mro = getattr(cls, "__mro__", ())
    try:
        hit = _USER_MRO.get(cls)
    except TypeError:  # not weak-referenceable
        return tuple(c for c in mro if _user_defined(c))
    if hit is None or hit[0] is not mro:
        hit = _USER_MRO[cls] = (mro, tuple(c for c in mro if _user_defined(c)))
    return hit[1]


def _user_module(module) -> bool:
    """A module of the user's own code (a config module), not a library's or a package."""
    path = getattr(module, "__file__", None) or ""
    return not _library(module.__name__) and not hasattr(module, "__path__") and \
        "site-packages" not in path and "dist-packages" not in path


def _user_defined(obj) -> bool:
    """A class or function of the user's code (not Python's, a library's or hybridnet's)."""
    return not _library(getattr(obj, "__module__", "") or "")


_LIBRARIES = ("hybridnet", "compiler", "runtime", "numpy", "numba", "llvmlite", "scipy",
              "networkx", "torch", "jax", "pytest", "_pytest", "hypothesis")


def _library(module_name: str) -> bool:
    """Python's own modules and the libraries' (their values count by identity)."""
    top = module_name.split(".")[0]
    if top == "__main__":  # a script's own code
        return False
    return not top or top in sys.stdlib_module_names or \
        top.lstrip("_") in sys.stdlib_module_names or top in _LIBRARIES


def _attributes(obj) -> dict:
    """An object's attributes: its __dict__ and its __slots__ values."""
    attrs = dict(getattr(obj, "__dict__", None) or {})
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                attrs[name] = getattr(obj, name)
    return attrs


def _attrs_key(attrs, seen, glb):
    return tuple((k, env_value_key(v, seen, glb)) for k, v in attrs.items()
                 if all(v is not x for x in seen))


def _array_key(value):
    arr = np.asarray(value)
    if arr.nbytes > _ARRAY_BYTES:
        return ("nd", id(value), arr.dtype.str, arr.shape)  # (documented: identity only)
    return ("nd", arr.dtype.str, arr.shape, hashlib.blake2b(arr.tobytes(), digest_size=16)
            .digest())


def describe_key_difference(new, old) -> str:
    """What differs between two static keys (for miss and recompile events)."""
    labels = ("argument structure or Python values", "tensor shapes/dtypes/requires_grad",
              "grad mode", "which arguments are the same tensor")
    if not (isinstance(new, tuple) and isinstance(old, tuple)):
        return "a different call"
    for i, (a, b) in enumerate(zip(new, old)):
        if a == b:
            continue
        if i == 1:
            return _describe_metas(a, b)
        if i < len(labels):
            return labels[i]
        return _describe_env(a, b)
    return "a different call"


def _describe_metas(new, old) -> str:
    if len(new) != len(old):
        return f"number of tensor inputs {len(new)} (was {len(old)})"
    for i, (a, b) in enumerate(zip(new, old)):
        if a != b:
            return (f"tensor input {i}: {describe_meta(a)} (was {describe_meta(b)})")
    return "tensor inputs"


def describe_meta(m) -> str:
    """One tensor input of a key as text: 'float32[3, 4] requires_grad'."""
    shape, dtype, rg = m[:3]
    dims = ["*" if s is None else str(s) for s in shape]  # (*: any size, dynamic.py)
    if _is_list(m):
        return f"list of {dims[0]} {dtype}[{', '.join(dims[1:])}]"
    return f"{dtype}[{', '.join(dims)}]{' requires_grad' if rg else ''}"


def _is_list(meta) -> bool:
    """Is this key meta a packed list's (pytree.Packed.meta_class)?"""
    return len(meta) > 3 and isinstance(meta[3], tuple) and meta[3][0] == "list"


def describe_dim(metas, i, d) -> str:
    """Size `d` of flat input `i` of a key whose tensor metas are `metas`, as text."""
    if i < len(metas) and _is_list(metas[i]):
        return f"the length of list argument {i}" if d == 0 else \
            f"dim {d - 1} of the items of list argument {i}"
    return f"dim {d} of tensor argument {i}"


def _describe_env(new, old) -> str:
    if isinstance(new, tuple) and isinstance(old, tuple) and len(new) == len(old):
        for a, b in zip(new, old):
            if a != b:
                if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):
                    return f"global {a[0]!r} (its value, identity or attributes)"
                if isinstance(a, tuple) and a and a[0] == "opt":
                    return "optimizer state or settings"
                return "module structure, training flags, parameters or attributes, or a " \
                    "closure value"
    return "module structure, training flags, parameters or attributes, or a closure value"
