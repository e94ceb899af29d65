"""hybridnet.optim.lr_scheduler against torch.optim.lr_scheduler (the lr sequences must be
equal to the last bit), state dicts, errors, and schedules driving a traced training step
without recompiling it."""

import copy
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
STEPS = 30


def _groups(lib, opt_name="SGD"):
    """An optimizer of `lib` (hn or torch) with two parameter groups (lr 0.1 and 0.05)."""
    p1 = lib.zeros(3, requires_grad=True)
    p2 = lib.zeros(2, requires_grad=True)
    groups = [{"params": [p1]}, {"params": [p2], "lr": 0.05}]
    if opt_name == "SGD":
        return lib.optim.SGD(groups, lr=0.1, momentum=0.9)
    return getattr(lib.optim, opt_name)(groups, lr=0.1)


def _opt_step(opt):
    """optimizer.step() with (zero) gradients, so that the schedule follows a real step."""
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = p.detach() * 0
    opt.step()


def _snapshot(opt, keys=("lr", "momentum", "betas")):
    return [tuple(group.get(k) for k in keys) for group in opt.param_groups]


def _warmup(e):
    return min(1.0, (e + 1) / 5)


class _Halving:
    """A callable object (its attributes go into the state dict, as in PyTorch)."""

    def __init__(self):
        self.base = 0.5

    def __call__(self, e):
        return self.base ** (e // 4)


CASES = {
    "step": lambda m, o: m.StepLR(o, step_size=3, gamma=0.5),
    "step_default_gamma": lambda m, o: m.StepLR(o, 7),
    "multistep": lambda m, o: m.MultiStepLR(o, milestones=[3, 7, 7, 12], gamma=0.3),
    "exponential": lambda m, o: m.ExponentialLR(o, gamma=0.9),
    "cosine": lambda m, o: m.CosineAnnealingLR(o, T_max=7, eta_min=0.01),
    "cosine_tmax10": lambda m, o: m.CosineAnnealingLR(o, T_max=10),
    "lambda": lambda m, o: m.LambdaLR(o, lr_lambda=lambda e: 0.95 ** e),
    "lambda_per_group": lambda m, o: m.LambdaLR(o, [_warmup, lambda e: 1.0 / (1 + e)]),
    "lambda_object": lambda m, o: m.LambdaLR(o, _Halving()),
    "multiplicative": lambda m, o: m.MultiplicativeLR(o, lambda e: 0.9 if e % 2 else 1.0),
    "constant": lambda m, o: m.ConstantLR(o, factor=0.5, total_iters=4),
    "linear": lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.8, total_iters=6),
    "polynomial": lambda m, o: m.PolynomialLR(o, total_iters=10, power=2.0),
    "warm_restarts": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2,
                                                                eta_min=0.001),
    "warm_restarts_1": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=4),
    "cyclic": lambda m, o: m.CyclicLR(o, 0.01, [0.1, 0.2], step_size_up=4),
    "cyclic_tri2": lambda m, o: m.CyclicLR(o, 0.01, 0.1, 3, 5, mode="triangular2"),
    "cyclic_exp": lambda m, o: m.CyclicLR(o, 0.01, 0.1, 4, mode="exp_range", gamma=0.97,
                                          base_momentum=0.7, max_momentum=0.95),
    "onecycle": lambda m, o: m.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1),
    "onecycle_linear": lambda m, o: m.OneCycleLR(o, max_lr=[0.1, 0.3], total_steps=STEPS + 1,
                                                 anneal_strategy="linear", pct_start=0.25),
    "onecycle_three_phase": lambda m, o: m.OneCycleLR(o, 0.1, total_steps=STEPS + 1,
                                                      three_phase=True, div_factor=10.0),
    "onecycle_epochs": lambda m, o: m.OneCycleLR(o, 0.1, epochs=5, steps_per_epoch=7,
                                                 base_momentum=0.8, max_momentum=0.9),
    "onecycle_no_momentum": lambda m, o: m.OneCycleLR(o, 0.1, total_steps=STEPS + 1,
                                                      cycle_momentum=False,
                                                      final_div_factor=100.0),
    "sequential": lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.2, total_iters=5),
            m.CosineAnnealingLR(o, T_max=10, eta_min=0.001)], milestones=[5]),
    "sequential_3": lambda m, o: m.SequentialLR(
        o, [m.ConstantLR(o, factor=0.5, total_iters=3), m.ExponentialLR(o, gamma=0.9),
            m.StepLR(o, 4, 0.5)], milestones=[4, 12]),
    "chained": lambda m, o: m.ChainedScheduler([m.ConstantLR(o, factor=0.5, total_iters=4),
                                                m.ExponentialLR(o, gamma=0.9)]),
}
ADAM_CASES = {  # cycle_momentum moves Adam's beta1
    "onecycle_adam": lambda m, o: m.OneCycleLR(o, max_lr=0.01, total_steps=STEPS + 1),
    "onecycle_adam_three_phase": lambda m, o: m.OneCycleLR(o, 0.01, epochs=3, steps_per_epoch=11,
                                                           three_phase=True,
                                                           anneal_strategy="linear"),
    "cyclic_adam": lambda m, o: m.CyclicLR(o, 0.001, 0.01, step_size_up=5),
}


def _run_pair(make, opt_name="SGD", steps=STEPS):
    ours, theirs = _groups(hn, opt_name), _groups(torch, opt_name)
    s_ours, s_theirs = make(hn.optim.lr_scheduler, ours), make(torch.optim.lr_scheduler, theirs)
    assert s_ours.get_last_lr() == s_theirs.get_last_lr()
    assert _snapshot(ours) == _snapshot(theirs)
    history = [s_ours.get_last_lr()[0]]
    for i in range(steps):
        _opt_step(ours)
        _opt_step(theirs)
        s_ours.step()
        s_theirs.step()
        assert getattr(s_ours, "last_epoch", None) == getattr(s_theirs, "last_epoch", None), i
        assert s_ours.get_last_lr() == s_theirs.get_last_lr(), i  # exactly: same arithmetic
        assert _snapshot(ours) == _snapshot(theirs), i
        history.append(s_ours.get_last_lr()[0])
    assert len(set(history)) > 1  # (the schedule does change the lr)
    return s_ours, s_theirs, ours, theirs


@needs_torch
@pytest.mark.parametrize("name", sorted(CASES) + sorted(ADAM_CASES))
def test_lr_sequence_matches_torch(name):
    make = CASES.get(name) or ADAM_CASES[name]
    s_ours, s_theirs, ours, theirs = _run_pair(make, "SGD" if name in CASES else "Adam")
    # the same attributes (PyTorch's state dict keys), and the same group keys
    assert sorted(s_ours.state_dict()) == sorted(s_theirs.state_dict())
    for a, b in zip(ours.param_groups, theirs.param_groups):
        assert {"initial_lr", "lr"} <= set(a) and all(a[k] == b[k] for k in a if k != "params")


@needs_torch
def test_cosine_annealing_matches_torch_over_many_periods_and_its_closed_form():
    make = lambda m, o: m.CosineAnnealingLR(o, T_max=6, eta_min=0.002)  # noqa: E731
    s_ours, *_ = _run_pair(make, steps=60)  # five periods down and up
    lrs = []
    opt = _groups(hn)
    sched = make(hn.optim.lr_scheduler, opt)
    for _ in range(24):
        _opt_step(opt)
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    closed = [0.002 + (0.1 - 0.002) * (1 + math.cos(math.pi * t / 6)) / 2 for t in range(1, 25)]
    np.testing.assert_allclose(lrs, closed, rtol=1e-12)


@needs_torch
@pytest.mark.parametrize("name", ["step", "multistep", "exponential", "cosine", "constant",
                                  "linear", "polynomial", "warm_restarts"])
def test_deprecated_step_with_epoch_uses_the_closed_form(name):
    ours, theirs = _groups(hn), _groups(torch)
    s_ours, s_theirs = CASES[name](hn.optim.lr_scheduler, ours), \
        CASES[name](torch.optim.lr_scheduler, theirs)
    for epoch in (3, 4, 9, 2, 15, 11.5 if name == "warm_restarts" else 11):
        _opt_step(ours)
        _opt_step(theirs)
        if name == "warm_restarts":  # (its step(epoch) is not deprecated)
            s_ours.step(epoch)
        else:
            with pytest.warns(UserWarning, match="epoch parameter"):
                s_ours.step(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s_theirs.step(epoch)
        assert s_ours.get_last_lr() == s_theirs.get_last_lr(), epoch


# ---- ReduceLROnPlateau ----------------------------------------------------------------------

METRICS = [1.0, 0.9, 0.85, 0.85, 0.8499, 0.86, 0.87, 0.9, 0.84, 0.84, 0.84, 0.84, 0.83, 0.9,
           0.95, 0.95, 0.95, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.69999, 0.7, 0.7, 0.7, 0.7, 0.7,
           0.7, 0.7, 0.7, 0.1]
PLATEAU = [
    dict(),
    dict(patience=2),
    dict(patience=1, factor=0.5, cooldown=2),
    dict(patience=0, factor=0.5, min_lr=0.01),
    dict(patience=1, factor=0.3, min_lr=[0.02, 0.001], threshold=0.01),
    dict(patience=2, threshold_mode="abs", threshold=0.005),
    dict(mode="max", patience=1, factor=0.5),
    dict(mode="max", patience=1, threshold_mode="abs", threshold=0.02, cooldown=1),
    dict(patience=0, factor=0.9, eps=0.006),  # reductions smaller than eps are skipped
]


@needs_torch
@pytest.mark.parametrize("kw", PLATEAU, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_reduce_lr_on_plateau_matches_torch(kw):
    ours, theirs = _groups(hn), _groups(torch)
    s_ours = hn.optim.lr_scheduler.ReduceLROnPlateau(ours, **kw)
    s_theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(theirs, **kw)
    seen = set()
    for i, metric in enumerate(METRICS):
        _opt_step(ours)
        _opt_step(theirs)
        s_ours.step(hn.tensor(metric, dtype=hn.float64) if i % 2 else metric)
        s_theirs.step(metric)
        assert s_ours.get_last_lr() == s_theirs.get_last_lr(), i
        assert _snapshot(ours, ("lr",)) == _snapshot(theirs, ("lr",)), i
        for key in ("best", "num_bad_epochs", "cooldown_counter", "last_epoch"):
            assert getattr(s_ours, key) == getattr(s_theirs, key), (i, key)
        seen.add(ours.param_groups[0]["lr"])
    assert len(seen) > 1 or kw.get("eps") or kw.get("mode") == "max"
    assert sorted(s_ours.state_dict()) == sorted(s_theirs.state_dict())


def test_reduce_lr_on_plateau_errors_and_resume(tmp_path):
    opt = _groups(hn)
    m = hn.optim.lr_scheduler
    with pytest.raises(ValueError, match="Factor"):
        m.ReduceLROnPlateau(opt, factor=1.0)
    with pytest.raises(ValueError, match="unknown"):
        m.ReduceLROnPlateau(opt, mode="median")
    with pytest.raises(ValueError, match="unknown"):
        m.ReduceLROnPlateau(opt, threshold_mode="pct")
    with pytest.raises(ValueError, match="min_lrs"):
        m.ReduceLROnPlateau(opt, min_lr=[0.1])
    sched = m.ReduceLROnPlateau(opt, patience=1, factor=0.5)
    for metric in METRICS[:8]:
        sched.step(metric)
    saved = _through_file(tmp_path, sched.state_dict())  # (best is inf or a float)
    opt2 = _groups(hn)
    opt2.load_state_dict(opt.state_dict())
    resumed = m.ReduceLROnPlateau(opt2)
    resumed.load_state_dict(saved)
    for metric in METRICS[8:]:
        sched.step(metric)
        resumed.step(metric)
        assert resumed.get_last_lr() == sched.get_last_lr()
    assert resumed.mode_worse == math.inf


# ---- state dicts, resuming and errors -------------------------------------------------------


def _through_file(tmp_path, state):
    path = str(tmp_path / "checkpoint.hn")
    hn.save(state, path)
    return hn.load_state(path)


@pytest.mark.parametrize("via", ["copy", "hn.save"])
@pytest.mark.parametrize("name", ["step", "cosine", "lambda_object", "onecycle", "cyclic",
                                  "warm_restarts", "sequential", "chained", "multistep"])
def test_state_dict_round_trip_continues_identically(name, via, tmp_path):
    make, m = CASES[name], hn.optim.lr_scheduler
    opt = _groups(hn, "Adam" if name == "onecycle" else "SGD")
    sched = make(m, opt)
    for _ in range(9):
        _opt_step(opt)
        sched.step()
    saved = {"sched": sched.state_dict(), "opt": opt.state_dict()}
    saved = copy.deepcopy(saved) if via == "copy" else _through_file(tmp_path, saved)
    saved_sched, saved_opt = saved["sched"], saved["opt"]
    opt2 = _groups(hn, "Adam" if name == "onecycle" else "SGD")
    resumed = make(m, opt2)  # a fresh start (lr and momentum reset by the constructor) ...
    opt2.load_state_dict(saved_opt)  # ... then the checkpoint, as a training script would
    resumed.load_state_dict(saved_sched)
    if name == "lambda_object":
        assert saved_sched["lr_lambdas"] == [{"base": 0.5}] * 2
    for _ in range(15):
        for o, s in ((opt, sched), (opt2, resumed)):
            _opt_step(o)
            s.step()
        assert resumed.get_last_lr() == sched.get_last_lr()
        assert _snapshot(opt2) == _snapshot(opt)
    assert getattr(resumed, "last_epoch", None) == getattr(sched, "last_epoch", None)
    if name == "multistep":
        with pytest.warns(UserWarning, match="epoch parameter"):
            resumed.step(25)  # (the closed form reads the milestones as a Counter)
        with pytest.warns(UserWarning, match="epoch parameter"):
            sched.step(25)
        assert resumed.get_last_lr() == sched.get_last_lr()


def test_base_class_protocol():
    m = hn.optim.lr_scheduler
    opt = _groups(hn)
    sched = m.StepLR(opt, step_size=2, gamma=0.5)
    assert sched.last_epoch == 0 and sched.base_lrs == [0.1, 0.05]
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.05]
    assert sched.get_last_lr() == [0.1, 0.05]
    with pytest.warns(UserWarning, match="before `optimizer.step"):
        sched.step()  # before any optimizer.step(), as PyTorch warns
    with pytest.warns(UserWarning, match="get_last_lr"):
        sched.get_lr()
    # resuming: initial_lr is kept, lr follows last_epoch
    opt2 = _groups(hn)
    with pytest.raises(KeyError, match="initial_lr"):
        m.StepLR(opt2, step_size=2, last_epoch=3)
    for g in opt2.param_groups:
        g["initial_lr"] = g["lr"]
    assert m.ExponentialLR(opt2, gamma=0.5, last_epoch=3).last_epoch == 4
    with pytest.raises(TypeError, match="not an Optimizer"):
        m.StepLR(object(), 2)
    assert isinstance(sched, m.LRScheduler)
    assert issubclass(m.ReduceLROnPlateau, m.LRScheduler)


def test_numpy_lr_values_are_stored_as_python_floats():
    opt = _groups(hn)
    sched = hn.optim.lr_scheduler.LambdaLR(opt, lambda e: np.float64(0.5) ** e)
    _opt_step(opt)
    sched.step()
    assert type(opt.param_groups[0]["lr"]) is float and opt.param_groups[0]["lr"] == 0.05


def test_scheduler_errors():
    m = hn.optim.lr_scheduler
    opt = _groups(hn)
    with pytest.raises(ValueError, match="lr_lambdas"):
        m.LambdaLR(opt, [lambda e: 1.0])
    with pytest.raises(TypeError, match="function"):
        m.MultiplicativeLR(opt, [1.0, 2.0])
    with pytest.raises(ValueError, match="factor"):
        m.ConstantLR(opt, factor=2.0)
    with pytest.raises(ValueError, match="Starting"):
        m.LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="total_steps OR"):
        m.OneCycleLR(opt, 0.1)
    with pytest.raises(ValueError, match="total_steps"):
        m.OneCycleLR(opt, 0.1, total_steps=0)
    with pytest.raises(ValueError, match="pct_start"):
        m.OneCycleLR(opt, 0.1, total_steps=10, pct_start=1)
    with pytest.raises(ValueError, match="anneal_strategy"):
        m.OneCycleLR(opt, 0.1, total_steps=10, anneal_strategy="exp")
    with pytest.raises(ValueError, match="max_lr"):
        m.OneCycleLR(opt, [0.1], total_steps=10)
    no_momentum = hn.optim.Adagrad([hn.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError, match="momentum or beta1"):
        m.OneCycleLR(no_momentum, 0.1, total_steps=10)
    sched = m.OneCycleLR(_groups(hn), 0.1, total_steps=3)
    for _ in range(3):
        _opt_step(sched.optimizer)
        sched.step()  # (the third step goes past the end)
        if sched.last_epoch == 3:
            break
    with pytest.raises(ValueError, match="Tried to step"):
        sched.step()
    with pytest.raises(ValueError, match="T_0"):
        m.CosineAnnealingWarmRestarts(opt, T_0=0)
    with pytest.raises(ValueError, match="milestone"):
        m.SequentialLR(opt, [m.StepLR(opt, 2)], milestones=[3])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        m.ChainedScheduler([m.ReduceLROnPlateau(opt)])
    with pytest.raises(ValueError, match="same optimizer"):
        m.ChainedScheduler([m.StepLR(opt, 2), m.StepLR(_groups(hn), 2)])
    with pytest.raises(ValueError, match="mode is invalid"):
        m.CyclicLR(opt, 0.01, 0.1, mode="sawtooth")


# ---- schedules driving a traced training step -------------------------------------------------


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def _twin(make_opt, make_sched):
    hn.manual_seed(0)
    model = _MLP()
    opt = make_opt(model.parameters())
    sched = make_sched(opt)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return model, opt, sched, step


def _train_twins(make_opt, make_sched, epochs, batches, per_batch):
    eager_model, eager_opt, eager_sched, eager_step = _twin(make_opt, make_sched)
    model, opt, sched, step = _twin(make_opt, make_sched)
    traced = hn.trace(step)
    rng = np.random.default_rng(3)
    lrs = set()
    for _ in range(epochs):
        for _ in range(batches):
            x = hn.tensor(rng.standard_normal((8, 6)).astype(np.float32))
            y = hn.tensor(rng.integers(0, 3, 8))
            want, got = eager_step(x, y).item(), traced(x, y).item()
            assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
            if per_batch:
                eager_sched.step()
                sched.step()
            lrs.add(opt.param_groups[0]["lr"])
        if not per_batch:
            eager_sched.step()
            sched.step()
    assert sched.get_last_lr() == eager_sched.get_last_lr()
    for p, q in zip(eager_model.parameters(), model.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    stats = traced.stats
    total = epochs * batches
    # the first call runs eagerly (it creates the optimizer state), the second is traced
    # and compiled, every later one runs compiled: the schedule never retraces
    assert stats.traces == 2 and stats.compiles + stats.kernel_reuses == 1, (stats, stats.events)
    assert stats.compiled_calls == total - 2 and stats.fallbacks == 0, (stats, stats.events)
    return lrs, stats


def test_traced_step_follows_step_lr_without_recompiling():
    lrs, stats = _train_twins(
        lambda p: hn.optim.SGD(p, lr=0.2, momentum=0.9, weight_decay=1e-3),
        lambda o: hn.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        epochs=6, batches=3, per_batch=False)
    assert lrs == {0.2, 0.1, 0.05}
    assert stats.compiles == 1  # (no other test here trains this graph)


def test_traced_step_follows_one_cycle_lr_with_adam_betas_without_recompiling():
    # lr and beta1 change before every call; both are runtime inputs of the compiled step
    lrs, _ = _train_twins(lambda p: hn.optim.Adam(p, lr=1e-3),
                       lambda o: hn.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05,
                                                                  total_steps=13),
                       epochs=1, batches=12, per_batch=True)
    assert len(lrs) == 12


def test_traced_step_follows_cyclic_momentum_of_sgd_without_recompiling():
    lrs, _ = _train_twins(lambda p: hn.optim.SGD(p, lr=0.1, momentum=0.9),
                       lambda o: hn.optim.lr_scheduler.CyclicLR(o, 0.01, 0.1, step_size_up=3),
                       epochs=2, batches=5, per_batch=True)
    assert len(lrs) > 3
