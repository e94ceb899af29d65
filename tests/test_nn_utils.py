"""hybridnet.nn.utils (gradient clipping, parameters <-> vector) against torch.nn.utils, and
gradient clipping inside a traced training step against eager."""

import math
import warnings

import numpy as np
import pytest
import torch  # noqa: E402,F401  (the oracle: a test extra, never skipped)

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn


def needs_torch(fn):
    """Marks a test compared with PyTorch (a test extra: always installed)."""
    return fn
utils = nn.utils


def _grads(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((3, 4)) * scale, rng.standard_normal(5) * scale,
            rng.standard_normal((2, 2, 2)) * scale]


def _params(lib, grads, dtype=np.float64, with_none=True):
    """Parameters of `lib` with the given gradients (and one parameter without a gradient)."""
    params = []
    for g in grads:
        p = lib.tensor(np.zeros(g.shape, dtype), requires_grad=True)
        p.grad = lib.tensor(g.astype(dtype))
        params.append(p)
    if with_none:
        params.insert(1, lib.tensor(np.ones(3, dtype), requires_grad=True))  # .grad is None
    return params


def _np(t):
    return t.detach().numpy()


def _grad_arrays(params):
    return [None if p.grad is None else _np(p.grad) for p in params]


NORMS = [2.0, 1, math.inf, 3.0, 0.5, 0, -math.inf, "inf"]


@needs_torch
@pytest.mark.parametrize("norm_type", NORMS, ids=str)
@pytest.mark.parametrize("max_norm", [0.3, 1e3], ids=["clips", "no_clip"])
def test_clip_grad_norm_against_torch(norm_type, max_norm):
    grads = _grads()
    ours, theirs = _params(hn, grads), _params(torch, grads)
    norm_type = float(norm_type)
    total = utils.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type)
    assert isinstance(total, hn.Tensor) and total.shape == () and total.dtype == hn.float64
    np.testing.assert_allclose(_np(total), ttotal.numpy(), rtol=1e-13)
    for a, b in zip(_grad_arrays(ours), _grad_arrays(theirs)):
        if a is None:
            assert b is None
        else:
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    changed = not np.allclose(_grad_arrays(ours)[0], grads[0])
    assert changed == (float(ttotal) > max_norm)


@needs_torch
def test_clip_grad_norm_float32_single_tensor_and_generators():
    grads = _grads(1, scale=3.0)
    ours, theirs = _params(hn, grads, np.float32), _params(torch, grads, np.float32)
    total = utils.clip_grad_norm_(ours[0], 1.0)  # a single tensor
    ttotal = torch.nn.utils.clip_grad_norm_(theirs[0], 1.0)
    assert total.dtype == hn.float32
    np.testing.assert_allclose(_np(total), ttotal.numpy(), rtol=1e-6)
    np.testing.assert_allclose(_np(ours[0].grad), theirs[0].grad.numpy(), rtol=1e-6)
    total = utils.clip_grad_norm_((p for p in ours), 2.0, norm_type="inf")  # a generator
    ttotal = torch.nn.utils.clip_grad_norm_((p for p in theirs), 2.0, norm_type="inf")
    np.testing.assert_allclose(_np(total), ttotal.numpy(), rtol=1e-6)
    for a, b in zip(_grad_arrays(ours), _grad_arrays(theirs)):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.warns(UserWarning, match="empty generator"):
        total = utils.clip_grad_norm_((p for p in []), 1.0)
    assert total.dtype == hn.float32 and float(total.item()) == 0.0
    # no gradients at all: a 0.0 norm, nothing changes
    total = utils.clip_grad_norm_([hn.ones(2, requires_grad=True)], 1.0)
    assert float(total.item()) == 0.0


@needs_torch
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_nonfinite_gradients_as_torch(bad, norm_type):
    grads = _grads(2)
    grads[1][3] = bad
    ours, theirs = _params(hn, grads), _params(torch, grads)
    before = _grad_arrays(ours)
    with pytest.raises(RuntimeError, match="non-finite"):
        utils.clip_grad_norm_(ours, 1.0, norm_type, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type, error_if_nonfinite=True)
    for a, b in zip(_grad_arrays(ours), before):  # nothing was scaled
        np.testing.assert_array_equal(a, b)
    # without the check the gradients are scaled by the non-finite norm anyway
    total = utils.clip_grad_norm_(ours, 1.0, norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type)
    np.testing.assert_array_equal(_np(total), ttotal.numpy())
    for a, b in zip(_grad_arrays(ours), _grad_arrays(theirs)):
        if a is not None:
            np.testing.assert_array_equal(a, b)  # (zeros, or nan where the grad was not finite)


@needs_torch
def test_get_total_norm_and_clip_grads_with_norm_against_torch():
    grads = _grads(3)
    ours, theirs = _params(hn, grads), _params(torch, grads)
    og = [p.grad for p in ours if p.grad is not None]
    tg = [p.grad for p in theirs if p.grad is not None]
    for norm_type in (2.0, 1.0, math.inf):
        np.testing.assert_allclose(_np(utils.get_total_norm(og, norm_type)),
                                   torch.nn.utils.get_total_norm(tg, norm_type).numpy(),
                                   rtol=1e-13)
    total = utils.get_total_norm(og)
    utils.clip_grads_with_norm_(ours, 0.5, total)
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.5, torch.nn.utils.get_total_norm(tg))
    for a, b in zip(_grad_arrays(ours), _grad_arrays(theirs)):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-13)
    with pytest.warns(FutureWarning, match="deprecated"):
        utils.clip_grad_norm(ours, 0.5)


@needs_torch
@pytest.mark.parametrize("clip_value", [0.5, 2, 0.0])
def test_clip_grad_value_against_torch(clip_value):
    grads = _grads(4)
    ours, theirs = _params(hn, grads), _params(torch, grads)
    assert utils.clip_grad_value_(ours, clip_value) is None
    torch.nn.utils.clip_grad_value_(theirs, clip_value)
    for a, b in zip(_grad_arrays(ours), _grad_arrays(theirs)):
        if a is not None:
            np.testing.assert_array_equal(a, b)
    single = _params(hn, grads, with_none=False)[0]
    utils.clip_grad_value_(single, 0.1)
    assert np.abs(_np(single.grad)).max() == 0.1


@needs_torch
def test_parameters_to_vector_and_back_against_torch():
    shapes = [(3, 4), (5,), (2, 1, 2), ()]
    rng = np.random.default_rng(5)
    values = [rng.standard_normal(s) for s in shapes]
    ours = [hn.tensor(v, requires_grad=True) for v in values]
    theirs = [torch.tensor(v, requires_grad=True) for v in values]
    vec, tvec = utils.parameters_to_vector(ours), torch.nn.utils.parameters_to_vector(theirs)
    np.testing.assert_array_equal(_np(vec), tvec.detach().numpy())
    assert vec.shape == (12 + 5 + 4 + 1,) and vec.requires_grad  # differentiable, as in torch
    (vec * hn.arange(vec.numel()).to(hn.float64)).sum().backward()
    np.testing.assert_array_equal(_np(ours[1].grad), np.arange(12, 17))
    new = np.arange(vec.numel(), dtype=np.float64) / 10
    nvec, tnvec = hn.tensor(new), torch.tensor(new)
    utils.vector_to_parameters(nvec, ours)
    torch.nn.utils.vector_to_parameters(tnvec, theirs)
    for p, t in zip(ours, theirs):
        assert p.shape == tuple(t.shape) and p.requires_grad
        np.testing.assert_array_equal(_np(p), t.detach().numpy())
    # as in PyTorch the parameters now share the vector's memory
    with hn.no_grad():
        nvec.mul_(2)
    with torch.no_grad():
        tnvec.mul_(2)
    for p, t in zip(ours, theirs):
        np.testing.assert_array_equal(_np(p), t.detach().numpy())
    with pytest.raises(TypeError, match="Tensor"):
        utils.vector_to_parameters(new, ours)
    with pytest.raises(ValueError, match="fewer"):
        utils.vector_to_parameters(hn.zeros(3), ours)


# ---- clipping inside a traced training step ---------------------------------------------------


def _twin(clip):
    hn.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = hn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        total = clip(model.parameters())
        opt.step()
        return loss.detach(), total
    return model, opt, step


CLIPS = {
    "norm2": lambda ps: utils.clip_grad_norm_(ps, 0.5),
    "norm_inf": lambda ps: utils.clip_grad_norm_(ps, 0.2, norm_type=math.inf),
    "norm1_checked": lambda ps: utils.clip_grad_norm_(ps, 2.0, 1.0, error_if_nonfinite=True),
    "value": lambda ps: utils.clip_grad_value_(ps, 0.05),
}


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_clipping_in_a_traced_step_matches_eager(name):
    eager_model, _, eager_step = _twin(CLIPS[name])
    model, _, step = _twin(CLIPS[name])
    traced = hn.trace(step)
    rng = np.random.default_rng(0)
    clipped = set()
    steps = 10
    for i in range(steps):
        # small inputs (a small norm: not clipped) and large ones (clipped), alternating
        x = hn.tensor(rng.standard_normal((16, 8)).astype(np.float32) * (3.0 if i % 2 else 0.05))
        y = hn.tensor(rng.integers(0, 4, 16))
        (want, want_total), (got, got_total) = eager_step(x, y), traced(x, y)
        assert abs(got.item() - want.item()) <= 1e-5 * max(1.0, abs(want.item())), i
        if want_total is None:
            assert got_total is None
        else:
            np.testing.assert_allclose(got_total.item(), want_total.item(), rtol=1e-5)
            clipped.add(want_total.item() > (0.5, 0.2, 2.0)[["norm2", "norm_inf",
                                                             "norm1_checked"].index(name)])
    assert clipped == {True, False} or name == "value"
    for p, q in zip(eager_model.parameters(), model.parameters()):
        np.testing.assert_allclose(_np(q), _np(p), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_np(q.grad), _np(p.grad), rtol=1e-5, atol=1e-7)
    stats = traced.stats
    # clipped or not, one compiled path: the coefficient is a tensor, not a value guard
    assert stats.compiles + stats.kernel_reuses == 1 and stats.side_exits == 0, stats.events
    assert stats.compiled_calls == steps - 2 and stats.fallbacks == 0, stats.events


def test_traced_step_with_a_nonfinite_norm_raises_as_eager():
    model, _, step = _twin(CLIPS["norm1_checked"])
    traced = hn.trace(step)
    rng = np.random.default_rng(1)
    y = hn.tensor(rng.integers(0, 4, 16))
    for _ in range(4):
        traced(hn.tensor(rng.standard_normal((16, 8)).astype(np.float32)), y)
    assert traced.stats.compiled_calls == 2
    before = [_np(p).copy() for p in model.parameters()]
    x = rng.standard_normal((16, 8)).astype(np.float32)
    x[3, 2] = np.inf
    with pytest.raises(RuntimeError, match="non-finite"):
        traced(hn.tensor(x), y)  # the value guard fails: the call runs eagerly and raises
    for b, p in zip(before, model.parameters()):
        np.testing.assert_array_equal(_np(p), b)  # no optimizer step happened
    assert traced.stats.side_exits == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traced(hn.tensor(rng.standard_normal((16, 8)).astype(np.float32)), y)
    assert traced.stats.compiled_calls == 3
