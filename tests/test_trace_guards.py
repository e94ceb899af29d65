"""Guards of the tracing JIT: every call returns the eager result, whatever changes."""

import numpy as np
import pytest

import hybridnet as hn


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_first_call_is_eager_then_compiled():
    @hn.trace
    def f(x):
        return (x * 2.0 + 1.0).tanh()
    x = hn.randn(5)
    first, second = f(x), f(x)
    _close(first.numpy(), np.tanh(x.numpy() * 2 + 1))
    _close(second.numpy(), first.numpy())
    assert f.stats.eager_calls == 1 and f.stats.compiled_calls == 1 and f.stats.compiles == 1


@pytest.mark.parametrize("backend", ["numba", "llvm"])
def test_new_shape_and_dtype_recompile_or_reuse(backend):
    def f(x):
        return (x * x).sum(1)
    f = hn.trace(f, backend=backend)
    for shape in [(2, 3), (2, 3), (4, 3), (4, 3)]:
        x = hn.randn(*shape)
        _close(f(x).numpy(), (x.numpy() ** 2).sum(1))
    # numba: one size-generic kernel serves both sizes; llvm: one kernel per exact shape
    expected = (1, 1) if backend == "numba" else (0, 2)
    assert (f.stats.kernel_reuses, f.stats.compiles) == expected
    x64 = hn.randn(2, 3, dtype=hn.float64)
    out = f(x64)
    assert out.dtype == hn.float64
    _close(f(x64).numpy(), (x64.numpy() ** 2).sum(1))
    assert f.stats.compiles == expected[1] + 1


def test_dynamic_false_never_reuses_across_shapes():
    # (a constant no other test uses: a kernel another test compiled for the same graph
    # and shape would count as a reuse, as tests/test_trace_state.py's x * 3.0 did)
    f = hn.trace(lambda x: x * 3.0137, dynamic=False)
    for n in (3, 3, 5, 5):
        x = hn.randn(n)
        _close(f(x).numpy(), x.numpy() * 3.0137)
    assert f.stats.kernel_reuses == 0


def test_python_scalar_argument_is_guarded():
    @hn.trace
    def f(x, k):
        return x * k
    x = hn.ones(3)
    for k in (2.0, 2.0, 3.0, 3.0, 2.0):
        _close(f(x, k).numpy(), np.full(3, k))
    assert f.stats.misses == 2


def test_branch_on_tensor_value_flips_between_calls():
    @hn.trace
    def f(x):
        if x.sum() > 0:
            return x * 2.0
        return x - 1.0
    pos, neg = hn.ones(3), -hn.ones(3)
    for t in [pos, pos, neg, neg, neg, pos, neg, pos]:
        ref = t.numpy() * 2 if t.numpy().sum() > 0 else t.numpy() - 1
        _close(f(t).numpy(), ref)
    assert f.stats.side_exits >= 1
    spec = next(iter(f.specializations.values()))
    assert len(spec.traces) == 2  # the other path repeated, so it was compiled too


def test_while_loop_with_value_dependent_trip_count():
    @hn.trace
    def f(x):
        steps = 0
        while x.sum() < 100:
            x = x * 2.0
            steps += 1
        return x, steps
    for v in [1.0, 1.0, 3.0, 3.0, 3.0, 50.0, 1.0]:
        out, steps = f(hn.full((2,), v))
        expect, n = np.full(2, v), 0
        while expect.sum() < 100:
            expect, n = expect * 2, n + 1
        _close(out.numpy(), expect)
        assert steps == n


def test_item_used_in_arithmetic():
    @hn.trace
    def f(x):
        s = x.sum().item()
        return x * s + float(x.max())
    for values in ([1.0, 2.0], [1.0, 2.0], [2.0, 2.0], [2.0, 2.0], [1.0, 2.0]):
        x = hn.tensor(values)
        a = np.array(values, np.float32)
        _close(f(x).numpy(), a * a.sum() + a.max())


def test_numpy_inside_falls_back_with_reason():
    @hn.trace
    def f(x):
        return hn.tensor(x.numpy() * 2)
    x = hn.tensor([1.0, 2.0])
    for _ in range(3):
        _close(f(x).numpy(), [2.0, 4.0])
    x.numpy()[0] = 5.0
    _close(f(x).numpy(), [10.0, 4.0])
    assert f.stats.compiled_calls == 0 and f.stats.fallbacks >= 1
    reasons = [e["detail"] for e in f.stats.events if e["kind"] == "fallback"]
    assert any("numpy" in r for r in reasons)


def test_random_numbers_are_drawn_anew_by_each_compiled_call():
    def plain(x):
        return x + hn.rand(*x.shape)
    f = hn.trace(plain)
    x = hn.zeros(1000)
    f(x)
    b, c = f(x), f(x)
    assert not np.array_equal(b.numpy(), c.numpy())  # never replays a baked-in sample
    assert f.stats.compiled_calls >= 1
    hn.manual_seed(5)
    want = plain(x)
    hn.manual_seed(5)
    np.testing.assert_array_equal(f(x).numpy(), want.numpy())  # the draws eager makes


def test_parameter_changed_in_place_is_seen():
    model = hn.nn.Linear(3, 2)
    traced = hn.trace(model)
    x = hn.randn(4, 3)
    with hn.no_grad():
        traced(x)
        before = traced(x).numpy().copy()
        model.weight.mul_(2.0)
        model.bias.zero_()
        after = traced(x).numpy()
        _close(after, model(x).numpy())
    assert not np.allclose(before, after)
    assert traced.stats.compiled_calls == 2


def test_closure_and_global_tensors_are_inputs_not_constants():
    scale = hn.tensor([1.0, 2.0])

    @hn.trace
    def f(x):
        return x * scale
    x = hn.ones(2)
    _close(f(x).numpy(), [1.0, 2.0])
    _close(f(x).numpy(), [1.0, 2.0])
    with hn.no_grad():
        scale.mul_(10.0)
    _close(f(x).numpy(), [10.0, 20.0])


def test_cache_limit_reached_still_correct():
    @hn.trace(cache_limit=2)
    def f(x, k):
        return x + k
    x = hn.zeros(2)
    for k in range(8):
        _close(f(x, float(k)).numpy(), [k, k])
    assert len(f.specializations) <= 2
    assert any(e["kind"] == "cache_limit" for e in f.stats.events)


def test_module_switched_to_eval_changes_dropout():
    hn.manual_seed(0)
    model = hn.nn.Sequential(hn.nn.Linear(8, 8), hn.nn.Dropout(0.5))
    traced = hn.trace(model)
    x = hn.randn(16, 8)
    with hn.no_grad():
        model.train()
        traced(x)
        assert traced.stats.compiled_calls == 0  # (the first call records)
        model.eval()
        out1, out2 = traced(x), traced(x)
        _close(out1.numpy(), model(x).numpy())
        _close(out2.numpy(), model(x).numpy())
    assert traced.stats.compiled_calls == 1


def test_inputs_requiring_grad_compile_forward_and_backward_and_grad_mode_is_in_the_key():
    @hn.trace
    def f(x):
        return (x * x).sum()
    x = hn.randn(3, requires_grad=True)
    for _ in range(2):
        x.grad = None
        y = f(x)
        y.backward()
        _close(x.grad.numpy(), 2 * x.detach().numpy())
    assert f.stats.compiled_calls == 1 and f.stats.compiled_backwards == 1
    with hn.no_grad():
        f(x), f(x)
    # its own specialization, whose forward may reuse the kernel: the saved x is the
    # input itself, not a copy, so both forwards have one graph
    assert f.stats.compiled_calls == 2 and len(f.specializations) == 2
    assert f.stats.misses == 2 and f.stats.compiles + f.stats.kernel_reuses == 2


def test_disable_jit_env(monkeypatch):
    f = hn.trace(lambda x: x + 1.0)
    monkeypatch.setenv("HYBRIDNET_DISABLE_JIT", "1")
    for _ in range(3):
        _close(f(hn.zeros(2)).numpy(), [1.0, 1.0])
    assert f.stats.compiled_calls == 0 and f.stats.traces == 0
    monkeypatch.delenv("HYBRIDNET_DISABLE_JIT")
    f(hn.zeros(2)), f(hn.zeros(2))
    assert f.stats.compiled_calls == 1


def test_containers_in_and_out():
    @hn.trace
    def f(d, pair):
        a, b = pair
        return {"sum": d["x"] + a, "prod": [d["x"] * b, 3]}
    d = {"x": hn.ones(2)}
    pair = (hn.full((2,), 2.0), hn.full((2,), 3.0))
    for _ in range(2):
        out = f(d, pair)
        _close(out["sum"].numpy(), [3.0, 3.0])
        _close(out["prod"][0].numpy(), [3.0, 3.0])
        assert out["prod"][1] == 3
    assert f.stats.compiled_calls == 1


def test_in_place_update_of_argument_is_written_back():
    @hn.trace
    def step(buf, x):
        buf.add_(x)
        return buf * 1.0
    with hn.no_grad():
        buf, x = hn.zeros(3), hn.ones(3)
        for i in range(1, 5):
            out = step(buf, x)
            _close(buf.numpy(), np.full(3, i))
            _close(out.numpy(), np.full(3, i))
    assert step.stats.compiled_calls == 3


def test_explain_report_lists_graphs_kernels_and_guards():
    def f(x):
        if x.sum() > 0:
            return hn.softmax(x * 2.0, 1)
        return x
    report = hn.explain(f, hn.ones(2, 3))
    text = str(report)
    assert "captured graph" in text and "fused kernels" in text and "guard: bool" in text
    data = report.to_dict()
    tr = data["specializations"][0]["traces"][0]
    assert tr["guards"] and "entry" in tr["source"]
    assert any("max" in k and "sum" in k and "exp" in k for k in tr["kernels"])


def test_benchmark_result_fields():
    res = hn.benchmark(lambda x: (x * 2.0).tanh(), hn.randn(1000), repeat=3)
    assert res.eager_seconds > 0 and res.compiled_seconds > 0 and res.compile_seconds > 0
    assert res.speedup == pytest.approx(res.eager_seconds / res.compiled_seconds)
    assert "speedup" in str(res) and set(res.to_dict()) >= {"speedup", "break_even_calls"}


def test_cross_entropy_compiles_and_still_rejects_bad_targets():
    import hybridnet.nn.functional as F
    f = hn.trace(lambda x, t: F.cross_entropy(x, t))
    x, t = hn.randn(8, 5), hn.randint(0, 5, (8,))
    with hn.no_grad():
        f(x, t)
        _close(f(x, t).numpy(), F.cross_entropy(x, t).numpy())
        assert f.stats.compiled_calls == 1
        with pytest.raises(IndexError, match="target 5 is out of bounds for 5 classes"):
            f(x, hn.tensor([0, 1, 2, 3, 4, 5, 0, 1]))


def test_traced_method_of_a_module():
    class Net(hn.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = hn.nn.Linear(4, 3)

        @hn.trace
        def forward(self, x):
            return self.lin(x).tanh()

    net = Net()
    x = hn.randn(2, 4)
    with hn.no_grad():
        ref = (x @ net.lin.weight.T + net.lin.bias).tanh().numpy()
        net(x)
        _close(net(x).numpy(), ref)
        assert Net.forward.stats.compiled_calls == 1
        net.eval()
        _close(net(x).numpy(), ref)  # training flag is part of the key: a new trace
    assert Net.forward.stats.misses == 2


def test_class_attributes_are_guarded_through_a_changed_mro():
    class Base(hn.nn.Module):
        k = 2.0

    class Other(hn.nn.Module):
        k = 5.0

    class M(Base):
        def forward(self, x):
            return x * self.k

    traced, x = hn.trace(M()), hn.ones(2)
    with hn.no_grad():
        for _ in range(3):
            traced(x)
        Base.k = 3.0
        assert traced(x).tolist() == [3.0, 3.0]
        M.__bases__ = (Other,)  # the cached MRO filter must notice
        assert traced(x).tolist() == [5.0, 5.0]


def test_defaults_of_a_forward_are_guarded_cheaply_when_immutable_and_fully_when_not():
    class Scale(hn.nn.Module):
        def forward(self, x, s=2.0, extra=[0.0]):  # noqa: B006  (mutated below on purpose)
            return x * s + extra[0]

    m = Scale()
    f = hn.trace(m)
    x = hn.ones(2)
    extra = [0.0]
    Scale.forward.__defaults__ = (2.0, extra)
    with hn.no_grad():
        for k in range(4):
            extra[0] = float(k // 2)  # the same list, changed in place
            _close(f(x).numpy(), [2.0 + k // 2] * 2)
    Scale.forward.__defaults__ = (3.0,)
    g = hn.trace(lambda x, s=3.0: x * s)
    with hn.no_grad():
        g(x), g(x)
    assert "__defaults__ is" in g.guard_source and "EK(" not in g.guard_source


def test_an_attribute_named_like_a_global_is_not_a_global_read():
    """`x.data` names `data` in co_names; a module global `data` that changes must not
    make every call a new specialization (only LOAD_GLOBAL names are the key)."""
    import types as _types
    mod = _types.ModuleType("attr_vs_global")
    exec("def step(x):\n    return x.data * 2\n", mod.__dict__)
    traced = hn.trace(mod.step)
    with hn.no_grad():
        for i in range(4):
            mod.data = i
            traced(hn.ones(2))
    assert traced.stats.compiled_calls == 3, traced.stats.events
