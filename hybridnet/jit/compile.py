"""From a TraceGraph to an Executable: optimize, fuse, lower to Numba, compile.

Compiled kernels are shared by structure: a graph that differs from an earlier
one only in sizes reuses its size-generic kernel without compiling again.
"""

import math
import time

from compiler.lowering.node_rules import large_product, view_root
from compiler.lowering.numba_codegen import (
    PARALLEL_THRESHOLD,
    LoweringError,
    check_supported,
    kernel_budget,
    lower,
)
from compiler.passes.manager import optimize as run_passes
from runtime.cache import KERNELS as _KERNELS
from runtime.executor import Executable
from runtime.numba_engine import compile_program


def _mathlib():
    """name_f32 -> vectorizable jitted scalar function, from compiler.lowering.mathlib.

    Imported at the first compile, not with hybridnet: it imports Numba (about 0.15 s),
    which eager-only use never needs."""
    from compiler.lowering import mathlib
    return dict(mathlib.LOWERING)


def optimize(graph):
    """Run the default pass pipeline (a report per pass)."""
    return run_passes(graph)


def _aliased_results(outputs, fresh) -> list:
    """Results the kernel may return as (views of) an input, a constant or another result
    where eager returned an array of its own (x + 0 simplified to x, say): copied."""
    roots = [view_root(o) for o in outputs]
    copies = []
    for k, r in enumerate(roots):
        if k < len(fresh) and not fresh[k]:
            continue
        shared = any(q is r for j, q in enumerate(roots)
                     if j != k and (j < k or (j < len(fresh) and not fresh[j])))
        if shared or r.op in ("input", "const"):
            copies.append(k)
    return copies


class CompileResult:
    """The executable plus what explain() reports about how it was made."""

    def __init__(self, executable, optimized, program, kernel, pass_report, reused, seconds):
        self.executable = executable
        self.optimized = optimized
        self.program = program
        self.kernel = kernel
        self.pass_report = pass_report
        self.reused = reused
        self.seconds = seconds


def compile_trace(tg, dynamic) -> CompileResult:
    """Compile a TraceGraph; raises LoweringError when the backend cannot take it."""
    start = time.perf_counter()
    optimized, report = optimize(tg.graph)
    check_supported(optimized)
    big = max((math.prod(n.shape) for n in optimized.nodes), default=0) >= PARALLEL_THRESHOLD
    budget = kernel_budget()  # programs split under another budget are other kernels
    threaded = large_product(optimized)  # (BLAS threads: part of the kernel, compiler.blas)
    generic_key = (optimized.structural_hash(exact_shapes=False), big, budget, threaded)
    exact_key = (optimized.structural_hash(exact_shapes=True), big, budget, threaded)
    cached = _KERNELS.get(generic_key) if dynamic is not False else None
    if cached is None or not cached[1].shape_generic:
        cached = _KERNELS.get(exact_key)
    reused = cached is not None
    if cached is None:
        program = lower(optimized, _mathlib(), parallel=big, budget=budget)
        kernel = compile_program(program)
        key = generic_key if program.shape_generic else exact_key
        _KERNELS.put(key, (kernel, program))
        _KERNELS.setdefault(generic_key, (kernel, program))
    else:
        kernel, program = cached
    scalar_in = [i for i, n in enumerate(optimized.inputs) if not len(n.shape)]
    scalar_out = [i for i, n in enumerate(optimized.outputs[:tg.n_results]) if not len(n.shape)]
    copies = _aliased_results(optimized.outputs[:tg.n_results], tg.fresh)
    exe = Executable(kernel, tg.n_results, tg.guards, tg.writebacks, scalar_in, scalar_out,
                     copies)
    return CompileResult(exe, optimized, program, kernel, report, reused,
                         time.perf_counter() - start)


__all__ = ["compile_trace", "CompileResult", "LoweringError"]
