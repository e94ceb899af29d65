"""Loops over a list argument (`for x in xs`): the list is passed packed (jit.pytree.Packed),
so its loop rerolls and one compiled specialization serves lists of every length.

Oracles: eager hybridnet (results, parameter gradients, the list and its items after the
call), object identity where eager returns an item, and the twin-state suite
(tests/test_state_twins.py, "list/..." scenarios).
"""

import numpy as np
import pytest
from trace_helpers import same_loss_and_grads

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from hybridnet.jit.traced import EXACT_LENGTHS

CELLS = {"rnn": nn.RNNCell, "lstm": nn.LSTMCell, "gru": nn.GRUCell}


def _cell(kind):
    hn.manual_seed(0)
    return CELLS[kind](4, 5)


def _over_list(cell, xs):
    h = c = hn.zeros(3, 5)
    for x in xs:
        if isinstance(cell, nn.LSTMCell):
            h, c = cell(x, (h, c))
        else:
            h = cell(x, h)
    return h


def _loop_compiles(traced) -> int:
    """How many kernels (forwards and backwards) were compiled for `traced`'s
    specializations that serve every length (numba compiles lazily, at the first call;
    the llvm backend compiles the specializations traced before the lengths generalized
    at once, for their exact shapes, in milliseconds: not counted)."""
    kernels = set()
    for entry in traced.specializations.values():
        if not entry.symbolic and len(traced.specializations) > 1:
            continue
        for trace in entry.traces:
            res = trace.result
            for k in (res.kernel, res.backward.kernel if res.backward else None):
                if k is not None and k.compiled:
                    kernels.add(id(k))
    return len(kernels)


def _items(rng, steps):
    return [hn.tensor(rng.standard_normal((3, 4)).astype(np.float32)) for _ in range(steps)]


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_a_cell_over_a_list_trains_as_eagerly_for_lengths_1_to_40_with_one_compile(kind):
    cell = _cell(kind)

    def loss_of(xs, target):
        return F.mse_loss(_over_list(cell, xs), target)

    traced = hn.trace(loss_of)
    rng = np.random.default_rng(0)
    lengths = list(range(1, 41)) + [100, 2, 57]  # (ascending: the hardest order)
    for steps in lengths:
        xs = _items(rng, steps)
        target = hn.tensor(rng.standard_normal((3, 5)).astype(np.float32))
        same_loss_and_grads(traced, cell, xs, target)
    stats = traced.stats
    # one forward and one backward loop kernel compiled for every length
    assert _loop_compiles(traced) == 2, stats
    assert any(e["kind"] == "generalize" for e in stats.events), stats.events
    # (and lengths beyond those confirmed are traced once to confirm: dynamic.Hull)
    assert stats.compiled_calls >= len(lengths) - 12 - stats.probes, stats


def test_inference_over_lists_in_random_order_compiles_once():
    cell = _cell("gru")
    traced = hn.trace(lambda xs: _over_list(cell, xs))
    rng = np.random.default_rng(1)
    lengths = [int(n) for n in rng.integers(8, 65, size=30)]
    with hn.no_grad():
        for steps in lengths:
            xs = _items(rng, steps)
            np.testing.assert_allclose(traced(xs).numpy(), _over_list(cell, xs).numpy(),
                                       rtol=1e-5, atol=1e-6)
    # one size-generic kernel; with llvm, also one of the lengths compiled exactly before
    # the third length made the trip count symbolic (traced.EXACT_LENGTHS)
    assert _loop_compiles(traced) == 1, traced.stats
    assert len(traced.specializations) <= EXACT_LENGTHS, traced.stats
    # (each length before the trip count is symbolic is traced, and runs eagerly)
    assert traced.stats.compiled_calls >= len(lengths) - 1 - EXACT_LENGTHS - \
        traced.stats.probes


def test_explain_names_the_list_argument_and_its_symbolic_length():
    cell = _cell("rnn")
    traced = hn.trace(lambda xs: _over_list(cell, xs))
    rng = np.random.default_rng(2)
    with hn.no_grad():
        for steps in (12, 15, 15):
            traced(_items(rng, steps))
        text = str(hn.explain(traced, _items(rng, 20)))
    assert "list of * float32[3, 4]" in text, text
    assert "the length of list argument 0" in text, text
    assert "loop" in text


def test_dynamic_false_traces_each_list_length_item_by_item():
    cell = _cell("rnn")
    traced = hn.trace(lambda xs: _over_list(cell, xs), dynamic=False)
    rng = np.random.default_rng(3)
    with hn.no_grad():
        for steps in (9, 12, 9, 12):
            xs = _items(rng, steps)
            np.testing.assert_allclose(traced(xs).numpy(), _over_list(cell, xs).numpy(),
                                       rtol=1e-5, atol=1e-6)
    assert len(traced.specializations) == 2
    assert not any(e["kind"] == "generalize" for e in traced.stats.events)


def _value(v):
    return v.numpy() if isinstance(v, hn.Tensor) else np.asarray(v)


def test_a_list_whose_items_differ_is_not_packed_and_runs_correctly():
    def f(xs):
        return sum((x.sum() if isinstance(x, hn.Tensor) else x) for x in xs)

    traced = hn.trace(f)
    for xs in ([hn.ones(2), hn.ones(3)], [hn.ones(2), hn.ones(2, dtype=hn.float64)],
               [hn.ones(2), 3.0], [], [hn.ones(2)], [hn.ones(2), hn.ones(3)]):
        np.testing.assert_allclose(_value(traced(xs)), _value(f(xs)))


def test_a_guard_sends_a_list_with_another_item_shape_elsewhere():
    traced = hn.trace(lambda xs: sum(x * 2 for x in xs))
    rng = np.random.default_rng(4)
    for shape in [(3,), (3,), (3,), (4,), (4,), (3,), (2, 3)]:
        xs = [hn.tensor(rng.standard_normal(shape)) for _ in range(4)]
        np.testing.assert_allclose(traced(xs).numpy(), sum(x.numpy() * 2 for x in xs))


def test_a_list_in_a_dict_argument_is_packed_too():
    cell = _cell("rnn")

    def f(batch):
        return _over_list(cell, batch["xs"]) * batch["scale"]

    traced = hn.trace(f)
    rng = np.random.default_rng(5)
    with hn.no_grad():
        for steps in (10, 14, 10, 23, 31, 14, 20):  # (31: a probe, dynamic.Hull)
            batch = {"xs": _items(rng, steps), "scale": 2.0}
            np.testing.assert_allclose(traced(batch).numpy(), f(batch).numpy(), rtol=1e-5,
                                       atol=1e-6)
    assert traced.stats.compiled_calls >= 2
    assert any(e["kind"] == "generalize" for e in traced.stats.events)


def test_an_item_updated_in_place_is_updated_as_eagerly():
    def f(xs):
        xs[0].add_(1.0)
        return xs[0] * xs[1]

    traced = hn.trace(f)
    for _ in range(4):
        xs = [hn.ones(3), hn.full((3,), 2.0), hn.ones(3)]
        twin = [x.clone() for x in xs]
        np.testing.assert_allclose(traced(xs).numpy(), f(twin).numpy())
        for a, b in zip(xs, twin):
            np.testing.assert_allclose(a.numpy(), b.numpy())
    assert any("item by item" in e["detail"] for e in traced.stats.events)
    assert traced.stats.compiled_calls >= 1  # (traced item by item, then compiled)


def test_an_item_returned_is_the_callers_very_object():
    def f(xs):
        return xs[-1], xs[0] + xs[1]

    traced = hn.trace(f)
    for _ in range(4):
        xs = [hn.randn(2) for _ in range(3)]
        last, total = traced(xs)
        assert last is xs[-1]
        np.testing.assert_allclose(total.numpy(), (xs[0] + xs[1]).numpy())


def test_an_item_changed_after_the_call_makes_backward_raise_as_eagerly():
    cell = _cell("rnn")
    traced = hn.trace(lambda xs: _over_list(cell, xs).sum())

    def run(fn):
        xs = [hn.randn(3, 4) for _ in range(9)]
        out = fn(xs)
        xs[4].mul_(2.0)
        out.backward()

    for fn in (traced, traced, traced):
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            run(fn)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        run(traced.fn)
    assert traced.stats.compiled_calls >= 1


def test_a_list_that_grows_between_calls_is_read_afresh():
    cell = _cell("lstm")
    traced = hn.trace(lambda xs: _over_list(cell, xs))
    rng = np.random.default_rng(6)
    xs = _items(rng, 8)
    with hn.no_grad():
        for _ in range(10):  # (12..15 are probes, dynamic.Hull; 16.. run compiled)
            xs.append(hn.tensor(rng.standard_normal((3, 4)).astype(np.float32)))
            xs[2].mul_(0.5)
            np.testing.assert_allclose(traced(xs).numpy(), _over_list(cell, xs).numpy(),
                                       rtol=1e-5, atol=1e-6)
    assert traced.stats.compiled_calls >= 3


# ---- review regressions: identity, aliasing, item class, the caller's list ------------------


def _same_as_eagerly(fn, make_calls):
    """Drive hn.trace(fn) and fn on twin arguments (make_calls(twin) yields argument
    tuples, the same sequence for both); results must match at every call."""
    traced = hn.trace(fn)
    for got_args, want_args in zip(make_calls(), make_calls()):
        got, want = traced(*got_args), fn(*want_args)
        np.testing.assert_allclose(_value(got), _value(want), rtol=1e-6)
    return traced


def _ones(v=1.0):
    return hn.full((3,), v)


@pytest.mark.parametrize("case", ["same_item_twice", "same_list_twice", "item_is_arg"])
def test_an_item_that_is_the_same_object_as_another_input_is_keyed(case):
    def make_calls():
        a, b = _ones(1.0), _ones(2.0)
        for i in range(4):
            other = a if i < 2 else b
            if case == "same_item_twice":
                yield ([a, other],)
            elif case == "same_list_twice":
                first = [a, a]
                yield (first, first if i < 2 else [other, other])
            else:
                yield ([a, _ones(5.0)], other)

    def fn(xs, ys=None):
        second = xs[1] if ys is None else ys[0] if isinstance(ys, list) else ys
        return xs[0] * 10 + second
    _same_as_eagerly(fn, make_calls)


@pytest.mark.parametrize("view", [False, True])
def test_an_argument_updated_in_place_that_is_an_item_or_a_view_of_one(view):
    def fn(xs, y):
        y.mul_(2.0)
        return xs[0] + xs[1]

    def make_calls():
        for i in range(4):
            xs = [_ones(1.0), _ones(1.0)]
            alias = xs[0][:] if view else xs[0]
            yield (xs, alias if i >= 2 else _ones(1.0))
    _same_as_eagerly(fn, make_calls)


def test_items_that_are_views_of_an_argument_updated_in_place():
    def fn(x, xs):
        x.add_(1.0)
        return xs[0] + xs[1]

    def make_calls():
        for i in range(4):
            x = hn.zeros(2, 3)
            yield (x, [x[0], x[1]] if i >= 2 else [hn.zeros(3), hn.zeros(3)])
    _same_as_eagerly(fn, make_calls)


def test_the_items_class_is_part_of_the_key():
    def fn(xs):
        return xs[0] * (3 if isinstance(xs[0], nn.Parameter) else 2)

    def make_calls():
        for i in range(4):
            yield ([_ones(), _ones()] if i < 2 else
                   [nn.Parameter(_ones(), requires_grad=False) for _ in range(2)],)
    _same_as_eagerly(fn, make_calls)


def test_a_closure_tensor_that_was_an_item_is_read_as_itself_later():
    w = _ones(1.0)

    def fn(xs):
        return xs[0] * 10 + w

    def make_calls():
        for i in range(5):
            yield ([w if i < 2 else _ones(2.0), _ones(3.0)],)
    _same_as_eagerly(fn, make_calls)


@pytest.mark.parametrize("change", ["append", "pop", "clear", "setitem"])
def test_a_function_that_changes_its_list_argument_runs_eagerly(change):
    def fn(xs):
        total = xs[0] * 1.0
        if change == "append":
            xs.append(xs[0] * 2)
        elif change == "pop":
            xs.pop()
        elif change == "clear":
            xs.clear()
        else:
            xs[0] = xs[0] * 3
        for x in xs:
            total = total * 0.5 + x
        return total

    traced = hn.trace(fn)
    for _ in range(4):
        got_list, want_list = ([_ones(k) for k in (1.0, 2.0, 3.0, 4.0)] for _ in range(2))
        np.testing.assert_allclose(traced(got_list).numpy(), fn(want_list).numpy())
        assert len(got_list) == len(want_list)  # (the list is left as eagerly)
        for a, b in zip(got_list, want_list):
            np.testing.assert_allclose(a.numpy(), b.numpy())
    assert traced.stats.compiled_calls == 0


def test_the_caller_changing_its_list_before_backward_is_not_an_in_place_update():
    cell = _cell("rnn")
    traced = hn.trace(lambda xs: _over_list(cell, xs).sum())
    for _ in range(4):
        xs = [hn.randn(3, 4) for _ in range(8)]
        out = traced(xs)
        xs.clear()
        out.backward()  # (eagerly fine: the items themselves are unchanged)
    popped = [hn.randn(3, 4) for _ in range(8)]
    out = traced(popped)
    popped.pop(4).mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        out.backward()
    assert traced.stats.compiled_calls >= 2


def test_a_specialization_made_packed_stays_packed_after_packing_is_switched_off():
    w = hn.randn(3, requires_grad=True)

    def fn(xs, mode):
        if mode:
            xs[0].add_(1.0)  # (an item as an object: list arguments unpacked from now on)
        return xs[0] * (1.0 if w.grad is None else 2.0) + xs[1]

    traced = hn.trace(fn)
    modes = [False] * 3 + [True] + [False] * 4
    for i, mode in enumerate(modes):
        if i == 4:
            w.grad = hn.ones(3)  # (the packed specialization goes stale: traced again)
        got = traced([_ones(1.0), _ones(5.0)], mode)
        want = fn([_ones(1.0), _ones(5.0)], mode)
        np.testing.assert_allclose(got.numpy(), want.numpy())
    assert not any(e["kind"] == "fallback" for e in traced.stats.events), traced.stats.events
