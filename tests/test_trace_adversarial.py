"""Adversarial regressions: a traced function's result, and the state it leaves behind,
must equal what the same function gives when run eagerly.

Each test drives the same scenario eagerly and traced (or states the eager answer) and
fails where a compiled call silently differs; the comment on each says what differs.
"""

import functools
import types

import numpy as np
from trace_helpers import values as _vals

import hybridnet as hn
from hybridnet import nn, optim


def _both(scenario):
    """(eager, traced) outcomes of `scenario(wrap)`, wrap being identity or hn.trace."""
    return scenario(lambda f: f), scenario(hn.trace)


def _assert_same(eager, traced):
    assert len(eager) == len(traced)
    for i, (e, t) in enumerate(zip(eager, traced)):
        np.testing.assert_allclose(t, e, rtol=1e-6, atol=1e-7, err_msg=f"item {i}")


# ---- values read from arguments or other traced functions are baked in ------------------


def test_hn_tensor_of_an_argument_is_not_a_constant():
    # hn.tensor(x) copies x._data into a "literal" (creation._infer_np/_finish), so the
    # first call's argument values are baked into the trace: later calls return them.
    def f(x):
        return hn.tensor(x) * 2.0

    traced = hn.trace(f)
    with hn.no_grad():
        for i in range(4):
            x = hn.full((3,), float(i))
            np.testing.assert_array_equal(_vals(traced(x)), _vals(f(x)))


def test_result_of_a_compiled_traced_helper_is_not_frozen():
    # A compiled helper's fast runner once wrapped its result without telling the trace, so
    # the outer recording sees a tensor from nowhere and captures it (weakref) as an
    # input: while the caller keeps the first result alive, every compiled outer call
    # returns that same stale tensor.
    inner = hn.trace(lambda x: x * 2.0)

    def outer_fn(x):
        y = inner(x)
        return y, y + 1.0

    outer = hn.trace(outer_fn)
    kept = []
    with hn.no_grad():
        for _ in range(3):
            inner(hn.ones(2))
        for i in range(4):
            x = hn.full((2,), float(i))
            y, z = outer(x)
            kept.append((y, z))
            np.testing.assert_array_equal(_vals(y), [2.0 * i] * 2)
            np.testing.assert_array_equal(_vals(z), [2.0 * i + 1.0] * 2)


def test_optimizer_step_in_a_traced_helper_is_not_dropped():
    # The helper's compiled call writes parameters back directly, invisible to the outer
    # recording, so the outer graph has no update and compiled outer calls skip the step.
    def scenario(wrap):
        p = hn.zeros(2)
        opt = optim.SGD([p], lr=1.0)
        step = wrap(lambda: opt.step())

        def outer_fn(x):
            step()
            return x * 2.0

        outer = wrap(outer_fn)
        with hn.no_grad():
            for i in range(6):
                p.grad = hn.ones(2)
                if i < 3:
                    step()
                else:
                    outer(hn.ones(1))
        return [_vals(p)]

    _assert_same(*_both(scenario))  # eager: p == -6; traced: -4


# ---- a tensor reached two ways is read one way ----------------------------------------


def test_two_parameters_sharing_one_grad_tensor_then_distinct_grads():
    # build._Builder.grad_of maps id(grad tensor) -> one owner: traced while p1.grad is
    # p2.grad, the compiled step reads p2.grad for both parameters from then on.
    def scenario(wrap):
        p1, p2 = hn.zeros(3), hn.zeros(3)
        opt = optim.SGD([p1, p2], lr=1.0)
        step = wrap(lambda: opt.step())
        with hn.no_grad():
            for i in range(5):
                if i < 3:
                    g = hn.ones(3)
                    p1.grad, p2.grad = g, g
                else:
                    p1.grad, p2.grad = hn.full((3,), 10.0), hn.full((3,), 100.0)
                step()
        return [_vals(p1), _vals(p2)]

    _assert_same(*_both(scenario))  # eager p1 == -23; traced p1 == -203


def test_argument_that_was_a_grad_when_traced():
    # The step reads p.grad, which was the argument tensor while tracing: the graph reads
    # the argument instead of p.grad, and nothing checks that p.grad is still it.
    def scenario(wrap):
        p = hn.zeros(2)
        opt = optim.SGD([p], lr=1.0)

        def f(g):
            opt.step()
            return g * 1.0

        traced = wrap(f)
        with hn.no_grad():
            for i in range(5):
                g = hn.ones(2)
                p.grad = g if i < 3 else hn.full((2,), 10.0)
                traced(g)
        return [_vals(p)]

    _assert_same(*_both(scenario))


def test_closure_tensor_that_was_a_grad_when_traced():
    # The closure tensor G was also p.grad while tracing, so it is read through p.grad
    # (Source "grad"); once p.grad is another tensor the compiled call multiplies by it.
    def scenario(wrap):
        p = hn.zeros(2)
        opt = optim.SGD([p], lr=1.0)
        G = hn.ones(2)

        def f(x):
            opt.step()
            return x * G

        traced = wrap(f)
        outs = []
        with hn.no_grad():
            for i in range(5):
                p.grad = G if i < 3 else hn.full((2,), 10.0)
                outs.append(_vals(traced(hn.ones(2))))
        return outs + [_vals(p)]

    _assert_same(*_both(scenario))


# ---- optimizer state and settings --------------------------------------------------------


def test_parameter_list_of_a_group_mutated_in_place():
    # group["params"].append(p2) bumps no version: the compiled step never updates p2.
    def scenario(wrap):
        p1, p2 = hn.zeros(3), hn.zeros(3)
        opt = optim.SGD([p1], lr=1.0)
        step = wrap(lambda: opt.step())
        with hn.no_grad():
            for i in range(5):
                p1.grad, p2.grad = hn.ones(3), hn.ones(3)
                if i == 3:
                    opt.param_groups[0]["params"].append(p2)
                step()
        return [_vals(p1), _vals(p2)]

    _assert_same(*_both(scenario))


def test_betas_list_of_a_group_mutated_in_place():
    # betas given as a list are not runtime inputs (tracked.hyper only takes tuples) but
    # baked constants, and group["betas"][0] = 0.1 bumps no version: the old beta1 stays.
    def scenario(wrap):
        p = hn.ones(3)
        opt = optim.Adam([p], lr=0.1)
        opt.param_groups[0]["betas"] = [0.5, 0.9]  # (Adam's constructor makes a tuple)
        step = wrap(lambda: opt.step())
        with hn.no_grad():
            for i in range(6):
                p.grad = hn.full((3,), 1.0 + i)
                if i == 4:
                    opt.param_groups[0]["betas"][0] = 0.1
                step()
        return [_vals(p), _vals(opt.state[p]["exp_avg"])]

    _assert_same(*_both(scenario))


def test_param_group_updated_with_in_place_or_operator():
    # `group |= {...}` is dict.__ior__, which tracked.ParamGroup does not override: no
    # version bump, so the compiled step keeps the old `maximize`.
    def scenario(wrap):
        p = hn.zeros(2)
        opt = optim.SGD([p], lr=1.0)
        step = wrap(lambda: opt.step())
        with hn.no_grad():
            for i in range(5):
                p.grad = hn.ones(2)
                if i == 3:
                    group = opt.param_groups[0]
                    group |= {"maximize": True}
                step()
        return [_vals(p)]

    _assert_same(*_both(scenario))


def test_learning_rate_read_through_group_items_is_guarded():
    # Reads through dict methods that ParamGroup does not hook (items(), dict(group)) are
    # not recorded, and a new float lr bumps no version: the old lr stays baked in.
    def scenario(wrap):
        p = hn.zeros(2)
        opt = optim.SGD([p], lr=0.1)

        def f(x):
            lr = dict(opt.param_groups[0].items())["lr"]
            return x * lr

        traced = wrap(f)
        outs = []
        with hn.no_grad():
            for lr in (0.1, 0.1, 0.5, 0.5):
                opt.param_groups[0]["lr"] = lr
                outs.append(_vals(traced(hn.ones(2))))
        return outs

    _assert_same(*_both(scenario))


# ---- what the function reaches by name ------------------------------------------------


ACT = hn.relu
PARTIAL = functools.partial(hn.clamp, min=0.0)
SCALE = 2.0
NP_SCALE = np.float32(2.0)
NP_INDEX = np.array([0, 1])


class _ClassConfig:
    scale = 2.0


class _Slotted:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale


class _CallableConfig:
    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x):
        return x * self.scale


SLOTTED = _Slotted(2.0)
CALLABLE = _CallableConfig(2.0)


def _use_act(x):
    return ACT(x)


def _use_partial(x):
    return PARTIAL(x)


def test_global_function_from_another_module_rebound():
    # keys.env_value_key returns None for functions defined in other modules (and for
    # partials, builtins, methods, classes): the guard rejects the call, but the slow-path
    # key is unchanged and sends it to the old specialization (docs: "by identity").
    global ACT, PARTIAL
    x = hn.tensor([-1.0, 0.5, 2.0])
    try:
        for fn, rebind in ((_use_act, lambda: globals().update(ACT=hn.tanh)),
                           (_use_partial,
                            lambda: globals().update(PARTIAL=functools.partial(hn.clamp,
                                                                               min=1.0)))):
            ACT, PARTIAL = hn.relu, functools.partial(hn.clamp, min=0.0)
            traced = hn.trace(fn)
            with hn.no_grad():
                traced(x)
                traced(x)
                rebind()
                np.testing.assert_array_equal(_vals(traced(x)), _vals(fn(x)))
    finally:
        ACT, PARTIAL = hn.relu, functools.partial(hn.clamp, min=0.0)


def _scale_in_comprehension(x):
    return [t * SCALE for t in (x,)][0]


def _scale_in_generator(x):
    return sum(t * SCALE for t in (x,))


def _scale_in_nested_def(x):
    def inner(t):
        return t * SCALE
    return inner(x)


def test_global_read_inside_a_comprehension_or_nested_function_is_guarded():
    # keys.env_names reads only the traced function's own code.co_names; names used in a
    # comprehension, generator expression, lambda or nested def (their own code objects
    # on Python 3.11) are not keyed, so rebinding SCALE keeps the old constant.
    global SCALE
    x = hn.ones(2)
    try:
        for fn in (_scale_in_comprehension, _scale_in_generator, _scale_in_nested_def):
            SCALE = 2.0
            traced = hn.trace(fn)
            with hn.no_grad():
                traced(x)
                traced(x)
                SCALE = 3.0
                np.testing.assert_array_equal(_vals(traced(x)), [3.0, 3.0], err_msg=fn.__name__)
    finally:
        SCALE = 2.0


class _ScaleByGlobal(nn.Module):
    def forward(self, x):
        return x * SCALE


class _Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _ScaleByGlobal()

    def forward(self, x):
        return self.inner(x)


def test_global_read_by_a_submodule_forward_is_guarded():
    # Only type(module).forward's environment is keyed: a submodule whose forward reads a
    # global (here through a wrapper and through nn.Sequential) keeps the old value.
    global SCALE
    x = hn.ones(2)
    try:
        for model in (_Wrapper(), nn.Sequential(_ScaleByGlobal())):
            SCALE = 2.0
            traced = hn.trace(model)
            with hn.no_grad():
                traced(x)
                traced(x)
                SCALE = 3.0
                np.testing.assert_array_equal(_vals(traced(x)), [3.0, 3.0],
                                              err_msg=type(model).__name__)
    finally:
        SCALE = 2.0


def _np_scale(x):
    return x * NP_SCALE


def _np_index(x):
    return x[NP_INDEX]


def test_numpy_globals_are_guarded():
    # NumPy scalars and arrays have no __dict__: keys.env_value_key returns None for them,
    # so a rebound NumPy constant or index array is never noticed.
    global NP_SCALE, NP_INDEX
    x = hn.tensor([0.0, 1.0, 2.0, 3.0])
    try:
        with hn.no_grad():
            traced = hn.trace(_np_scale)
            traced(x)
            traced(x)
            NP_SCALE = np.float32(3.0)
            np.testing.assert_array_equal(_vals(traced(x)), _vals(x * 3.0))
            traced = hn.trace(_np_index)
            traced(x)
            traced(x)
            NP_INDEX = np.array([2, 3])
            np.testing.assert_array_equal(_vals(traced(x)), [2.0, 3.0])
    finally:
        NP_SCALE, NP_INDEX = np.float32(2.0), np.array([0, 1])


def _class_scale(x):
    return x * _ClassConfig.scale


def _slotted_scale(x):
    return x * SLOTTED.scale


def _callable_scale(x):
    return CALLABLE(x)


def test_attributes_of_classes_slotted_and_callable_objects_are_guarded():
    # Classes are opaque (identity only), objects without __dict__ and callable objects
    # are not keyed at all (keys.env_value_key): their changed attributes stay baked in.
    x = hn.ones(2)
    holders = ((_class_scale, _ClassConfig), (_slotted_scale, SLOTTED),
               (_callable_scale, CALLABLE))
    try:
        for fn, holder in holders:
            holder.scale = 2.0
            traced = hn.trace(fn)
            with hn.no_grad():
                traced(x)
                traced(x)
                holder.scale = 3.0
                np.testing.assert_array_equal(_vals(traced(x)), [3.0, 3.0], err_msg=fn.__name__)
    finally:
        for _, holder in holders:
            holder.scale = 2.0


# ---- module attributes -----------------------------------------------------------------


class _PrivateList(nn.Module):
    def __init__(self):
        super().__init__()
        self._scales = [2.0]

    def forward(self, x):
        return x * self._scales[0]


class _PlainConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = types.SimpleNamespace(scale=2.0)

    def forward(self, x):
        return x * self.cfg.scale


def test_private_list_attribute_read_by_forward_is_guarded():
    # reads._recording_getattribute skips names starting with "_", and module_key keys
    # list attributes by identity only: an in-place change of self._scales is unseen.
    model = _PrivateList()
    traced = hn.trace(model)
    x = hn.ones(2)
    with hn.no_grad():
        traced(x)
        traced(x)
        model._scales[0] = 3.0
        np.testing.assert_array_equal(_vals(traced(x)), _vals(model(x)))


def test_attribute_of_a_plain_object_held_by_a_module_is_guarded():
    # module_key caches the module's attribute key until STRUCTURE_VERSION changes (and
    # the guard checks only that counter); m.cfg.scale = 3.0 sets no module attribute.
    model = _PlainConfig()
    traced = hn.trace(model)
    x = hn.ones(2)
    with hn.no_grad():
        traced(x)
        traced(x)
        model.cfg.scale = 3.0
        np.testing.assert_array_equal(_vals(traced(x)), _vals(model(x)))


# ---- value guards ------------------------------------------------------------------------


def test_item_guard_tells_signed_zeros_apart():
    # runtime.executor._guard_holds compares with ==, so -0.0 (seen while tracing, baked
    # in as a constant) accepts 0.0: 1 / x.item() gives -inf where eager gives +inf.
    def f(x, y):
        return y / x.item()

    traced = hn.trace(f)
    y = hn.ones(2)
    with hn.no_grad():
        traced(hn.tensor([-0.0]), y)
        traced(hn.tensor([-0.0]), y)
        x = hn.tensor([0.0])
        np.testing.assert_array_equal(_vals(traced(x, y)), _vals(f(x, y)))


# ---- identity and memory of what a compiled call returns or assigns ---------------------


def test_returned_grad_assigned_inside_is_that_grad():
    # run.Trace._run gives .grad a fresh copy and the result another array: eager returns
    # the very tensor it stored in p.grad.
    p = hn.zeros(3)

    @hn.trace
    def f(x):
        g = x * 2.0
        p.grad = g
        return g

    with hn.no_grad():
        for _ in range(3):
            out = f(hn.ones(3))
            assert out is p.grad


def test_same_computed_tensor_returned_twice_is_one_object():
    # Each result leaf is wrapped on its own (and copied by runtime.pipeline.aliased_results).
    @hn.trace
    def f(x):
        y = x * 2.0
        return y, y

    with hn.no_grad():
        for _ in range(3):
            a, b = f(hn.ones(2))
            assert a is b


def test_detached_argument_returned_shares_its_memory():
    # detach lowers to an elementwise copy (compiler/lowering/rules.py): eager x.detach()
    # and x.data share x's memory (and version counter); the compiled result does not.
    for fn in (lambda x: x.detach(), lambda x: x.data):
        traced = hn.trace(fn)
        with hn.no_grad():
            for _ in range(3):
                x = hn.ones(2)
                traced(x).mul_(2.0)
                np.testing.assert_array_equal(_vals(x), [2.0, 2.0])


def test_grad_assigned_a_detached_argument_shares_its_memory():
    # The compiled call replays `p.grad = x.detach()` with a copy (run.Trace._run), so a
    # later in-place update of x no longer shows in p.grad as it does eagerly.
    p = hn.zeros(2)

    @hn.trace
    def f(x):
        p.grad = x.detach()

    with hn.no_grad():
        for _ in range(3):
            x = hn.ones(2)
            f(x)
            x.add_(1.0)
            np.testing.assert_array_equal(_vals(p.grad), [2.0, 2.0])


def test_view_of_an_argument_updated_in_place_aliases_the_argument():
    # The compiled result is a view of the kernel's own buffer (the updated value is only
    # copied into x afterwards), not of x: writing through it leaves x unchanged.
    @hn.trace
    def f(x):
        return x.add_(1.0)[0]

    with hn.no_grad():
        for _ in range(3):
            x = hn.ones(2, 2)
            f(x).mul_(5.0)
            np.testing.assert_array_equal(_vals(x), [[10.0, 10.0], [2.0, 2.0]])
            assert x._version == 2


def test_view_result_shares_the_argument_version_counter():
    # shape._view shares the version counter of a view; compiled results get their own,
    # so an in-place update through the view does not bump x._version (and autograd's
    # saved-tensor check would not fire).
    @hn.trace
    def f(x):
        return x.reshape(4)

    with hn.no_grad():
        for _ in range(3):
            x = hn.ones(2, 2)
            f(x).add_(1.0)
            assert x._version == 1


def test_expanded_result_stays_read_only():
    # Eager expand returns a read-only broadcast view (in-place ops on it raise); the
    # compiled result is a writeable array.
    @hn.trace
    def f(x):
        return x.expand(2, 3)

    with hn.no_grad():
        for _ in range(3):
            out = f(hn.ones(3))
            assert not out._data.flags.writeable


# ---- arithmetic -------------------------------------------------------------------------


def test_adding_positive_zero_is_not_dropped():
    # simplify.identity_element rewrites x + 0.0 to x, but -0.0 + 0.0 is +0.0 (the
    # identity of IEEE addition is -0.0).
    @hn.trace
    def f(x):
        return x + 0.0

    x = hn.tensor([-0.0, 1.0])
    with hn.no_grad():
        for _ in range(3):
            out = _vals(f(x))
            assert not np.signbit(out[0]), out


def test_compiled_arithmetic_is_not_reassociated():
    # numba_engine.FASTMATH includes 'reassoc', which lets LLVM fold (x + c) - c and
    # (x + x) - x to x: eager float32 gives 0.0 for 1 + 1e8 - 1e8 and nan for inf.
    cases = ((lambda x: (x + 1e8) - 1e8, [1.0, -2.5]), (lambda x: (x + x) - x, [np.inf]))
    for fn, values in cases:
        traced = hn.trace(fn)
        x = hn.tensor(values)
        with hn.no_grad():
            traced(x)
            np.testing.assert_array_equal(_vals(traced(x)), _vals(fn(x)))
