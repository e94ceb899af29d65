"""Adversarial regressions for random draws in traced calls: after every call a traced
function's results and the global generator's state must equal a plain eager run's from
the same seed."""

import numpy as np
import pytest

import hybridnet as hn


def _next_draw():
    return hn.creation.generator().random(3).tolist()  # (consumes: call once per check)


def _twin_calls(fn, traced, make_args, seeds):
    for seed in seeds:
        hn.manual_seed(seed)
        want = fn(*make_args(seed))
        want_next = _next_draw()
        hn.manual_seed(seed)
        got = traced(*make_args(seed))
        got_next = _next_draw()
        np.testing.assert_allclose(np.asarray(got.numpy()), np.asarray(want.numpy()),
                                   rtol=1e-6, atol=1e-6)
        assert got_next == want_next, f"seed {seed}: the generator is not where eager's is"


@pytest.mark.parametrize("backend", ["llvm", "numba"])
def test_unused_draw_in_a_function_of_arguments_only_moves_the_generator(backend):
    """A trace whose inputs are all arguments takes the short gather path (and then the
    fast runner), which skipped the call's draws: the generator never moved."""
    def f(x):
        hn.randn(4)  # drawn, never used
        return x * 2.0
    traced = hn.trace(f, backend=backend)
    with hn.no_grad():
        _twin_calls(f, traced, lambda s: (hn.ones(3),), range(5))
    assert traced.stats.compiled_calls >= 3, traced.stats.events


def test_generalized_loop_trace_draws_each_lengths_recipes():
    """Traces at different sequence lengths merge into one with symbolic lengths although
    their draws differ (an unused draw of the sequence's length): the merged trace
    then replays the first length's recipes at every length."""
    W = hn.tensor(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    lengths = [3, 5, 4, 7, 6, 8, 9]

    def f(x):
        h = hn.randn(2, 4)
        hn.rand(x.shape[0])  # drawn, unused; its size is the sequence's length
        for t in range(x.shape[0]):
            h = hn.tanh(x[t] @ W + h)
        return h

    def args(seed):
        n = lengths[seed]
        return (hn.tensor(np.random.default_rng(seed).standard_normal((n, 2, 4))
                          .astype(np.float32)),)
    traced = hn.trace(f)
    with hn.no_grad():
        _twin_calls(f, traced, args, range(len(lengths)))


@pytest.mark.parametrize("make", [
    lambda x: hn.randn(4, 4).T,
    lambda x: hn.randn(4, 4)[0],
], ids=["transpose", "row"])
def test_result_that_is_a_view_of_a_draw(make):
    """A result eager returns as a view of a drawn tensor: the compiled call looked the
    draw up as a .grad source (AttributeError: 'str' object has no attribute 'resolve')."""
    def f(x):
        return make(x)
    traced = hn.trace(f)
    with hn.no_grad():
        _twin_calls(f, traced, lambda s: (hn.ones(4),), range(4))


def test_in_place_update_of_a_draw():
    """A drawn tensor updated in place (noise scaled in place): the compiled call bumped
    the version of the draw's source, looked up as a .grad (AttributeError)."""
    def f(x):
        noise = hn.randn(3)
        noise.mul_(0.1)
        return x + noise
    traced = hn.trace(f)
    with hn.no_grad():
        _twin_calls(f, traced, lambda s: (hn.ones(3),), range(4))
