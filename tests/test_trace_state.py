"""Regression tests: traced calls leave state exactly as eager calls do.

Each test names the fact it pins down (from the issue "Traced code keeps state exactly
as eager code does"); each failed before the change.
"""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn.functional as F


def _values(t):
    return t.detach().numpy().copy()


def test_mutator_returning_none_applies_its_update_once_per_call():
    @hn.trace
    def bump(t):
        t.add_(1.0)

    z = hn.zeros(3)
    seen = []
    for _ in range(4):
        assert bump(z) is None
        seen.append(_values(z)[0])
    assert seen == [1.0, 2.0, 3.0, 4.0]
    assert bump.stats.compiled_calls == 3


def test_returned_argument_is_the_same_object():
    @hn.trace
    def bump(t):
        return t.add_(1.0)

    z = hn.zeros(3)
    for _ in range(3):
        assert bump(z) is z
    np.testing.assert_array_equal(_values(z), [3.0, 3.0, 3.0])
    assert bump.stats.compiled_calls == 2


def test_returned_closure_tensor_is_the_same_object():
    state = hn.zeros(2)

    @hn.trace
    def tick(x):
        state.add_(x)
        return state

    with hn.no_grad():
        for _ in range(3):
            assert tick(hn.ones(2)) is state
    np.testing.assert_array_equal(_values(state), [3.0, 3.0])


def test_learning_rate_changed_between_calls_is_honoured_without_recompiling():
    w = hn.nn.Parameter(hn.ones(3))
    opt = hn.optim.SGD([w], lr=0.1)

    @hn.trace
    def step():
        opt.step()

    w.grad = hn.ones(3)
    steps = []
    with hn.no_grad():
        for lr in [0.1, 0.1, 0.1, 1.0, 0.5, 0.25]:
            opt.param_groups[0]["lr"] = lr
            before = _values(w)
            step()
            steps.append(float((before - _values(w))[0]))
    np.testing.assert_allclose(steps, [0.1, 0.1, 0.1, 1.0, 0.5, 0.25], rtol=1e-6)
    assert step.stats.compiles + step.stats.kernel_reuses == 1  # (a kernel another test
    assert step.stats.traces == 2  # compiled may be reused) traced once after the first step
    assert step.stats.compiled_calls == 4


@pytest.mark.parametrize("make", [
    lambda ps: hn.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda ps: hn.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: hn.optim.Adam(ps, lr=0.01),
    lambda ps: hn.optim.AdamW(ps, lr=0.01, amsgrad=True),
])
def test_optimizer_settings_schedule_matches_eager(make):
    def build():
        hn.manual_seed(0)
        w = hn.nn.Parameter(hn.randn(4))
        return w, make([w])

    (w1, o1), (w2, o2) = build(), build()

    def step_of(opt):
        def step():
            opt.step()
        return step

    eager, traced = step_of(o1), hn.trace(step_of(o2))
    with hn.no_grad():
        for i in range(8):
            g = hn.randn(4)
            w1.grad, w2.grad = g.clone(), g.clone()
            for opt in (o1, o2):
                group = opt.param_groups[0]
                group["lr"] = 0.1 / (i + 1)
                group["weight_decay"] = 0.0 if i < 4 else 0.05
                if "betas" in group:
                    group["betas"] = (0.9, 0.99 if i % 2 else 0.999)
                if "momentum" in group:
                    group["momentum"] = 0.9 if i < 6 else 0.5
            eager()
            traced()
            np.testing.assert_allclose(_values(w2), _values(w1), rtol=1e-5, atol=1e-6)
    sd1, sd2 = o1.state_dict(), o2.state_dict()
    assert sd1["param_groups"] == sd2["param_groups"]
    for k, v in sd1["state"][0].items():
        np.testing.assert_allclose(sd2["state"][0][k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6)
    assert traced.stats.compiled_calls >= 3


def test_user_code_reading_a_setting_is_guarded():
    w = hn.nn.Parameter(hn.ones(2))
    opt = hn.optim.SGD([w], lr=0.5)

    @hn.trace
    def scaled(x):
        return x * opt.param_groups[0]["lr"]

    with hn.no_grad():
        x = hn.ones(2)
        assert _values(scaled(x))[0] == 0.5
        assert _values(scaled(x))[0] == 0.5
        opt.param_groups[0]["lr"] = 2.0
        assert _values(scaled(x))[0] == 2.0
        assert _values(scaled(x))[0] == 2.0


def _classifier():
    hn.manual_seed(0)
    model = hn.nn.Sequential(hn.nn.Linear(4, 8), hn.nn.Tanh(), hn.nn.Linear(8, 3))
    return model, hn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_traced_training_step_keeps_the_model_intact():
    model, opt = _classifier()
    twin, twin_opt = _classifier()

    def make(m, o):
        def train_step(x, y):
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            return loss
        return train_step

    traced, eager = hn.trace(make(model, opt)), make(twin, twin_opt)
    x, y = hn.randn(5, 4), hn.randint(0, 3, (5,))
    for _ in range(3):
        lt, le = traced(x, y), eager(x, y)
        np.testing.assert_allclose(float(lt), float(le), rtol=1e-6)
        for p, q in zip(model.parameters(), twin.parameters()):
            assert p.requires_grad and p.is_leaf and p.grad is None
            np.testing.assert_allclose(_values(p), _values(q), rtol=1e-6, atol=1e-7)
    assert traced.stats.compiled_calls == 1 and traced.stats.fallbacks == 0, traced.stats
    # the model still trains eagerly afterwards
    F.cross_entropy(model(x), y).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_in_place_update_of_a_leaf_under_no_grad_keeps_requires_grad():
    w = hn.nn.Parameter(hn.ones(3))

    @hn.trace
    def decay(x):
        w.sub_(x * 0.1)
        return w * 2

    with hn.no_grad():
        for _ in range(3):
            decay(hn.ones(3))
            assert w.requires_grad and w.is_leaf
    np.testing.assert_allclose(_values(w), [0.7, 0.7, 0.7], rtol=1e-6)
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [1.4, 1.4, 1.4], rtol=1e-6)


def test_step_traced_while_grad_was_none_applies_later_gradients():
    w = hn.nn.Parameter(hn.ones(2))
    opt = hn.optim.SGD([w], lr=1.0)

    @hn.trace
    def step():
        opt.step()

    with hn.no_grad():
        step()
        step()  # p.grad is None: nothing to do, as in eager
        np.testing.assert_array_equal(_values(w), [1.0, 1.0])
        w.grad = hn.ones(2)
        step()
        step()
        w.grad = None
        step()
    np.testing.assert_array_equal(_values(w), [-1.0, -1.0])


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_inside_a_traced_call_is_replayed(set_to_none):
    model = hn.nn.Linear(3, 2)
    opt = hn.optim.SGD(model.parameters(), lr=0.1)

    @hn.trace
    def step():
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    with hn.no_grad():
        for i in range(4):
            for p in model.parameters():
                if set_to_none or p.grad is None:
                    p.grad = hn.ones(*p.shape)
                else:
                    p.grad.add_(1.0)
            step()
            for p in model.parameters():
                if set_to_none:
                    assert p.grad is None, i
                else:
                    np.testing.assert_array_equal(p.grad.numpy(), np.zeros(p.shape))
    np.testing.assert_allclose(_values(model.bias), model.bias.detach().numpy())
    assert step.stats.compiled_calls >= 1


def test_growing_list_attribute_that_forward_does_not_read_does_not_miss():
    class Policy(hn.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = hn.nn.Linear(4, 2)
            self.rewards, self.saved_log_probs = [], []

        def forward(self, x):
            return F.softmax(self.fc(x), 1)

    policy = Policy()
    traced = hn.trace(policy)
    with hn.no_grad():
        for i in range(30):
            probs = traced(hn.randn(1, 4))
            policy.rewards.append(float(i))
            policy.saved_log_probs.append(probs.log())
    assert traced.stats.misses == 1
    assert traced.stats.compiled_calls == 29


def test_list_attribute_that_forward_reads_is_guarded():
    class Scaled(hn.nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = [1.0]

        def forward(self, x):
            return x * self.scales[-1]

    m = Scaled()
    traced = hn.trace(m)
    with hn.no_grad():
        x = hn.ones(2)
        for s in [1.0, 1.0, 3.0, 3.0, 5.0]:
            if s != m.scales[-1]:
                m.scales.append(s)
            assert _values(traced(x))[0] == s


def test_traced_module_behaves_as_the_module():
    model = hn.nn.Sequential(hn.nn.Linear(3, 4), hn.nn.Dropout(0.5))
    traced = hn.trace(model)
    assert [id(p) for p in traced.parameters()] == [id(p) for p in model.parameters()]
    assert traced.eval() is model and not model.training and not traced.training
    assert list(traced.state_dict()) == list(model.state_dict())
    assert traced[0] is model[0]
    with hn.no_grad():
        x = hn.randn(2, 3)
        np.testing.assert_allclose(traced(x).numpy(), model(x).numpy(), rtol=1e-6)
        np.testing.assert_allclose(traced(x).numpy(), model(x).numpy(), rtol=1e-6)
    traced.train()
    assert model.training


def test_zero_dim_results_are_ndarrays():
    x = hn.randn(5)
    for t in (x.mean(), x.sum(), x.amax(), x.var(), hn.tensor(2.0) * 3):
        assert type(t._data) is np.ndarray and t._data.ndim == 0
        assert np.asarray(t).shape == ()
    loss = F.mse_loss(x, hn.zeros(5))
    assert float(np.asarray(loss)) == pytest.approx(float(loss.item()))


def test_load_state_dict_between_calls_is_seen():
    model = hn.nn.Linear(2, 1)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    traced = hn.trace(model)
    x = hn.ones(1, 2)
    with hn.no_grad():
        before = _values(traced(x))
        traced(x)
        with hn.no_grad():
            model.weight.add_(1.0)
        assert not np.allclose(_values(traced(x)), before)
        model.load_state_dict(saved)
        np.testing.assert_allclose(_values(traced(x)), before, rtol=1e-6)


def test_events_say_what_differed():
    @hn.trace
    def f(x, k):
        return x * k

    with hn.no_grad():
        f(hn.ones(2), 2.0)
        f(hn.ones(3), 2.0)
        f(hn.ones(3), 3.0)
    details = [e["detail"] for e in f.stats.events if e["kind"] == "recompile"]
    assert "tensor input 0: float32[3] (was float32[2])" in details[0]
    assert "Python values" in details[1]


def test_fast_guard_serves_real_functions():
    model = hn.nn.Linear(4, 4)

    @hn.trace
    def uses_globals(x):
        return hn.tanh(model(x) * 2 + 1)

    @hn.trace
    def takes_list(xs):
        return hn.tanh(xs[0] * 2 + xs[1])

    with hn.no_grad():
        x = hn.randn(3, 4)
        for _ in range(5):
            uses_globals(x)
            takes_list([x, x * 2])
    for fn in (uses_globals, takes_list):
        assert fn.stats.slow_lookups == 1, fn.guard_source  # only the first call
        assert "def guard(args, kwargs)" in fn.guard_source


def test_versions_after_compiled_calls_match_eager():
    def bump(t, u):
        t.add_(1.0)
        t.mul_(2.0)
        u.sub_(1.0)
        return t + u

    traced = hn.trace(bump)
    a, b, c, d = hn.zeros(3), hn.ones(3), hn.zeros(3), hn.ones(3)
    with hn.no_grad():
        for _ in range(4):
            bump(a, b)
            traced(c, d)
            assert (c._version, d._version) == (a._version, b._version)
    assert (a._version, b._version) == (8, 4)
    assert traced.stats.compiled_calls == 3


def test_side_exit_event_says_which_value_changed():
    @hn.trace
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x * 3

    with hn.no_grad():
        for v in (1.0, 1.0, -1.0):
            f(hn.full((3,), v))
    exits = [e["detail"] for e in f.stats.events if e["kind"] == "side_exit"]
    assert exits and "saw True while tracing, False now" in exits[0]


def test_update_through_param_data_is_traced_and_matches_eager():
    """PyTorch's word_language_model updates with `p.data.add_(p.grad, alpha=-lr)`: an
    in-place op on the `.data` alias of a parameter changes the parameter (untracked by
    autograd). Traced, it is an update of the parameter written back after the call."""
    def make():
        hn.manual_seed(0)
        lin = hn.nn.Linear(3, 2)

        def step(x, lr):
            loss = (lin(x) ** 2).sum()
            lin.zero_grad()
            loss.backward()
            for p in lin.parameters():
                p.data.add_(p.grad, alpha=-lr)
            lin.weight.data.clamp_(-0.5, 0.5)
            return loss.detach()
        return lin, step
    (lin_e, step_e), (lin_t, step_t) = make(), make()
    traced = hn.trace(step_t)
    x = hn.randn(4, 3)
    for _ in range(5):
        le, lt = step_e(x, 0.1), traced(x, 0.1)
        assert abs(le.item() - lt.item()) <= 1e-5 * max(1.0, abs(le.item()))
        for pe, pt in zip(lin_e.parameters(), lin_t.parameters()):
            np.testing.assert_allclose(pt.detach().numpy(), pe.detach().numpy(), rtol=1e-6,
                                       atol=1e-7)
            assert pt.requires_grad and pt.is_leaf
    assert traced.stats.compiled_calls >= 3, traced.stats.events
