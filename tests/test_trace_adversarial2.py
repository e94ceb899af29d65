"""Adversarial regressions, second round: a traced function's result, and the state it
leaves behind, must equal what the same function gives when run eagerly.

Each test states the eager answer (or drives the scenario both ways) and fails where a
compiled call silently differs; the comment on each says what differs and the guessed
root cause.
"""

import types

import numpy as np
from trace_helpers import run_twice_then as _run_twice_then

import hybridnet as hn
from hybridnet import nn

# ---- what the function reaches by name ---------------------------------------------------


@hn.trace
def _late_global(x):
    return x * _LATE_SCALE


@hn.trace
def _late_helper_user(x):
    return _late_helper(x)


def _late_helper(x):
    return x * _LATE_SCALE


_LATE_SCALE = 2.0


def test_global_defined_after_the_decorator_is_guarded():
    # TracedFunction.__init__ computes env_names(fn) once, at decoration time, and
    # keys.env_names keeps only names already in fn.__globals__: a constant or helper
    # defined below `@hn.trace` (the usual layout of a module) is never keyed, so
    # rebinding it keeps the old value baked in.
    global _LATE_SCALE
    x = hn.ones(2)
    try:
        for traced in (_late_global, _late_helper_user):
            _LATE_SCALE = 2.0
            out = _run_twice_then(traced, x, lambda: globals().update(_LATE_SCALE=3.0))
            np.testing.assert_array_equal(out, [3.0, 3.0], err_msg=traced.__name__)
    finally:
        _LATE_SCALE = 2.0


SCALE = 2.0


class _HelperMethod(nn.Module):
    def scaled(self, x):
        return x * SCALE

    def forward(self, x):
        return self.scaled(x)


class _StaticHelper(nn.Module):
    @staticmethod
    def act(x):
        return x * SCALE

    def forward(self, x):
        return _StaticHelper.act(x)


def test_global_read_by_a_helper_method_of_the_module_is_guarded():
    # keys._structure keys only type(m).forward of each submodule (and what it reaches
    # by name); a method the forward calls through `self.` (or a staticmethod through the
    # class) is an attribute name, not a global, so the global it reads is never keyed.
    global SCALE
    x = hn.ones(2)
    try:
        for model in (_HelperMethod(), _StaticHelper()):
            SCALE = 2.0
            out = _run_twice_then(hn.trace(model), x, lambda: globals().update(SCALE=3.0))
            np.testing.assert_array_equal(out, [3.0, 3.0], err_msg=type(model).__name__)
    finally:
        SCALE = 2.0


class _MethodConfig:
    def apply(self, x):
        return x * SCALE

    @property
    def scale(self):
        return SCALE


METHOD_CONFIG = _MethodConfig()


def _uses_object_method(x):
    return METHOD_CONFIG.apply(x)


def _uses_object_property(x):
    return x * METHOD_CONFIG.scale


def test_global_read_by_a_method_or_property_of_a_plain_object_is_guarded():
    # keys.env_value_key keys a plain object by its instance attributes only; the
    # globals its class's methods and properties read (defined in the same module as
    # the traced function) are not followed, so their new values are never seen.
    global SCALE
    x = hn.ones(2)
    try:
        for fn in (_uses_object_method, _uses_object_property):
            SCALE = 2.0
            out = _run_twice_then(hn.trace(fn), x, lambda: globals().update(SCALE=3.0))
            np.testing.assert_array_equal(out, [3.0, 3.0], err_msg=fn.__name__)
    finally:
        SCALE = 2.0


class _ClassLevel:
    scale = 2.0


class _ClassLevelChild(_ClassLevel):
    pass


CLASS_LEVEL = _ClassLevel()


def _inherited_class_attribute(x):
    return x * _ClassLevelChild.scale


def _class_attribute_through_instance(x):
    return x * CLASS_LEVEL.scale


class _ClassConstantModule(nn.Module):
    scale = 2.0

    def forward(self, x):
        return x * self.scale


def test_class_attributes_read_through_a_subclass_or_an_instance_are_guarded():
    # keys.env_value_key keys a class by vars(cls) (its own dict, not its bases') and a
    # plain object or a module by its instance __dict__: a class attribute reached
    # through a subclass, an instance or `self` of a module is baked in unguarded.
    x = hn.ones(2)
    cases = ((hn.trace(_inherited_class_attribute), _ClassLevel),
             (hn.trace(_class_attribute_through_instance), _ClassLevel),
             (hn.trace(_ClassConstantModule()), _ClassConstantModule))
    try:
        for traced, owner in cases:
            _ClassLevel.scale = _ClassConstantModule.scale = 2.0
            out = _run_twice_then(traced, x, lambda owner=owner: setattr(owner, "scale", 3.0))
            np.testing.assert_array_equal(out, [3.0, 3.0], err_msg=repr(traced))
    finally:
        _ClassLevel.scale = _ClassConstantModule.scale = 2.0


NP_CONFIG = {"scale": np.float32(2.0)}
OBJ_CONFIG = {"cfg": types.SimpleNamespace(scale=2.0)}
ARRAY_TUPLE = (1, np.array([2.0]))


def _dict_with_numpy_scalar(x):
    return x * NP_CONFIG["scale"]


def _dict_with_plain_object(x):
    return x * OBJ_CONFIG["cfg"].scale


def _tuple_with_array(x):
    return x * float(ARRAY_TUPLE[1][0])


def test_containers_holding_numpy_values_or_objects_are_guarded():
    # keys.env_value_key flattens a list/dict/tuple global with pytree.flatten, which
    # refuses NumPy scalars/arrays and plain objects; it then keys the container by
    # ("unsupported", id(value)) only, so a changed entry is never noticed (np.float32 is
    # not a float subclass; np.float64 is, which is why that one works).
    x = hn.ones(2)
    cases = ((_dict_with_numpy_scalar, lambda: NP_CONFIG.update(scale=np.float32(3.0))),
             (_dict_with_plain_object, lambda: setattr(OBJ_CONFIG["cfg"], "scale", 3.0)),
             (_tuple_with_array, lambda: ARRAY_TUPLE[1].__setitem__(0, 3.0)))
    try:
        for fn, change in cases:
            out = _run_twice_then(hn.trace(fn), x, change)
            np.testing.assert_array_equal(out, [3.0, 3.0], err_msg=fn.__name__)
    finally:
        NP_CONFIG["scale"] = np.float32(2.0)
        OBJ_CONFIG["cfg"].scale = 2.0
        ARRAY_TUPLE[1][0] = 2.0


def _deep1(x):
    return _deep2(x)


def _deep2(x):
    return _deep3(x)


def _deep3(x):
    return _deep4(x)


def _deep4(x):
    return _deep5(x)


def _deep5(x):
    return _deep6(x)


def _deep6(x):
    return x * SCALE


def test_global_read_by_a_deep_helper_chain_is_guarded():
    # keys.env_value_key stops following helper functions once `seen` holds 5 of them
    # (len(seen) <= 4) and keys deeper ones by identity only: the global the sixth
    # helper reads is baked in.
    global SCALE
    SCALE = 2.0
    try:
        out = _run_twice_then(hn.trace(_deep1), hn.ones(2),
                              lambda: globals().update(SCALE=3.0))
        np.testing.assert_array_equal(out, [3.0, 3.0])
    finally:
        SCALE = 2.0


# ---- results that are views ------------------------------------------------------------


def test_view_of_a_grad_returned_shares_the_grad():
    # build._fresh_results (and _grad_writes) count only argument and "captured" sources
    # as outside memory, not "grad" sources: a view of p.grad (an index, a detach, or a
    # view of p.grad updated in place) is taken for a fresh result and returned as a copy,
    # so writing through it no longer reaches p.grad (and p.grad._version is not shared).
    cases = (lambda p: p.grad[0], lambda p: p.grad.detach(),
             lambda p: p.grad.mul_(2.0)[1])
    for k, body in enumerate(cases):
        p = hn.zeros(2, 3)
        p.grad = hn.ones(2, 3)
        traced = hn.trace(lambda x, p=p, body=body: (x * 1.0, body(p)))
        with hn.no_grad():
            for i in range(3):
                _, view = traced(hn.ones(1))
                assert np.shares_memory(view._data, p.grad._data), (k, i)
                before = p.grad._version
                view.add_(10.0)
                assert p.grad._version == before + 1, (k, i)


def test_tensor_made_and_updated_inside_keeps_its_version():
    # A tensor created inside the call and then updated in place is returned by eager
    # with its version counter at the number of updates; build._writebacks skips tensors
    # made inside the call (no version_bumps entry) and run.Trace._fresh wraps the kernel
    # output with no counter, so compiled calls return _version == 0.
    cases = ((lambda x: x.clone().add_(1.0), 1), (lambda x: (x * 2.0).add_(1.0).mul_(3.0), 2),
             (lambda x: x.clone().add_(1.0)[0], 1))
    for k, (fn, versions) in enumerate(cases):
        traced = hn.trace(fn)
        with hn.no_grad():
            for i in range(3):
                assert traced(hn.ones(2, 2))._version == versions, (k, i)


def test_result_that_views_an_assigned_grad_shares_it():
    # run.Trace._run replays `p.grad = value` with a fresh copy unless the result *is*
    # that value (`same`); when a result is a view of the assigned grad (or the grad a
    # view of a result), eager's result and p.grad share memory, the compiled ones not:
    # writing through the returned tensor no longer changes p.grad.
    def view_of_grad(x, p):
        p.grad = x * 2.0
        return p.grad[0]

    def reshaped_grad(x, p):
        g = x * 2.0
        p.grad = g
        return g.reshape(-1)

    def grad_is_a_view(x, p):
        g = x * 2.0
        p.grad = g.reshape(2, 3)
        return g

    for body in (view_of_grad, reshaped_grad, grad_is_a_view):
        p = hn.zeros(2, 3)
        traced = hn.trace(lambda x, p=p, body=body: body(x, p))
        with hn.no_grad():
            for i in range(3):
                out = traced(hn.ones(2, 3))
                assert np.shares_memory(out._data, p.grad._data), (body.__name__, i)


def test_grad_assigned_after_an_in_place_update_keeps_its_version():
    # Same root cause as test_tensor_made_and_updated_inside_keeps_its_version: the
    # tensor assigned to p.grad was updated in place inside the call (version 1 eagerly);
    # the compiled replay assigns a fresh tensor with _version 0.
    p = hn.zeros(3)

    @hn.trace
    def f(x):
        g = x * 2.0
        g.add_(1.0)
        p.grad = g
        return x * 1.0

    with hn.no_grad():
        for i in range(3):
            f(hn.ones(3))
            assert p.grad._version == 1, i


def test_reshape_result_follows_the_argument_memory_layout_of_each_call():
    # Whether x.reshape(6) is a view (contiguous x) or a copy (x = base.T) is decided once
    # at trace time (build._fresh_results / _view_source), but the guard and key check
    # only shape, dtype and requires_grad, not strides:
    # traced on a transposed x, a later contiguous x gets a fresh copy where eager returns
    # a view of x; traced on a contiguous x, a later transposed x gets run.Trace._view's
    # NumPy copy with x's version counter attached, so updating the result bumps x._version.
    def transposed():
        return hn.arange(6).float().reshape(3, 2).T

    def contiguous():
        return hn.arange(6).float().reshape(2, 3)

    for first, then in ((transposed, contiguous), (contiguous, transposed)):
        traced = hn.trace(lambda x: x.reshape(6))
        with hn.no_grad():
            traced(first())
            traced(first())
            for i in range(2):
                x = then()
                out = traced(x)
                eager = x.reshape(6)
                assert np.shares_memory(out._data, x._data) == np.shares_memory(
                    eager._data, x._data), (first.__name__, i)
                before = x._version
                out.add_(1.0)
                expected = before + 1 if np.shares_memory(eager._data, x._data) else before
                assert x._version == expected, (first.__name__, i)
