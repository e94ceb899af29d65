"""Whole training steps under `@hn.trace`, 50 steps against an eager twin.

Each case builds two identical models and optimizers from one seed: the eager twin runs
the plain step, the traced twin the same step under `hn.trace` (forward, loss,
`backward()`, `optimizer.step()` and `zero_grad()` in one compiled kernel). A learning
rate schedule changes `lr` before every step. After every step the losses must agree,
and at the end (and every 10 steps) the parameters, their `.grad` and the whole
optimizer state (momentum buffers, Adam moments, step counts); nearly every step must
have run compiled, with no recompile caused by the schedule.
"""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn

STEPS = 50
RTOL, ATOL = 2e-4, 2e-6  # float32 round-off, compounded over 50 updates


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                                 nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class GRUModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(6, 12)
        self.head = nn.Linear(12, 4)

    def forward(self, xs):
        h = hn.zeros(xs.shape[1], 12)
        for t in range(xs.shape[0]):
            h = self.cell(xs[t], h)
        return self.head(h)


class Block(nn.Module):
    """Embedding, layer_norm, single-head attention written with matmul and softmax,
    an MLP with residuals, mean-pooled to class logits."""

    def __init__(self, vocab=20, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        # (no key bias: softmax over keys cancels it, so its exact gradient is 0 and Adam
        # would turn round-off noise into full-size steps, different in any two programs)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.out = nn.Linear(d, 4)
        self.scale = 1.0 / np.sqrt(d)

    def forward(self, tokens):
        h = self.embed(tokens)
        a = self.ln1(h)
        att = hn.softmax(self.q(a) @ self.k(a).transpose(1, 2) * self.scale, -1)
        h = h + att @ self.v(a)
        h = h + self.mlp(self.ln2(h))
        return self.out(h.mean(1))


def _data(kind, rng):
    if kind == "mlp":
        return hn.tensor(rng.standard_normal((16, 10)).astype(np.float32))
    if kind == "gru":
        return hn.tensor(rng.standard_normal((5, 8, 6)).astype(np.float32))
    return hn.tensor(rng.integers(0, 20, (8, 7)))


MODELS = {"mlp": MLP, "gru": GRUModel, "block": Block}
OPTIMIZERS = {
    "sgd_momentum": lambda p: hn.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                           weight_decay=1e-4),
    "adam": lambda p: hn.optim.Adam(p, lr=3e-3),
    "adamw": lambda p: hn.optim.AdamW(p, lr=3e-3, amsgrad=True),
}


def _twin(kind, opt_name):
    hn.manual_seed(0)
    model = MODELS[kind]()
    opt = OPTIMIZERS[opt_name](model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return model, opt, step


def _values(t):
    return None if t is None else t.detach().numpy()


def _compare_state(a, b, oa, ob, when):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_allclose(_values(q), _values(p), rtol=RTOL, atol=ATOL,
                                   err_msg=f"{when}: parameter {name}")
        assert (p.grad is None) == (q.grad is None), f"{when}: {name}.grad"
        if p.grad is not None:
            np.testing.assert_allclose(_values(q.grad), _values(p.grad), rtol=RTOL,
                                       atol=ATOL, err_msg=f"{when}: {name}.grad")
        sa, sb = oa.state.get(p, {}), ob.state.get(q, {})
        assert sorted(sa) == sorted(sb), f"{when}: optimizer state keys of {name}"
        for key in sa:
            np.testing.assert_allclose(_values(sb[key]), _values(sa[key]), rtol=RTOL,
                                       atol=ATOL, err_msg=f"{when}: state {key} of {name}")


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_compiled_training_step_matches_the_eager_loop(kind, opt_name):
    eager_model, eager_opt, eager_step = _twin(kind, opt_name)
    model, opt, step = _twin(kind, opt_name)
    traced = hn.trace(step)
    rng = np.random.default_rng(1)
    for i in range(STEPS):
        x, y = _data(kind, rng), hn.tensor(rng.integers(0, 4, 16 if kind == "mlp" else 8))
        for o in (eager_opt, opt):  # a schedule: a new lr before every step
            for g in o.param_groups:
                g["lr"] = (0.05 if opt_name == "sgd_momentum" else 3e-3) * 0.97 ** i
        want, got = eager_step(x, y).item(), traced(x, y).item()
        assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), f"step {i}: {got} vs {want}"
        if i % 10 == 9:
            _compare_state(eager_model, model, eager_opt, opt, f"after step {i}")
    stats = traced.stats
    assert stats.compiles == 1 and stats.compiled_calls >= STEPS - 2, (stats, stats.events)
    assert stats.fallbacks == 0, stats.events
