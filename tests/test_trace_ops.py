"""Every op through the tracing JIT: traced == eager == interpreted, and really compiled.

The cases are the tables of test_primitives (a representative subset: every op at least
twice, with different shapes, dtypes and layouts) and test_composites (all of them),
plus extra cases here for broadcasting, size-1 dims, 0-d tensors, non-contiguous views,
float64, int and bool inputs, fused reductions and a second shape of the same rank.

Each case runs its function under `hn.no_grad()`: eagerly, through the reference
interpreter (the recorded graph), and through `hn.trace` twice on the same inputs (the
first call traces and returns the eager result, the second runs the compiled kernel).
All must agree within float32 round-off (exactly for int/bool; nan == nan), and the
second call must have run compiled, except for the cases in EAGER, whose fallback
reason must be recorded in `stats.events`.

The table tests run once per backend (the `backend` parameter: "numba", "llvm"). With
"llvm", a case the llvm backend cannot lower compiles with numba and records why (a
"backend_fallback" event); the ops the llvm backend claims (LLVM_OPS) must compile with
it, except the cases in LLVM_FALLBACK.
"""

import numpy as np
import pytest
import test_composites as comp
import test_primitives as prim
from oracles import R, flat, make_inputs, seed_of

import hybridnet as hn

TOL = {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float64): (1e-10, 1e-12)}

# Cases that legitimately run eagerly: case name -> words of the recorded fallback reason.
EAGER = {
    # size-0 dims: check_supported runs any graph with an empty intermediate eagerly (a
    # size-generic kernel must never meet the empty edge cases: reductions without
    # identity, gathers from nothing); there is nothing to compute anyway.
    # an integer power's exponent tensor may hold a negative value, which eager raises for
    "pow-int": "exponent tensor runs eagerly",
    "neg-size0": "size-0 dims",
    "div-size0": "size-0 dims",
    "lt-size0": "size-0 dims",
    "where-size0": "size-0 dims",
    "sum-(1, 0, 2)(2,)-k1": "size-0 dims",
    "reshape-size0": "size-0 dims",
    "slice-empty": "size-0 dims",
    "take-empty-index": "size-0 dims",
    "relu-size0": "size-0 dims",
    "idx-tensor-empty": "size-0 dims",
    # x[x > 0]: a boolean mask computed from the data gives a data-dependent shape; the
    # gather index is made with NumPy from values the trace cannot see.
    "idx-mask-data": "values the JIT cannot see",
}


# ---- picking the primitive cases ----------------------------------------------------------

# Unary and binary elementwise ops have the same layout variants each; op number i takes a
# rotating subset of them, so every variant is still tested on several ops. Every other
# case is kept, but size-0 ones only where listed in EAGER (and sum-size0: an empty input
# whose result is not empty compiles).
UNARY_VARIANTS = ("2x3", "0d", "size1", "T", "step", "flip")
BINARY_VARIANTS = ("bcast", "same", "0d", "0d-bcast", "scalar", "T-step", "bcast3")


def _pick_primitives():
    unary = list(dict.fromkeys(c.op for c in prim.CASES if c.name == "flip"))
    binary = list(dict.fromkeys(c.op for c in prim.CASES if c.name == "bcast3"))
    keep = set()
    for ops, variants, steps in ((unary, UNARY_VARIANTS, (0, 1, 3)),
                                 (binary, BINARY_VARIANTS, (0, 1, 3, 5))):
        for i, op in enumerate(ops):
            keep |= {f"{op}-{variants[(i + k) % len(variants)]}" for k in steps}
    rotated = set(UNARY_VARIANTS) | set(BINARY_VARIANTS)
    picked = []
    for case in prim.CASES:
        if case.id in EAGER or case.id in keep or case.id == "sum-size0":  # compiles
            picked.append(case)
        elif "size0" in case.name or "(1, 0, 2)" in case.name or case.name == "empty":
            continue
        elif case.op not in unary + binary or case.name not in rotated:
            picked.append(case)
    return picked


PRIMS = _pick_primitives()


# ---- the check ----------------------------------------------------------------------------

def _bind(fn, arrays):
    """fn over the tensor inputs only; NumPy scalars (weak operands) become constants."""
    slots = [isinstance(a, np.ndarray) for a in arrays]
    consts = [None if s else a for s, a in zip(slots, arrays)]

    def bound(*tensors):
        it = iter(tensors)
        return fn(*[next(it) if s else c for s, c in zip(slots, consts)])
    return bound


class Fixed:
    """An input spec for a fixed array of any dtype and layout (made afresh each time)."""

    def __init__(self, make):
        self._make = make

    def make(self, rng, dtype):
        return self._make()


def _tensors(specs, dtype, seed):
    """Fresh hn tensors (same values and memory layout every time) for the array specs."""
    return [hn.from_numpy(a) for a in make_inputs(specs, dtype, seed)
            if isinstance(a, np.ndarray)]


def _datas(out):
    return [np.array(t._data, copy=True) for t in flat(out)]


def assert_same(actual, expected, what):
    """Same shapes and dtypes; floats within round-off (nan == nan), others exactly."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        assert (a.shape, a.dtype) == (e.shape, e.dtype), f"{what} output {k}: " \
            f"{a.dtype}{list(a.shape)} != {e.dtype}{list(e.shape)}"
        if a.dtype.kind == "f":
            rtol, atol = TOL[a.dtype]
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{what} output {k}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{what} output {k}")


def interpreted(fn, tensors):
    """The eager outputs recorded by hn.record(), and the interpreter's run of that graph."""
    with hn.record():
        outs = flat(fn(*tensors))
        graph = hn.graph_of(*outs)  # inside the block (see oracles.check_interpreted)
    return [np.array(t._data) for t in outs], graph.run(*[n.value for n in graph.inputs])


def fallback_reasons(tf):
    return [e["detail"] for e in tf.stats.events if e["kind"] == "fallback"]


# The ops the llvm backend lowers itself (elementwise, reductions, views, float matmul).
LLVM_OPS = {"abs", "add", "cast", "cos", "detach", "div", "eq", "erf", "exp", "expand", "ge",
            "gt", "le", "log", "lt", "max", "maximum", "min", "minimum", "mul", "ne", "neg",
            "pow", "sigmoid", "sign", "sin", "sqrt", "sub", "sum", "tanh", "where", "reshape",
            "permute", "slice", "pad_slice", "cat", "take", "scatter_add", "matmul", "argmax",
           "argmin", "unfold", "fold", "cumsum"}
# Cases of those ops that still go to numba, with words of the reason.
LLVM_FALLBACK = {"int-matmul-batched": "matmul on int64", "pow-int": "pow on int"}


@pytest.fixture(params=["numba", "llvm"])
def backend(request, monkeypatch):
    """Run the test with hn.trace's default backend set to the parameter."""
    monkeypatch.setenv("HYBRIDNET_BACKEND", request.param)
    return request.param


def compiled_by(tf):
    """(backend, fallback reason) of the last compiled trace of `tf`."""
    for entry in tf.specializations.values():
        for trace in entry.traces:
            return trace.result.backend, trace.result.fallback
    return None, None


def check_traced(name, fn, specs, dtype=np.float32):
    """Eager, interpreted, traced and compiled calls agree; compiled unless in EAGER."""
    seed = seed_of(name)
    fn = _bind(fn, make_inputs(specs, dtype, seed))
    with hn.no_grad():
        eager = _datas(fn(*_tensors(specs, dtype, seed)))
    recorded, interp = interpreted(fn, _tensors(specs, dtype, seed))
    assert_same(recorded, eager, "recorded eager call vs eager")
    assert_same(interp, eager, "interpreter vs eager")
    tf = hn.trace(fn)
    tensors = _tensors(specs, dtype, seed)
    with hn.no_grad():
        first = _datas(tf(*tensors))
        second = _datas(tf(*tensors))
    assert_same(first, eager, "first traced call vs eager")
    assert_same(second, eager, "compiled call vs eager")
    assert_same(second, interp, "compiled call vs interpreter")
    if name in EAGER:
        assert tf.stats.compiled_calls == 0, tf.stats
        reasons = fallback_reasons(tf)
        assert any(EAGER[name] in r for r in reasons), reasons
    else:
        assert tf.stats.compiled_calls == 1, (tf.stats, fallback_reasons(tf))
        _check_backend(name, tf)
    return tf


def _check_backend(name, tf):
    """With the llvm backend: the graph compiled with llvm, or numba took it for a reason
    that names an op or type outside what llvm lowers."""
    if tf.backend != "llvm":
        assert compiled_by(tf)[0] == "numba"
        return
    used, reason = compiled_by(tf)
    if used == "llvm":
        assert name not in LLVM_FALLBACK, f"{name} compiles with llvm now: update LLVM_FALLBACK"
        return
    assert reason and "llvm backend" in reason and "failed (" not in reason, reason
    if name in LLVM_FALLBACK:
        assert LLVM_FALLBACK[name] in reason, reason
        return
    claimed = [op for op in LLVM_OPS if f"op {op!r}" in reason]
    assert not claimed, f"{name}: llvm claims {claimed} but fell back: {reason}"


# ---- the registry tables ------------------------------------------------------------------


def test_primitive_selection_covers_every_op_twice():
    ops = {c.op for c in prim.CASES}
    counts = {op: sum(c.op == op for c in PRIMS) for op in ops}
    assert min(counts.values()) >= 2, counts


@pytest.mark.parametrize("case", PRIMS, ids=[c.id for c in PRIMS])
def test_primitive_traced(case, backend):
    check_traced(case.id, case.fn, case.inputs)


@pytest.mark.parametrize("case", comp.CASES, ids=comp.IDS)
def test_composite_traced(case, backend):
    check_traced(case.name, lambda *ts: case.fn(hn, *ts), case.inputs)


def test_eager_list_names_real_cases():
    names = {c.id for c in PRIMS} | set(comp.IDS) | {c.name for c in EXTRA}
    assert set(EAGER) <= names, set(EAGER) - names


# ---- extra shapes, layouts and dtypes -----------------------------------------------------

I64 = np.array([[3, -1, 0, 7], [2, 5, -4, 1], [-6, 0, 2, 2]], dtype=np.int64)
I32 = I64.astype(np.int32)
BOOLS = np.array([[True, False, True, False], [False, False, True, True], [True] * 4])


def _layer_norm(m, x):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / (x.var(-1, correction=0, keepdim=True) + 1e-5).sqrt()


C = comp.C
EXTRA = [
    # broadcasting
    C("bcast-col-row", lambda m, a, b: a * 2.0 + b, None, (R((3, 1)), R((1, 4)))),
    C("bcast-row-3d", lambda m, a, b: (a - b).tanh(), None, (R((4,)), R((2, 3, 4)))),
    C("bcast-where", lambda m, c, a, b: m.where(c > 0, a, b), None,
      (R((3, 1)), R((1, 4)), R((4,)))),
    C("bcast-minimum-3d", lambda m, a, b: m.minimum(a, b) * a, None,
      (R((2, 1, 4)), R((3, 1)))),
    C("bcast-softmax", lambda m, a, b: (a + b).softmax(-1), None, (R((3, 1)), R((5,)))),
    # size-1 dims
    C("size1-sum-keep", lambda m, x: x.sum(0, keepdim=True) * x, None, (R((1, 5)),)),
    C("size1-row-softmax", lambda m, x: x.softmax(-1), None, (R((4, 1)),)),
    C("size1-mid", lambda m, x, y: (x * y).sum(1), None, (R((3, 1, 4)), R((3, 1, 1)))),
    C("size1-all", lambda m, x: (x.exp() + 1.0).log().sum(), None, (R((1, 1, 1)),)),
    # 0-d tensors
    C("0d-with-0d", lambda m, a, b: (a * b + 1.0).sigmoid(), None, (R(()), R(()))),
    C("0d-with-2d", lambda m, a, x: (x - a) * a, None, (R(()), R((3, 4)))),
    C("0d-reduce-bcast", lambda m, x: x - x.mean(), None, (R((3, 4)),)),
    C("0d-max-0d", lambda m, a: m.maximum(a, a * -2.0), None, (R(()),)),
    # non-contiguous inputs: transposed, strided and reversed views
    C("T-rows", lambda m, x: (x * 2.0).sum(-1), None, (R((5, 3), layout="T"),)),
    C("T-softmax", lambda m, x: x.log_softmax(-1), None, (R((3, 6), layout="T"),)),
    C("T-plus-C", lambda m, x, y: x * y + x, None, (R((4, 5), layout="T"), R((4, 5)))),
    C("step-reduce0", lambda m, x: x.amax(0), None, (R((3, 4), layout="step"),)),
    C("flip-cumulative", lambda m, x: (x - x.min()) / (x.max() - x.min() + 1.0), None,
      (R((6,), layout="flip"),)),
    C("T-matmul", lambda m, a, b: a @ b, None, (R((3, 4), layout="T"), R((4, 2), layout="T"))),
    # fused reductions and the row/epilogue machinery
    C("row-sum-plus-vec", lambda m, x, b: x.sum(-1) + b, None, (R((4, 4)), R((4,)))),
    C("row-max-then-full", lambda m, x: (x - x.amax(-1, keepdim=True)).exp().sum(-1), None,
      (R((3, 5)),)),
    C("layer-norm", _layer_norm, None, (R((2, 3, 8)),)),
    C("two-row-reductions", lambda m, x: x.sum(-1) * x.amax(-1) - x.amin(-1), None,
      (R((4, 6)),)),
    C("reduce-leading-then-full", lambda m, x: x / (x.abs().sum(0) + 1.0), None,
      (R((5, 3)),)),
    C("reduce-middle", lambda m, x: (x * x).sum(1, keepdim=True) + x, None, (R((2, 3, 4)),)),
    C("reduce-of-reduce", lambda m, x: x.sum(-1).amax(-1), None, (R((2, 3, 4)),)),
    C("matmul-epilogue", lambda m, x, w, b: (x @ w + b).relu().sum(-1), None,
      (R((4, 3)), R((3, 5)), R((5,)))),
    C("many-outputs", lambda m, x: (x.exp(), x.sum(), x * 0.5, x.T), None, (R((2, 3)),)),
    C("same-output-twice", lambda m, x: (x + 1.0, x + 1.0), None, (R((3,)),)),
    C("clone-output", lambda m, x: x.clone(), None, (R((2, 2)),)),
    # int and bool inputs
    C("int-arith", lambda m, a, b: (a * b - a + 3) * m.maximum(a, b), None, (I64, I64[0])),
    C("int-reduce", lambda m, a: (a.sum(-1), a.amax(0), a.argmax(1)), None, (I64,)),
    C("int32-arith", lambda m, a: (a * a + 1).sum(0), None, (I32,)),
    C("int-compare", lambda m, a, b: (a > b, a == 2, m.where(a < b, a, b)), None,
      (I64, I64[:, :1])),
    C("int-matmul-batched", lambda m, a, b: m.matmul(a, b), None,
      (np.stack([I64, I64 - 1]), I64.T.copy())),
    C("int-to-float", lambda m, a: a.to(m.float32) / 2.0 + a, None, (I64,)),
    C("bool-ops", lambda m, c, d: (c * d, c + d, ~c, m.where(c, d, c)), None,
      (BOOLS, BOOLS[::-1].copy())),
    C("bool-to-float", lambda m, c, x: m.where(c, x, -x).sum(), None, (BOOLS, R((3, 4)))),
    C("int-T", lambda m, a: a.T * 2 + a.T.sum(0), None, (Fixed(lambda: np.asfortranarray(I64)),)),
    C("int-step", lambda m, a: (a - 1) * a.amin(-1, keepdim=True), None,
      (Fixed(lambda: np.arange(24).reshape(4, 6)[::2, 1::2]),)),
]


@pytest.mark.parametrize("case", EXTRA, ids=[c.name for c in EXTRA])
def test_extra_traced(case, backend):
    check_traced(case.name, lambda *ts: case.fn(hn, *ts), case.inputs)


F64 = ["softmax-last", "log-softmax", "var-all", "gelu-none", "gelu-tanh", "sigmoid",
       "logsumexp-dim", "matmul-2d-2d", "matmul-batched-bcast", "pow-tensor", "clamp-both",
       "std-dim-keep", "rsqrt", "argmax-dim", "operators", "where-0d", "stack-neg"]


@pytest.mark.parametrize("name", F64)
def test_float64_traced(name, backend):
    case = next(c for c in comp.CASES if c.name == name)
    tf = check_traced(name, lambda *ts: case.fn(hn, *ts), case.inputs, dtype=np.float64)
    assert "float64" in tf.stats.events[0]["detail"]


# ---- a second shape of the same rank ------------------------------------------------------

SHAPES = [
    ("elementwise", lambda x, y: (x * y + 1.0).tanh(), [(3, 4), (3, 4)], [(5, 2), (5, 2)]),
    ("bcast", lambda x, y: x - y, [(3, 1), (1, 4)], [(6, 1), (1, 2)]),
    ("row-softmax", lambda x, y: (x + y).softmax(-1), [(4, 4), (4,)], [(3, 7), (7,)]),
    ("row-sum-vec", lambda x, y: x.sum(-1) + y, [(4, 4), (4,)], [(3, 5), (3,)]),
    ("leading-sum", lambda x, y: (x * y).sum(0), [(4, 3), (3,)], [(2, 6), (6,)]),
    ("matmul", lambda x, y: (x @ y).sigmoid(), [(2, 3), (3, 4)], [(5, 2), (2, 3)]),
    ("reshape", lambda x, y: (x * 2.0).reshape(-1) + y, [(2, 3), (6,)], [(3, 3), (9,)]),
    ("transpose", lambda x, y: x.T * y, [(2, 3), (3, 2)], [(4, 5), (5, 4)]),
    ("slice", lambda x, y: x[1:, ::2] * y, [(3, 4), (2,)], [(5, 6), (3,)]),
    ("layer-norm", lambda x, y: _layer_norm(hn, x) * y, [(3, 4), (4,)], [(2, 9), (9,)]),
]


@pytest.mark.parametrize("name,fn,shapes_a,shapes_b", SHAPES, ids=[s[0] for s in SHAPES])
def test_second_shape_same_rank(name, fn, shapes_a, shapes_b):
    """A new size: the size-generic kernel is reused, or a new one compiled; both correct."""
    tf = hn.trace(fn)
    for k, shapes in enumerate((shapes_a, shapes_a, shapes_b, shapes_b, shapes_a)):
        specs, seed = [R(s) for s in shapes], seed_of(name) + k
        with hn.no_grad():
            expected = _datas(fn(*_tensors(specs, np.float32, seed)))
            got = _datas(tf(*_tensors(specs, np.float32, seed)))
        assert_same(got, expected, f"{name} call {k} {shapes}")
    st = tf.stats
    assert st.compiled_calls == 3 and st.fallbacks == 0, (st, fallback_reasons(tf))
    assert st.compiles + st.kernel_reuses == 2, st


def test_second_shape_reuses_generic_kernel():
    tf = hn.trace(lambda x: (x * 3.0).exp().sum(-1), backend="numba")
    for shape in ((3, 4), (3, 4), (7, 2), (7, 2)):
        x = hn.from_numpy(make_inputs([R(shape)], np.float32, 1)[0])
        with hn.no_grad():
            assert_same(_datas(tf(x)), [np.exp(x._data * 3.0).sum(-1)], str(shape))
    assert tf.stats.compiled_calls == 2, tf.stats
    first, second = tf.specializations.values()
    assert second.traces[0].result.reused, "the second size did not reuse the first kernel"
    assert second.traces[0].result.kernel is first.traces[0].result.kernel


def test_random_numbers_without_a_recipe_run_eagerly_with_the_reason():
    """randint draws straight from the generator (no recipe): such a call runs eagerly;
    randn has a recipe and is drawn anew by each compiled call (test_trace_random.py)."""
    tf = hn.trace(lambda x: x + hn.randint(0, 1000, (3,)))
    with hn.no_grad():
        a, b = tf(hn.zeros(3)), tf(hn.zeros(3))
    assert not np.array_equal(a._data, b._data)  # fresh draws each call, as eagerly
    assert tf.stats.compiled_calls == 0
    assert any("random" in r for r in fallback_reasons(tf)), tf.stats.events
    tf = hn.trace(lambda x: x + hn.randn(3))
    with hn.no_grad():
        a, b, c = tf(hn.zeros(3)), tf(hn.zeros(3)), tf(hn.zeros(3))
    assert not np.array_equal(b._data, c._data) and tf.stats.compiled_calls >= 1


# ---- compiled results own their memory as eager ones do ---------------------------------


def test_compiled_result_survives_next_call_and_owns_memory():
    tf = hn.trace(lambda x, y: x.clone().add_(y))
    x, y = hn.ones(3), hn.ones(3)
    with hn.no_grad():
        first = tf(x, y)
        second = tf(x, y * 5.0)
        tf(x, y * 7.0)
    assert tf.stats.compiled_calls == 2, tf.stats
    assert_same([first._data, second._data], [np.full(3, 2.0, np.float32),
                                              np.full(3, 6.0, np.float32)], "results")
    clone = hn.trace(lambda x: x.clone())
    with hn.no_grad():
        clone(x)
        out = clone(x)
    assert clone.stats.compiled_calls == 1 and not np.shares_memory(out._data, x._data)


def test_in_place_update_of_an_input_is_written_back():
    def step(w, g):
        w.sub_(g * 0.5)
        return (w * w).sum()
    tf = hn.trace(step)
    w_eager, w_traced = hn.ones(4), hn.ones(4)
    with hn.no_grad():
        for k in range(3):
            g = hn.from_numpy(np.arange(4, dtype=np.float32) + k)
            assert_same(_datas(tf(w_traced, g)), _datas(step(w_eager, g)), f"call {k}")
            assert_same([w_traced._data], [w_eager._data], f"updated input, call {k}")
    assert tf.stats.compiled_calls == 2, tf.stats


def _update_view_of_input(x):
    x[0].add_(1.0)
    return x * 2.0


def _update_after_view(x):
    v = x.reshape(-1)
    x.add_(1.0)
    return v * 2.0


def _update_view_of_intermediate(x):
    y = x * 2.0
    y[0].mul_(3.0)
    return y


def _update_detached_alias(x):
    x.detach().mul_(2.0)
    return x + 1.0


def _update_through_data(x):
    x.data.sub_(0.5)
    return x * 3.0


def _replace_data(x):
    x.data = x.data - 0.5
    return x * 3.0


ALIASING = [(_update_view_of_input, "shares"), (_update_after_view, "shares"),
            (_update_view_of_intermediate, "shares"), (_update_detached_alias, "shares"),
            (_replace_data, "replaces")]


@pytest.mark.parametrize("fn,reason", ALIASING, ids=[f.__name__[1:] for f, _ in ALIASING])
def test_in_place_update_through_an_alias_runs_eagerly(fn, reason):
    """Eager code sees an update through every alias of the buffer; a replay would not."""
    tf = hn.trace(fn)
    for _ in range(3):
        a, b = (hn.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3)) for _ in "ab")
        with hn.no_grad():
            assert_same(_datas(tf(a)), _datas(fn(b)), fn.__name__)
        assert_same([a._data], [b._data], f"{fn.__name__}: input after the call")
    assert tf.stats.compiled_calls == 0
    assert any(reason in r for r in fallback_reasons(tf)), tf.stats.events


def test_in_place_update_through_data_is_an_update_of_the_tensor():
    """x.data.sub_(...) updates x (PyTorch's .data): traced, it compiles as an update of
    the argument, written back, with eager's result and input after every call."""
    tf = hn.trace(_update_through_data)
    for _ in range(3):
        a, b = (hn.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3)) for _ in "ab")
        with hn.no_grad():
            assert_same(_datas(tf(a)), _datas(_update_through_data(b)), "through .data")
        assert_same([a._data], [b._data], "through .data: input after the call")
    assert tf.stats.compiled_calls >= 1, tf.stats.events


def test_setitem_inside_a_traced_function_runs_eagerly():
    def fn(x):
        y = x * 2.0
        y[0] = 5.0
        return y
    tf = hn.trace(fn)
    with hn.no_grad():
        for _ in range(2):
            assert_same(_datas(tf(hn.ones(3))), [np.array([5.0, 2.0, 2.0], np.float32)], "")
    assert any("setitem" in r for r in fallback_reasons(tf)), tf.stats.events


def test_constant_index_gather_compiles():
    tf = hn.trace(lambda x: x[hn.tensor([2, 0, -1])] + x[[0, 1]].sum(0))
    x = hn.from_numpy(make_inputs([R((3, 4))], np.float32, 3)[0])
    with hn.no_grad():
        expected = _datas(x[hn.tensor([2, 0, -1])] + x[[0, 1]].sum(0))
        tf(x)
        assert_same(_datas(tf(x)), expected, "gather")
    assert tf.stats.compiled_calls == 1, (tf.stats, fallback_reasons(tf))



def test_code_numba_rejects_runs_eagerly_with_the_reason(monkeypatch):
    import runtime.pipeline as pipeline
    from compiler.lowering import rules
    from runtime.cache import KernelCache
    monkeypatch.setattr(pipeline, "_KERNELS", KernelCache())  # keep the bad kernel local
    monkeypatch.setitem(rules.RULES, "cos", lambda a, node, ctx: f"np.cos({a[0]}, 1, 2, 3)")
    tf = hn.trace(lambda x: x.cos() * 2.0, backend="numba")
    x = hn.ones(3)
    with hn.no_grad():
        for _ in range(3):
            assert_same(_datas(tf(x)), [np.full(3, np.cos(1.0) * 2, np.float32)], "cos")
    assert tf.stats.compiled_calls == 0
    assert any("could not compile" in r for r in fallback_reasons(tf)), tf.stats.events


_SCALE = 2.0


def _scaled(x):
    return x * _SCALE


def test_python_values_read_from_globals_and_closures_are_guarded():
    """They are baked into the trace as constants: a new value must trace anew."""
    global _SCALE
    config = {"shift": 1.0}
    tf, tg = hn.trace(_scaled), hn.trace(lambda x: x + config["shift"])
    x = hn.ones(3)
    try:
        with hn.no_grad():
            for scale in (2.0, 2.0, 5.0, 5.0):
                _SCALE = config["shift"] = scale
                assert_same(_datas(tf(x)), [np.full(3, scale, np.float32)], "global")
                assert_same(_datas(tg(x)), [np.full(3, scale + 1, np.float32)], "closure")
    finally:
        _SCALE = 2.0
    assert tf.stats.compiled_calls == 2 and tg.stats.compiled_calls == 2, (tf.stats, tg.stats)
