"""Below the JIT front end: from an optimized graph to an Executable, through a backend
(runtime.backends) and the process-wide kernel cache.

Kernels are shared by structure: a graph that differs from an earlier one only in sizes
reuses its size-generic kernel (numba) without compiling again, and two graphs that lower
to the same code share one kernel.
"""

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
                  saved_from=None, backend="numba"):
    """Check, lower and compile one optimized graph with `backend` (or reuse a kernel of
    the same structure): (Executable, kernel, program, reused, fallback). A graph the llvm
    backend cannot take is compiled by numba; `fallback` then says why (else None)."""
    chosen = get_backend(backend)
    fallback = None
    try:
        chosen.check(optimized, dynamic)
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
    types), driver, globals (arrays by bytes, other objects by identity) and the flags
    its kernel is compiled and run with (BLAS threads, parallel...)."""
    flags = tuple(bool(getattr(program, f, False)) for f in (
        "large_products", "parallel", "uses_blas", "shape_generic", "single_output", "may_exit"))
    return (_code(program.source), program.driver, globals_key(program.globals), flags)


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
