"""From a TraceGraph to an Executable: optimize, fuse, lower to Numba, compile.

Compiled kernels are shared by structure: a graph that differs from an earlier
one only in sizes reuses its size-generic kernel without compiling again.
"""

import math
import time

from compiler.autodiff import inputs_read_by_vjps, reaching
from compiler.lowering.node_rules import large_product, view_root
from compiler.lowering.numba_codegen import (
    PARALLEL_THRESHOLD,
    LoweringError,
    check_supported,
    kernel_budget,
    lower,
)
from compiler.partition import split_gradient
from compiler.passes.manager import optimize as run_passes
from compiler.reroll import reroll
from runtime.cache import KERNELS as _KERNELS
from runtime.executor import Executable
from runtime.numba_engine import compile_program

from .dynamic import loop_dims, loop_trips, program_key


def _mathlib():
    """name_f32 -> vectorizable jitted scalar function, from compiler.lowering.mathlib.

    Imported at the first compile, not with hybridnet: it imports Numba (about 0.15 s),
    which eager-only use never needs."""
    from compiler.lowering import mathlib
    return dict(mathlib.LOWERING)


def optimize(graph):
    """Run the default pass pipeline (a report per pass)."""
    return run_passes(graph)


def _aliased_results(outputs, fresh, owned=(), saved_from=None) -> list:
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
        self.backward = None  # Backward, for a trace whose results carry gradients
        self.loop_trips = ()  # the trip counts of its loops that iterate over sizes
        self.loop_dims = {}  # (flat argument, dim) -> trip counts of the loops slicing it


def compile_trace(tg, dynamic) -> CompileResult:
    """Compile a TraceGraph; raises LoweringError when the backend cannot take it.

    A trace whose results carry gradients (`tg.grad_results`) compiles its forward and
    backward together (`compiler.partition.split_gradient`): the forward also returns the
    values the backward reads, and `CompileResult.backward` runs the backward."""
    start = time.perf_counter()
    if tg.grad_results:
        # (only the inputs some differentiable result reaches: the others get no .grad)
        reach = reaching(tg.graph, [tg.graph.inputs[i] for i in tg.grad_inputs],
                         tg.grad_results, tg.blocked)
        tg.grad_inputs = [i for i, r in zip(tg.grad_inputs, reach) if r]
        reach = [r for r in reach if r]
        _refuse_updated_saved_inputs(tg)
        wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
        split, report = split_gradient(tg.graph, wrt, tg.grad_results, tg.blocked)
        forward = split.forward
    else:
        forward, report = optimize(reroll(tg.graph)[0])
    exe, kernel, program, reused = _compile_graph(
        forward, dynamic, tg.n_results, tg.guards, tg.writebacks, tg.fresh,
        [k for _, k, same, _ in tg.grad_writes if k is not None and same is None],
        len(tg.graph.outputs) if tg.grad_results else None)
    result = CompileResult(exe, forward, program, kernel, report, reused, 0.0)
    result.loop_trips = loop_trips(forward)
    result.loop_dims = loop_dims(tg, forward)
    if tg.grad_results:
        n = len(split.backward.outputs)
        bexe, bkernel, bprogram, breused = _compile_graph(
            split.backward, dynamic, n, (), (), [True] * n)
        result.backward = Backward(split, bexe, bkernel, bprogram, breused,
                                   inputs_read_by_vjps(tg.graph), reach)
    result.seconds = time.perf_counter() - start
    return result


def _refuse_updated_saved_inputs(tg):
    """An input the call updates in place that a vjp also reads: eager's backward raises
    or not depending on whether the read came before the update, which the graph does
    not keep; such a call runs eagerly. (After `reaching` marked requires_grad.)"""
    read = set(inputs_read_by_vjps(tg.graph))
    if any(target in read for _, target in tg.writebacks):
        raise LoweringError("the call updates in place a tensor that the backward of its "
                            "results reads; it runs eagerly (as eager, the backward then "
                            "raises or not depending on the order)")


class Backward:
    """The compiled backward of a differentiable trace: `split` (compiler.partition),
    its executable, kernel and program; `reused`: its kernel came from the cache."""

    def __init__(self, split, executable, kernel, program, reused, saved_inputs, reach):
        self.split, self.executable, self.kernel = split, executable, kernel
        self.program, self.reused = program, reused
        self.reach = reach  # per differentiated input: the result slots that reach it
        # graph inputs eager's vjps would read (updated in place before the backward, it
        # raises as eager does)
        self.saved_inputs = saved_inputs


def _compile_graph(optimized, dynamic, n_results, guards, writebacks, fresh, owned=(),
                   saved_from=None):
    """Lower and compile one optimized graph (or reuse a kernel of the same structure)."""
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
        # (graphs that differ only in sizes the code never names lower to the same source)
        source_key = ("source",) + program_key(program)
        cached = _KERNELS.get(source_key) if dynamic is not False else None
        reused = cached is not None
        if cached is None:
            kernel = compile_program(program)
            _KERNELS.put(source_key, (kernel, program))
        else:
            kernel, program = cached
        key = generic_key if program.shape_generic else exact_key
        _KERNELS.put(key, (kernel, program))
        _KERNELS.setdefault(generic_key, (kernel, program))
    else:
        kernel, program = cached
    scalar_in = [i for i, n in enumerate(optimized.inputs) if not len(n.shape)]
    scalar_out = [i for i, n in enumerate(optimized.outputs[:n_results]) if not len(n.shape)]
    copies = _aliased_results(optimized.outputs, fresh, owned, saved_from)
    exe = Executable(kernel, n_results, guards, writebacks, scalar_in, scalar_out, copies)
    return exe, kernel, program, reused


__all__ = ["compile_trace", "CompileResult", "LoweringError"]
