"""`hn.trace`: a tracing JIT over eager hybridnet code.

A call first tries the generated guard function of each specialization (most recent
first, `guards.py`); failing those it is looked up by its static key (`keys.py`). A
miss runs the function eagerly while recording it (that call returns the eager
result), then compiles the recording. A hit runs the compiled trace (`run.py`), which
checks what the trace read and the value guards it computed, and writes in-place
updates back; when a value guard fails the call takes a side exit and runs eagerly,
and a path seen twice is compiled as well. Every miss, recompile and fallback event
says what differed.
"""

import functools
import os
import time
import types

from runtime.backends import get_backend
from runtime.cache import SpecializationCache
from runtime.executor import Outcome

from .._state import STATE
from ..capture import TraceRecorder
from ..dispatch import node_of
from ..nn.module import STRUCTURE_VERSION, Module
from ..tensor import Tensor
from ..tensor_ops import matrix_trace
from .build import Untraceable, build
from .compile import LoweringError, compile_trace
from .dynamic import (
    mask_key,
)
from .generalize import EXACT_LENGTHS, Generalizing  # noqa: F401  (tests read it here)
from .guards import make_guard
from .keys import (
    describe_key_difference,
    describe_meta,
    env_key,
    env_names,
    env_value_key,
    missing_globals,
    module_key,
    same_tensors,
)
from .pytree import Packed, Unsupported, flatten
from .run import Trace
from .stats import Stats

HOT_PATH_THRESHOLD = 2  # a side-exit path seen this often gets compiled
STALE_LIMIT = 4  # a key whose traces go stale this often runs eagerly

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
        self.guard = None  # generated hit test (guards.py), once a trace compiled
        self.version = None  # its STRUCTURE_VERSION cell
        self.pending = None  # (guard, cell) made before the first recording
        self.symbolic = frozenset()  # (flat index, dim) sizes it serves any value of
        self.packs = False  # its key's lists of tensors alike are packed (pytree.Packed)


class TracedFunction(Generalizing):
    """The callable `hn.trace` returns; see the module docstring.

    Attributes: `stats` (live counters), `specializations` (per static key).
    """

    def __init__(self, fn, backend=None, dynamic=None, cache_limit=8):
        backend = default_backend() if backend is None else backend
        get_backend(backend)  # (a ValueError names the available ones)
        if cache_limit < 1:
            raise ValueError(f"trace: cache_limit must be >= 1, got {cache_limit}")
        self.fn = fn
        self.module = fn if isinstance(fn, Module) else None
        self.backend, self.dynamic, self.cache_limit = backend, dynamic, cache_limit
        self.stats = Stats()
        self.specializations = SpecializationCache(cache_limit)
        self._env_fn = None if self.module is not None else fn  # (modules: module_key)
        # a bound method: what its `self` holds counts too; a callable object or a
        # functools.partial: all of it (attributes, class functions; function, arguments)
        self._self = fn.__self__ if isinstance(fn, types.MethodType) else \
            fn if self.module is None and not isinstance(fn, types.FunctionType) else None
        self._globals_size = -1
        self._refresh_env()
        self._hot = []  # specializations with a guard function, most recently hit first
        # argument structure -> the masks (frozensets of (flat index, dim)) of its
        # generalized specializations: a key missing exactly is looked up under each
        self._symbolic = {}
        self._stale = {}  # key -> how often its traces went stale
        # list arguments of tensors alike are passed packed (pytree.Packed), so a loop
        # over one serves every length; off for dynamic=False, or once a call used an item
        # as an object (build._unpack)
        self._packs = dynamic is not False
        self._hn_traced_fn = self
        if self.module is None:
            functools.update_wrapper(self, fn, updated=())

    # -- keys -------------------------------------------------------------------------------

    def _refresh_env(self):
        """The global names the function mentions, looked up again whenever its module
        gained or lost globals (names defined below the decorator count too)."""
        fn = self._env_fn
        glb = getattr(fn, "__globals__", None)
        if glb is not None and len(glb) == self._globals_size:
            return
        self._globals_size = -1 if glb is None else len(glb)
        self._env_names = env_names(fn) if fn is not None else ()
        self._has_env = fn is not None and bool(
            self._env_names or getattr(fn, "__closure__", None) or missing_globals(fn) or
            getattr(fn, "__defaults__", None) or getattr(fn, "__kwdefaults__", None))

    def _key(self, flat, spec):
        self._refresh_env()
        metas = tuple((t.shape, t._data.dtype, False, t.meta_class) if isinstance(t, Packed)
                      else (t._data.shape, t._data.dtype, t._rg, t.__class__) for t in flat)
        key = (spec, metas, STATE.grad, same_tensors(flat))
        if self.module is not None:
            key += (module_key(self.module),)
        if self._has_env:
            key += (env_key(self._env_fn, self._env_names),)
        if self._self is not None:
            key += (env_value_key(self._self, ()),)
        return key

    # -- calling ---------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        stats = self.stats
        stats.calls += 1
        if jit_disabled() or STATE.recorders:
            # (inside an outer trace or hn.record() block, ops must run to be recorded)
            return self._eager(args, kwargs)
        for entry in self._hot:
            try:
                flat = entry.guard(args, kwargs)
            except Exception:  # noqa: BLE001  (e.g. a closure cell emptied: the slow path)
                flat = None
            if flat is not None:
                stats.hits += 1
                return self._run_compiled(entry, flat, args, kwargs)
        return self._slow_call(args, kwargs)

    def _slow_call(self, args, kwargs):
        self.stats.slow_lookups += 1
        try:
            flat, spec = flatten((args, kwargs), module_key=module_key, packs=self._packs)
        except Unsupported as exc:
            return self._eager(args, kwargs, f"unsupported argument: {exc}")
        key = self._key(flat, spec)
        entry = self._lookup(key)
        if entry is None:
            return self._miss(key, flat, args, kwargs)
        if entry.fallback is not None:
            return self._eager(args, kwargs)
        self.stats.hits += 1
        if entry.version is not None:
            entry.version[0] = STRUCTURE_VERSION[0]  # the key says the structure is the same
            self._promote(entry)
        return self._run_compiled(entry, flat, args, kwargs)

    def _lookup(self, key):
        """The specialization for exact `key`, else a generalized one whose mask covers
        it. (New specializations are keyed exactly: one traced at some length of a
        symbolic size holds for that length only.)"""
        entry = self.specializations.get(key)
        if entry is not None or not self._symbolic:
            return entry
        for mask in self._symbolic.get(key[0], ()):
            entry = self.specializations.get(mask_key(key, mask))
            if entry is not None and entry.symbolic == mask:
                return entry
        return None

    def _eager(self, args, kwargs, reason=None):
        self.stats.eager_calls += 1
        if reason is not None:
            self.stats.fallbacks += 1
            self.stats.event("fallback", reason)
        return self.fn(*args, **kwargs)

    def _miss(self, key, flat, args, kwargs, packs=None):
        stats = self.stats
        stats.misses += 1
        why = self._difference(key)
        allowed, evicted = self.specializations.admit()
        if evicted:
            stats.event("cache_limit", evicted)
            self._hot = [e for e in self._hot if e.key in self.specializations.entries]
        if not allowed:
            return self._eager(args, kwargs, f"cache_limit={self.cache_limit} reached "
                               f"(this call differs in {why})")
        entry = Specialization(key)
        entry.packs = self._packs if packs is None else packs  # (as `flat` was made)
        self.specializations.put(key, entry)
        kind = "recompile" if len(self.specializations) > 1 else "compile"
        stats.event(kind, f"new specialization: {why}")
        return self._trace_and_compile(entry, flat, args, kwargs, first=True)

    def _difference(self, key) -> str:
        """What differs from the nearest specialization (the most components alike; the
        most recently used among equals)."""
        entries = list(self.specializations.entries)
        if not entries:
            return "first call " + (_describe_inputs(key) or "(no tensor inputs)")
        nearest = max(reversed(entries), key=lambda k: sum(
            a == b for a, b in zip(k, key)) if isinstance(k, tuple) else 0)
        return describe_key_difference(key, nearest)

    def _trace_and_compile(self, entry, flat, args, kwargs, first):
        if entry.guard is None and entry.pending is None:
            # the hit test describes the state the call starts from (the call itself may
            # change what it reads)
            entry.pending = make_guard(
                args, kwargs, entry.key, fn=self._env_fn if self._has_env else None,
                module=self.module, same=entry.key[3], bound=self._self, packs=entry.packs)
        result, tg_or_exc = self._record(flat, args, kwargs, entry.key)
        if isinstance(tg_or_exc, Exception):
            reason = str(tg_or_exc)
            if getattr(tg_or_exc, "unpack", False):
                self._packs = False
                self._forget(entry)
                self.stats.event("eager", reason)
            elif getattr(tg_or_exc, "retry", False):
                self._forget(entry)
                self.stats.event("eager", reason)
            elif first:
                entry.fallback = reason
                self.stats.fallbacks += 1
                self.stats.event("fallback", reason)
            self.stats.eager_calls += 1
            return result
        tg = tg_or_exc
        path = tuple(g[2] for g in tg.guards)
        count = entry.path_counts.get(path, 0) + 1
        entry.path_counts[path] = count
        if first or count >= HOT_PATH_THRESHOLD:
            self._compile_into(entry, tg, args, kwargs, flat)
        self.stats.eager_calls += 1
        return result

    def _record(self, flat, args, kwargs, key=()):
        start = time.perf_counter()
        self.stats.traces += 1
        containers = _containers((args, kwargs))
        with TraceRecorder() as rec:
            arg_nodes = [[node_of(x) for x in t.items] if isinstance(t, Packed) else node_of(t)
                         for t in flat]
            result = self.fn(*args, **kwargs)
            try:
                if any(_contents(c) != seen for c, seen in containers):
                    raise Untraceable("the call changes a list or dict argument (append, pop, "
                                      "xs[i] = ...); compiled calls would not, so it runs "
                                      "eagerly")
                leaves, spec = flatten(result)
                tg = build(rec, flat, arg_nodes, leaves, pinned=_ints_in(key))
                tg.result_spec = spec
            except (Untraceable, Unsupported) as exc:
                tg = exc
        self.stats.trace_seconds += time.perf_counter() - start
        return result, tg

    def _compile_into(self, entry, tg, args, kwargs, flat):
        try:
            # (dynamic=None with an exact-shape backend: loops compile for their traced
            # trip count until EXACT_LENGTHS lengths were seen, see _generalize)
            exact = self.dynamic is None and get_backend(self.backend).exact_shapes
            res = compile_trace(tg, False if exact else self.dynamic, self.backend,
                                lazy=exact)
        except LoweringError as exc:
            entry.fallback = str(exc)
            self._hot = [e for e in self._hot if e is not entry]
            self.stats.fallbacks += 1
            self.stats.event("fallback", str(exc))
            return
        if res.kernel.compiled:  # (compiled already, the llvm backend: counted now)
            self.stats.compile_seconds += res.seconds
        if res.fallback:
            self.stats.event("backend_fallback", res.fallback)
        if res.reused:
            self.stats.kernel_reuses += 1
            self.stats.event("kernel_reuse", "same graph structure: size-generic kernel reused")
        elif not getattr(res.kernel, "deferred", False):  # (else counted when it compiles)
            self.stats.compiles += 1
        entry.traces.append(Trace(tg, res, self.stats))
        if entry.guard is None and entry.pending is not None:
            entry.guard, entry.version = entry.pending
            self._promote(entry)
        if res.loop_trips and self.dynamic is not False:
            self._generalize(entry, args, kwargs)

    def _promote(self, entry):
        if self._hot and self._hot[0] is entry:
            return
        self._hot = [entry] + [e for e in self._hot if e is not entry][:self.cache_limit - 1]

    def _run_compiled(self, entry, flat, args, kwargs):
        for trace in entry.traces:
            out = trace.run(flat)
            kind = out.kind
            if kind is Outcome.RESULT:
                return out.value
            if kind is Outcome.SIDE_EXIT:
                continue
            if kind is Outcome.STALE:
                return self._stale_trace(entry, trace, flat, args, kwargs)
            if kind is Outcome.PROBE:
                return self._probe(entry, out.value, flat, args, kwargs)
            if kind is Outcome.ALIASED:
                return self._eager(args, kwargs, "an in-place update writes memory that "
                                   "another input of this call shares; this call runs eagerly")
            entry.traces.clear()  # FAILED
            entry.fallback = out.value
            self._hot = [e for e in self._hot if e is not entry]
            self.stats.fallbacks += 1
            self.stats.event("fallback", out.value)
            return self._eager(args, kwargs)
        self.stats.side_exits += 1
        self.stats.event("side_exit", _describe_exit(entry) + "; this call runs eagerly")
        if entry.symbolic:  # (its code is confirmed for the lengths it covers only)
            return self._eager(args, kwargs)
        return self._trace_and_compile(entry, flat, args, kwargs, first=False)

    def _stale_trace(self, entry, trace, flat, args, kwargs):
        """A guard on what the trace read failed: trace again (or, when that keeps
        happening for this key, run it eagerly)."""
        why = trace.failed_check(flat)
        if entry.symbolic:
            # (a trace made now would be keyed for every length, unconfirmed for any but
            # this one: the sizes go back to exact keys, and may be generalized again)
            self._symbolic.get(entry.key[0], set()).discard(entry.symbolic)
            self._forget(entry)
            self.stats.event("stale", f"{why}; its lengths are exact again")
            return self._slow_call(args, kwargs)
        count = self._stale.get(entry.key, 0) + 1
        self._stale[entry.key] = count
        self._forget(entry)
        if count > STALE_LIMIT:
            entry = Specialization(entry.key)
            entry.fallback = f"{why}, {count} times: this call signature now runs eagerly"
            self.specializations.put(entry.key, entry)
            return self._eager(args, kwargs, entry.fallback)
        self.stats.event("stale", why)
        return self._miss(entry.key, list(flat), args, kwargs, packs=entry.packs)

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

    @property
    def guard_source(self) -> str:
        """The generated guard function of the most recently hit specialization."""
        if not self._hot:
            raise RuntimeError("nothing compiled yet: call the traced function (twice) first")
        return self._hot[0].guard.source

    def _forget(self, entry):
        self.specializations.pop(entry.key)
        self._hot = [e for e in self._hot if e is not entry]

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return f"<hn.trace {name}: {self.stats}>"


class TracedModule(TracedFunction):
    """`hn.trace(module)`: calls run the traced forward; everything else (attributes,
    `parameters()`, `train()`, `eval()`, `state_dict()`, ...) is the module's own, and
    attributes set on it are set on the module."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ready = True

    def __setattr__(self, name, value):
        if name.startswith("_") or not self.__dict__.get("_ready") or name in self.__dict__:
            object.__setattr__(self, name, value)  # the wrapper's own state
        else:
            setattr(self.__dict__["module"], name, value)

    def __getattr__(self, name):
        # only reached for names the traced wrapper does not define itself
        if name.startswith("__") or "module" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["module"], name)

    def __getitem__(self, index):  # containers (Sequential, ModuleList...) index as before
        return self.module[index]

    def __len__(self) -> int:
        return len(self.module)

    def __iter__(self):
        return iter(self.module)

    def __repr__(self) -> str:
        return f"hn.trace({self.module!r})"


def _containers(obj, found=None) -> list:
    """(container, its contents by identity) for every list and dict inside `obj` (the
    arguments), to tell whether the call changed one."""
    found = [] if found is None else found
    if type(obj) in (list, dict) or isinstance(obj, tuple):
        if not isinstance(obj, tuple):
            found.append((obj, _contents(obj)))
        for item in (obj.values() if isinstance(obj, dict) else obj):
            _containers(item, found)
    return found


def _contents(c) -> tuple:
    items = c.items() if isinstance(c, dict) else enumerate(c)
    return tuple((k, id(v)) for k, v in items)


def _describe_exit(entry) -> str:
    for trace in entry.traces:
        seen = trace.result.executable.last_exit
        if seen is not None:
            kind, expected, now = seen
            if kind == "error" and now.startswith("hn-loop"):
                return f"these sizes are outside what the compiled loops cover ({now[9:]})"
            if kind == "error":
                return f"the kernel raised {expected} ({now}) where a value guard decides"
            return f"value guard {kind}() saw {expected!r} while tracing, {now!r} now"
    return "a value guard failed"


def _ints_in(key) -> frozenset:
    """Every int in a static key: the ids of the tensors it holds by identity among them
    (ids of live objects are unique; other numbers in a key are tagged and far smaller)."""
    found, stack = set(), [key]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(v)
        elif type(v) is int:
            found.add(v)
    return frozenset(found)


def _describe_inputs(key) -> str:
    metas = key[1] if isinstance(key, tuple) and len(key) > 1 else ()
    shapes = ", ".join(describe_meta(m) for m in metas)
    return f"(inputs {shapes})" if shapes else ""


def default_backend() -> str:
    """HYBRIDNET_BACKEND if set ("numba" or "llvm"), else "llvm"."""
    return os.environ.get("HYBRIDNET_BACKEND", "").strip() or "llvm"


def trace(fn=None, *, backend=None, dynamic=None, cache_limit=8):
    """Compile `fn` (a function of tensors, or an hn.nn.Module) with the tracing JIT.

    `backend`: "llvm" (LLVM IR from llvmlite: compiles in milliseconds, exact shapes,
    object code cached on disk; a graph it cannot lower, such as a rerolled loop that
    must serve every length, is compiled by numba, and `hn.explain` says why) or "numba"
    (generated loops compiled by Numba: slower to compile, size-generic). None: the
    HYBRIDNET_BACKEND environment variable, else "llvm".

    Use as `@hn.trace`, `@hn.trace(cache_limit=4)` or `hn.trace(model)`; a traced module
    still behaves as the module (attributes, `parameters()`, `train()`... pass through).
    """
    if fn is None:
        return lambda f: trace(f, backend=backend, dynamic=dynamic, cache_limit=cache_limit)
    if isinstance(fn, Tensor):  # torch.trace(matrix): the sum of its diagonal
        return matrix_trace(fn)
    cls = TracedModule if isinstance(fn, Module) else TracedFunction
    return cls(fn, backend, dynamic, cache_limit)
