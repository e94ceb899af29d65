"""The backend interface, and the two backends.

A backend turns an optimized graph into a kernel: `check(graph, dynamic)` raises LoweringError
for what it cannot take, `lower(graph)` gives a program (generated code plus what the
runtime needs to call it), `compile(program)` a kernel (`kernel(*arrays)` -> outputs;
`.fn`, `.compiled`, `.source`, `.llvm_ir`, `.compile_seconds`), `cache_key(graph)` the
key of the in-memory kernel cache (the structural hash and what else changes the code),
`run(kernel, arrays)` one call, and `explain(kernel)` the compile time per phase.

- `numba`: Python loop source compiled by numba.njit (compiler.lowering.numba_codegen,
  runtime.numba_engine). Takes every op, loops, size-generic kernels, long graphs split.
- `llvm`: LLVM IR emitted with llvmlite (compiler.lowering.llvm_emit), optimized at O3,
  object code cached on disk (runtime.llvm_engine). Exact shapes; a graph it cannot
  take (loops, gathers, arg-reductions, integer matmul...) is compiled by `numba`
  instead, and the reason is recorded (`explain` shows it).
"""

import math
import time

from compiler.errors import LoweringError
from compiler.lowering.llvm_program import check_llvm_supported
from compiler.lowering.node_rules import any_large_product, large_product
from compiler.lowering.numba_codegen import (
    PARALLEL_THRESHOLD,
    check_supported,
    kernel_budget,
    lower,
)
from compiler.passes.fusion import partition

from .llvm_engine import compile_llvm, graph_key, load_cached
from .numba_engine import compile_program


class Backend:
    """The interface the JIT front end compiles through (see the module docstring)."""

    name = "?"
    exact_shapes = False  # kernels serve only the traced shapes

    def check(self, graph, dynamic=None) -> None:
        raise NotImplementedError

    def lower(self, graph):
        raise NotImplementedError

    def compile(self, program):
        raise NotImplementedError

    def cache_key(self, graph, dynamic) -> tuple:
        raise NotImplementedError

    def run(self, kernel, arrays):
        return kernel(*arrays)

    def explain(self, kernel) -> dict:
        """{phase: seconds} of the kernel's compilation."""
        return dict(getattr(kernel, "phases", {}) or {"compile": kernel.compile_seconds})


class NumbaBackend(Backend):
    """Generated Python loops, compiled by Numba (lazily: at the first call)."""

    name = "numba"

    def check(self, graph, dynamic=None):
        check_supported(graph)

    def _options(self, graph):
        big = max((math.prod(n.shape) for n in graph.nodes), default=0) >= PARALLEL_THRESHOLD
        # (programs split under another budget are other kernels; BLAS threads are part
        # of the kernel, compiler.blas)
        return big, kernel_budget(), large_product(graph)

    def cache_key(self, graph, dynamic):
        return self._options(graph)

    def lower(self, graph):
        from compiler.lowering import mathlib
        big, budget, _ = self._options(graph)
        return lower(graph, dict(mathlib.LOWERING), parallel=big, budget=budget)

    def compile(self, program):
        return compile_program(program)


class LLVMBackend(Backend):
    """LLVM IR from llvmlite, O3, a shared library (or MCJIT), cached on disk by the
    graph (exact shapes)."""

    name = "llvm"
    exact_shapes = True

    def check(self, graph, dynamic=None):
        # (a rerolled loop compiles for its traced trip count only: with dynamic=False,
        # where every length is its own specialization anyway)
        check_llvm_supported(graph, loops=dynamic is False)

    def cache_key(self, graph, dynamic):
        return ("llvm", large_product(graph))

    def load(self, graph):
        """(kernel, program) from the disk cache, before anything is lowered; or None."""
        kernel = load_cached(graph, partition(graph), graph_key(graph))
        if kernel is None:
            return None
        kernel.program.large_products = kernel.program.uses_blas and large_product(graph)
        kernel.program.any_large = kernel.program.uses_blas and any_large_product(graph)
        kernel.refresh()
        return kernel, kernel.program

    def lower(self, graph):
        from compiler.lowering.llvm_emit import lower_llvm
        start = time.perf_counter()
        program = lower_llvm(graph)
        program.large_products = program.uses_blas and large_product(graph)
        program.any_large = program.uses_blas and any_large_product(graph)
        program.key = graph_key(graph)
        program.lower_seconds = time.perf_counter() - start
        return program

    def compile(self, program):
        kernel = compile_llvm(program, program.key)
        kernel.phases = {"lower": getattr(program, "lower_seconds", 0.0), **kernel.phases}
        return kernel


BACKENDS = {"numba": NumbaBackend(), "llvm": LLVMBackend()}


def get_backend(name) -> Backend:
    """The backend called `name`; a ValueError lists the available ones."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"trace: unknown backend {name!r}; available: "
                         f"{', '.join(repr(n) for n in BACKENDS)}") from None


__all__ = ["Backend", "NumbaBackend", "LLVMBackend", "BACKENDS", "get_backend",
           "LoweringError"]
