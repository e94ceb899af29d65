"""One llvm kernel for every length of a rerolled loop (compiler.lowering.llvm_sym,
runtime.llvm_kernel.SymKernel): three traces of other lengths lower to IR that differs
only in integer literals affine in the length; those become values computed from n.

Oracles: eager hybridnet (results, gradients, parameters and optimizer state after
every call), the exact llvm kernels of the same traces (bit for bit), and unit tests of
the text parametrization on hand-written IR.
"""

import numpy as np
import pytest
from trace_helpers import same_loss_and_grads

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from compiler.lowering.llvm_sym import (
    Affine,
    Bounds,
    SymbolicError,
    fit,
    parametrize,
)
from runtime.llvm_kernel import SymKernel

# ---- the text and the fits ---------------------------------------------------------------

FN = '''define internal void @"hn_part0"(i8** %".1", i8** %".2", i64 %".3", i64 %".4") noinline
{{
entry:
  %".5" = getelementptr i8*, i8** %".1", i64 1
  br label %"loop"
loop:
  %".6" = phi i64 [0, %"entry"], [%".8", %"loop"]
  %".8" = add i64 %".6", {step}
  %".9" = icmp slt i64 %".8", {trip}
  br i1 %".9", label %"loop", label %"done"
done:
  ret void
}}'''


def test_fit_is_exact_through_every_point():
    assert fit([7, 7, 7], [3, 5, 9]) == 7
    assert fit([6, 10, 18], [3, 5, 9]) == Affine(2, 0)
    assert fit([2, 4, 8], [3, 5, 9]) == Affine(1, -1)
    assert fit([1, 2, 4], [3, 5, 9]) is None  # (n // 2: slope 1/2)
    assert fit([6, 6, 7], [12, 13, 14]) is None  # (n // 2 across a boundary)
    assert fit([9, 25, 81], [3, 5, 9]) is None  # (n * n)
    assert Affine(32, -64).at(10) == 256


def test_parametrize_computes_each_literal_from_n():
    texts = [FN.format(step=1, trip=t) for t in (12, 13, 17)]
    text, largest = parametrize(texts, [12, 13, 17], n_slot=9)
    assert largest is None
    assert 'icmp slt i64 %".8", %"hn.s0"' in text
    assert 'getelementptr i8*, i8** %".1", i64 9' in text  # (n from the table's slot 9)
    assert '%"hn.s0.m" = mul i64 %"hn.n", 1' in text
    assert '%"hn.s0" = add i64 %"hn.s0.m", 0' in text
    assert text.index('%"hn.n" =') < text.index('%".5"')  # (at the top of the function)
    from runtime.llvm_engine import _llvm
    _llvm()["llvm"].parse_assembly(text).verify()


@pytest.mark.parametrize("texts, why", [
    ([FN.format(step=1, trip=t) for t in (12, 13, 18)], "no affine"),  # (not on a line)
    ([FN.format(step=1, trip=t) for t in (12, 13, 14)][:2] + [FN], "differs"),
    ([FN.format(step=s, trip=12) for s in (1, 1, 1)][:2] +
     [FN.format(step=1, trip=12).replace("add i64", "sub i64")], "differs"),
    ([FN.replace("{step}", "1").replace("{trip}", "12").replace("{{", "{").replace(
        "}}", "}").replace("i64 %\".6\", 1", f"i64 %\".6\", {v}.0") for v in (1, 2, 3)],
     "differs"),
])
def test_parametrize_refuses_what_is_not_a_size(texts, why):
    with pytest.raises(SymbolicError, match=why):
        parametrize(texts, [12, 13, 14], n_slot=9)


def test_a_literal_in_a_loop_body_function_is_refused():
    texts = [FN.format(step=1, trip=t).replace("hn_part0", "hn_b0_part0") for t in (4, 5, 6)]
    with pytest.raises(SymbolicError, match="beyond its sizes"):
        parametrize(texts, [4, 5, 6], n_slot=9)


def test_bounds_from_affine_constraints():
    b = Bounds()
    b.at_least(Affine(1, -3), 1)  # (n - 3 >= 1)
    b.at_least(Affine(2, 0), 1)
    b.at_least(5, 1)
    assert b.least == 4 and b.most is None
    b.at_least(Affine(-1, 40), 0)
    assert b.most == 40


# ---- through hn.trace ---------------------------------------------------------------------


def _over(cell, xs, lstm=False):
    h = hn.zeros(3, 5)
    state = (h, hn.zeros(3, 5)) if lstm else h
    for t in range(xs.shape[0]):
        state = cell(xs[t], state)
    return state[0] if lstm else state


def _symbolic(traced):
    generic = [e for e in traced.specializations.values() if e.symbolic]
    assert len(generic) == 1, traced.stats.events
    return generic[0].traces[0].result


@pytest.mark.parametrize("cls", [nn.RNNCell, nn.GRUCell, nn.LSTMCell])
def test_one_llvm_kernel_serves_lengths_up_to_100(cls):
    """Every call from 1 to 100 steps equals eager; one kernel (forward and backward)
    serves all but the shortest, which run eagerly (the backward's loop peels steps)."""
    hn.manual_seed(7)
    cell = cls(4, 5)
    lstm = cls is nn.LSTMCell
    traced = hn.trace(lambda xs, y: F.mse_loss(_over(cell, xs, lstm), y))
    rng = np.random.default_rng(7)

    def call(steps):
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        y = hn.tensor(rng.standard_normal((3, 5)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs, y)

    for steps in (20, 23, 31):
        call(steps)
    result = _symbolic(traced)
    assert isinstance(result.kernel, SymKernel) and isinstance(result.backward.kernel,
                                                               SymKernel)
    assert result.fallback is None and result.backward.fallback is None
    compiles, traces = traced.stats.compiles, traced.stats.traces
    for steps in [1, 2, 3, 100, 4, 57] + list(range(5, 100, 7)):
        call(steps)
    # (lengths beyond those confirmed are traced once to confirm, dynamic.Hull: four a
    # side, 1..4 below and 57..89 above, before the others are trusted)
    stats = traced.stats
    assert (stats.compiles, stats.traces - stats.probes) == (compiles, traces), stats
    assert stats.probes <= 8 and stats.compiled_calls >= 15 - stats.probes, stats
    assert not any(e["kind"] == "backend_fallback" for e in traced.stats.events)


def test_the_symbolic_kernel_equals_the_exact_kernels_bit_for_bit():
    hn.manual_seed(2)
    cell = nn.GRUCell(4, 5)
    traced = hn.trace(lambda xs: _over(cell, xs), dynamic=False)
    rng = np.random.default_rng(2)
    exact = {}
    with hn.no_grad():
        for steps in (9, 10, 14, 25):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            traced(xs)
            traced(xs)
            entry = list(traced.specializations.values())[-1]
            exact[steps] = entry.traces[0].result
            gather = entry.traces[0].gather
    from runtime.pipeline import symbolic_kernel
    kernel, program = symbolic_kernel([exact[n].optimized for n in (9, 10, 14)], [9, 10, 14])
    assert program.sym[2] == Affine(1, 0) and "hn.n" in program.source
    assert program.min_n == 1  # (the loop holds every step: one step is enough)
    for steps in (9, 14, 25):  # (25: no trace at that length went into it)
        ins = [rng.standard_normal(s).astype(d) for s, d in exact[steps].program.inputs]
        want, got = exact[steps].kernel(*ins), kernel(*ins)
        for a, b in zip(want if isinstance(want, tuple) else (want,),
                        got if isinstance(got, tuple) else (got,)):
            np.testing.assert_array_equal(a, b)
    ins = [rng.standard_normal(s).astype(d) for s, d in exact[9].program.inputs]
    xs = hn.tensor(rng.standard_normal((1, 3, 4)).astype(np.float32))
    with hn.no_grad():  # (one step, with the cell's own weights)
        np.testing.assert_allclose(kernel(*gather([xs])), _over(cell, xs).numpy(), rtol=1e-5,
                                   atol=1e-6)
    ins[program.sym[0]] = ins[program.sym[0]][:0]  # (below the kernel's bounds)
    with pytest.raises(ValueError, match="hn-loop"):
        kernel(*ins)


def _steps_loss(cell, scale):
    def loss(xs):
        h, outs = hn.zeros(3, 5), []
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
            outs.append(h)
        return hn.stack(outs).mean() * scale(xs.shape[0])
    return loss


@pytest.mark.parametrize("reduce", ["mean", "var", "mse"])
def test_a_mean_over_every_step_is_one_kernel_that_counts_from_n(reduce):
    """The mean's count (3 * 5 * n) and its gradient's 1 / count are float constants the
    trace computed from the length: the kernel computes each from n (a whole number as
    sitofp, a reciprocal as 1 / it, as exactly as the trace divided), and every call,
    lengths never traced included, gives eager's answer and gradients."""
    hn.manual_seed(1)
    cell = nn.RNNCell(4, 5)

    def loss(xs):
        h, outs = hn.zeros(3, 5), []
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
            outs.append(h)
        y = hn.stack(outs)
        if reduce == "var":
            return y.var()
        return F.mse_loss(y, y.detach() * 0.5) if reduce == "mse" else y.mean()
    traced = hn.trace(loss)
    rng = np.random.default_rng(1)
    for steps in (12, 15, 19, 26, 12, 3, 40, 64, 20, 33, 50):  # (3, 26, 40, 64: probes)
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs)
    assert any(e.symbolic for e in traced.specializations.values()), traced.stats.events
    assert not [e for e in traced.stats.events if e["kind"] == "backend_fallback"]
    assert traced.stats.compiled_calls >= 4 and traced.stats.probes == 4, traced.stats


def test_parametrize_computes_whole_and_reciprocal_float_literals_from_n():
    body = 'define internal void @"hn_part0"(i8** %".1", i8** %".2") noinline\n{\nentry:\n' \
           '  %".3" = fmul float 1.000000e+00, {a}\n  %".4" = fmul double 2.0, {b}\n' \
           '  ret void\n}}'
    import struct

    def hexf(v):  # (llvmlite's form of a float literal: a double's bits)
        return "0x" + struct.pack(">d", float(np.float32(v))).hex().upper()
    ns = [12, 13, 17]
    texts = [body.replace("{a}", hexf(15 * n)).replace("{b}", repr(1 / (4 * n)))
             .replace("}}", "}") for n in ns]
    text, _ = parametrize(texts, ns, n_slot=3)
    assert '= sitofp i64 %"hn.s0.w" to float' in text
    assert 'fdiv double 1.000000e+00' in text
    from runtime.llvm_engine import _llvm
    _llvm()["llvm"].parse_assembly(text).verify()
    odd = [body.replace("{a}", hexf(v)).replace("{b}", "2.0").replace("}}", "}")
           for v in (1 / 3, 1 / 3.5, 0.2)]  # (1 / 3.5: no whole count)
    with pytest.raises(SymbolicError):
        parametrize(odd, ns, n_slot=3)


def test_a_float_that_is_no_count_goes_to_numba_with_the_reason():
    hn.manual_seed(1)
    cell = nn.RNNCell(4, 5)
    traced = hn.trace(_steps_loss(cell, lambda n: n ** -0.5))
    rng = np.random.default_rng(1)
    for steps in (12, 15, 19, 26, 12):
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs)
    fallbacks = [e["detail"] for e in traced.stats.events if e["kind"] == "backend_fallback"]
    assert fallbacks and "no kernel for every length" in fallbacks[0], traced.stats.events


def test_a_slice_of_fixed_size_bounds_the_length():
    """x[:4] has 4 rows from length 4 on and fewer below: the kernel traced at longer
    lengths runs only from 4 on; shorter calls run eagerly, with eager's answer."""
    hn.manual_seed(4)
    cell = nn.RNNCell(4, 5)

    def f(xs):
        h = xs[:4].sum(0) @ hn.ones(4, 5)
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
        return h
    traced = hn.trace(f)
    rng = np.random.default_rng(4)
    with hn.no_grad():
        for steps in (10, 11, 13, 2, 3, 4, 5, 30):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), f(xs).numpy(), rtol=1e-5,
                                       atol=1e-6)
    result = _symbolic(traced)
    assert result.kernel.program.min_n >= 4


def test_a_training_step_over_lengths_keeps_eager_state():
    """The whole step (forward, backward, Adam) traced; an eager twin runs the same data:
    losses, parameters and Adam's moments agree after every step."""
    def make():
        hn.manual_seed(9)
        cell, head = nn.LSTMCell(4, 6), nn.Linear(6, 2)
        params = list(cell.parameters()) + list(head.parameters())
        opt = hn.optim.Adam(params, lr=0.01)

        def step(xs, y):
            opt.zero_grad()
            h = c = hn.zeros(3, 6)
            for t in range(xs.shape[0]):
                h, c = cell(xs[t], (h, c))
            loss = F.cross_entropy(head(h), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return step, params, opt
    traced_step, tparams, topt = make()
    traced = hn.trace(traced_step)
    eager_step, eparams, eopt = make()
    rng = np.random.default_rng(9)
    for steps in (12, 12, 15, 15, 21, 21, 8, 40, 12, 9, 33, 15):
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        y = hn.tensor(rng.integers(0, 2, 3))
        np.testing.assert_allclose(traced(xs, y).item(), eager_step(xs, y).item(),
                                   rtol=1e-5, atol=1e-6)
        for a, b in zip(tparams, eparams):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4,
                                       atol=1e-6)
            sa, sb = topt.state[a], eopt.state[b]
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(sa[key].numpy(), sb[key].numpy(), rtol=1e-4,
                                           atol=1e-7)
    generic = [e for e in traced.specializations.values() if e.symbolic]
    assert generic and generic[0].traces[0].result.backend == "llvm", traced.stats.events
    assert traced.stats.compiled_calls >= 4, traced.stats


_CHILD = """
import numpy as np, hybridnet as hn, hybridnet.nn as nn, hybridnet.nn.functional as F
hn.manual_seed(0)
cell = nn.GRUCell(4, 5)
def loss(xs, y):
    h = hn.zeros(3, 5)
    for t in range(xs.shape[0]):
        h = cell(xs[t], h)
    return F.mse_loss(h, y)
f = hn.trace(loss)
rng = np.random.default_rng(0)
for steps in (9, 12, 16, 30):
    xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
    y = hn.tensor(rng.standard_normal((3, 5)).astype(np.float32))
    cell.zero_grad(); f(xs, y).backward()
    got = [p.grad.numpy().copy() for p in cell.parameters()]
    cell.zero_grad(); loss(xs, y).backward()
    err = max(float(np.abs(a - p.grad.numpy()).max()) for a, p in zip(got, cell.parameters()))
(entry,) = [e for e in f.specializations.values() if e.symbolic]
res = entry.traces[0].result
print(int(res.kernel.from_disk), int(res.backward.kernel.from_disk), ",".join(res.kernel.phases),
      err)
"""


def test_a_new_process_loads_the_kernel_for_every_length_from_disk(tmp_path):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, HYBRIDNET_CACHE_DIR=str(tmp_path), PYTHONPATH=root)
    env.pop("HYBRIDNET_BACKEND", None)

    def child():
        out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                             env=env, check=True)
        fw, bw, phases, err = out.stdout.split()
        return int(fw), int(bw), phases, float(err)
    fw, bw, phases, err = child()
    assert (fw, bw) == (0, 0) and "llvm_optimize" in phases and err < 1e-5
    fw, bw, phases, err = child()
    assert (fw, bw) == (1, 1) and "llvm_optimize" not in phases and err < 1e-5, phases


def test_a_loop_trace_is_lowered_at_its_first_run_and_falls_back_then():
    """A trace with loops is lowered when it first runs compiled (DeferredKernel); a graph
    llvm fails to lower then (an embedding lookup inside the loop body) is compiled by
    numba, with the reason, and gives eager's answer."""
    from runtime.pipeline import DeferredKernel
    hn.manual_seed(0)
    emb = nn.Embedding(7, 5)

    def f(tokens):
        h = hn.zeros(3, 5)
        for t in range(tokens.shape[0]):
            h = hn.tanh(emb(tokens[t]) + h)
        return h
    traced = hn.trace(f)
    tokens = hn.tensor(np.random.default_rng(0).integers(0, 7, (9, 3)))
    with hn.no_grad():
        traced(tokens)
        (entry,) = traced.specializations.values()
        kernel = entry.traces[0].result.kernel
        assert isinstance(kernel, DeferredKernel) and not kernel.compiled
        for _ in range(2):
            np.testing.assert_allclose(traced(tokens).numpy(), f(tokens).numpy(), rtol=1e-5)
    assert kernel.compiled and "inside a loop body" in kernel.fallback, kernel.fallback
    assert traced.stats.compiled_calls == 2
    assert any(e["kind"] == "backend_fallback" for e in traced.stats.events)
    report = str(hn.explain(traced, tokens))
    assert "loop" in report and "inside a loop body" in report


# ---- regressions from the adversarial review ----------------------------------------------


def _compare_over(f, lengths, seed=0):
    traced = hn.trace(f)
    rng = np.random.default_rng(seed)
    with hn.no_grad():
        for steps in lengths:
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            np.testing.assert_allclose(traced(xs).numpy(), f(xs).numpy(), rtol=1e-5,
                                       atol=1e-5, err_msg=f"{steps} steps")
    return traced


def _stacked(cell, tail):
    def f(xs):
        h, outs = hn.zeros(3, 5), []
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
            outs.append(h)
        return tail(h, outs, xs.shape[0])
    return f


@pytest.mark.parametrize("name, tail", [
    ("float(n)", lambda h, outs, n: h * float(n)),
    ("n - 7", lambda h, outs, n: h * float(n - 7)),
    ("zeros(n)", lambda h, outs, n: h + hn.ones(n, 1, 1).sum(0)),
    ("stack[::4]", lambda h, outs, n: hn.stack(outs)[::4].sum(0)),
    ("stack[:20]", lambda h, outs, n: hn.stack(outs)[:20].sum(0)),
    ("stack[-20:]", lambda h, outs, n: hn.stack(outs)[-20:].sum(0)),
])
def test_values_and_slices_computed_from_the_length_stay_eagers(name, tail):
    """Python arithmetic on the length (a constant of the trace: `float(n - 7)` was fitted
    as an affine literal in review, silently wrong at other lengths), a strided slice
    along it, slices clamped at the traced lengths: none becomes one kernel's affine size.
    (What Python alone decides from the length and that is the same at every traced
    length, `n % 7` at 13, 20 and 27, or `outs[:20]` of a list with fewer items, cannot
    be told from a constant: docs/jit.md, Loops.)"""
    hn.manual_seed(3)
    cell = nn.RNNCell(4, 5)
    _compare_over(_stacked(cell, tail), (10, 11, 13, 10, 11, 13, 14, 20, 21, 30, 5, 6, 64))


def test_kernels_shared_by_two_functions_keep_their_own_bounds():
    """Two traced functions share a backward kernel (the same loss); one also slices
    xs[:9], which raises its least length: the other's calls still run compiled from 5
    steps on, forward and backward (review: a shared program's bound was changed)."""
    hn.manual_seed(2)
    cell = nn.RNNCell(4, 5)

    def a(xs):
        return F.mse_loss(_over(cell, xs), hn.zeros(3, 5))

    def c(xs):
        return a(xs) + 0.0 * xs[:9].sum()
    ta, tc = hn.trace(a), hn.trace(c)
    rng = np.random.default_rng(2)
    for steps in (12, 12, 13, 13, 17, 17, 15, 6, 30, 10):
        xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
        for traced in (ta, tc):
            same_loss_and_grads(traced, cell, xs)
    assert _symbolic(ta).backend == "llvm" and _symbolic(tc).backend == "llvm"


def test_explain_says_how_the_kernel_finds_its_length():
    hn.manual_seed(5)
    cell = nn.GRUCell(4, 5)
    traced = hn.trace(lambda xs: _over(cell, xs))
    rng = np.random.default_rng(5)
    with hn.no_grad():
        for steps in (9, 12, 16, 16):
            xs = hn.tensor(rng.standard_normal((steps, 3, 4)).astype(np.float32))
            traced(xs)
        report = str(hn.explain(traced, xs))
    assert "one llvm kernel for every length n" in report, report
    assert "traces at n = [9, 12, 16]" in report


@pytest.mark.parametrize("name, tail", [
    ("split(20)[0]", lambda h, outs, n: hn.stack(outs).split(20)[0].sum(0)),
    ("split(20)[-1]", lambda h, outs, n: hn.stack(outs).split(20)[-1].sum(0)),
    ("chunk(2)[1]", lambda h, outs, n: hn.stack(outs).chunk(2)[1].sum(0)),
    ("split(n // 2)[0]", lambda h, outs, n: hn.stack(outs).split(n // 2)[0].sum(0)),
])
def test_split_and_chunk_along_the_length_stay_eagers(name, tail):
    """Pieces whose bounds Python decided from the time dim's size (review: split(20) at
    10, 11 and 13 steps passed for a whole slice, wrong at 30)."""
    hn.manual_seed(3)
    cell = nn.RNNCell(4, 5)
    _compare_over(_stacked(cell, tail), (10, 10, 11, 11, 13, 13, 30, 20, 21, 22, 64, 19))


def test_chunk_of_a_fixed_dim_still_generalizes():
    """An LSTM cell chunks its gates (a fixed dim) every step: its lengths still become
    symbolic, one llvm kernel."""
    hn.manual_seed(4)
    cell = nn.LSTMCell(4, 5)
    traced = _compare_over(lambda xs: _over(cell, xs, lstm=True), (9, 9, 12, 12, 16, 16, 30))
    assert _symbolic(traced).backend == "llvm"
