"""Fused eager ops: composites that training code calls on every step (`F.linear`,
`F.relu`, `F.cross_entropy`) run as a few NumPy calls and record one tape node with a
hand-written backward.

Why: written with primitives, a cross-entropy is 28 eager ops and 15 more in backward,
and each costs a dispatch and a tape node (about 5 us, 12 us in backward) whatever the
array size: a W2 MLP step spent a third of its time there. PyTorch fuses the same ops
for the same reason.

When: only where nothing records primitives, i.e. no trace is being recorded
(`STATE.tracer`) and no `hn.record()` block is open. Traced, recorded and exported
graphs still hold the composite, so the JIT, the exporters and every backend see what
they always saw. Each fused op computes the composite's formulas with its edge cases
(tests/test_fused.py compares values and gradients with the composite, including
create_graph); inputs the fused op does not cover (other dtypes, shapes, options) take
the composite.

Backward: a `FusedNode` is an `OwnBackward` node (as a compiled call's is): its `route`
emits the gradient ops through the engine's emitter, so `create_graph=True` records
them with history; without history (`emitter.in_place`) it may read the NumPy values
the forward saved instead of recomputing them.
"""

import contextlib

import numpy as np

from compiler import blas
from compiler.autodiff import OwnBackward
from compiler.autodiff import backward as engine_backward
from compiler.errors import OpError
from compiler.ir import collect, next_seq
from compiler.registry import OpDef

from ._state import STATE
from .dispatch import TapeNode, node_of
from .tensor import Tensor, make, version_counter, wrap

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _not_runnable(*args, **kwargs):
    raise OpError("fused: an eager fused op's tape node has no impl (it only runs a backward)")


FUSED_OPDEF = OpDef("fused", -1, _not_runnable, _not_runnable, vjp=(), saves=frozenset())


class FusedNode(TapeNode, OwnBackward):
    """The tape node of one fused op: `grad_rule(node, e, g, value_of)` gives the
    gradient per input (None where none is needed); `extra` holds what the forward
    saved for it (freed with the node's value); `composite(*tensors)` computes the same
    with primitives (what `unfuse` puts in its place when the tape is read as a graph)."""

    __slots__ = ("grad_rule", "extra", "composite", "watched")

    def route(self, e, g, value_of):
        return list(zip(self.inputs, self.grad_rule(self, e, g, value_of)))

    def release(self):
        self.value = self.extra = None

    def name(self) -> str:
        return self.op

    @property
    def opdef(self):
        return FUSED_OPDEF


_OFF = [0]  # depth of `composites()` blocks


def enabled() -> bool:
    """True when an eager op may run fused: nothing is recording primitives (and no
    `composites()` block is open)."""
    return STATE.tracer is None and not STATE.recorders and not _OFF[0]


@contextlib.contextmanager
def composites():
    """Run the composites instead of the fused ops inside the block (to compare the two,
    or to rule fusion out while debugging)."""
    _OFF[0] += 1
    try:
        yield
    finally:
        _OFF[0] -= 1


def result(name, out, inputs, grad_rule, composite, extra=None, saves=(), closed=()):
    """The tensor of fused op `name`'s result `out`, with a `FusedNode` when grad mode is
    on and an input requires grad. `saves`: tensors whose values the NumPy backward reads
    (a later in-place update of one makes backward raise, as for any op); `closed`:
    tensors `composite` reads besides the inputs (cross-entropy's targets). The versions
    of the inputs and of `closed` are kept too: a rerun of the composite (`replay`,
    `unfuse`) raises rather than read values updated since."""
    if not (STATE.grad and any(t._rg for t in inputs)):
        return make(out)
    node = FusedNode(name, tuple(node_of(t) for t in inputs), {}, out.shape, out.dtype, True)
    node.value, node.ref, node.grad_rule, node.extra = out, None, grad_rule, extra
    node.composite = composite
    node.watched = tuple((vc, vc[0]) for vc in map(version_counter, (*inputs, *closed)))
    node.saved = tuple((vc, vc[0]) for vc in map(version_counter, saves))
    return make(out, True, node)


def replay(node, e, g, value_of) -> list:
    """The gradients of a fused node from its composite: run again from the inputs (with
    history down to them), then the composite's vjps through `e` (recorded, or with
    history under create_graph). For fused ops whose hand-written backward is NumPy
    only, when the backward's ops must be ops."""
    out = _rerun(node, "backward")
    targets = {id(n): i for i, n in enumerate(node.inputs)}
    found = {}

    def sink(n, gi):
        i = targets.get(id(n))
        if i is not None:
            found[i] = gi

    engine_backward([out._node], [g], e, value_of, sink, stop=frozenset(targets))
    return [found.get(i) for i in range(len(node.inputs))]


def float_tensors(*ts) -> bool:
    """Tensors of one float32/float64 dtype (None entries aside)."""
    if not all(isinstance(t, Tensor) for t in ts if t is not None):
        return False
    dts = {t._data.dtype for t in ts if t is not None}
    return len(dts) == 1 and dts.pop() in _FLOATS


def const(e, array):
    """A NumPy array as a value of emitter `e`'s kind (no history)."""
    return wrap(array)


# ---- linear: x @ W.T + b ----------------------------------------------------------------


def linear(input, weight, bias, composite):
    """F.linear fused (None: take `composite`). The weight's gradient is one product
    g.T @ x laid out as W, where the composite's is (x.T @ g).T, a transposed view."""
    if not enabled() or not float_tensors(input, weight, bias) or input._data.ndim < 2 or \
            weight._data.ndim != 2 or input._data.shape[-1] != weight._data.shape[1] or \
            (bias is not None and bias._data.shape != weight._data.shape[:1]):
        return None
    out = blas.matmul(input._data, weight._data.T)  # (the composite's matmul impl)
    if bias is not None:
        np.add(out, bias._data, out=out)
    ins = (input, weight) if bias is None else (input, weight, bias)
    return result("linear", out, ins, _linear_grad, composite, saves=ins[:2])


def _linear_grad(node, e, g, value_of):
    x_node, w_node = node.inputs[0], node.inputs[1]
    gx = gw = gb = None
    if x_node.requires_grad:
        gx = e("matmul", g, value_of(w_node))
    if w_node.requires_grad:
        x = value_of(x_node)
        rows = int(np.prod(g.shape[:-1]))
        g2 = e("reshape", g, shape=(rows, g.shape[-1])) if g.ndim != 2 else g
        x2 = e("reshape", x, shape=(rows, x.shape[-1])) if x.ndim != 2 else x
        gw = e("matmul", e("permute", g2, dims=(1, 0)), x2)
    if len(node.inputs) > 2 and node.inputs[2].requires_grad:
        gb = e("sum", g, dims=tuple(range(g.ndim - 1)), keepdim=False)
    return (gx, gw, gb)[:len(node.inputs)]


# ---- relu: where(x > 0, x, 0) -------------------------------------------------------------


def relu(input, composite):
    """F.relu fused (None: take `composite`): one fmax pass (NaN -> 0 and -0.0 -> 0, as
    the composite's where) where the composite makes a mask, then selects."""
    if not enabled() or not isinstance(input, Tensor) or input._data.dtype not in _FLOATS:
        return None
    x = input._data
    out = np.fmax(x, x.dtype.type(0))
    res = result("relu", out, (input,), _relu_grad, composite)
    if res._node is not None:
        vc = version_counter(res)
        res._node.saved = ((vc, vc[0]),)
    return res


def _relu_grad(node, e, g, value_of):
    mask = node.value > 0
    if e.in_place:
        gd = g._data
        if np.isfinite(gd).all():  # g * mask is where(mask, g, 0) for a finite g; adding
            out = np.multiply(gd, mask, out=np.empty(gd.shape, gd.dtype))  # 0 makes its
            return (wrap(np.add(out, gd.dtype.type(0), out=out)),)  # -0.0 where's +0.0
    return (e("where", const(e, mask), g, 0),)


# ---- cross_entropy: log_softmax, then nll_loss --------------------------------------------


def cross_entropy(input, target, ignore_index, reduction, check, composite):
    """F.cross_entropy of (N, C) float logits and (N,) int class indices, no class
    weights or label smoothing, fused (None: take `composite`, a function of the logits).
    `check(targets, classes)` raises for out-of-range targets, as the composite does."""
    if not enabled() or not float_tensors(input) or not isinstance(target, Tensor) or \
            input._data.ndim != 2 or target._data.ndim != 1 or \
            target._data.dtype.kind not in "iu" or target._data.shape[0] != input._data.shape[0] \
            or reduction not in ("mean", "sum", "none") or input._data.size == 0:
        return None
    x, t = input._data, target._data
    n, classes = x.shape
    check(t, classes)
    with np.errstate(all="ignore"):
        m = np.maximum.reduce(x, axis=1, keepdims=True)
        m = np.where(np.abs(m) < np.inf, m, x.dtype.type(0))
        shifted = x - m
        ex = np.exp(shifted)
        s = np.add.reduce(ex, axis=1, dtype=x.dtype, keepdims=True)
        hit = (t >= 0) & (t < classes)  # the rows whose target names a class
        rows, cols = np.nonzero(hit)[0], t[hit]
        picked = np.zeros(n, x.dtype)
        picked[rows] = shifted[rows, cols] - np.log(s[rows, 0])
        w = (t != ignore_index).astype(x.dtype)
        losses = -picked * w
        den = np.add.reduce(w, dtype=x.dtype)
        out = losses if reduction == "none" else np.add.reduce(losses, dtype=x.dtype)
        if reduction == "mean":
            out = out / den
    extra = (ex, s, rows, cols, w, den, reduction, m)
    return result("cross_entropy", np.asarray(out, x.dtype), (input,), _ce_grad, composite,
                  extra, closed=(target,))


def _ce_grad(node, e, g, value_of):
    ex, s, rows, cols, w, den, reduction, m = node.extra
    kept = w != 0  # (ignored rows get 0, also for an infinite or NaN g, or den = 0)
    if e.in_place:  # (no history: the forward's exp and sums)
        with np.errstate(all="ignore"):
            coef = np.where(kept, g._data * w if reduction != "mean" else (g._data / den) * w,
                            w.dtype.type(0))
            grad = ex / s
            grad[rows, cols] -= 1
            grad *= coef[:, None]
        return (wrap(grad),)
    x = _inputs(node, "backward")[0]
    exps = e("exp", e("sub", x, const(e, m)))
    p = e("div", exps, e("sum", exps, dims=(1,), keepdim=True))
    onehot = np.zeros(ex.shape, ex.dtype)
    onehot[rows, cols] = 1
    coef = e("where", const(e, kept), e("mul", g if reduction != "mean" else e(
        "div", g, const(e, np.asarray(den))), const(e, w)), 0)
    return (e("mul", e("sub", p, const(e, onehot)), e("reshape", coef, shape=(len(w), 1))),)


# ---- reading the tape as a graph ----------------------------------------------------------


def unfuse(roots) -> list:
    """`roots` (tape nodes), with every `FusedNode` they reach replaced by its composite's
    primitive nodes, so the tape reads as a graph of registry ops (`hn.graph_of`). The
    consumers are rewired in place; backward through them then runs the composite's
    vjps (same gradients). Raises where the fused node's saved values are gone or were
    updated in place since (backward would raise there too)."""
    replaced = {}
    for node in collect(roots):
        if replaced and any(id(i) in replaced for i in node.inputs):
            node.inputs = tuple(replaced.get(id(i), i) for i in node.inputs)
        if isinstance(node, FusedNode):
            replaced[id(node)] = _expand(node)
    return [replaced.get(id(r), r) for r in roots]


def _rerun(node, why):
    """node's composite on its inputs' values, recorded (`_inputs`)."""
    tensors = _inputs(node, why)
    grad, STATE.grad = STATE.grad, True
    _OFF[0] += 1
    try:
        return node.composite(*tensors)
    finally:
        _OFF[0] -= 1
        STATE.grad = grad


def _inputs(node, why) -> list:
    """Tensors of node's input values with history down to the inputs' nodes, sharing
    their version counters; raises where a value was freed, or an input or a tensor the
    composite reads was updated in place since the fused op ran."""
    for n in (node, *node.inputs):
        if n.value is None:
            raise RuntimeError(f"{why}: the values of '{node.op}' ({node.type_str()}) were "
                               "freed by backward(); read the graph before, or pass "
                               "retain_graph=True")
    for vc, version in (*node.saved, *node.watched):
        if vc[0] != version:
            raise RuntimeError(f"{why}: one of the values needed for gradient computation "
                               f"has been modified by an in-place operation: an input of "
                               f"'{node.op}' ({node.type_str()}) is at version {vc[0]}; "
                               f"expected version {version}")
    tensors = []
    for n, (vc, _) in zip(node.inputs, node.watched):
        t = make(n.value, n.requires_grad, n)
        t._vc = vc
        tensors.append(t)
    return tensors


def _expand(node):
    start = next_seq()
    out = _rerun(node, "graph_of")
    new = [n for n in collect([out._node]) if n.seq >= start]
    for k, n in enumerate(new):  # (ordered between the fused node's inputs and its users)
        n.seq = node.seq - 1 + (k + 1) / (len(new) + 1)
    return out._node

