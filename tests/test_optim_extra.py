"""RMSprop, Adagrad and Adadelta against torch.optim (float64, tight tolerance), their
state dicts, errors, and whole traced training steps against eager."""


import numpy as np
import pytest
import torch  # noqa: E402,F401  (the oracle: a test extra, never skipped)

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn


def needs_torch(fn):
    """Marks a test compared with PyTorch (a test extra: always installed)."""
    return fn
STEPS = 8
A = np.linspace(0.5, 2.0, 12).reshape(3, 4)


def _start():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 4)), rng.standard_normal(5)]


def _loss(lib, p1, p2):
    """A loss whose gradients change from step to step (hn or torch tensors)."""
    a = lib.tensor(A) if lib is hn else lib.from_numpy(A)
    return (a * p1 * p1).sum() + 0.1 * (p1 * p1 * p1).sum() + lib.sin(p2).sum()


def _run(lib, name, kw, steps=STEPS, params=None, opt=None, dtype=np.float64):
    if params is None:
        params = [lib.tensor(a.astype(dtype), requires_grad=True) for a in _start()]
    opt = opt or getattr(lib.optim, name)(params, **kw)
    for _ in range(steps):
        opt.zero_grad()
        _loss(lib, *params).backward()
        opt.step()
    return params, opt


def _np(t):
    return t.detach().numpy()


CONFIGS = [
    ("RMSprop", dict()),
    ("RMSprop", dict(lr=0.05, alpha=0.9, eps=1e-6)),
    ("RMSprop", dict(lr=0.01, momentum=0.9)),
    ("RMSprop", dict(lr=0.01, centered=True)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.02, weight_decay=0.05, maximize=True)),
    ("Adagrad", dict()),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05)),
    ("Adagrad", dict(lr=0.1, weight_decay=0.1, initial_accumulator_value=0.3)),
    ("Adagrad", dict(lr=0.2, eps=1e-6, lr_decay=0.01, maximize=True)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8)),
    ("Adadelta", dict(rho=0.95, eps=1e-4, weight_decay=0.1)),
    ("Adadelta", dict(lr=2.0, weight_decay=0.01, maximize=True)),
]


def _ids(x):
    return x if isinstance(x, str) else "-".join(f"{k}{v}" for k, v in x.items()) or "defaults"


@needs_torch
@pytest.mark.parametrize("name, kw", CONFIGS, ids=_ids)
def test_against_torch_optim(name, kw):
    params, opt = _run(hn, name, kw)
    tparams, topt = _run(torch, name, kw)
    for p, t in zip(params, tparams):
        np.testing.assert_allclose(_np(p), _np(t), rtol=1e-12, atol=1e-14)
    assert not np.allclose(_np(params[0]), _start()[0])  # the test does move the params
    # the same state, under the same names
    for p, t in zip(params, tparams):
        ours, theirs = opt.state[p], topt.state[t]
        assert sorted(ours) == sorted(theirs)
        for key in ours:
            np.testing.assert_allclose(_np(ours[key]), _np(theirs[key]), rtol=1e-12,
                                       atol=1e-14, err_msg=key)
    assert float(opt.state[params[0]]["step"].item()) == STEPS
    assert opt.state[params[0]]["step"].dtype == hn.float32  # as PyTorch's
    # the same hyper-parameters, under the same names, as PyTorch's param groups
    ours, theirs = opt.state_dict()["param_groups"][0], topt.state_dict()["param_groups"][0]
    assert ours == theirs
    assert opt.defaults == topt.defaults


@needs_torch
@pytest.mark.parametrize("name, kw", [CONFIGS[4], CONFIGS[8], CONFIGS[12]], ids=_ids)
def test_against_torch_optim_float32(name, kw):
    params, _ = _run(hn, name, kw, dtype=np.float32)
    tparams, _ = _run(torch, name, kw, dtype=np.float32)
    for p, t in zip(params, tparams):
        assert p.dtype == hn.float32
        np.testing.assert_allclose(_np(p), _np(t), rtol=2e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("name", ["RMSprop", "Adagrad", "Adadelta"])
def test_param_groups_and_added_groups_against_torch(name):

    def build(lib):
        p1, p2 = (lib.tensor(a, requires_grad=True) for a in _start())
        p3 = lib.tensor(np.array([1.0, -2.0, 0.5]), requires_grad=True)
        opt = getattr(lib.optim, name)([{"params": [p1], "lr": 0.05}, {"params": [p2]}],
                                       lr=0.1, weight_decay=0.01)
        return [p1, p2, p3], opt

    results = []
    for lib in (hn, torch):
        (p1, p2, p3), opt = build(lib)
        _run(lib, name, {}, steps=3, params=[p1, p2], opt=opt)
        opt.add_param_group({"params": [p3], "lr": 0.3})  # its state is created lazily
        opt.param_groups[0]["lr"] = 0.02  # a changed setting is honoured
        for _ in range(3):
            opt.zero_grad()
            (_loss(lib, p1, p2) + (p3 * p3 * p3).sum()).backward()
            opt.step()
        results.append([_np(p) for p in (p1, p2, p3)])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name, kw", [CONFIGS[4], CONFIGS[2], CONFIGS[8], CONFIGS[13]],
                         ids=_ids)
def test_state_dict_round_trip_continues_identically(name, kw):
    uninterrupted, _ = _run(hn, name, kw, steps=6)
    params, opt = _run(hn, name, kw, steps=3)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1]
    resumed = [hn.tensor(_np(p), requires_grad=True) for p in params]
    opt2 = getattr(hn.optim, name)(resumed, **kw)
    opt2.param_groups[0]["lr"] = 123.0  # overwritten by the loaded hyper-parameters
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    _run(hn, name, kw, steps=3, params=resumed, opt=opt2)
    _run(hn, name, kw, steps=3, params=params, opt=opt)  # the original goes on independently
    for a, b, c in zip(uninterrupted, resumed, params):
        np.testing.assert_array_equal(_np(a), _np(b))
        np.testing.assert_array_equal(_np(a), _np(c))


@needs_torch
def test_adagrad_state_exists_from_construction_as_in_torch():
    p = hn.zeros(3, requires_grad=True)
    opt = hn.optim.Adagrad([p], initial_accumulator_value=0.25)
    topt = torch.optim.Adagrad([torch.zeros(3, requires_grad=True)], initial_accumulator_value=0.25)
    assert sorted(opt.state[p]) == ["step", "sum"]
    np.testing.assert_array_equal(_np(opt.state[p]["sum"]), [0.25] * 3)
    assert float(opt.state[p]["step"].item()) == 0.0
    ours, theirs = opt.state_dict(), topt.state_dict()
    assert sorted(ours["state"]) == sorted(theirs["state"]) == [0]
    assert sorted(ours["state"][0]) == sorted(theirs["state"][0])


def test_rmsprop_momentum_switched_on_later_gets_a_buffer():
    params, opt = _run(hn, "RMSprop", dict(lr=0.01), steps=2)
    assert "momentum_buffer" not in opt.state[params[0]]
    opt.param_groups[0]["momentum"] = 0.9  # (PyTorch raises KeyError here)
    _run(hn, "RMSprop", {}, steps=2, params=params, opt=opt)
    assert "momentum_buffer" in opt.state[params[0]]


def test_zero_grad_closure_and_params_without_grad():
    for cls in (hn.optim.RMSprop, hn.optim.Adagrad, hn.optim.Adadelta):
        a, b = hn.ones(3, requires_grad=True), hn.ones(3, requires_grad=True)
        opt = cls([a, b])

        def closure():
            opt.zero_grad()  # noqa: B023
            loss = (a * a).sum() * 2  # noqa: B023
            loss.backward()
            return loss
        assert float(opt.step(closure).item()) == 6.0
        assert not np.allclose(_np(a), 1.0)
        np.testing.assert_array_equal(_np(b), np.ones(3))
        opt.zero_grad(set_to_none=False)
        np.testing.assert_array_equal(_np(a.grad), np.zeros(3))
        opt.zero_grad()
        assert a.grad is None


def test_optimizer_errors():
    p = [hn.zeros(2, requires_grad=True)]
    cases = [
        (lambda: hn.optim.RMSprop(p, lr=-0.1), "learning rate"),
        (lambda: hn.optim.RMSprop(p, alpha=-0.5), "alpha"),
        (lambda: hn.optim.RMSprop(p, momentum=-0.5), "momentum"),
        (lambda: hn.optim.RMSprop(p, eps=-1.0), "epsilon"),
        (lambda: hn.optim.RMSprop(p, weight_decay=-1.0), "weight_decay"),
        (lambda: hn.optim.Adagrad(p, lr_decay=-0.1), "lr_decay"),
        (lambda: hn.optim.Adagrad(p, initial_accumulator_value=-1.0), "initial_accumulator"),
        (lambda: hn.optim.Adadelta(p, rho=1.5), "rho"),
        (lambda: hn.optim.Adadelta(p, lr=-1.0), "learning rate"),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match):
            make()
    for cls in (hn.optim.RMSprop, hn.optim.Adagrad, hn.optim.Adadelta):
        with pytest.raises(ValueError, match="empty"):
            cls([])
        with pytest.raises(NotImplementedError, match="differentiable"):
            cls(p, differentiable=True)
    with pytest.raises(RuntimeError, match="fused"):
        hn.optim.Adagrad(p, foreach=True, fused=True)


def test_defaults_match_pytorch_signatures():
    p = [hn.zeros(2, requires_grad=True)]
    g = hn.optim.RMSprop(p).param_groups[0]
    assert (g["lr"], g["alpha"], g["eps"], g["momentum"], g["centered"]) == (1e-2, 0.99, 1e-8,
                                                                           0, False)
    g = hn.optim.Adagrad(p).param_groups[0]
    assert (g["lr"], g["lr_decay"], g["eps"], g["initial_accumulator_value"]) == (1e-2, 0, 1e-10,
                                                                                0)
    g = hn.optim.Adadelta(p).param_groups[0]
    assert (g["lr"], g["rho"], g["eps"], g["weight_decay"]) == (1.0, 0.9, 1e-6, 0)
    # positional arguments in PyTorch's order
    g = hn.optim.RMSprop(p, 0.1, 0.5, 1e-3, 0.2, 0.3, True).param_groups[0]
    assert (g["alpha"], g["eps"], g["weight_decay"], g["momentum"], g["centered"]) == (
        0.5, 1e-3, 0.2, 0.3, True)
    g = hn.optim.Adagrad(p, 0.1, 0.01, 0.2, 0.3, 1e-5).param_groups[0]
    assert (g["lr_decay"], g["weight_decay"], g["initial_accumulator_value"], g["eps"]) == (
        0.01, 0.2, 0.3, 1e-5)


# ---- whole traced training steps --------------------------------------------------------------


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


TRACED = {
    "rmsprop": lambda p: hn.optim.RMSprop(p, lr=1e-3),
    "rmsprop_centered_momentum": lambda p: hn.optim.RMSprop(p, lr=1e-3, momentum=0.9,
                                                            centered=True, weight_decay=1e-4),
    "adagrad": lambda p: hn.optim.Adagrad(p, lr=0.05, lr_decay=0.01, weight_decay=1e-4),
    "adadelta": lambda p: hn.optim.Adadelta(p, weight_decay=1e-4),
}


def _twin(make_opt):
    hn.manual_seed(0)
    model = _MLP()
    opt = make_opt(model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return model, opt, step


@pytest.mark.parametrize("name", sorted(TRACED))
def test_a_traced_training_step_matches_eager(name):
    steps = 12
    eager_model, eager_opt, eager_step = _twin(TRACED[name])
    model, opt, step = _twin(TRACED[name])
    traced = hn.trace(step)
    rng = np.random.default_rng(1)
    for i in range(steps):
        x = hn.tensor(rng.standard_normal((16, 8)).astype(np.float32))
        y = hn.tensor(rng.integers(0, 4, 16))
        for o in (eager_opt, opt):  # a schedule: the lr is a runtime input, no recompile
            for g in o.param_groups:
                g["lr"] = TRACED[name]([hn.zeros(1, requires_grad=True)]).defaults["lr"] \
                    * 0.95 ** i
        want, got = eager_step(x, y).item(), traced(x, y).item()
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (i, got, want)
    for p, q in zip(eager_model.parameters(), model.parameters()):
        np.testing.assert_allclose(_np(q), _np(p), rtol=1e-4, atol=1e-6)
        for key in eager_opt.state[p]:
            np.testing.assert_allclose(_np(opt.state[q][key]), _np(eager_opt.state[p][key]),
                                       rtol=1e-4, atol=1e-6, err_msg=key)
    stats = traced.stats
    assert stats.compiles + stats.kernel_reuses == 1, (stats, stats.events)
    assert stats.compiled_calls >= steps - 2 and stats.fallbacks == 0, (stats, stats.events)
