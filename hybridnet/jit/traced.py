"""`hn.trace`: a tracing JIT over eager hybridnet code.

A call is looked up by its static key (tensor shapes, dtypes and requires_grad
flags, Python scalar values, container structure, grad mode, module state and
the identity of tensors reached through closures and globals). A miss runs the
function eagerly while recording it (that call returns the eager result), then
compiles the recording. A hit runs the compiled kernel, checks the value guards
it computed, and writes in-place updates back; when a guard fails the call takes
a side exit and runs eagerly, and a path seen twice is compiled as well.
"""

import functools
import os
import time
import types

import numpy as np

from runtime.cache import SpecializationCache

from .._state import STATE
from ..capture import TraceRecorder
from ..dispatch import node_of
from ..nn.module import STRUCTURE_VERSION, Module
from ..tensor import Tensor
from .build import Untraceable, build
from .compile import LoweringError, compile_trace
from .pytree import Unsupported, flatten, unflatten
from .stats import Stats

HOT_PATH_THRESHOLD = 2  # a side-exit path seen this often gets compiled


class Trace:
    """One compiled path of a specialization."""

    def __init__(self, tg, result, stats):
        self.tg = tg
        self.result = result
        self.path = tuple(g[2] for g in tg.guards)
        self.run = _make_runner(tg, result, stats)


def _make_runner(tg, result, stats):
    """A closure running this trace on the flat tensor args: result, or None (side exit)."""
    exe, kernel = result.executable, result.kernel
    sources, spec = tg.sources, tg.result_spec
    simple_args = all(s.kind == "arg" for s in sources)
    arg_index = [s.index for s in sources]
    single = spec[0] == "T"
    wrap = Tensor._wrap
    targets = frozenset(t for _, t in tg.writebacks)

    def run(flat):
        if simple_args:
            arrays = [flat[i]._data for i in arg_index]
        else:
            arrays = _gather(sources, flat)
            if arrays is None:
                return _STALE
        if targets and _overlaps(arrays, targets):
            return _ALIASED
        try:
            if not kernel.compiled:
                outs = exe.run(arrays)
                stats.compile_seconds += kernel.compile_seconds + result.seconds
            else:
                outs = exe.run(arrays)
        except Exception as exc:  # only Numba's own errors are caught
            if not type(exc).__module__.startswith("numba."):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return _Failed(f"the numba backend could not compile this trace "
                           f"({type(exc).__name__}: {first[:200]})")
        if outs is None:
            return None
        stats.compiled_calls += 1
        if single:
            return wrap(outs[0])
        return unflatten(spec, [wrap(outs[k]) for _, k in tg.outputs])
    return run


_STALE = object()
_ALIASED = object()


def _overlaps(arrays, targets) -> bool:
    """Does an array updated in place share memory with another input of this call? (The
    graph gives each input its own buffer; eager code would see the update through it.)"""
    by_root = {}
    for i, a in enumerate(arrays):
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        by_root.setdefault(id(root), []).append(i)
    for group in by_root.values():
        if len(group) > 1 and not targets.isdisjoint(group):
            for i in targets.intersection(group):
                if any(j != i and np.may_share_memory(arrays[i], arrays[j]) for j in group):
                    return True
    return False


class _Failed:
    """What a runner returns when Numba rejects the generated code (the call runs eagerly)."""

    def __init__(self, reason):
        self.reason = reason


try:
    _ENV = os.environ._data  # the encoded dict behind os.environ (POSIX): a cheap lookup
    _DISABLE_KEY = os.environ.encodekey("HYBRIDNET_DISABLE_JIT")
except AttributeError:  # pragma: no cover
    _ENV, _DISABLE_KEY = None, None


def jit_disabled() -> bool:
    """True when HYBRIDNET_DISABLE_JIT=1 (read at every call)."""
    if _ENV is not None:
        return _ENV.get(_DISABLE_KEY) in (b"1", "1")
    return os.environ.get("HYBRIDNET_DISABLE_JIT") == "1"


class Specialization:
    """Everything compiled (or refused) for one static key."""

    def __init__(self, key):
        self.key = key
        self.traces = []
        self.path_counts = {}
        self.fallback = None  # reason this key runs eagerly
        self.result_spec = None


class TracedFunction:
    """The callable `hn.trace` returns; see the module docstring.

    Attributes: `stats` (live counters), `specializations` (per static key).
    """

    def __init__(self, fn, backend="numba", dynamic=None, cache_limit=8):
        if backend != "numba":
            raise ValueError(f"trace: unknown backend {backend!r}; available: 'numba'")
        if cache_limit < 1:
            raise ValueError(f"trace: cache_limit must be >= 1, got {cache_limit}")
        self.fn = fn
        self.module = fn if isinstance(fn, Module) else None
        self.backend, self.dynamic, self.cache_limit = backend, dynamic, cache_limit
        self.stats = Stats()
        self.specializations = SpecializationCache(cache_limit)
        self._env_names = _env_names(fn) if self.module is None else ()
        self._fast = {}  # (metas, grad) -> Specialization, for calls with only tensor args
        # globals or closure cells to key on (else, for functions, "plain": only the args)
        self._has_env = self.module is None and bool(
            self._env_names or getattr(fn, "__closure__", None) or
            getattr(fn, "__defaults__", None) or getattr(fn, "__kwdefaults__", None))
        self._plain = self.module is None and not self._has_env
        functools.update_wrapper(self, fn if self.module is None else type(fn).forward,
                                 updated=())

    # -- keys -------------------------------------------------------------------------------

    def _key(self, flat, spec):
        metas = tuple((t._data.shape, t._data.dtype, t._rg) for t in flat)
        key = (spec, metas, STATE.grad, _same_tensors(flat))
        if self.module is not None:
            return key + (_module_key(self.module),)
        if self._has_env:
            return key + (_env_key(self.fn, self._env_names),)
        return key

    # -- calling ---------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        stats = self.stats
        stats.calls += 1
        if jit_disabled():
            return self._eager(args, kwargs)
        if self._plain and not kwargs:
            try:
                metas = tuple([(a._data.shape, a._data.dtype, a._rg) for a in args])
            except AttributeError:
                metas = None
            entry = self._fast.get((metas, STATE.grad, _same_tensors(args))) \
                if metas is not None else None
            if entry is not None and entry.traces:
                stats.hits += 1
                return self._run_compiled(entry, args, args, kwargs)
        try:
            flat, spec = flatten((args, kwargs))
        except Unsupported as exc:
            return self._eager(args, kwargs, f"unsupported argument: {exc}")
        if STATE.grad and any(t._rg for t in flat):
            return self._eager(args, kwargs, "autograd not compiled yet: an input requires "
                               "grad (call under hn.no_grad() to compile inference)")
        key = self._key(flat, spec)
        entry = self.specializations.get(key)
        if entry is None:
            return self._miss(key, flat, args, kwargs)
        if entry.fallback is not None:
            return self._eager(args, kwargs)
        stats.hits += 1
        return self._run_compiled(entry, flat, args, kwargs)

    def _eager(self, args, kwargs, reason=None):
        self.stats.eager_calls += 1
        if reason is not None:
            self.stats.fallbacks += 1
            self.stats.event("fallback", reason)
        return self.fn(*args, **kwargs)

    def _miss(self, key, flat, args, kwargs):
        stats = self.stats
        stats.misses += 1
        allowed, why = self.specializations.admit()
        if why:
            stats.event("cache_limit", why)
            self._fast = {k: v for k, v in self._fast.items()
                          if v.key in self.specializations.entries}
        if not allowed:
            return self._eager(args, kwargs, f"cache_limit={self.cache_limit} reached")
        entry = Specialization(key)
        self.specializations.put(key, entry)
        if self._plain and not kwargs and len(flat) == len(args) and \
                all(a is t for a, t in zip(args, flat)):
            self._fast[(key[1], key[2], key[3])] = entry
        kind = "recompile" if len(self.specializations) > 1 else "compile"
        stats.event(kind, _describe_key(flat))
        return self._trace_and_compile(entry, flat, args, kwargs, first=True)

    def _trace_and_compile(self, entry, flat, args, kwargs, first):
        result, tg_or_reason = self._record(flat, args, kwargs)
        if isinstance(tg_or_reason, str):
            if first:
                entry.fallback = tg_or_reason
                self.stats.fallbacks += 1
                self.stats.event("fallback", tg_or_reason)
            self.stats.eager_calls += 1
            return result
        tg = tg_or_reason
        path = tuple(g[2] for g in tg.guards)
        count = entry.path_counts.get(path, 0) + 1
        entry.path_counts[path] = count
        if first or count >= HOT_PATH_THRESHOLD:
            self._compile_into(entry, tg)
        self.stats.eager_calls += 1
        return result

    def _record(self, flat, args, kwargs):
        start = time.perf_counter()
        self.stats.traces += 1
        with TraceRecorder() as rec:
            arg_nodes = [node_of(t) for t in flat]
            result = self.fn(*args, **kwargs)
            try:
                leaves, spec = flatten(result)
                tg = build(rec, flat, arg_nodes, leaves)
                tg.result_spec = spec
            except (Untraceable, Unsupported) as exc:
                tg = str(exc)
        self.stats.trace_seconds += time.perf_counter() - start
        return result, tg

    def _compile_into(self, entry, tg):
        try:
            res = compile_trace(tg, self.dynamic)
        except LoweringError as exc:
            entry.fallback = str(exc)
            self.stats.fallbacks += 1
            self.stats.event("fallback", str(exc))
            return
        if res.reused:
            self.stats.kernel_reuses += 1
            self.stats.event("kernel_reuse", "same graph structure: size-generic kernel reused")
        else:
            self.stats.compiles += 1
        entry.traces.append(Trace(tg, res, self.stats))

    def _run_compiled(self, entry, flat, args, kwargs):
        for trace in entry.traces:
            out = trace.run(flat)
            if out is _STALE:
                self._forget(entry)
                return self._miss(entry.key, list(flat), args, kwargs)
            if out is _ALIASED:
                return self._eager(args, kwargs, "an in-place update writes memory that "
                                   "another input of this call shares; this call runs eagerly")
            if isinstance(out, _Failed):
                entry.traces.clear()
                entry.fallback = out.reason
                self.stats.fallbacks += 1
                self.stats.event("fallback", out.reason)
                return self._eager(args, kwargs)
            if out is not None:
                return out
        self.stats.side_exits += 1
        self.stats.event("side_exit", "a value guard failed; this call runs eagerly")
        return self._trace_and_compile(entry, flat, args, kwargs, first=False)

    # -- inspection ---------------------------------------------------------------------

    def _latest_kernel(self):
        for entry in reversed(list(self.specializations.values())):
            if entry.traces:
                return entry.traces[-1].result.kernel
        raise RuntimeError("nothing compiled yet: call the traced function (twice) first")

    @property
    def source(self) -> str:
        """Generated Python/Numba source of the most recent compiled specialization."""
        return self._latest_kernel().source

    @property
    def llvm_ir(self) -> str:
        """LLVM IR of the most recent compiled specialization (after its first run)."""
        return self._latest_kernel().llvm_ir

    def _forget(self, entry):
        self.specializations.pop(entry.key)
        for k, v in list(self._fast.items()):
            if v is entry:
                del self._fast[k]

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return f"<hn.trace {name}: {self.stats}>"


def _same_tensors(flat):
    """None when every tensor argument is a distinct object, else which repeat which (a
    trace reads a tensor passed twice from one input)."""
    if len(flat) < 2 or len({id(t) for t in flat}) == len(flat):
        return None
    first = {}
    return tuple(first.setdefault(id(t), i) for i, t in enumerate(flat))


def _gather(sources, flat):
    arrays = []
    for src in sources:
        if src.kind == "arg":
            arrays.append(flat[src.index]._data)
            continue
        t = src.ref()
        if t is None or t._data.shape != src.shape or t._data.dtype != src.dtype:
            return None
        arrays.append(t._data)
    return arrays


def _describe_key(flat) -> str:
    shapes = ", ".join(f"{t._data.dtype}{list(t._data.shape)}" for t in flat)
    return f"new specialization for inputs ({shapes})"


def _module_key(module):
    """Module identity, structure, training flags and plain Python attributes (cached until
    any module attribute is set), plus each parameter's and buffer's shape, dtype and
    requires_grad and the contents of list/dict attributes (checked per call)."""
    cached = module.__dict__.get("_hn_structure")
    if cached is None or cached[0] != STRUCTURE_VERSION[0]:
        mods = tuple((id(m), m.training) for m in module.modules())
        params = [p for _, p in module.named_parameters()]
        bufs = [b for _, b in module.named_buffers()]
        attrs, mutable = [], []
        for m in module.modules():
            for name, value in m.__dict__.items():
                if name.startswith("_hn") or name in _MODULE_TABLES:
                    continue
                if isinstance(value, (list, dict)):
                    mutable.append(value)  # may change without a setattr: keyed per call
                    continue
                attrs.append((id(m), name, _env_value_key(value, ())))
        ids = (mods, tuple(id(t) for t in params), tuple(id(t) for t in bufs), tuple(attrs))
        cached = (STRUCTURE_VERSION[0], ids, params + bufs, tuple(mutable))
        object.__setattr__(module, "_hn_structure", cached)
    metas = tuple((t._data.shape, t._data.dtype, t._rg) for t in cached[2])
    if cached[3]:
        return cached[1], metas, tuple(_env_value_key(v, ()) for v in cached[3])
    return cached[1], metas


_MODULE_TABLES = ("_parameters", "_buffers", "_modules", "training")


def _env_names(fn):
    code = getattr(fn, "__code__", None)
    if code is None:
        return ()
    return tuple(n for n in code.co_names if n in getattr(fn, "__globals__", {}))


def _env_key(fn, names, seen=()):
    """What the function reads by global name, closure or default argument: identities of
    tensors and modules, the values of Python scalars and containers of them and of the
    plain attributes of other objects (baked into a trace as constants, so a new value must
    trace anew), and the same for helper functions defined beside it."""
    glb = fn.__globals__
    seen = seen + (fn,)
    parts = []
    for name in names:
        key = _env_value_key(glb.get(name), seen, glb)
        if key is not None:
            parts.append((name, key))
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        key = _env_value_key(value, seen, glb)
        if key is not None:
            parts.append(key)
    for defaults in (fn.__defaults__, fn.__kwdefaults__):
        if defaults:
            parts.append(("defaults", _env_value_key(defaults, seen, glb)))
    return tuple(parts)


_ENV_VALUES = (int, float, bool, str, tuple, list, dict, type(None))
_OPAQUE = (type, types.ModuleType, types.BuiltinFunctionType, types.MethodType,
           functools.partial)


def _env_value_key(value, seen, glb=None):
    if isinstance(value, Tensor):
        return id(value)
    if isinstance(value, Module):
        return _module_key(value)
    if isinstance(value, _ENV_VALUES):
        try:
            leaves, spec = flatten(value)
        except Unsupported:
            return ("unsupported", id(value))
        return (spec, tuple(id(t) for t in leaves))
    if isinstance(value, TracedFunction):  # a traced helper: what it reads counts too
        if value.module is not None:
            return _module_key(value.module)
        value = value.fn
        glb = getattr(value, "__globals__", None)
    if isinstance(value, types.FunctionType):
        # a helper defined beside the traced function: what it reads counts too
        if glb is None or value.__globals__ is not glb or value in seen or len(seen) > 4:
            return None
        return ("fn", id(value), _env_key(value, _env_names(value), seen))
    if glb is not None and not isinstance(value, _OPAQUE) and \
            type(value).__module__ in (glb.get("__name__"), "types"):
        # a plain object of the traced function's module (or a SimpleNamespace): its
        # attributes may be read as constants
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict):
            return ("obj", id(value), tuple(
                (k, _env_value_key(v, seen)) for k, v in attrs.items()))
    return None


def trace(fn=None, *, backend="numba", dynamic=None, cache_limit=8):
    """Compile `fn` (a function of tensors, or an hn.nn.Module) with the tracing JIT.

    Use as `@hn.trace`, `@hn.trace(cache_limit=4)` or `hn.trace(model)`.
    """
    if fn is None:
        return lambda f: TracedFunction(f, backend, dynamic, cache_limit)
    return TracedFunction(fn, backend, dynamic, cache_limit)
