"""binary_cross_entropy, smooth_l1_loss, huber_loss, kl_div, cosine_similarity (and their
modules), and Dropout2d (hybridnet.nn.losses, loss_modules, transformer) against PyTorch.

Each loss is run in both libraries on the same float32 and float64 arrays for every
reduction; values, input gradients (and target gradients where PyTorch defines them)
must agree, including at the edges (BCE at probabilities 0 and 1, |d| = beta, zero
vectors in cosine_similarity). Errors and warnings follow PyTorch's. One traced graph:
the losses under hn.trace, compiled and equal to eager.
"""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import hybridnet as hn
import hybridnet.nn.functional as F

nn = hn.nn
DTYPES = [np.float32, np.float64]
REDUCTIONS = ["mean", "sum", "none"]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-9, atol=1e-12)}


def _np(t):
    return t.detach().numpy().copy()


def _compare(hfn, tfn, arrays, grad_args=(0,), tol=None, seed=0, inf_grad_is_zero=()):
    """Run hfn on hybridnet tensors and tfn on torch tensors made from `arrays`; compare
    values and the gradients (of sum(out * g), g random) of the arrays in grad_args.
    For the arguments in inf_grad_is_zero, where torch's gradient is infinite ours is 0."""
    dtype = arrays[0].dtype.type
    tol = tol or TOL[dtype]
    hs = [hn.tensor(a, requires_grad=i in grad_args) for i, a in enumerate(arrays)]
    ts = [torch.tensor(a, requires_grad=i in grad_args) for i, a in enumerate(arrays)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hout, tout = hfn(*hs), tfn(*ts)
    assert hout.shape == tuple(tout.shape)
    assert hout.dtype == getattr(hn, str(tout.dtype).split(".")[-1])
    np.testing.assert_allclose(_np(hout), tout.detach().numpy(), **tol, err_msg="value")
    g = np.random.default_rng(seed).standard_normal(tout.shape).astype(_np(tout).dtype)
    (hout * hn.tensor(g)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    for i in grad_args:
        want = ts[i].grad.numpy()
        if i in inf_grad_is_zero:
            want = np.where(np.isinf(want), 0.0, want)
        np.testing.assert_allclose(_np(hs[i].grad), want, **tol,
                                   err_msg=f"gradient of argument {i}")
    return hout


# ---- binary_cross_entropy ------------------------------------------------------------------


def _probabilities(rng, dtype, shape=(4, 6)):
    """Probabilities and targets with the edge cases in the first row."""
    x = rng.uniform(0.02, 0.98, shape)
    t = rng.uniform(0, 1, shape)
    x[0] = [0.0, 1.0, 1e-13, 1 - 1e-7, 0.0, 1.0]
    t[0] = [0.0, 0.0, 1.0, 0.3, 1.0, 1.0]
    t[1, :2] = [0.0, 1.0]  # hard labels inside
    return x.astype(dtype), t.astype(dtype)


@pytest.mark.parametrize("weight", ["none", "row", "full"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_cross_entropy_matches_torch(dtype, reduction, weight):
    rng = np.random.default_rng(1)
    x, t = _probabilities(rng, dtype)
    arrays = [x, t]
    if weight != "none":
        arrays.append(rng.uniform(0.5, 2.0, x.shape[-1:] if weight == "row" else x.shape)
                      .astype(dtype))
    # float64: torch's gradient is (x - t) / (x (1 - x)); ours, -t/x + (1-t)/(1-x), differs
    # by rounding near x = 1 (relative 4e-9 at 1 - 1e-7). The target's gradient at x = 0 or
    # 1 is torch's -logit(x) = +-inf; ours is 0 there (a documented difference).
    tol = dict(rtol=1e-7, atol=1e-12) if dtype is np.float64 else None
    _compare(lambda *a: F.binary_cross_entropy(*a, reduction=reduction),
             lambda *a: TF.binary_cross_entropy(*a, reduction=reduction), arrays, (0, 1), tol,
             inf_grad_is_zero=(1,))
    module_weight = None if weight == "none" else hn.tensor(arrays[2])
    _compare(lambda a, b: nn.BCELoss(module_weight, reduction=reduction)(a, b),
             lambda a, b: torch.nn.BCELoss(None if weight == "none" else torch.tensor(arrays[2]),
                                           reduction=reduction)(a, b), [x, t], (0, 1), tol,
             inf_grad_is_zero=(1,))


def test_binary_cross_entropy_through_a_saturated_sigmoid_matches_torch():
    # float32 sigmoid(20) is exactly 1.0: torch's gradient there is (1 - t) / 1e-12
    logits = np.array([[-30.0, -20.0, -5.0, 0.0, 5.0, 20.0, 30.0]], np.float32)
    target = np.array([[0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]], np.float32)
    _compare(lambda z, t: F.binary_cross_entropy(hn.sigmoid(z), t),
             lambda z, t: TF.binary_cross_entropy(torch.sigmoid(z), t), [logits, target],
             tol=dict(rtol=1e-5, atol=1e-6))


def test_binary_cross_entropy_errors_match_torch():
    x, t = hn.tensor([0.2, 0.7]), hn.tensor([0.0, 1.0])
    with pytest.raises(ValueError, match=r"binary_cross_entropy.*target size \(\[1, 2\]\).*"
                                         r"input size \(\[2\]\)"):
        F.binary_cross_entropy(x, hn.tensor([[0.0, 1.0]]))
    for bad in ([0.2, 1.5], [-0.1, 0.5], [0.2, float("nan")]):
        with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
            F.binary_cross_entropy(hn.tensor(bad), t)
    with pytest.raises(RuntimeError, match="all elements of target should be between 0 and 1"):
        F.binary_cross_entropy(x, hn.tensor([0.0, 2.0]))
    with pytest.raises(hn.DTypeError, match="binary_cross_entropy.*dtype"):
        F.binary_cross_entropy(x, t.double())
    with pytest.raises(hn.DTypeError, match="target must be a floating-point"):
        F.binary_cross_entropy(x, hn.tensor([0, 1]))
    with pytest.raises(hn.ShapeError, match=r"weight hn.float32\[3\]"):
        F.binary_cross_entropy(x, t, weight=hn.ones(3))
    with pytest.raises(hn.ShapeError, match=r"weight hn.float32\[2, 1\] does not broadcast"):
        F.binary_cross_entropy(hn.tensor([[0.2, 0.7]]), hn.tensor([[0.0, 1.0]]),
                               weight=hn.ones(2, 1))
    with pytest.raises(ValueError, match="'avg' is not a valid value for reduction"):
        F.binary_cross_entropy(x, t, reduction="avg")


# ---- smooth_l1_loss and huber_loss -----------------------------------------------------------


def _differences(rng, dtype, threshold):
    """input, target with differences exactly 0 and +-threshold in the first row."""
    a, b = rng.standard_normal((3, 5)) * 2, rng.standard_normal((3, 5))
    a[0, :3] = b[0, :3] + np.array([0.0, threshold, -threshold])
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_smooth_l1_loss_matches_torch(dtype, reduction, beta):
    a, b = _differences(np.random.default_rng(2), dtype, beta)
    _compare(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=beta),
             lambda x, y: TF.smooth_l1_loss(x, y, reduction=reduction, beta=beta), [a, b], (0, 1))
    _compare(lambda x, y: nn.SmoothL1Loss(reduction=reduction, beta=beta)(x, y),
             lambda x, y: torch.nn.SmoothL1Loss(reduction=reduction, beta=beta)(x, y), [a, b])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("delta", [1.0, 0.3, 2.5])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_huber_loss_matches_torch(dtype, reduction, delta, weighted):
    rng = np.random.default_rng(3)
    a, b = _differences(rng, dtype, delta)
    arrays = [a, b] + ([rng.uniform(0, 2, a.shape).astype(dtype)] if weighted else [])
    _compare(lambda *x: F.huber_loss(*x[:2], reduction=reduction, delta=delta,
                                     weight=x[2] if weighted else None),
             lambda *x: TF.huber_loss(*x[:2], reduction=reduction, delta=delta,
                                      weight=x[2] if weighted else None), arrays, (0, 1))
    if not weighted:
        _compare(lambda x, y: nn.HuberLoss(reduction=reduction, delta=delta)(x, y),
                 lambda x, y: torch.nn.HuberLoss(reduction=reduction, delta=delta)(x, y), arrays)


@pytest.mark.parametrize("name", ["smooth_l1_loss", "huber_loss"])
def test_regression_losses_warn_and_broadcast_as_torch(name):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((3, 1)), rng.standard_normal(4)
    with pytest.warns(UserWarning, match=r"target size \(\[4\]\).*input size \(\[3, 1\]\)"):
        getattr(F, name)(hn.tensor(a), hn.tensor(b))
    _compare(getattr(F, name), getattr(TF, name), [a, b], (0, 1))
    with pytest.warns(UserWarning), pytest.raises(
            hn.ShapeError, match=rf"{name}: input hn.float64\[3, 2\] and target "
                                 r"hn.float64\[4\] cannot be broadcast"):
        getattr(F, name)(hn.tensor(rng.standard_normal((3, 2))), hn.tensor(b))


def test_regression_loss_errors_match_torch():
    x, y = hn.randn(3), hn.randn(3)
    with pytest.raises(RuntimeError, match="smooth_l1_loss does not support negative values"):
        F.smooth_l1_loss(x, y, beta=-1.0)
    for delta in (0.0, -1.0):
        with pytest.raises(RuntimeError, match="huber_loss does not support non-positive"):
            F.huber_loss(x, y, delta=delta)
    with pytest.raises(ValueError, match="Weights and input must have the same size"):
        F.huber_loss(x, y, weight=hn.ones(1))
    for fn in (F.smooth_l1_loss, F.huber_loss):
        with pytest.raises(ValueError, match="'bad' is not a valid value for reduction"):
            fn(x, y, reduction="bad")
    with pytest.raises(TypeError, match="delta must be a float or int"):
        nn.HuberLoss(delta="1")


# ---- kl_div --------------------------------------------------------------------------------


@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kl_div_matches_torch(dtype, reduction, log_target):
    rng = np.random.default_rng(5)
    logp = np.log(rng.dirichlet(np.ones(6), 4)).astype(dtype)
    q = rng.dirichlet(np.ones(6), 4)
    if log_target:
        target, grads = np.log(q).astype(dtype), (0, 1)
    else:
        q[0, 0] = q[2, 3] = 0.0  # 0 * log 0 = 0; torch's target gradient there is not finite
        target, grads = q.astype(dtype), (0,)
    _compare(lambda x, t: F.kl_div(x, t, reduction=reduction, log_target=log_target),
             lambda x, t: TF.kl_div(x, t, reduction=reduction, log_target=log_target),
             [logp, target], grads)
    _compare(lambda x, t: nn.KLDivLoss(reduction=reduction, log_target=log_target)(x, t),
             lambda x, t: torch.nn.KLDivLoss(reduction=reduction, log_target=log_target)(x, t),
             [logp, target], grads)


def test_kl_div_target_gradient_matches_torch_for_positive_targets():
    rng = np.random.default_rng(6)
    logp = np.log(rng.dirichlet(np.ones(5), 3))
    _compare(lambda x, t: F.kl_div(x, t, reduction="batchmean"),
             lambda x, t: TF.kl_div(x, t, reduction="batchmean"),
             [logp, rng.dirichlet(np.ones(5), 3)], (0, 1))


def test_kl_div_warnings_broadcasting_and_edge_cases_match_torch():
    x, t = hn.log(hn.tensor([[0.25, 0.75]])), hn.tensor([[0.5, 0.5]])
    with pytest.warns(UserWarning, match="'batchmean' divides only by the batch size"):
        F.kl_div(x, t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.kl_div(x, t, reduction="batchmean")  # no warning
    rng = np.random.default_rng(7)
    _compare(lambda a, b: F.kl_div(a, b, reduction="sum"),
             lambda a, b: TF.kl_div(a, b, reduction="sum"),
             [rng.standard_normal((3, 1)), rng.uniform(0, 1, 4)], (0,))
    _compare(lambda a, b: F.kl_div(a, b, reduction="batchmean"),  # 0-d: the sum
             lambda a, b: TF.kl_div(a, b, reduction="batchmean"),
             [np.array(-0.5), np.array(0.3)], (0,))
    negative = F.kl_div(hn.tensor([0.0]), hn.tensor([-0.5]), reduction="none")
    assert np.isnan(_np(negative)).all()  # log of a negative target, as torch
    with pytest.raises(hn.ShapeError, match=r"kl_div: input hn.float32\[3\] and target "
                                            r"hn.float32\[4\]"):
        F.kl_div(hn.zeros(3), hn.zeros(4), reduction="sum")
    with pytest.raises(ValueError, match="'bad' is not a valid value for reduction"):
        F.kl_div(x, t, reduction="bad")
    with pytest.warns(UserWarning, match="reduction='sum' instead"):
        legacy = F.kl_div(x, t, size_average=False)
    np.testing.assert_allclose(_np(legacy), _np(F.kl_div(x, t, reduction="sum")))


# ---- cosine_similarity ---------------------------------------------------------------------

COSINE_CASES = {
    "3d-dim1": ((3, 4, 5), (3, 4, 5), 1),
    "dim-1-broadcast": ((2, 1, 3), (4, 3), -1),
    "size-1-along-dim": ((2, 1), (2, 3), 1),
    "1d-dim0": ((5,), (5,), 0),
}


@pytest.mark.parametrize("case", list(COSINE_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_cosine_similarity_matches_torch(dtype, case):
    s1, s2, dim = COSINE_CASES[case]
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal(s1).astype(dtype), rng.standard_normal(s2).astype(dtype)
    if case == "3d-dim1":
        a[0, :, 0] = 0.0  # a zero vector: norm 0, clamped to eps
        b[1, :, 1] = 1e-10  # a norm below eps
        a[2, :, 2] = 1e-5
    _compare(lambda x, y: F.cosine_similarity(x, y, dim=dim),
             lambda x, y: TF.cosine_similarity(x, y, dim=dim), [a, b], (0, 1))
    _compare(lambda x, y: nn.CosineSimilarity(dim=dim, eps=1e-6)(x, y),
             lambda x, y: torch.nn.CosineSimilarity(dim=dim, eps=1e-6)(x, y), [a, b], (0, 1))


def test_cosine_similarity_dtypes_and_errors():
    out = F.cosine_similarity(hn.tensor([1.0, 2.0]), hn.tensor([1.0, 2.5], dtype=hn.float64),
                              dim=0)
    assert out.dtype == hn.float64 and out.shape == ()
    with pytest.raises(hn.DTypeError, match="cosine_similarity: expected common dtype to be "
                                            "floating point"):
        F.cosine_similarity(hn.tensor([1, 2]), hn.tensor([1, 2]), dim=0)
    with pytest.raises(hn.ShapeError, match=r"cosine_similarity: dim 2 is out of range.*\[2, 3\]"):
        F.cosine_similarity(hn.zeros(2, 3), hn.zeros(2, 3), dim=2)
    with pytest.raises(hn.ShapeError, match=r"x1 hn.float32\[2, 3\] and x2 hn.float32\[4, 3\]"):
        F.cosine_similarity(hn.zeros(2, 3), hn.zeros(4, 3))


# ---- module forms ------------------------------------------------------------------------------


def test_loss_modules_state_and_legacy_arguments_match_torch():
    w = np.array([1.0, 2.0, 0.5], np.float32)
    hm, tm = nn.BCELoss(weight=hn.tensor(w)), torch.nn.BCELoss(weight=torch.tensor(w))
    assert list(hm.state_dict()) == list(tm.state_dict()) == ["weight"]
    assert list(nn.BCELoss().state_dict()) == []
    for legacy, expected in [(dict(size_average=False), "sum"), (dict(reduce=False), "none"),
                             (dict(size_average=True, reduce=True), "mean")]:
        for h, t in [(nn.BCELoss, torch.nn.BCELoss), (nn.SmoothL1Loss, torch.nn.SmoothL1Loss),
                     (nn.KLDivLoss, torch.nn.KLDivLoss)]:
            with pytest.warns(UserWarning, match=f"reduction='{expected}'"):
                assert h(**legacy).reduction == expected
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert t(**legacy).reduction == expected
    assert nn.HuberLoss().delta == 1.0 and nn.SmoothL1Loss().beta == 1.0
    assert nn.CosineSimilarity().dim == 1 and nn.CosineSimilarity().eps == 1e-8
    with pytest.warns(UserWarning, match="reduction='none'"):
        out = F.binary_cross_entropy(hn.tensor([0.5]), hn.tensor([1.0]), None, True, False)
    assert out.shape == (1,)


# ---- Dropout2d -----------------------------------------------------------------------------------


def test_dropout2d_zeroes_whole_channels_at_rate_p():
    hn.manual_seed(0)
    p, shape = 0.3, (64, 48, 3, 4)
    x = hn.ones(*shape, requires_grad=True)
    drop = nn.Dropout2d(p)
    out = drop(x)
    v = _np(out)
    per_channel = v.reshape(64, 48, -1)
    first = per_channel[..., :1]
    assert (per_channel == first).all()  # each channel all dropped or all kept
    assert set(np.unique(first)) <= {0.0, np.float32(1 / (1 - p))}
    rate = (first == 0).mean()
    assert abs(rate - p) < 4 * np.sqrt(p * (1 - p) / first.size), rate  # 4 sigma
    (out * 2.0).sum().backward()
    np.testing.assert_allclose(_np(x.grad), v * 2.0)  # the gradient is the mask
    hn.manual_seed(0)
    np.testing.assert_array_equal(_np(nn.Dropout2d(p)(hn.ones(*shape))), v)  # seeded
    assert not np.array_equal(_np(drop(hn.ones(*shape))), v)  # a fresh mask per call


def test_dropout2d_eval_p0_p1_inplace_and_ranks():
    x = hn.randn(2, 3, 4, 5)
    drop = nn.Dropout2d(0.5).eval()
    assert drop(x) is x and F.dropout2d(x, 0.5, training=False) is x
    assert nn.Dropout2d(0.0)(x) is x
    assert not _np(nn.Dropout2d(1.0)(x)).any()
    y = hn.ones(2, 3, 4, 4)
    assert nn.Dropout2d(0.5, inplace=True)(y) is y
    assert set(np.unique(_np(y))) <= {0.0, 2.0}
    assert repr(nn.Dropout2d(0.25)) == repr(torch.nn.Dropout2d(0.25)) == \
        "Dropout2d(p=0.25, inplace=False)"
    hn.manual_seed(1)
    with pytest.warns(UserWarning, match="3D input to dropout2d.*\\(N, C, L\\)"):
        out3 = _np(F.dropout2d(hn.ones(40, 50, 6)))
    assert (out3 == out3[..., :1]).all() and 0 < (out3 == 0).mean() < 1
    with pytest.warns(UserWarning, match="Received a 2-D input to dropout2d"):
        out2 = _np(F.dropout2d(hn.ones(40, 50)))
    assert 0 < (out2 == 0).mean() < 1  # (N, C): elementwise, as torch
    with pytest.warns(UserWarning), pytest.raises(hn.ShapeError, match="at least 2 dimensions"):
        F.dropout2d(hn.ones(5))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            nn.Dropout2d(bad)
        with pytest.raises(ValueError, match="between 0 and 1"):
            F.dropout2d(x, bad)


# ---- under hn.trace -----------------------------------------------------------------------------


def test_losses_traced_compile_and_equal_eager():
    def losses(x, t, p, q):
        return hn.stack([
            F.binary_cross_entropy(hn.sigmoid(x), p),
            F.smooth_l1_loss(x, t, beta=0.5),
            F.huber_loss(x, t, delta=2.0, reduction="sum"),
            F.kl_div(hn.log_softmax(x, 1), q, reduction="batchmean"),
            F.cosine_similarity(x, t).mean(),
        ])

    traced = hn.trace(losses)
    rng = np.random.default_rng(9)
    calls = 3
    with hn.no_grad():
        for i in range(calls):
            args = [rng.standard_normal((4, 6)), rng.standard_normal((4, 6)),
                    rng.uniform(0, 1, (4, 6)), rng.dirichlet(np.ones(6), 4)]
            args = [hn.tensor(a.astype(np.float32)) for a in args]
            np.testing.assert_allclose(_np(traced(*args)), _np(losses(*args)), rtol=1e-5,
                                       atol=1e-6, err_msg=f"call {i}")
        stats = traced.stats
        assert stats.compiled_calls == calls - 1, (str(stats), stats.events)
        assert stats.fallbacks == 0, stats.events
        # the range check is a guard: a bad probability leaves the compiled path and raises
        args[2] = hn.tensor(np.full((4, 6), 1.5, np.float32))
        with pytest.raises(RuntimeError, match="all elements of target"):
            traced(*args)
