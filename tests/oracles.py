"""Oracles shared by the registry-driven tests.

Inputs are described by small specs (`R` random floats, `V` fixed float values,
`S` a float scalar, or a plain ndarray used as is), made in float32 for the
forward/interpreter checks and in float64 (same values) for finite differences.
The three checks every op and composite gets:

* `check_forward`: eager float32 result vs a float64 NumPy reference;
* `check_grad`: `hn.grad` in float64 vs central finite differences of the eager op;
* `check_interpreted`: eager result vs `hn.graph_of(out).run(...)` (the reference
  interpreter), to 1 ulp, on the recorded inputs and again on fresh inputs.
"""

import zlib
from dataclasses import dataclass

import numpy as np

import hybridnet as hn

RTOL32, ATOL32 = 1e-5, 1e-5  # float32 result vs a float64 reference
FD_EPS, FD_RTOL, FD_ATOL = 1e-6, 1e-5, 1e-7


# ---- input specs ----------------------------------------------------------------------


@dataclass(frozen=True)
class R:
    """Random floats in [lo, hi]; |x| >= away; layout 'c', 'T' (transposed), 'step', 'flip'."""

    shape: tuple
    lo: float = -2.0
    hi: float = 2.0
    layout: str = "c"
    away: float = 0.0

    def make(self, rng, dtype):
        base_shape = {"T": self.shape[::-1], "step": (2 * self.shape[0],) + self.shape[1:]
                      if self.shape else ()}.get(self.layout, self.shape)
        x = rng.uniform(self.lo, self.hi, size=base_shape)
        if self.away:
            x = np.where(np.abs(x) < self.away, np.copysign(self.away, x) + x, x)
        x = x.astype(np.float32).astype(dtype)  # the same values in both precisions
        if self.layout == "T":
            x = x.T
        elif self.layout == "step" and self.shape:
            x = x[::2]
        elif self.layout == "flip" and self.shape:
            x = x[::-1]
        assert x.shape == tuple(self.shape)
        if self.layout != "c" and x.size > 1:
            assert not x.flags.c_contiguous
        return x


@dataclass(frozen=True)
class V:
    """Fixed float values (in the working float dtype)."""

    values: object

    def make(self, rng, dtype):
        return np.array(self.values, dtype=np.float32).astype(dtype)


@dataclass(frozen=True)
class S:
    """A NumPy float scalar of the working dtype (a weakly typed operand)."""

    value: float

    def make(self, rng, dtype):
        return np.dtype(dtype).type(self.value)


def make_inputs(specs, dtype, seed):
    """Arrays (or NumPy scalars) for `specs`; fixed ndarrays are copied unchanged."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        if isinstance(spec, np.ndarray):
            out.append(spec.copy())
        else:
            out.append(spec.make(rng, dtype))
    return out


def seed_of(name: str) -> int:
    """A stable seed per case id."""
    return zlib.crc32(name.encode())


def wrap(values):
    """hn tensors sharing memory with arrays; NumPy scalars pass through."""
    return [hn.from_numpy(v) if isinstance(v, np.ndarray) else v for v in values]


def is_float(x) -> bool:
    return np.asarray(x).dtype.kind == "f"


def flat(out) -> list:
    """A list of output tensors from a tensor or a (nested) tuple/list of them."""
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return [out]


def to64(values):
    return [np.asarray(v, dtype=np.float64) if is_float(v) and isinstance(v, np.ndarray)
            else (np.float64(v) if is_float(v) else v) for v in values]


# ---- comparisons ------------------------------------------------------------------------


def assert_ulp_equal(actual, expected, maxulp=1):
    """Same shape and dtype, same non-finite pattern, finite values within `maxulp`."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if actual.dtype.kind != "f":
        np.testing.assert_array_equal(actual, expected)
        return
    fa, fe = np.isfinite(actual), np.isfinite(expected)
    np.testing.assert_array_equal(fa, fe)
    np.testing.assert_array_equal(actual[~fa], expected[~fe])  # inf signs; nan == nan
    if fa.any():
        np.testing.assert_array_max_ulp(actual[fa], expected[fa], maxulp=maxulp)


def assert_matches_ref(out, ref, rtol=RTOL32, atol=ATOL32, float_dtype=np.float32):
    """An hn float32 result vs a float64 (or exact int/bool) reference."""
    ref = np.asarray(ref)
    data = out._data
    assert data.shape == ref.shape, f"shape {data.shape} != reference {ref.shape}"
    if ref.dtype.kind == "f":
        assert data.dtype == float_dtype, f"dtype {data.dtype}, expected {float_dtype}"
        np.testing.assert_allclose(data.astype(np.float64), ref, rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        assert data.dtype == ref.dtype, f"dtype {data.dtype} != reference {ref.dtype}"
        np.testing.assert_array_equal(data, ref)


# ---- the three checks ------------------------------------------------------------------


def check_forward(fn, ref, specs, seed, rtol=RTOL32, atol=ATOL32, float_dtype=np.float32):
    """fn on float32 inputs (under no_grad) vs ref on the same values in float64."""
    arrays = make_inputs(specs, np.float32, seed)
    expected = flat(ref(*to64(arrays)))  # before fn: in-place cases overwrite inputs
    with hn.no_grad():
        outs = flat(fn(*wrap(arrays)))
    assert len(outs) == len(expected), (len(outs), len(expected))
    for out, exp in zip(outs, expected):
        assert_matches_ref(out, exp, rtol, atol, float_dtype)
    return outs


def _loss_inputs(fn, arrays, picks, ws):
    with hn.no_grad():
        outs = flat(fn(*wrap(arrays)))
    return sum(float(np.sum(outs[k]._data * w)) for k, w in zip(picks, ws))


def finite_difference(fn, arrays, i, picks, ws, eps=FD_EPS):
    """Central differences of sum_k <w_k, out_k> with respect to arrays[i]."""
    base = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
    grad = np.zeros(np.shape(arrays[i]))
    x = np.array(arrays[i], dtype=np.float64)
    for j in np.ndindex(*x.shape):
        for sign in (1, -1):
            xp = x.copy()
            xp[j] += sign * eps
            args = list(base)
            args[i] = xp if isinstance(arrays[i], np.ndarray) else np.float64(xp)
            args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            grad[j] += sign * _loss_inputs(fn, args, picks, ws)
    return grad / (2 * eps)


def check_grad(fn, specs, seed, wrt=None, rtol=FD_RTOL, atol=FD_ATOL):
    """hn.grad of fn (float64) vs central finite differences, for each float input."""
    arrays = make_inputs(specs, np.float64, seed)
    if wrt is None:
        wrt = [i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and is_float(a)]
    assert wrt, "a gradient check needs a float input"
    keep = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
    tensors = wrap(arrays)
    for i in wrt:
        tensors[i].requires_grad_()
    outs = flat(fn(*tensors))
    picks = [k for k, o in enumerate(outs) if is_float(o._data) and o.requires_grad]
    assert picks, "no output requires grad"
    rng = np.random.default_rng(seed + 1)
    ws = [rng.standard_normal(outs[k].shape) for k in picks]
    grads = hn.grad([outs[k] for k in picks], [tensors[i] for i in wrt],
                    grad_outputs=[hn.from_numpy(w) for w in ws], allow_unused=True)
    for i, g in zip(wrt, grads):
        g = np.zeros(keep[i].shape) if g is None else g._data
        assert g.shape == np.shape(keep[i]), f"grad shape {g.shape} != {np.shape(keep[i])}"
        assert g.dtype == np.float64, g.dtype
        fd = finite_difference(fn, keep, i, picks, ws)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")
    return grads


def check_interpreted(fn, specs, seed, rerun=True):
    """Eager == the recorded graph run by the interpreter (same inputs, then fresh ones)."""
    arrays = make_inputs(specs, np.float32, seed)
    original = make_inputs(specs, np.float32, seed)  # same values and memory layout
    with hn.record() as rec:
        outs = flat(fn(*wrap(arrays)))
        # inside the block: on exit, tensors rebound by in-place ops become fresh leaves
        graph = hn.graph_of(*outs)
    graph.verify()
    rec.graph.verify()

    def feed(values):
        # graph inputs are matched to the caller's arrays by identity (a detached
        # copy of an input is its own graph input holding the same buffer)
        fed = []
        for node in graph.inputs:
            k = next((k for k, a in enumerate(arrays) if node.value is a), None)
            fed.append(node.value if k is None else values[k])
        return fed

    results = graph.run(*feed(original))
    assert len(results) == len(outs)
    for out, res in zip(outs, results):
        assert_ulp_equal(out._data, res)
    if rerun:
        fresh = make_inputs(specs, np.float32, seed + 7)
        results = graph.run(*feed(fresh))
        with hn.no_grad():
            again = flat(fn(*wrap(make_inputs(specs, np.float32, seed + 7))))
        for out, res in zip(again, results):
            assert_ulp_equal(out._data, res)
    return graph


def _first_grads(fn, arrays, wrt, seed, create_graph):
    tensors = wrap([a.copy() if isinstance(a, np.ndarray) else a for a in arrays])
    for i in wrt:
        tensors[i].requires_grad_()
    outs = [o for o in flat(fn(*tensors)) if is_float(o._data) and o.requires_grad]
    rng = np.random.default_rng(seed + 1)
    ws = [hn.from_numpy(rng.standard_normal(o.shape)) for o in outs]
    grads = hn.grad(outs, [tensors[i] for i in wrt], grad_outputs=ws,
                    create_graph=create_graph, allow_unused=True)
    return tensors, grads


def check_second_order(fn, specs, seed, wrt=None, rtol=FD_RTOL, atol=1e-6):
    """Gradient of <v, hn.grad(..., create_graph=True)> vs finite differences of hn.grad."""
    arrays = make_inputs(specs, np.float64, seed)
    if wrt is None:
        wrt = [i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and is_float(a)]
    tensors, grads = _first_grads(fn, arrays, wrt, seed, True)
    rng = np.random.default_rng(seed + 2)
    vs = [rng.standard_normal(np.shape(arrays[i])) for i in wrt]
    terms = [(g * hn.from_numpy(v)).sum() for g, v in zip(grads, vs)
             if g is not None and g.requires_grad]
    second = [None] * len(wrt)
    if terms:  # else every first derivative is constant: finite differences must be 0
        second = hn.grad(sum(terms[1:], terms[0]), [tensors[i] for i in wrt],
                         allow_unused=True)

    def directional(args):
        _, gs = _first_grads(fn, args, wrt, seed, False)
        return sum(float(np.sum(g._data * v)) for g, v in zip(gs, vs) if g is not None)

    for k, i in enumerate(wrt):
        x = np.asarray(arrays[i], dtype=np.float64)
        fd = np.zeros(x.shape)
        for j in np.ndindex(*x.shape):
            for sign in (1, -1):
                args = list(arrays)
                args[i] = x.copy()
                args[i][j] += sign * FD_EPS
                fd[j] += sign * directional(args)
        fd /= 2 * FD_EPS
        got = np.zeros(x.shape) if second[k] is None else second[k]._data
        np.testing.assert_allclose(got, fd, rtol=rtol, atol=atol,
                                   err_msg=f"second derivative for input {i}")
