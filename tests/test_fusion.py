"""Fusion and lowering structure: what becomes one kernel, and inspectable output."""

import linecache

import numpy as np

import hybridnet as hn
from compiler.lowering.numba_codegen import lower
from compiler.passes import optimize
from compiler.passes.fusion import LoopGroup, NodeUnit, describe, partition


def _graph(fn, *arrays):
    with hn.record() as rec:
        fn(*[hn.tensor(a) for a in arrays])
    graph, _ = optimize(rec.graph)
    return graph


def _groups(units):
    return [u for u in units if isinstance(u, LoopGroup)]


def test_chain_of_eight_elementwise_ops_is_one_kernel():
    def chain(x):
        return ((((x * 2.0 + 1.0).exp() - 3.0).tanh() * x) / 4.0).abs().sqrt()
    units = partition(_graph(chain, np.ones(16, np.float32)))
    assert len(units) == 1 and isinstance(units[0], LoopGroup)
    assert len([n for n in units[0].nodes]) >= 8


def test_softmax_is_one_kernel_with_three_phases():
    units = partition(_graph(lambda x: hn.softmax(x, 1), np.ones((4, 5), np.float32)))
    (group,) = units
    assert isinstance(group, LoopGroup) and group.inner == 1
    assert {"max", "exp", "sum", "div"} <= {n.op for n in group.nodes}
    assert len(set(group.phase.values())) == 3


def test_layer_norm_and_log_softmax_fuse_per_row():
    def ln(x):
        return hn.nn.functional.layer_norm(x, (5,))
    for fn in (ln, lambda x: hn.log_softmax(x, -1)):
        units = partition(_graph(fn, np.ones((4, 5), np.float32)))
        assert len(_groups(units)) == 1, describe(units)


def test_matmul_is_its_own_unit_and_bias_relu_fuse_after_it():
    units = partition(_graph(lambda x, w, b: (x @ w + b).relu(),
                             np.ones((4, 3), np.float32), np.ones((3, 2), np.float32),
                             np.ones(2, np.float32)))
    assert isinstance(units[0], NodeUnit) and units[0].node.op == "matmul"
    assert len(units) == 2 and {"add", "where"} <= {n.op for n in units[1].nodes}


def test_reduction_over_leading_dim_uses_a_buffer():
    units = partition(_graph(lambda x: (x * 2.0).sum(0), np.ones((4, 5), np.float32)))
    (group,) = units
    assert group.buffer_reductions and group.inner == 0


def test_generated_source_is_inspectable_and_in_linecache():
    f = hn.trace(lambda x: (x * 3.0).tanh(), backend="numba")
    x = hn.randn(8)
    f(x), f(x)
    src = f.source
    assert src.startswith("def entry(") and "for i0 in range" in src
    kernel = next(iter(f.specializations.values())).traces[0].result.kernel
    assert any(line.startswith("def entry(") for line in linecache.getlines(kernel.filename))
    assert "define" in f.llvm_ir


def test_lowering_of_a_graph_returns_program_with_units():
    program = lower(_graph(lambda x: (x + 1.0).sum(), np.ones(3, np.float32)))
    assert program.entry == "entry" and "def entry" in program.source
    assert program.shape_generic


def test_independent_chains_over_one_domain_share_a_loop():
    def w1(x):
        y = x * 1.5 + 0.1
        return hn.gelu(y, approximate="tanh") * hn.sigmoid(x) + 0.5 * x
    units = partition(_graph(w1, np.ones(64, np.float32)))
    assert len(units) == 1, describe(units)


def test_big_loops_run_in_parallel_and_stay_correct():
    from compiler.lowering.numba_codegen import PARALLEL_THRESHOLD
    f = hn.trace(lambda x: (x * 2.0 + 1.0).tanh(), backend="numba")
    x = hn.randn(PARALLEL_THRESHOLD)
    f(x)
    np.testing.assert_allclose(f(x).numpy(), np.tanh(x.numpy() * 2 + 1), rtol=1e-6, atol=1e-6)
    assert "prange(" in f.source


def test_dead_buffers_are_reused_and_results_stay_right():
    layers = [hn.nn.Linear(16, 16) for _ in range(4)]
    model = hn.nn.Sequential(*[m for lin in layers for m in (lin, hn.nn.ReLU())])
    traced = hn.trace(model, backend="numba")
    with hn.no_grad():
        for batch in (8, 8, 3, 3):
            x = hn.randn(batch, 16)
            out = traced(x)
            np.testing.assert_allclose(out.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    notes = next(iter(traced.specializations.values())).traces[0].result.program.notes
    assert any(n.startswith("buffers reused: ") and not n.endswith(" 0") for n in notes)
    assert " if v" in traced.source and ".shape == (" in traced.source


def test_long_float32_sums_accumulate_in_float64():
    x = hn.tensor(np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32) + 3)
    f = hn.trace(lambda t: t.var(), backend="numba")
    f(x)
    ref = np.var(x.numpy().astype(np.float64), ddof=1)
    assert abs(float(f(x)) - ref) / ref < 1e-6
    assert "np.float32(r" in f.source  # rounded back to float32 once, at the end
