"""Random draws in traced calls (dropout, Dropout2d, rand, randn): each compiled call
draws its recipes anew from the global generator, in the order eager draws them, used
or not, so results, parameters and the generator's state equal an eager twin's after
every call; a call that leaves the compiled path puts the generator back first."""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F


def _next_draw():
    return hn.creation.generator().random(3).tolist()  # (consumes: call once per check)


def _twin_step(dropout):
    hn.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), dropout, nn.Linear(16, 4))
    opt = hn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        noise = hn.rand(2) + hn.randn(3).sum()
        hn.randn(4)  # drawn and never used: the generator still moves past it
        return loss.detach(), noise
    return model, step


@pytest.mark.parametrize("dropout", [nn.Dropout(0.3), nn.Dropout(0.0), nn.Identity()],
                         ids=["dropout", "p0", "none"])
def test_traced_training_step_with_random_draws_equals_eager(dropout):
    (me, se), (mt, st) = _twin_step(dropout), _twin_step(type(dropout)(
        *([dropout.p] if isinstance(dropout, nn.Dropout) else [])))
    traced = hn.trace(st)
    rng = np.random.default_rng(1)
    for k in range(6):
        x = hn.tensor(rng.standard_normal((5, 8)).astype(np.float32))
        y = hn.tensor(rng.integers(0, 4, 5))
        hn.manual_seed(100 + k)
        le, ne = se(x, y)
        after_eager = _next_draw()
        hn.manual_seed(100 + k)
        lt, nt = traced(x, y)
        after_traced = _next_draw()
        assert after_traced == after_eager  # the generator ends where eager's does
        assert lt.item() == pytest.approx(le.item(), rel=1e-6)
        np.testing.assert_allclose(nt.numpy(), ne.numpy(), rtol=1e-6)
        for p, q in zip(me.parameters(), mt.parameters()):
            np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), atol=1e-6)
    assert traced.stats.compiled_calls >= 3, traced.stats.events


def test_dropout2d_traced_equals_eager():
    def f(x):
        return F.dropout2d(x, 0.5, training=True) * 2.0
    traced = hn.trace(f)
    x = hn.randn(2, 6, 3, 3)
    with hn.no_grad():
        for seed in range(4):
            hn.manual_seed(seed)
            want = f(x)
            hn.manual_seed(seed)
            got = traced(x)
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert traced.stats.compiled_calls >= 2


def test_side_exit_after_drawing_puts_the_generator_back():
    """A value guard fails after the compiled call drew its mask: the eager rerun must
    draw exactly what a plain eager call draws."""
    def f(x):
        y = F.dropout(x, 0.5)
        if y.sum() > 0:  # a value guard
            return y * 2.0
        return y * 3.0
    traced = hn.trace(f)
    x = hn.ones(64)
    outcomes = set()
    with hn.no_grad():
        for seed in range(12):
            hn.manual_seed(seed)
            want, want_next = f(x), _next_draw()
            hn.manual_seed(seed)
            got, got_next = traced(x), _next_draw()
            np.testing.assert_array_equal(got.numpy(), want.numpy())
            assert got_next == want_next
            outcomes.add(bool(want.sum() > 0))
        # an all-dropped mask sends y.sum() to 0: make the other branch happen for sure
        hn.manual_seed(0)
        zeros = hn.zeros(64)
        want, want_next = f(zeros), _next_draw()
        hn.manual_seed(0)
        got, got_next = traced(zeros), _next_draw()
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert got_next == want_next
    assert traced.stats.compiled_calls >= 5 and traced.stats.side_exits >= 1, traced.stats


def test_export_refuses_a_function_that_draws():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    with pytest.raises(hn.ExportError, match="random"):
        hn.export(model, hn.randn(2, 3))
