"""Twin-state differential testing of `hn.trace` (used by tests/test_state_twins.py).

A scenario is a factory `make(seed) -> Twin(fn, state, calls)`: `fn` closes over one
twin's model, optimizer and tensors, `state` names everything to compare, and
`calls(f)` is a generator that applies the perturbations scripted before each call and
yields a `Call` (arguments and grad mode) for `f`, the callable being driven (the plain
`fn` for the eager twin, `hn.trace(fn)` for the traced one); it receives each call's
output back through `send`. `run_twins` builds both twins from one seed, drives them in
lockstep (reseeding the global RNG identically before each step) and, after every
perturbation and every call, compares outputs, which outputs are the very same object as
an argument or a state tensor, which state tensors the call replaced by new objects
(eager updates in place), the arguments and the whole state. The first difference fails
the test, naming the field. (A factory may also return the tuple (fn, state, calls).)

Every traced call's outcome (compiled or eager, and why) is kept in `RESULTS`;
`format_summary()` prints the fraction that ran compiled and a tally of eager reasons
(tests/conftest.py prints it after a test session that ran twin tests;
`python tests/twins.py --summary` runs the twin tests and prints it).
"""

import math
import re
import sys
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn, optim
from hybridnet.nn import Module
from hybridnet.optim import Optimizer

TOLERANCE = {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float64): (1e-9, 1e-12)}
FLOAT_TOL = (1e-5, 1e-6)  # plain Python floats (computed from float32 results)
MAX_DIFFS = 8

RESULTS = []  # one record per run_twins call: name, per-call outcomes, ok


@dataclass
class Call:
    """One call of the scenario's function: positional and keyword arguments, grad mode."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    grad: bool = True


def call(*args, grad=True, **kwargs) -> Call:
    """`yield call(x, y, grad=False)` in a scenario's call generator."""
    return Call(args, kwargs, grad)


@dataclass
class Twin:
    """What a scenario factory returns for one twin."""

    fn: object
    state: dict
    calls: object  # calls(f) -> generator of Call, sent each call's output


class lazy:  # noqa: N801 - reads as a marker in state tables
    """A state entry read at comparison time (e.g. a global that may be rebound)."""

    def __init__(self, get):
        self.get = get


# ---- comparison -------------------------------------------------------------------------


def _values(t):
    return np.array(t.detach().numpy(), copy=True)


def _compare_tensor(a, b, path, diffs):
    if not isinstance(a, hn.Tensor) or not isinstance(b, hn.Tensor):
        diffs.append((path, "type", type(a).__name__, type(b).__name__))
        return
    for what, get in (("class", lambda t: type(t).__name__), ("shape", lambda t: t.shape),
                      ("dtype", lambda t: t.dtype), ("requires_grad", lambda t: t.requires_grad),
                      ("is_leaf", lambda t: t.is_leaf)):
        va, vb = get(a), get(b)
        if va != vb:
            diffs.append((path, what, va, vb))
            if what in ("shape", "dtype"):
                return
    va, vb = _values(a), _values(b)
    if va.dtype.kind == "f":
        rtol, atol = TOLERANCE.get(va.dtype, (0.0, 0.0))
        if not np.allclose(va, vb, rtol=rtol, atol=atol, equal_nan=True):
            err = np.nanmax(np.abs(va.astype(np.float64) - vb)) if va.size else 0.0
            diffs.append((path, f"values (max abs diff {err:.3g})", _show(va), _show(vb)))
    elif not np.array_equal(va, vb):
        diffs.append((path, "values", _show(va), _show(vb)))
    ga, gb = a.grad, b.grad
    if (ga is None) != (gb is None):
        diffs.append((path, ".grad", _grad_desc(ga), _grad_desc(gb)))
    elif ga is not None:
        _compare_tensor(ga, gb, path + ".grad", diffs)


def _grad_desc(g):
    return "None" if g is None else f"a tensor {list(g.shape)}"


def _brief(seq):
    if all(isinstance(x, (str, int, float)) for x in seq):
        text = repr(list(seq))
        return f"{len(seq)} {text[:300]}"
    return len(seq)


def _show(arr):
    return np.array2string(np.asarray(arr), precision=6, threshold=12, edgeitems=3)


def _compare_module(a, b, path, diffs):
    modes_a = [(n, m.training) for n, m in a.named_modules()]
    modes_b = [(n, m.training) for n, m in b.named_modules()]
    if modes_a != modes_b:
        diffs.append((path, "training flags", modes_a, modes_b))
    for kind in ("named_parameters", "named_buffers"):
        ta, tb = dict(getattr(a, kind)()), dict(getattr(b, kind)())
        if list(ta) != list(tb):
            diffs.append((path, kind, list(ta), list(tb)))
            continue
        for name in ta:
            _compare_tensor(ta[name], tb[name], f"{path}.{name}", diffs)
    for (name, ma), (_, mb) in zip(a.named_modules(), b.named_modules()):
        attrs_a, attrs_b = _plain_attrs(ma), _plain_attrs(mb)
        prefix = f"{path}.{name}" if name else path
        if list(attrs_a) != list(attrs_b):
            diffs.append((prefix, "attributes", list(attrs_a), list(attrs_b)))
            continue
        for key in attrs_a:
            compare(attrs_a[key], attrs_b[key], f"{prefix}.{key}", diffs)


_PLAIN = (list, dict, tuple, int, float, str, bool, type(None))


def _plain_attrs(m):
    return {k: v for k, v in vars(m).items()
            if not k.startswith("_") and k != "training" and isinstance(v, _PLAIN)}


def _compare_optimizer(a, b, path, diffs):
    sa, sb = a.state_dict(), b.state_dict()
    compare(sa["param_groups"], sb["param_groups"], f"{path}.param_groups", diffs, exact=True)
    compare(sa["state"], sb["state"], f"{path}.state", diffs, exact=True)


def compare(a, b, path, diffs, exact=False):
    """Append (path, field, eager, traced) for every difference between a and b."""
    if isinstance(a, lazy):
        a, b = a.get(), b.get()
    if isinstance(a, hn.Tensor) or isinstance(b, hn.Tensor):
        _compare_tensor(a, b, path, diffs)
    elif type(a) is not type(b):
        diffs.append((path, "type", type(a).__name__, type(b).__name__))
    elif isinstance(a, Module):
        _compare_module(a, b, path, diffs)
    elif isinstance(a, Optimizer):
        _compare_optimizer(a, b, path, diffs)
    elif isinstance(a, dict):
        if list(a) != list(b):
            diffs.append((path, "keys", list(a), list(b)))
            return
        for k in a:
            compare(a[k], b[k], f"{path}[{k!r}]", diffs, exact)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            diffs.append((path, "length", _brief(a), _brief(b)))
            return
        for k, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}[{k}]", diffs, exact)
    elif isinstance(a, float) and not exact:
        if not (math.isclose(a, b, rel_tol=FLOAT_TOL[0], abs_tol=FLOAT_TOL[1])
                or (math.isnan(a) and math.isnan(b))):
            diffs.append((path, "value", a, b))
    elif isinstance(a, float):
        if not (a == b or (math.isnan(a) and math.isnan(b))):
            diffs.append((path, "value", a, b))
    elif a != b:
        diffs.append((path, "value", a, b))


# ---- object identity of outputs ---------------------------------------------------------


def labelled(args, state):
    """(label, tensor) for every tensor reachable from the arguments and the state:
    parameters, buffers, grads, optimizer state, closure tensors."""
    found = []

    def visit(obj, label):
        if isinstance(obj, lazy):
            obj = obj.get()
        if isinstance(obj, hn.Tensor):
            found.append((label, obj))
            if obj.grad is not None:
                found.append((label + ".grad", obj.grad))
        elif isinstance(obj, Module):
            for n, t in list(obj.named_parameters()) + list(obj.named_buffers()):
                visit(t, f"{label}.{n}")
        elif isinstance(obj, Optimizer):
            for gi, group in enumerate(obj.param_groups):
                for pi, p in enumerate(group["params"]):
                    for key, v in obj.state.get(p, {}).items():
                        visit(v, f"{label}.state[{gi}][{pi}][{key!r}]")
        else:
            _visit_items(obj, label, visit)

    visit(args, "args")
    visit(state, "state")
    return found


def _visit_items(obj, label, visit):
    """visit(item, label) for the items of a dict, list or tuple (nothing otherwise)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            visit(v, f"{label}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for k, v in enumerate(obj):
            visit(v, f"{label}[{k}]")


def replaced(before, after):
    """Labels whose tensor is another object after the call than before it (eager updates
    parameters, buffers and optimizer state in place: the objects stay)."""
    now = dict(after)
    return sorted(label for label, obj in before if label in now and now[label] is not obj)


def identity(out, args, state):
    """For each tensor in `out`: which argument/state tensor (or earlier output) it is."""
    names, seen, sig = {}, {}, []
    for label, obj in labelled(args, state):
        names.setdefault(id(obj), label)

    def visit(obj, label):
        if isinstance(obj, hn.Tensor):
            sig.append((label, names.get(id(obj)) or seen.get(id(obj)) or "new"))
            seen.setdefault(id(obj), label)
        else:
            _visit_items(obj, label, visit)

    visit(out, "out")
    return sig


# ---- driving the twins ------------------------------------------------------------------


class TwinMismatch(AssertionError):
    """The traced twin's state or result differs from the eager twin's."""


def _seed(seed, i, phase):
    return (seed * 1_000_003 + i * 7919 + phase) % (2 ** 31)


def _advance(gen, sent, seed, i):
    hn.manual_seed(_seed(seed, i, 1))
    try:
        return gen.send(sent)
    except StopIteration:
        return None


def _grad_mode(on):
    return hn.enable_grad() if on else hn.no_grad()


def _as_twin(made):
    return made if isinstance(made, Twin) else Twin(*made)


def _outcome(stats, compiled_before):
    """'compiled', or the reason this call ran eagerly (from this call's events)."""
    if stats.compiled_calls > compiled_before:
        return "compiled"
    events = [e for e in stats.events if e.get("call") == stats.calls]
    for e in events:
        if e["kind"] not in ("compile", "recompile", "kernel_reuse"):
            return f"{e['kind']}: {e['detail']}"[:160]
    if events:
        return "recording a new specialization"
    return "eager: a specialization that already fell back"


def run_twins(name, make, seed=0, keep=True, **trace_kwargs):
    """Drive an eager and a traced twin of `make`; raise TwinMismatch at the first
    difference. Returns the traced function (for extra checks on its stats). `keep`:
    keep the calls' outcomes for the summary."""
    hn.manual_seed(seed)
    eager = _as_twin(make(seed))
    hn.manual_seed(seed)
    twin = _as_twin(make(seed))
    traced = hn.trace(twin.fn, **trace_kwargs)
    record = {"name": name, "outcomes": [], "ok": False}
    if keep:
        RESULTS.append(record)
    gen_e, gen_t = eager.calls(eager.fn), twin.calls(traced)
    out_e = out_t = None
    i = 0
    while True:
        call_e = _advance(gen_e, out_e, seed, i)
        try:
            call_t = _advance(gen_t, out_t, seed, i)
        except Exception as exc:
            raise TwinMismatch(f"{name}: the traced twin's script failed before call {i} "
                               f"(the eager twin's did not): {type(exc).__name__}: {exc}"
                               ) from exc
        when = f"after the perturbations before call {i}" if call_e else "at the end"
        _check(name, when, [("state", eager.state, twin.state)], traced)
        if call_e is None:
            break
        args_e, args_t = (call_e.args, call_e.kwargs), (call_t.args, call_t.kwargs)
        held_e, held_t = labelled(args_e, eager.state), labelled(args_t, twin.state)
        hn.manual_seed(_seed(seed, i, 2))
        with _grad_mode(call_e.grad):
            out_e = eager.fn(*call_e.args, **call_e.kwargs)
        hn.manual_seed(_seed(seed, i, 2))
        before = traced.stats.compiled_calls
        try:
            with _grad_mode(call_t.grad):
                out_t = traced(*call_t.args, **call_t.kwargs)
        except Exception as exc:
            record["outcomes"].append("raised")
            raise TwinMismatch(f"{name}: traced call {i} raised {type(exc).__name__}: {exc} "
                               f"(the eager call did not)") from exc
        outcome = _outcome(traced.stats, before)
        record["outcomes"].append(outcome)
        _check(name, f"after call {i} (grad={'on' if call_e.grad else 'off'}, traced call "
                     f"ran {'compiled' if outcome == 'compiled' else 'eagerly'})", [
            ("result", out_e, out_t),
            ("result identity", identity(out_e, args_e, eager.state),
             identity(out_t, args_t, twin.state)),
            ("tensors replaced by new objects", replaced(held_e, labelled(args_e, eager.state)),
             replaced(held_t, labelled(args_t, twin.state))),
            ("args", args_e, args_t),
            ("state", eager.state, twin.state)], traced)
        i += 1
    record["ok"] = True
    return traced


def _check(name, when, pairs, traced):
    diffs = []
    for label, a, b in pairs:
        compare(a, b, label, diffs)
    if not diffs:
        return
    lines = [f"{name}: {when}: the traced twin differs from the eager twin "
             f"({len(diffs)} difference(s)); first: {_fmt(diffs[0])}"]
    lines += ["  " + _fmt(d) for d in diffs[1:MAX_DIFFS]]
    if len(diffs) > MAX_DIFFS:
        lines.append(f"  ... and {len(diffs) - MAX_DIFFS} more")
    lines.append(f"  traced stats: {traced.stats}")
    for e in traced.stats.events[-4:]:
        lines.append(f"  event: {e}")
    raise TwinMismatch("\n".join(lines))


def _fmt(d):
    path, what, a, b = d
    return f"{path} {what}: eager={a!s} traced={b!s}"


# ---- building blocks shared by the scenarios ---------------------------------------


def mlp(d_in=4, hidden=8, d_out=3, ln=False, dropout=None, dtype=None):
    layers = [nn.Linear(d_in, hidden, dtype=dtype)]
    if ln:
        layers.append(nn.LayerNorm(hidden, dtype=dtype))
    if dropout is not None:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Tanh(), nn.Linear(hidden, d_out, dtype=dtype)]
    return nn.Sequential(*layers)


OPTS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_nesterov": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "sgd_weight_decay": lambda ps: optim.SGD(ps, lr=0.1, weight_decay=0.05),
    "sgd_dampening_wd": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.8, dampening=0.1,
                                             weight_decay=0.01),
    "adam": lambda ps: optim.Adam(ps, lr=0.01),
    "adam_amsgrad_wd": lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.01, amsgrad=True),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "sgd_two_groups": lambda ps: optim.SGD([{"params": ps[:2], "lr": 0.1},
                                            {"params": ps[2:]}], lr=0.01, momentum=0.9),
}


def batch(b=5, d_in=4, d_out=3, loss="ce", dtype=None):
    x = hn.randn(b, d_in, dtype=dtype)
    y = hn.randint(0, d_out, (b,)) if loss == "ce" else hn.randn(b, d_out, dtype=dtype)
    return x, y


def hand_grads(params):
    for p in params:
        if p.requires_grad:
            p.grad = hn.randn(*p.shape, dtype=p.dtype)


# ---- random programs (for the hypothesis test) ----------------------------------------


@dataclass(frozen=True)
class Program:
    d_in: int
    hidden: int
    d_out: int
    layernorm: bool
    opt: tuple  # None or (class name, kwargs as sorted items)
    zero: str  # "none" | "start" | "end": where a grad-mode step calls opt.zero_grad()
    step_no_grad: bool  # a no_grad call runs opt.step() on the grads that are there
    mutate_c: bool  # the function updates the closure tensor c in place
    calls: tuple  # (grad mode, batch size, perturbations before the call)


SGD_KW = st.fixed_dictionaries({"lr": st.sampled_from([0.01, 0.1]),
                                "momentum": st.sampled_from([0.0, 0.9]),
                                "weight_decay": st.sampled_from([0.0, 0.01])})
ADAM_KW = st.fixed_dictionaries({"lr": st.sampled_from([1e-3, 1e-2]),
                                 "betas": st.sampled_from([(0.9, 0.999), (0.8, 0.99)]),
                                 "weight_decay": st.sampled_from([0.0, 0.01]),
                                 "amsgrad": st.booleans()})
PERTURB = st.one_of(
    st.tuples(st.just("lr"), st.sampled_from([0.0, 0.003, 0.05])),
    st.tuples(st.sampled_from(["freeze", "unfreeze", "grad_none"]), st.integers(0, 3)),
    st.tuples(st.sampled_from(["hand_grads", "train", "eval"])),
    st.tuples(st.just("bump_c"), st.sampled_from([-1.0, 0.5])))


@st.composite
def programs(draw):
    kind = draw(st.sampled_from([None, "SGD", "Adam", "AdamW"]))
    opt = None
    if kind is not None:
        kw = draw(SGD_KW if kind == "SGD" else ADAM_KW)
        if kind == "SGD" and kw["momentum"]:
            kw["nesterov"] = draw(st.booleans())
        opt = (kind, tuple(sorted(kw.items())))
    calls = draw(st.lists(st.tuples(st.booleans(), st.sampled_from([1, 3, 4]),
                                    st.lists(PERTURB, max_size=2).map(tuple)),
                          min_size=3, max_size=6))
    return Program(draw(st.integers(2, 5)), draw(st.integers(3, 6)), draw(st.integers(1, 4)),
                   draw(st.booleans()), opt, draw(st.sampled_from(["none", "start", "end"])),
                   draw(st.booleans()), draw(st.booleans()), tuple(calls))


def random_program(seed, prog):
    model = mlp(prog.d_in, prog.hidden, prog.d_out, ln=prog.layernorm, dropout=0.0)
    params = list(model.parameters())
    opt = getattr(optim, prog.opt[0])(params, **dict(prog.opt[1])) if prog.opt else None
    c = hn.randn(prog.d_out)

    def fn(x, y):
        out = model(x) + c
        result = out
        if opt is not None and hn.is_grad_enabled():
            if prog.zero == "start":
                opt.zero_grad()
            loss = F.mse_loss(out, y)
            loss.backward()
            opt.step()
            if prog.zero == "end":
                opt.zero_grad()
            result = loss.detach()
        elif opt is not None and prog.step_no_grad:
            opt.step()
        if prog.mutate_c:
            with hn.no_grad():
                c.mul_(0.5).add_(1.0)
        return result

    def perturb(p):
        first = list(model[0].parameters())  # the last layer always stays trainable
        if p[0] == "lr" and opt is not None:
            for g in opt.param_groups:
                g["lr"] = p[1]
        elif p[0] in ("freeze", "unfreeze"):
            first[p[1] % len(first)].requires_grad_(p[0] == "unfreeze")
        elif p[0] == "grad_none":
            params[p[1] % len(params)].grad = None
        elif p[0] == "hand_grads":
            hand_grads(params)
        elif p[0] in ("train", "eval"):
            model.train(p[0] == "train")
        elif p[0] == "bump_c":
            c.add_(p[1])

    def calls(f):
        for grad, size, perturbations in prog.calls:
            for p in perturbations:
                perturb(p)
            yield call(hn.randn(size, prog.d_in), hn.randn(size, prog.d_out), grad=grad)
    return Twin(fn, {"model": model, "opt": opt, "c": c}, calls)


# ---- summary ----------------------------------------------------------------------------


def _reason_key(reason):
    return re.sub(r"\[[^\]]*\]", "[..]", reason)


def format_summary(results=None) -> str:
    """Compiled fraction per scenario and overall, and a tally of eager reasons."""
    results = RESULTS if results is None else results
    if not results:
        return "twin-state summary: no twin scenarios ran"
    rows, groups = [], {}
    for rec in results:
        key = rec["name"].split("[")[0] if rec["name"].startswith("random") else rec["name"]
        groups.setdefault(key, []).append(rec)
    reasons, total, compiled = Counter(), 0, 0
    for key, recs in groups.items():
        outcomes = [o for r in recs for o in r["outcomes"]]
        n_comp = sum(o == "compiled" for o in outcomes)
        total, compiled = total + len(outcomes), compiled + n_comp
        reasons.update(_reason_key(o) for o in outcomes if o != "compiled")
        failed = sum(not r["ok"] for r in recs)
        marks = "".join("C" if o == "compiled" else "e" for o in outcomes)
        label = f"{key} ({len(recs)} runs)" if len(recs) > 1 else key
        status = f"FAIL x{failed}" if failed > 1 else ("FAIL" if failed else "ok")
        rows.append(f"  {label:<50} {status:<8} {n_comp:>3}/{len(outcomes):<3} "
                    f"{marks if len(recs) == 1 else ''}")
    frac = compiled / total if total else 0.0
    out = ["hn.trace twin-state summary (C = ran compiled, e = ran eagerly)",
           f"traced calls: {total}, compiled: {compiled} ({frac:.0%}), eager: "
           f"{total - compiled}"]
    out += rows
    out.append("eager reasons:")
    out += [f"  {n:>5}  {r}" for r, n in reasons.most_common()]
    return "\n".join(out)


if __name__ == "__main__":
    if "--summary" not in sys.argv[1:]:
        print("usage: python tests/twins.py --summary   (runs tests/test_state_twins.py; "
              "tests/conftest.py prints the compiled/eager summary at the end)")
        sys.exit(2)
    import os
    import subprocess
    test_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_state_twins.py")
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              test_file]))
