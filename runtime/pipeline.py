"""Below the JIT front end: from an optimized graph to an Executable, through a backend
(runtime.backends) and the process-wide kernel cache.

Kernels are shared by structure: a graph that differs from an earlier one only in sizes
reuses its size-generic kernel (numba) without compiling again, and two graphs that lower
to the same code share one kernel.
"""

import threading
import time

import numpy as np

from compiler.errors import LoweringError
from compiler.lowering.llvm_sym import lower_symbolic
from compiler.lowering.node_rules import view_root

from .backends import get_backend, large_product
from .cache import KERNELS as _KERNELS
from .executor import Executable
from .llvm_engine import compile_symbolic


def aliased_results(outputs, fresh, owned=(), saved_from=None) -> list:
    """Outputs the kernel may return as (views of) an input, a constant or another output
    where eager had an array of its own (x + 0 simplified to x, say): copied. Checked:
    the results (the first len(fresh) outputs, where `fresh`) and the outputs `owned`
    (values the call assigns to .grad), against each other and the saved values (outputs
    from `saved_from` on, which the backward reads later)."""
    roots = [view_root(o) for o in outputs]
    copies = []
    for k, r in enumerate(roots[:len(fresh)]):
        if not fresh[k]:
            continue
        shared = any(q is r for j, q in enumerate(roots[:len(fresh)])
                     if j != k and (j < k or not fresh[j]))
        if shared or r.op in ("input", "const"):
            copies.append(k)
    checked = set(range(len(fresh))) | set(owned)
    if saved_from is not None:
        checked |= set(range(saved_from, len(outputs)))
    for k in owned:
        r = roots[k]
        if r.op in ("input", "const") or any(roots[j] is r for j in checked if j != k):
            copies.append(k)
    return copies


def compile_graph(optimized, dynamic, n_results, guards, writebacks, fresh, owned=(),
                  saved_from=None, backend="numba", lazy=False):
    """Check, lower and compile one optimized graph with `backend` (or reuse a kernel of
    the same structure): (Executable, kernel, program, reused, fallback). A graph the llvm
    backend cannot take is compiled by numba; `fallback` then says why (else None).
    `lazy` (an exact-shape backend): lowered too at the first call (DeferredKernel)."""
    chosen = get_backend(backend)
    fallback = None
    try:
        chosen.check(optimized, dynamic)
        if lazy and chosen.exact_shapes:
            kernel, program, reused = _deferred(chosen, optimized)
        else:
            kernel, program, reused = _kernel_for(chosen, optimized, dynamic)
    except Exception as exc:  # noqa: BLE001  (any failure of another backend: numba runs it)
        if chosen.name == "numba":
            raise
        what = str(exc) if isinstance(exc, LoweringError) else \
            f"failed ({type(exc).__name__}: {str(exc)[:200]})"
        fallback = f"{chosen.name} backend: {what}; compiled by the numba backend instead"
        chosen = get_backend("numba")
        chosen.check(optimized, dynamic)
        kernel, program, reused = _kernel_for(chosen, optimized, dynamic)
    scalar_in = [i for i, n in enumerate(optimized.inputs) if not len(n.shape)]
    scalar_out = [i for i, n in enumerate(optimized.outputs[:n_results]) if not len(n.shape)]
    copies = aliased_results(optimized.outputs, fresh, owned, saved_from)
    exe = Executable(kernel, n_results, guards, writebacks, scalar_in, scalar_out, copies)
    return exe, kernel, program, reused, fallback


def _kernel_for(backend, optimized, dynamic):
    """(kernel, program, reused) from the process-wide kernel cache, or compiled."""
    extra = backend.cache_key(optimized, dynamic)
    generic_key = (optimized.structural_hash(exact_shapes=False),) + tuple(extra)
    exact_key = (optimized.structural_hash(exact_shapes=True),) + tuple(extra)
    cached = _KERNELS.get(generic_key) if dynamic is not False and \
        not backend.exact_shapes else None
    if cached is None or not cached[1].shape_generic:
        cached = _KERNELS.get(exact_key)
    if cached is not None:
        return cached[0], cached[1], True
    loaded = backend.load(optimized) if hasattr(backend, "load") else None
    if loaded is not None:  # (from the disk cache, nothing lowered)
        _KERNELS.put(exact_key, loaded)
        return loaded[0], loaded[1], False
    program = backend.lower(optimized)
    # (graphs that differ only in sizes the code never names lower to the same source)
    source_key = ("source", backend.name) + program_key(program)
    cached = _KERNELS.get(source_key) if dynamic is not False else None
    reused = cached is not None
    if cached is None:
        kernel = backend.compile(program)
        _KERNELS.put(source_key, (kernel, program))
    else:
        kernel, program = cached
    key = generic_key if program.shape_generic else exact_key
    _KERNELS.put(key, (kernel, program))
    if not backend.exact_shapes:
        _KERNELS.setdefault(generic_key, (kernel, program))
    return kernel, program, reused


def _deferred(backend, optimized):
    """(kernel, program, reused): from the disk cache, else a DeferredKernel."""
    loaded = backend.load(optimized) if hasattr(backend, "load") else None
    if loaded is not None:
        return loaded[0], loaded[1], False
    kernel = DeferredKernel(optimized, backend)
    return kernel, kernel.program, False


class _Pending:
    """The program of a DeferredKernel: what an Executable asks before the first call
    (single_output, may_exit) without lowering; anything else lowers the graph."""

    def __init__(self, kernel, graph):
        self._kernel = kernel
        self.single_output, self.may_exit = len(graph.outputs) == 1, False

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._kernel.kernel().program, name)


class DeferredKernel:
    """A kernel lowered and compiled at its first call (or when anything but a call asks
    for it): the exact kernel of a loop's length traced before the length became
    symbolic (runtime.pipeline.symbolic_kernel) costs nothing if that length never runs
    again. A graph the backend then fails to lower is compiled by numba (`fallback`)."""

    deferred = True  # (the JIT counts its compile when it happens)

    def __init__(self, graph, backend):
        self.program = _Pending(self, graph)
        self.compile_seconds, self.fallback, self.fn = 0.0, None, self.__call__
        self._graph, self._backend, self._kernel = graph, backend, None
        self._lock = threading.Lock()

    @property
    def compiled(self) -> bool:
        return self._kernel is not None and self._kernel.compiled

    def kernel(self):
        """The backend's kernel (lowered and compiled now, once; numba's compiles at its
        own first call)."""
        with self._lock:
            if self._kernel is None:
                start = time.perf_counter()
                try:
                    kernel = self._backend.compile(self._backend.lower(self._graph))
                except Exception as exc:  # noqa: BLE001  (as compile_graph: numba runs it)
                    what = str(exc) if isinstance(exc, LoweringError) else \
                        f"failed ({type(exc).__name__}: {str(exc)[:200]})"
                    self.fallback = (f"{self._backend.name} backend: {what}; compiled by the "
                                     "numba backend instead")
                    numba = get_backend("numba")
                    numba.check(self._graph, False)
                    kernel = numba.compile(numba.lower(self._graph))
                self._seconds = time.perf_counter() - start
                self._kernel = kernel
            return self._kernel

    def __call__(self, *arrays):
        kernel = self.kernel()
        out = kernel(*arrays)
        if kernel.compiled and self.fn != kernel.fn:
            self.fn = kernel.fn
            self.compile_seconds = self._seconds + (0.0 if self._backend.exact_shapes and
                                                    self.fallback is None
                                                    else kernel.compile_seconds)
        return out

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.kernel(), name)


def symbolic_kernel(graphs, ns):
    """(kernel, program): one llvm kernel for every length, from one optimized graph
    traced at each length of `ns` (compiler.lowering.llvm_sym; raises LoweringError when
    they make none), compiled, or taken from the process-wide or the disk cache."""
    start = time.perf_counter()
    program = lower_symbolic(graphs, ns)
    program.large_products = program.uses_blas and any(large_product(g) for g in graphs)
    lowered = time.perf_counter() - start
    key = ("symbolic", "llvm") + program_key(program)
    cached = _KERNELS.get(key)
    if cached is not None:
        return cached
    kernel = compile_symbolic(program)
    kernel.phases = {"lower": lowered, **kernel.phases}
    kernel.compile_seconds = sum(kernel.phases.values())
    _KERNELS.put(key, (kernel, program))
    return kernel, program


def program_key(program) -> tuple:
    """A generated program by content: its code (comments aside, which name the trace's
    types), driver, globals (arrays by bytes, other objects by identity), its split
    kernels' code and own globals (the constants they read, which the driver's comments
    name only by their kernel's hash) and the flags its kernel is compiled and run with
    (BLAS threads, parallel...)."""
    flags = tuple(bool(getattr(program, f, False)) for f in (
        "large_products", "parallel", "uses_blas", "shape_generic", "single_output", "may_exit"))
    chunks = tuple((_code(c.source), globals_key(c.globals))
                   for c in getattr(program, "chunks", None) or ())
    return (_code(program.source), program.driver, globals_key(program.globals), chunks,
            flags)


def _code(source) -> str:
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))


def globals_key(globals_) -> tuple:
    items = []
    for name, value in sorted(globals_.items()):
        if isinstance(value, np.ndarray):
            items.append((name, value.dtype.str, value.shape, value.tobytes()))
        elif isinstance(value, np.generic):
            items.append((name, value.dtype.str, value.tobytes()))
        else:
            items.append((name, id(value)))
    return tuple(items)
