"""Adversarial regressions, third round: a traced function's result, and the state it
leaves behind, must equal what the same function gives when run eagerly.

Each test states the eager answer (or drives the scenario both ways) and fails where a
compiled call silently differs; the comment on each says what differs and the guessed
root cause. Cases that depend on environment variables read at import or compile time
(HYBRIDNET_KERNEL_BUDGET, HYBRIDNET_CACHE_DIR) run in a subprocess.
"""

import types
from collections import OrderedDict

import numpy as np
import pytest
from trace_helpers import run_twice_then as _run_twice_then
from trace_helpers import values as _vals

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn

# ---- results and arguments: containers and tensor classes ----------------------------


class _MyList(list):
    pass


def test_result_container_types_are_kept():
    # pytree.flatten records a dict as ("D", keys, specs) and any list subclass as "list",
    # and pytree._build rebuilds a plain dict / list: compiled calls return a plain dict
    # where eager returns an OrderedDict (and a list where eager returns a list subclass).
    cases = ((lambda x: OrderedDict(a=x * 2.0, b=x + 1.0), OrderedDict),
             (lambda x: _MyList([x * 2.0]), _MyList))
    for fn, kind in cases:
        traced = hn.trace(fn)
        with hn.no_grad():
            for i in range(3):
                assert type(traced(hn.ones(2))) is kind, (kind.__name__, i)


def test_tensor_class_of_an_argument_is_keyed():
    # The generated guard checks `x.__class__ is Parameter`, but the slow-path static key
    # (TracedFunction._key: shape, dtype, requires_grad) does not hold the class, so a plain
    # tensor with the same metadata is sent to the Parameter specialization and gets the
    # branch eager takes only for Parameters (isinstance baked in while tracing).
    def f(x):
        return x * 2.0 if isinstance(x, nn.Parameter) else x * 3.0

    traced = hn.trace(f)
    with hn.no_grad():
        p = nn.Parameter(hn.ones(2))
        traced(p)
        traced(p)
        q = hn.ones(2)
        q.requires_grad = True
        np.testing.assert_array_equal(_vals(traced(q)), [3.0, 3.0])


# ---- bound methods and traced modules ---------------------------------------------------


class _Cfg:
    def __init__(self):
        self.scale = 2.0

    def apply(self, x):
        return x * self.scale


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        return x * self.scale


def test_attributes_of_the_self_of_a_traced_bound_method_are_guarded():
    # hn.trace(obj.method): TracedFunction keys the bound method like a function (its
    # globals, closure, defaults via env_names/env_key) but never its __self__, and
    # self.module is None for a bound Module.forward: a changed self.scale stays baked in.
    cfg, model = _Cfg(), _Scaled()
    for owner, traced in ((cfg, hn.trace(cfg.apply)), (model, hn.trace(model.forward))):
        out = _run_twice_then(traced, hn.ones(2), lambda o=owner: setattr(o, "scale", 3.0))
        np.testing.assert_array_equal(out, [3.0, 3.0], err_msg=type(owner).__name__)


def test_attributes_set_on_a_traced_module_reach_the_module():
    # TracedModule forwards attribute reads (__getattr__) but not writes: `traced.scale =
    # 3.0` or `traced.training = False` sets an attribute of the wrapper, the module's
    # forward keeps reading its own (eager `model.scale = 3.0` changes the output), and
    # afterwards traced.scale / traced.training disagree with the module.
    model = _Scaled()
    traced = hn.trace(model)
    out = _run_twice_then(traced, hn.ones(2), lambda: setattr(traced, "scale", 3.0))
    np.testing.assert_array_equal(out, [3.0, 3.0])
    assert model.scale == 3.0
    traced.training = False
    assert model.training is False


# ---- value guards and errors raised by the kernel --------------------------------------


def test_kernel_error_on_a_path_eager_does_not_take_is_a_side_exit():
    # Executable.run runs the whole kernel before it checks the value guards: traced on a
    # call whose indices were in range (`i.max().item()` guard), a call whose max is 5
    # takes the other branch eagerly, but the compiled take raises IndexError first and the
    # call fails (wrapped in OpError) instead of taking a side exit.
    def f(w, i):
        if i.max().item() < 4:
            return F.embedding(i, w) * 2.0
        return w.sum() * 1.0

    traced = hn.trace(f)
    w = hn.arange(8).float().reshape(4, 2)
    with hn.no_grad():
        traced(w, hn.tensor([0, 1]))
        traced(w, hn.tensor([0, 1]))
        i = hn.tensor([5, 1])
        np.testing.assert_array_equal(_vals(traced(w, i)), _vals(f(w, i)))


def test_kernel_index_error_keeps_its_type_when_the_trace_writes_back():
    # Eager raises IndexError for an out-of-range embedding index; the plain compiled path
    # does too, but a trace with a write-back (or a guard, or a 0-d input) goes through
    # Executable.run, which wraps every non-Numba exception in OpError (a RuntimeError /
    # ValueError, not an IndexError): `except IndexError` no longer catches it.
    def f(w, i, acc):
        acc.add_(1.0)
        return F.embedding(i, w) * 2.0

    traced = hn.trace(f)
    w = hn.arange(8).float().reshape(4, 2)
    with hn.no_grad():
        with pytest.raises(IndexError):
            f(w, hn.tensor([5, 1]), hn.zeros(1))
        traced(w, hn.tensor([0, 1]), hn.zeros(1))
        traced(w, hn.tensor([0, 1]), hn.zeros(1))
        with pytest.raises(IndexError):
            traced(w, hn.tensor([5, 1]), hn.zeros(1))


# ---- what the function reaches by name ---------------------------------------------------


CONF = types.ModuleType("_adversarial3_conf")
CONF.scale = 2.0


def _module_attribute(x):
    return x * CONF.scale


def test_attribute_of_a_python_module_reached_by_name_is_guarded():
    # `import config; x * config.scale`: keys.env_value_key keys a ModuleType by identity
    # (_OPAQUE) and the guard checks `is`, so a changed module attribute stays baked in.
    try:
        out = _run_twice_then(hn.trace(_module_attribute), hn.ones(2),
                              lambda: setattr(CONF, "scale", 3.0))
        np.testing.assert_array_equal(out, [3.0, 3.0])
    finally:
        CONF.scale = 2.0


class _Inner(nn.Module):
    def forward(self, x):
        return x * 2.0


class _Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Inner()

    def forward(self, x):
        return self.model(x)


model = _Wrapper()  # a script's usual global name, also an attribute name in forward


def _calls_the_global_model(x):
    return model(x)


def test_global_named_like_an_attribute_its_forward_reads_does_not_recurse():
    # co_names of _Wrapper.forward holds the attribute name "model", which is also the
    # global bound to that very module: keys.env_key -> env_value_key(global model) ->
    # module_key(model) -> module_live_key -> env_key(forward) again, with `seen` reset,
    # until RecursionError. The traced module (and a function calling it) raise where
    # eager works.
    x = hn.ones(2)
    for traced in (hn.trace(model), hn.trace(_calls_the_global_model)):
        with hn.no_grad():
            for _ in range(3):
                np.testing.assert_array_equal(_vals(traced(x)), [2.0, 2.0])


def test_guard_checks_the_environment_the_call_started_with():
    # TracedFunction._compile_into builds the guard with make_guard, which computes the
    # expected env_key(fn, ...) *after* the recording call ran, while the specialization's
    # static key was computed before it. A function that changes what it reads by name
    # (here an entry of a closure dict) gets a guard expecting the post-call value: the
    # next call passes it and replays the trace made for the pre-call value (3.0 baked in,
    # eager gives 4.0, 5.0, ...; with a tensor entry, the old captured tensor is read).
    def scenario(traced):
        cfg = {"scale": 2.0}
        state = {"h": hn.zeros(2)}

        def f(x):
            cfg["scale"] += 1.0
            state["h"] = state["h"] * 0.5 + x
            return x * cfg["scale"], state["h"]

        g = hn.trace(f) if traced else f
        outs = []
        with hn.no_grad():
            for _ in range(4):
                outs.append(g(hn.ones(2)))  # (kept alive, as a training loop's log would)
        return [(_vals(a), _vals(b)) for a, b in outs]

    eager, traced = scenario(False), scenario(True)
    for i, ((ea, eb), (ta, tb)) in enumerate(zip(eager, traced)):
        np.testing.assert_array_equal(ta, ea, err_msg=f"call {i}")
        np.testing.assert_array_equal(tb, eb, err_msg=f"call {i}")


# ---- requires_grad changed inside the call ------------------------------------------------


def test_requires_grad_set_inside_on_a_new_tensor_is_kept():
    # A tensor made inside and marked with requires_grad_() is returned by eager with
    # requires_grad True; run.Trace._fresh wraps the kernel output without it.
    @hn.trace
    def f(x):
        y = hn.zeros(2)
        y.requires_grad_()
        return y, x * 2.0

    with hn.no_grad():
        for i in range(3):
            y, _ = f(hn.ones(2))
            assert y.requires_grad, i


def test_requires_grad_cleared_inside_on_an_argument_is_replayed():
    # x.requires_grad_(False) inside the function: eager leaves the argument with
    # requires_grad False; compiled calls do not replay the flag change (the guard keyed
    # requires_grad True on entry and nothing records the change), so it stays True.
    @hn.trace
    def f(x):
        x.requires_grad_(False)
        return x * 2.0

    with hn.no_grad():
        for i in range(3):
            a = hn.ones(2)
            a.requires_grad_(True)
            f(a)
            assert not a.requires_grad, i


_MAIN_SCRIPT = '''
import hybridnet as hn
SCALE = 2.0
def helper(x):
    return x * SCALE
@hn.trace
def f(x):
    return helper(x)
with hn.no_grad():
    x = hn.ones(2)
    f(x); f(x)
    SCALE = 3.0
    print(f(x).tolist())
'''


def test_helper_of_a_script_reading_a_global_is_guarded(tmp_path):
    # Code run as a script lives in module "__main__", which keys._user_defined took for
    # a private library module: its helpers were keyed by identity and SCALE stayed 2.0.
    import subprocess
    import sys
    script = tmp_path / "script.py"
    script.write_text(_MAIN_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip().splitlines()[-1] == "[3.0, 3.0]"


# ---- a tensor made inside the call from literals, then updated in place ---------------
# The trace bakes such a tensor in as a constant; it used to copy its buffer after the
# call, when in-place ops had already written their results into it, so the compiled
# call started from the first call's final value (an accumulator loop doubled up).


@pytest.mark.parametrize("name,body", [
    ("accumulator +=", lambda x: _accumulate(hn.zeros(3), x)),
    ("add_", lambda x: hn.zeros(3).add_(x)),
    ("mul_", lambda x: hn.ones(3).mul_(x).mul_(x)),
    ("sub_ of a literal list", lambda x: hn.tensor([1.0, 2.0, 3.0]).sub_(x)),
    ("zeros_like then +=", lambda x: _accumulate(hn.zeros_like(x), x * 2.0)),
])
def test_a_literal_updated_in_place_starts_from_its_built_value(name, body):
    traced = hn.trace(body)
    with hn.no_grad():
        for v in (1.0, 2.0, 3.0, 5.0):
            x = hn.full((3,), v)
            np.testing.assert_array_equal(traced(x).numpy(), body(x).numpy(), err_msg=name)
    assert traced.stats.compiled_calls >= 2


def _accumulate(s, x):
    for k in range(3):
        s += x * float(k)
    return s


def test_a_grad_built_from_zeros_like_and_accumulated_in_place():
    bias = hn.nn.Parameter(hn.zeros(2))

    def step(x):
        bias.grad = hn.zeros_like(bias)
        bias.grad.add_(x.sum())

    traced = hn.trace(step)
    with hn.no_grad():
        for v in (1.0, 2.0, 3.0):
            traced(hn.full((3,), v))
            np.testing.assert_array_equal(bias.grad.numpy(), [3.0 * v] * 2)
    assert traced.stats.compiled_calls >= 1
