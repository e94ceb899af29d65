"""SGD, Adam and AdamW against NumPy implementations of PyTorch's update rules."""

import importlib.util
import os

import numpy as np
import pytest
from nn_refs import AdamRef, SGDRef, np_of

import hybridnet as hn
import hybridnet.nn.functional as F

nn = hn.nn
STEPS = 6
A = np.linspace(0.5, 2.0, 12).reshape(3, 4)
DIGITS = os.path.join(os.path.dirname(__file__), "data", "digits.csv.gz")


def _start():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 4)), rng.standard_normal(5)]


def _loss(p1, p2):
    """A loss with gradients that change from step to step (float64 tensors)."""
    return (hn.tensor(A) * p1 * p1).sum() + 0.1 * (p1 * p1 * p1).sum() + hn.sin(p2).sum()


def _ref_grads(p1, p2):
    return [2 * A * p1 + 0.3 * p1 * p1, np.cos(p2)]


def _run(make_opt, steps=STEPS, params=None, opt=None):
    params = params or [hn.tensor(a, requires_grad=True) for a in _start()]
    opt = opt or make_opt(params)
    for _ in range(steps):
        opt.zero_grad()
        _loss(*params).backward()
        opt.step()
    return params, opt


def _ref_run(make_ref, steps=STEPS):
    params = _start()
    ref = make_ref(params)
    for _ in range(steps):
        ref.step(_ref_grads(*params))
    return params


SGD_CONFIGS = [
    dict(lr=0.05),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.5),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, weight_decay=0.1),
    dict(lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True),
    dict(lr=0.05, momentum=0.5, dampening=0.2, weight_decay=0.01, maximize=True),
]
ADAM_CONFIGS = [
    ("Adam", dict(lr=0.1)),
    ("Adam", dict(lr=0.1, betas=(0.8, 0.95), eps=1e-6)),
    ("Adam", dict(lr=0.1, weight_decay=0.1)),
    ("Adam", dict(lr=0.1, amsgrad=True)),
    ("Adam", dict(lr=0.1, amsgrad=True, weight_decay=0.05)),
    ("Adam", dict(lr=0.1, maximize=True)),
    ("AdamW", dict(lr=0.1)),
    ("AdamW", dict(lr=0.1, weight_decay=0.2, amsgrad=True)),
]


def _ids(kw):
    return "-".join(f"{k}{v}" for k, v in kw.items())


@pytest.mark.parametrize("kw", SGD_CONFIGS, ids=_ids)
def test_sgd_vs_numpy(kw):
    params, _ = _run(lambda ps: hn.optim.SGD(ps, **kw))
    expected = _ref_run(lambda ps: SGDRef(ps, **kw))
    for p, e in zip(params, expected):
        np.testing.assert_allclose(np_of(p), e, rtol=1e-12, atol=1e-12)
    assert not np.allclose(np_of(params[0]), _start()[0])  # the test does move the params


@pytest.mark.parametrize("name, kw", ADAM_CONFIGS, ids=lambda x: str(x))
def test_adam_vs_numpy(name, kw):
    params, opt = _run(lambda ps: getattr(hn.optim, name)(ps, **kw))
    decoupled = name == "AdamW"
    ref_kw = dict(kw)
    if decoupled:
        ref_kw.setdefault("weight_decay", 0.01)  # AdamW's default
    expected = _ref_run(lambda ps: AdamRef(ps, decoupled=decoupled, **ref_kw))
    for p, e in zip(params, expected):
        np.testing.assert_allclose(np_of(p), e, rtol=1e-10, atol=1e-12)
    state = opt.state[params[0]]
    assert float(np_of(state["step"])) == STEPS
    assert ("max_exp_avg_sq" in state) == kw.get("amsgrad", False)


def test_adam_and_adamw_defaults_differ_as_in_pytorch():
    p = [hn.zeros(2, requires_grad=True)]
    adam, adamw = hn.optim.Adam(p), hn.optim.AdamW([hn.zeros(2, requires_grad=True)])
    assert adam.param_groups[0]["lr"] == 1e-3 and adam.param_groups[0]["weight_decay"] == 0
    assert adam.param_groups[0]["betas"] == (0.9, 0.999) and adam.param_groups[0]["eps"] == 1e-8
    assert adamw.param_groups[0]["weight_decay"] == 0.01
    assert not adam.param_groups[0]["amsgrad"]


def test_param_groups_with_different_lr():
    p1, p2 = (hn.tensor(a, requires_grad=True) for a in _start())
    opt = hn.optim.SGD([{"params": [p1], "lr": 0.1}, {"params": p2}], lr=0.01, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    assert all(g["momentum"] == 0.9 for g in opt.param_groups)
    _run(None, params=[p1, p2], opt=opt)
    r1, r2 = _start()
    ref1, ref2 = SGDRef([r1], lr=0.1, momentum=0.9), SGDRef([r2], lr=0.01, momentum=0.9)
    for _ in range(STEPS):
        g1, g2 = _ref_grads(r1, r2)
        ref1.step([g1])
        ref2.step([g2])
    np.testing.assert_allclose(np_of(p1), r1, rtol=1e-12)
    np.testing.assert_allclose(np_of(p2), r2, rtol=1e-12)
    # a group added later and hyper-parameters changed between steps are honoured
    p3 = hn.ones(2, requires_grad=True)
    opt.add_param_group({"params": [p3], "lr": 0.5, "momentum": 0.0})
    opt.param_groups[0]["lr"] = 0.0
    before = np_of(p1)
    (p3 * p3).sum().backward()
    opt.step()
    np.testing.assert_allclose(np_of(p3), [0.0, 0.0])  # 1 - 0.5 * 2
    np.testing.assert_array_equal(np_of(p1), before)


def test_params_without_grad_are_skipped_and_zero_grad():
    a = hn.ones(3, requires_grad=True)
    frozen = hn.ones(3, requires_grad=False)  # allowed, as in PyTorch
    b = hn.ones(3, requires_grad=True)
    opt = hn.optim.Adam([a, frozen, b], lr=0.1)
    (a * 2).sum().backward()
    opt.step()
    assert not np.allclose(np_of(a), 1.0)
    np.testing.assert_array_equal(np_of(b), np.ones(3))
    np.testing.assert_array_equal(np_of(frozen), np.ones(3))
    assert b not in opt.state and a in opt.state
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(np_of(a.grad), np.zeros(3))
    opt.zero_grad()
    assert a.grad is None
    loss = opt.step(lambda: (a * a).sum())  # a closure's loss is returned
    assert float(loss.item()) > 0


@pytest.mark.parametrize("make", [
    lambda ps: hn.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda ps: hn.optim.Adam(ps, lr=0.1, amsgrad=True, weight_decay=0.01),
    lambda ps: hn.optim.AdamW(ps, lr=0.1),
], ids=["sgd", "adam", "adamw"])
def test_state_dict_round_trip_continues_identically(make):
    uninterrupted, _ = _run(make, steps=6)
    params, opt = _run(make, steps=3)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1]
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1]]
    resumed = [hn.tensor(np_of(p), requires_grad=True) for p in params]
    opt2 = make(resumed)
    opt2.param_groups[0]["lr"] = 123.0  # overwritten by the loaded hyper-parameters
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    _run(None, steps=3, params=resumed, opt=opt2)
    _run(None, steps=3, params=params, opt=opt)  # the original also goes on, independently
    for a, b, c in zip(uninterrupted, resumed, params):
        np.testing.assert_array_equal(np_of(a), np_of(b))
        np.testing.assert_array_equal(np_of(a), np_of(c))


def test_load_state_dict_errors():
    p = [hn.zeros(2, requires_grad=True)]
    opt = hn.optim.SGD(p, lr=0.1, momentum=0.9)
    (p[0] * 1.0).sum().backward()
    opt.step()
    sd = opt.state_dict()
    two = hn.optim.SGD([{"params": [hn.zeros(2, requires_grad=True)]},
                        {"params": [hn.zeros(2, requires_grad=True)]}], lr=0.1)
    with pytest.raises(ValueError, match="parameter groups"):
        two.load_state_dict(sd)
    wrong_shape = hn.optim.SGD([hn.zeros(3, requires_grad=True)], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="shape"):
        wrong_shape.load_state_dict(sd)


def test_optimizer_errors():
    p = [hn.zeros(2, requires_grad=True)]
    for make in (lambda: hn.optim.SGD(p, lr=-0.1), lambda: hn.optim.Adam(p, lr=-1.0),
                 lambda: hn.optim.AdamW(p, lr=-1e-3)):
        with pytest.raises(ValueError, match="lr"):
            make()
    for cls in (hn.optim.SGD, hn.optim.Adam, hn.optim.AdamW):
        with pytest.raises(ValueError, match="empty"):
            cls([], lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        hn.optim.SGD(iter([]), lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        hn.optim.SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="momentum"):
        hn.optim.SGD(p, lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="betas"):
        hn.optim.Adam(p, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="more than one"):
        hn.optim.SGD([{"params": p}, {"params": p}], lr=0.1)
    with pytest.raises(TypeError, match="tensors"):
        hn.optim.SGD([np.zeros(2)], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        hn.optim.SGD([hn.zeros(2, requires_grad=True) * 2], lr=0.1)


# ---- a real training run ------------------------------------------------------------------


def test_mlp_learns_digits_with_adam():
    data = np.loadtxt(DIGITS, delimiter=",")
    assert data.shape == (1797, 65)
    x = (data[:, :64] / 16.0).astype(np.float32)
    y = data[:, 64].astype(np.int64)
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
    mu, sd = x_train.mean(0), x_train.std(0) + 0.1  # standardise with training statistics
    x_train, x_test = (x_train - mu) / sd, (x_test - mu) / sd
    hn.manual_seed(0)
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = hn.optim.Adam(model.parameters(), lr=1e-2)
    first = last = None
    for _ in range(10):
        perm = rng.permutation(len(x_train))
        for i in range(0, len(perm), 64):
            idx = perm[i:i + 64]
            loss = F.cross_entropy(model(hn.tensor(x_train[idx])), hn.tensor(y_train[idx]),
                                   label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = float(loss.item()) if first is None else first
            last = float(loss.item())
    assert last < 0.5 * first
    model.eval()
    with hn.no_grad():
        pred = np_of(model(hn.tensor(x_test))).argmax(1)
    accuracy = float((pred == y_test).mean())
    # Achieved 0.947 (seeds 0-5 give 0.940-0.955; plain training without standardisation and
    # label smoothing reaches only ~0.91 on this writer-disjoint split, in PyTorch as well).
    assert accuracy >= 0.93, accuracy


# ---- the dedicated comparison with PyTorch -------------------------------------------------


@pytest.mark.parametrize("name, kw", [("SGD", kw) for kw in SGD_CONFIGS] + ADAM_CONFIGS,
                         ids=lambda x: str(x))
def test_against_torch_optim(name, kw):
    import torch
    params, _ = _run(lambda ps: getattr(hn.optim, name)(ps, **kw))
    tparams = [torch.tensor(a, requires_grad=True) for a in _start()]
    topt = getattr(torch.optim, name)(tparams, **kw)
    ta = torch.from_numpy(A)
    for _ in range(STEPS):
        topt.zero_grad()
        loss = (ta * tparams[0] ** 2).sum() + 0.1 * (tparams[0] ** 3).sum() \
            + torch.sin(tparams[1]).sum()
        loss.backward()
        topt.step()
    for p, t in zip(params, tparams):
        np.testing.assert_allclose(np_of(p), t.detach().numpy(), rtol=1e-10, atol=1e-12)
    ours = getattr(hn.optim, name)([hn.zeros(1, requires_grad=True)], **kw).state_dict()
    theirs = getattr(torch.optim, name)([torch.zeros(1, requires_grad=True)], **kw).state_dict()
    for key, value in ours["param_groups"][0].items():  # same hyper-parameter names/values
        assert theirs["param_groups"][0][key] == value, key


if importlib.util.find_spec("torch") is None:  # compared with PyTorch only where it is installed
    del test_against_torch_optim
