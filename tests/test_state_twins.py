"""Twin-state differential tests of `hn.trace`: a traced function leaves every piece of
state (outputs, object identity, parameters, requires_grad, is_leaf, .grad, optimizer
state, buffers, closure and global tensors, training flags) exactly as the same function
run eagerly on a twin built from the same seed. Harness: tests/twins.py.

Nothing here asserts that a call compiles (tests/twins.py records it; the summary is
printed at the end of the session), only that the traced twin equals the eager twin.
"""

import functools
import types
import zlib

import pytest
import twins
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from twins import OPTS, Twin, batch, call, hand_grads, lazy, mlp, run_twins

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn, optim

N = 6  # calls per scenario: the first records, the later ones can run compiled
SCENARIOS = {}


def scenario(name, **options):
    """Register `factory(seed, **options)` as the twin scenario `name`."""
    def register(factory):
        SCENARIOS[name] = functools.partial(factory, **options) if options else factory
        return factory
    return register


# ---- mutators --------------------------------------------------------------------------


def _add_none(t):
    t.add_(1.0)


def _fresh_none(t):
    t.mul_(3.0).add_(1.0)


def _mul_return_arg(t):
    t.mul_(2.0)
    return t


def _add_result(t):
    return t.add_(1.0)


def _untouched(t, u):
    return t, u * 2.0, t


def _return_new(t):
    t.add_(1.0)
    return t * 2.0


def _two_args(u, v):
    u.add_(v)
    v.mul_(0.5)
    return u.sum()


def _leaf_update(v, g):
    with hn.no_grad():
        v.sub_(g * 0.1)
    return v


def _setitem_arg(u, v):
    with hn.no_grad():
        u[0] = 5.0
        u[1:3] = v
    return u.sum()


def _setitem_returns_arg(u):
    with hn.no_grad():
        u[1:3] = u[0:2] * 0.5
    return u


def args_scenario(seed, body, held, fresh=(), rg=False):
    """body(*held, *fresh): `held` tensors are the same objects at every call (and are
    negated in place before call 3), `fresh` ones are new at every call."""
    kept = [hn.randn(*shape, requires_grad=rg) for shape in held]

    def calls(f):
        for i in range(N):
            if i == 3:
                with hn.no_grad():
                    for t in kept:
                        t.mul_(-1.0)
            yield call(*kept, *(hn.randn(*shape) for shape in fresh))
    return Twin(body, {"held": kept}, calls)


for _name, _body, _held, _fresh in (
        ("mutate/add_returns_none", _add_none, [(3,)], ()),
        ("mutate/fresh_arg_returns_none", _fresh_none, (), [(4,)]),
        ("mutate/return_arg_after_mul_", _mul_return_arg, [(3,)], ()),
        ("mutate/return_add_result", _add_result, [(2, 3)], ()),
        ("mutate/return_untouched_args", _untouched, [(3,)], [(3,)]),
        ("mutate/return_new_value", _return_new, [(3,)], ()),
        ("mutate/two_args", _two_args, [(4,), (4,)], ()),
        ("setitem/argument", _setitem_arg, [(5,)], [(2,)]),
        ("setitem/returns_argument", _setitem_returns_arg, [(4,)], ())):
    SCENARIOS[_name] = functools.partial(args_scenario, body=_body, held=_held, fresh=_fresh)
SCENARIOS["mutate/leaf_requiring_grad_updated_under_no_grad"] = functools.partial(
    args_scenario, body=_leaf_update, held=[(3,)], fresh=[(3,)], rg=True)


@scenario("mutate/closure_tensor", perturbed=False)
@scenario("mutate/closure_tensor_perturbed", perturbed=True)
def _closure_tensor(seed, perturbed):
    c = hn.zeros(3)

    def fn(x):
        c.mul_(0.5).add_(x)
        return c * x

    def calls(f):
        for i in range(N):
            if perturbed and i == 2:
                c.fill_(1.0)
            if perturbed and i == 4:
                c.mul_(-1.0)
            yield call(hn.randn(3))
    return Twin(fn, {"c": c}, calls)


ACC = None  # a module-level tensor; each twin runs a copy of the function whose globals
# are a copy of this module's namespace holding that twin's own ACC


def _global_step(x):
    ACC.add_(x)
    return ACC * 2.0


def with_globals(fn, **values):
    namespace = {**fn.__globals__, **values}
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                              fn.__closure__), namespace


@scenario("mutate/global_tensor", rebind=False)
@scenario("mutate/global_tensor_rebound", rebind=True)
def _global_tensor(seed, rebind):
    fn, namespace = with_globals(_global_step, ACC=hn.zeros(3))

    def calls(f):
        for i in range(N):
            if rebind and i == 3:
                namespace["ACC"] = hn.ones(3)
            yield call(hn.randn(3))
    return Twin(fn, {"ACC": lazy(lambda: namespace["ACC"])}, calls)


class RunningNorm(nn.Module):
    """Subtracts a running mean kept in a buffer (updated under no_grad, as BatchNorm)."""

    def __init__(self, d=4):
        super().__init__()
        self.register_buffer("running_mean", hn.zeros(d))
        self.register_buffer("batches", hn.zeros(1, dtype=hn.int64))
        self.lin = nn.Linear(d, 3)

    def forward(self, x):
        if self.training:
            with hn.no_grad():
                self.running_mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
                self.batches.add_(1)
        return self.lin(x - self.running_mean)


@scenario("buffer/running_mean_no_grad", grad=False, sizes=(5,))
@scenario("buffer/running_mean_grad_mode", grad=True, sizes=(5,))
@scenario("buffer/running_mean_new_batch_sizes", grad=False, sizes=(5, 5, 2, 2, 7, 5))
def _running_mean(seed, grad, sizes):
    model = RunningNorm()

    def fn(x):
        return model(x)

    def calls(f):
        for i in range(N):
            model.train(i != 4)
            yield call(hn.randn(sizes[i % len(sizes)], 4), grad=grad)
    return Twin(fn, {"model": model}, calls)


# ---- setitem -----------------------------------------------------------------------------


@scenario("setitem/closure")
def _setitem_closure(seed):
    buf = hn.zeros(4, 3)

    def fn(x):
        with hn.no_grad():
            buf[1:3] = x
            buf[:, 0] = 1.0
            buf[3] = buf[3] + x[0]
        return buf * 1.0

    def calls(f):
        for _ in range(N):
            yield call(hn.randn(2, 3))
    return Twin(fn, {"buf": buf}, calls)


# ---- optimizer steps -------------------------------------------------------------------


def train_step(seed, opt, loss="ce", order="zero_last", dtype=None, sizes=(5,), live=False,
               perturb=None, ln=False):
    """forward, loss, backward, step (and zero_grad somewhere), in grad mode."""
    model = mlp(ln=ln, dtype=dtype)
    o = OPTS[opt](list(model.parameters()))
    loss_fn = F.cross_entropy if loss == "ce" else F.mse_loss
    ctx = types.SimpleNamespace(model=model, opt=o, memo={})

    def fn(x, y):
        if order == "zero_first":
            o.zero_grad()
        if order == "model_keep_first":
            model.zero_grad(set_to_none=False)
        value = loss_fn(model(x), y)
        value.backward()
        o.step()
        if order == "zero_last":
            o.zero_grad()
        if order == "model_last":
            model.zero_grad()
        return value if live else value.detach()

    def calls(f):
        for i in range(N):
            if perturb:
                perturb(ctx, i)
            yield call(*batch(sizes[i % len(sizes)], loss=loss, dtype=dtype))
    return Twin(fn, {"model": model, "opt": o}, calls)


def update_step(seed, opt, dtype=None, grads="assign", late=0, partial=False, zero=None,
                perturb=None, after=None):
    """opt.step() alone under no_grad, with gradients made outside the traced function."""
    model = mlp(dtype=dtype)
    params = list(model.parameters())
    o = OPTS[opt](params)
    ctx = types.SimpleNamespace(model=model, opt=o, memo={})

    def fn():
        o.step()
        if zero == "opt":
            o.zero_grad()
        elif zero == "model":
            model.zero_grad()
        elif zero == "keep":
            o.zero_grad(set_to_none=False)
        elif zero == "model_keep":
            model.zero_grad(set_to_none=False)

    def calls(f):
        for i in range(N):
            if perturb:
                perturb(ctx, i)
            if i < late:
                if partial:
                    hand_grads(params[2:])
            elif grads == "outside":
                x, y = batch(loss="mse", dtype=dtype)
                F.mse_loss(model(x), y).backward()
            elif grads == "copy" and all(p.grad is not None for p in params):
                for p in params:
                    p.grad.copy_(hn.randn(*p.shape, dtype=p.dtype))
            else:
                hand_grads(params)
            if after:
                after(ctx, i)
            yield call(grad=False)
    return Twin(fn, {"model": model, "opt": o}, calls)


for _name in OPTS:
    SCENARIOS[f"train/{_name}/cross_entropy"] = functools.partial(train_step, opt=_name)
    SCENARIOS[f"update/{_name}"] = functools.partial(update_step, opt=_name)
for _name in ("sgd", "sgd_momentum", "adam", "adamw"):
    SCENARIOS[f"train/{_name}/mse_zero_grad_first"] = functools.partial(
        train_step, opt=_name, loss="mse", order="zero_first")
SCENARIOS["train/adam/float64"] = functools.partial(
    train_step, opt="adam", loss="mse", dtype=hn.float64)
SCENARIOS["train/sgd_momentum/returns_live_loss"] = functools.partial(
    train_step, opt="sgd_momentum", live=True)
SCENARIOS["update/adam/float64"] = functools.partial(update_step, opt="adam",
                                                     dtype=hn.float64)
for _name in ("sgd_momentum", "adam"):
    SCENARIOS[f"update/{_name}/grads_from_outside"] = functools.partial(
        update_step, opt=_name, grads="outside", zero="opt")
    SCENARIOS[f"late_grads/{_name}"] = functools.partial(update_step, opt=_name, late=1)
    SCENARIOS[f"late_grads/{_name}/partial"] = functools.partial(
        update_step, opt=_name, late=2, partial=True)


# ---- hyper-parameters changed between calls -------------------------------------------


def sgd_changes(ctx, i):
    g = ctx.opt.param_groups[0]
    g.update({1: {"lr": 0.05}, 2: {"momentum": 0.5}, 3: {"weight_decay": 0.1},
              4: {"nesterov": True}, 5: {"lr": 0.2}}.get(i, {}))


def adam_changes(ctx, i):
    g = ctx.opt.param_groups[0]
    g.update({1: {"lr": 0.05}, 2: {"betas": (0.8, 0.99)}, 3: {"eps": 1e-3},
              4: {"weight_decay": 0.1}, 5: {"lr": 1e-3}}.get(i, {}))


def lr_schedule(ctx, i):
    for g in ctx.opt.param_groups:
        g["lr"] = 0.1 * 0.7 ** i


def second_group_lr(ctx, i):
    ctx.opt.param_groups[1]["lr"] = 0.01 * (i + 1)


for _name, _opt, _change in (("sgd_changes", "sgd_momentum", sgd_changes),
                             ("adam_changes", "adam", adam_changes),
                             ("adamw_changes", "adamw", adam_changes),
                             ("lr_schedule_sgd", "sgd", lr_schedule),
                             ("lr_schedule_adam", "adam", lr_schedule),
                             ("second_group_lr", "sgd_two_groups", second_group_lr)):
    SCENARIOS[f"hparams/update/{_name}"] = functools.partial(
        update_step, opt=_opt, perturb=_change)
    SCENARIOS[f"hparams/train/{_name}"] = functools.partial(
        train_step, opt=_opt, perturb=_change)


# ---- modes, state dicts, frozen parameters, grads reset between calls --------------------


class ModeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        return y * 2.0 + 1.0 if self.training else y.tanh()


MODE_PATTERN = (True, False, False, True, False, True, True)


@scenario("modes/layernorm_dropout0", kind="ln")
@scenario("modes/branch_on_training", kind="branch")
@scenario("modes/dropout_half_in_eval", kind="dropout")
@scenario("state/load_state_dict_forward", kind="load")
@scenario("batch/forward_new_sizes", kind="sizes")
def _forward(seed, kind):
    model = {"branch": ModeBranch, "dropout": lambda: mlp(dropout=0.5)}.get(
        kind, lambda: mlp(ln=True, dropout=0.0))()
    sizes = (4, 4, 7, 7, 2, 4, 1)

    def fn(x):
        return model(x)

    def calls(f):
        for i, mode in enumerate(MODE_PATTERN):
            if kind in ("ln", "branch"):
                model.train(mode)
            elif kind == "dropout":
                model.eval()
            elif kind == "load" and i in (2, 4):
                model.load_state_dict({k: hn.randn(*v.shape)
                                       for k, v in model.state_dict().items()})
            yield call(hn.randn(sizes[i] if kind == "sizes" else 5, 4), grad=False)
    return Twin(fn, {"model": model}, calls)


def train_eval(ctx, i):
    ctx.model.train(MODE_PATTERN[i])


def load_both(ctx, i):
    """Snapshot the optimizer at call 1; at call 3 load random weights and the snapshot."""
    if i == 1:
        sd = ctx.opt.state_dict()
        ctx.memo["opt"] = {"param_groups": [dict(g) for g in sd["param_groups"]], "state": {
            k: {n: v.detach() * 1.0 if isinstance(v, hn.Tensor) else v for n, v in e.items()}
            for k, e in sd["state"].items()}}
    if i == 3:
        ctx.model.load_state_dict({k: hn.randn(*v.shape)
                                   for k, v in ctx.model.state_dict().items()})
        ctx.opt.load_state_dict(ctx.memo["opt"])


def freeze(ctx, i):
    weight = ctx.model[0].weight
    if i == 2:
        weight.requires_grad_(False)
    if i == 4:
        weight.requires_grad_(True)


def reset_grads(ctx, i):
    if i == 2:
        ctx.model[0].weight.grad = None
    if i == 4:
        ctx.model.zero_grad()
    if i == 5:
        ctx.opt.zero_grad(set_to_none=False)


def drop_grad(ctx, i):
    if i in (2, 4):
        ctx.model[0].weight.grad = None


SCENARIOS.update({
    "state/grad_none_between_calls_update_sgd_momentum": functools.partial(
        update_step, opt="sgd_momentum", after=drop_grad),
    "state/grad_none_between_calls_update_adam": functools.partial(
        update_step, opt="adam", after=drop_grad),
    "modes/train_step": functools.partial(train_step, opt="sgd_momentum", ln=True,
                                          perturb=train_eval),
    "state/load_state_dict_update": functools.partial(update_step, opt="sgd_momentum",
                                                      perturb=load_both),
    "state/load_state_dict_train_adam": functools.partial(train_step, opt="adam",
                                                          perturb=load_both),
    "state/freeze_param_train": functools.partial(train_step, opt="sgd_momentum",
                                                  perturb=freeze),
    "state/freeze_param_update": functools.partial(update_step, opt="adam", zero="opt",
                                                   perturb=freeze),
    "state/grad_none_between_calls_accumulating": functools.partial(
        train_step, opt="sgd", order="none", perturb=reset_grads),
    "zero_grad/opt_in_update": functools.partial(update_step, opt="sgd_momentum",
                                                 zero="opt"),
    "zero_grad/model_in_update": functools.partial(update_step, opt="adam", zero="model"),
    "zero_grad/keep_in_update_assign": functools.partial(update_step, opt="sgd", zero="keep"),
    "zero_grad/keep_in_update_copy": functools.partial(update_step, opt="adam", zero="keep",
                                                       grads="copy"),
    "zero_grad/model_keep_in_update_copy": functools.partial(
        update_step, opt="sgd_momentum", zero="model_keep", grads="copy"),
    "zero_grad/model_keep_first_train": functools.partial(
        train_step, opt="sgd_momentum", order="model_keep_first"),
    "zero_grad/model_last_train": functools.partial(train_step, opt="adam",
                                                    order="model_last"),
    "batch/train_new_sizes": functools.partial(train_step, opt="adam", loss="mse",
                                               sizes=(4, 4, 7, 7, 2, 4)),
})


# ---- hn.trace(module) ------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 3)
        self.scale = 2.0

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)).tanh()) * self.scale


@scenario("module/api_passes_through")
def _module_api(seed):
    model = Net()
    facts = []

    def calls(f):
        for i in range(N):
            if i == 2:
                f.eval()
            if i == 3:
                f.load_state_dict({k: v * 0.5 for k, v in f.state_dict().items()})
            if i == 4:
                f.train()
            facts.append([f.training, f.scale, f.fc1.out_features,
                          [n for n, _ in f.named_parameters()], list(f.state_dict()),
                          all(p is q for p, q in zip(f.parameters(), model.parameters())),
                          len(list(f.parameters())), len(list(f.modules()))])
            yield call(hn.randn(5, 4), grad=False)
    return Twin(model, {"model": model, "facts": facts}, calls)


@scenario("module/backward_through_traced_output")
def _module_backward(seed):
    model = Net()
    o = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def calls(f):
        for _ in range(N):
            x, y = batch(loss="mse")
            out = yield call(x)
            F.mse_loss(out, y).backward()
            o.step()
            f.zero_grad()
    return Twin(model, {"model": model, "opt": o}, calls)


# ---- list arguments (passed packed: jit.pytree.Packed) ----------------------------------


@scenario("list/cell_trained_over_lists_of_many_lengths")
def _list_training(seed):
    cell = nn.GRUCell(3, 4)
    o = optim.SGD(cell.parameters(), lr=0.1, momentum=0.9)

    def fn(xs, y):
        h = hn.zeros(2, 4)
        for x in xs:
            h = cell(x, h)
        return F.mse_loss(h, y)

    def calls(f):
        for steps in (8, 11, 8, 15, 9, 20, 3, 30):
            loss = yield call([hn.randn(2, 3) for _ in range(steps)], hn.randn(2, 4))
            loss.backward()
            o.step()
            o.zero_grad()
    return Twin(fn, {"cell": cell, "opt": o}, calls)


def _held_list_scenario(body, steps=4):
    def make(seed):
        held = [hn.randn(3) for _ in range(steps)]

        def calls(f):
            for i in range(N):
                if i == 3:
                    with hn.no_grad():
                        held[1].mul_(-1.0)
                yield call(held)
        return Twin(body, {"held": held}, calls)
    return make


def _item_add_(xs):
    xs[0].add_(1.0)
    return xs[0] * xs[1]


def _returns_items(xs):
    return xs[-1], xs[0] + xs[1], xs


def _sums_items(xs):
    total = xs[0]
    for x in xs[1:]:
        total = total * 0.5 + x
    return total


SCENARIOS["list/item_updated_in_place"] = _held_list_scenario(_item_add_)
SCENARIOS["list/returns_items_and_the_list"] = _held_list_scenario(_returns_items)
SCENARIOS["list/held_list_read_each_call"] = _held_list_scenario(_sums_items, steps=9)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_twin_scenario(name):
    run_twins(name, SCENARIOS[name], seed=zlib.crc32(name.encode()) % 10_000)


# ---- a growing Python list attribute (REINFORCE style) ---------------------------------


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.rewards = []

    def forward(self, x):
        return self.net(x).softmax(-1)


@pytest.mark.parametrize("wrap", ["closure", "module"])
def test_growing_list_attribute(wrap):
    def make(seed):
        policy = Policy()

        def fn(x):
            return policy(x)

        def calls(f):
            for _ in range(10):
                probs = yield call(hn.randn(1, 4), grad=False)
                policy.rewards.append(float(probs[0, 0]))
        return Twin(policy if wrap == "module" else fn, {"policy": policy}, calls)
    traced = run_twins(f"list_attribute/{wrap}", make, seed=3)
    assert traced.stats.misses <= 2, (
        f"the list attribute the function never reads made {traced.stats.misses} of 10 "
        f"calls miss: {traced.stats.events[-3:]}")


_random_count = [0]


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
@given(prog=twins.programs(), seed=st.integers(0, 10_000))
def test_random_programs(prog, seed):
    note(f"program: {prog}")
    _random_count[0] += 1
    run_twins(f"random[{_random_count[0]}]", functools.partial(twins.random_program, prog=prog),
              seed=seed)


# ---- the oracle itself: a deliberate difference in one twin is always reported ---------


def _sabotage(kind, ctx):
    model, o, x = ctx.model, ctx.opt, ctx.x
    with hn.no_grad():
        {"param value": lambda: model[0].weight.add_(1e-4),
         "requires_grad": lambda: model[0].bias.requires_grad_(False),
         "grad None": lambda: setattr(model[0].weight, "grad", None),
         "grad values": lambda: model[0].weight.grad.add_(1e-3),
         "buffer": lambda: model.count.add_(1.0),
         "hyper-parameter": lambda: o.param_groups[0].update(lr=0.01 + 1e-12),
         "optimizer state": lambda: o.state[model[0].weight]["exp_avg"].add_(1e-3),
         "training flag": lambda: model[1].eval(),
         "list attribute": lambda: model.rewards.append(2.0),
         "closure tensor": lambda: x.add_(1e-4),
         "float64 tensor": lambda: ctx.x64.add_(1e-8)}.get(kind, lambda: None)()


ORACLE_CASES = dict([
    ("param value", r"\.0\.weight values"), ("requires_grad", r"0\.bias requires_grad"),
    ("grad None", r"0\.weight \.grad: eager=a tensor"), ("grad values", r"weight\.grad values"),
    ("buffer", r"\.count values"), ("hyper-parameter", r"param_groups\[0\]\['lr'\]"),
    ("optimizer state", r"'exp_avg'\] values"), ("training flag", "training flags"),
    ("list attribute", r"rewards length: eager=3 \[1.0, 1.0, 1.0\] traced=4"),
    ("closure tensor", r"\['x'\] values"),
    ("float64 tensor", r"\['x64'\] values"), ("identity", r"result identity"),
    ("arg mutated", r"args\[0\]\[0\] values"), ("result value", r"result\[1\] values"),
    ("replaced", r"replaced by new objects.*'exp_avg'")])


@pytest.mark.parametrize("kind", list(ORACLE_CASES))
def test_oracle_reports_a_difference(kind, monkeypatch):
    monkeypatch.setenv("HYBRIDNET_DISABLE_JIT", "1")  # both twins eager: only the sabotage
    built = []

    def make(seed):
        built.append(seed)
        saboteur = len(built) == 2
        model = mlp(ln=True)
        model.register_buffer("count", hn.zeros(1))
        model.rewards = []
        o = optim.Adam(model.parameters(), lr=0.01)
        ctx = types.SimpleNamespace(model=model, opt=o, x=hn.randn(3),
                                    x64=hn.randn(3, dtype=hn.float64))

        def fn(t):
            if saboteur and kind == "arg mutated" and len(model.rewards) == 3:
                t.add_(1e-4)
            if saboteur and kind == "result value" and len(model.rewards) == 3:
                return t, t * (1.0 + 1e-4)
            if saboteur and kind == "replaced" and len(model.rewards) == 3:
                o.state[model[0].weight]["exp_avg"] = o.state[model[0].weight]["exp_avg"] * 1.0
            return (t * 1.0 if saboteur and kind == "identity" else t), t * 1.0

        def calls(f):
            for i in range(4):
                hand_grads(model.parameters())
                o.step()
                model.rewards.append(1.0)
                if saboteur and i == 2:
                    _sabotage(kind, ctx)
                yield call(ctx.x, grad=False)
        return Twin(fn, {"model": model, "opt": o, "x": ctx.x, "x64": ctx.x64}, calls)
    with pytest.raises(AssertionError, match=ORACLE_CASES[kind]):
        run_twins(f"sabotage/{kind}", make, keep=False)
