"""Symbolic backward (`compiler.autodiff.grad_graph`): the eager vjp rules, run by the
graph emitter, give a graph whose gradients equal eager `hn.grad`, for every
differentiable primitive (table-driven from the primitive cases) and for composites;
and the backward walk orders nodes topologically, not by creation."""

import numpy as np
import pytest
from oracles import flat, is_float, make_inputs, wrap
from test_primitives import GRAD_CASES

import hybridnet as hn
import hybridnet.nn.functional as F
from compiler.autodiff import grad_graph, reachable
from compiler.ir import Node
from compiler.registry import REGISTRY, Trait


def _record(fn, arrays, wrt):
    tensors = wrap(arrays)
    for i in wrt:
        tensors[i].requires_grad_()
    outs = [o for o in flat(fn(*tensors)) if is_float(o._data) and o.requires_grad]
    return tensors, outs, hn.graph_of(*outs)


def _compare(fn, specs, seed, wrt=None, dtype=np.float64, rtol=1e-10, atol=1e-12):
    arrays = make_inputs(specs, dtype, seed)
    if wrt is None:
        wrt = [i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and is_float(a)]
    tensors, outs, graph = _record(fn, arrays, wrt)
    assert outs, "no output requires grad"
    rng = np.random.default_rng(seed + 1)
    seeds = [rng.standard_normal(o.shape).astype(o._data.dtype) for o in outs]
    eager = hn.grad(outs, [tensors[i] for i in wrt], grad_outputs=[hn.from_numpy(s) for s in
                                                                   seeds], allow_unused=True)
    leaf = {id(t._node): i for i, t in enumerate(tensors)
            if isinstance(t, hn.Tensor) and t._node is not None}
    targets = [n for n in graph.inputs if leaf.get(id(n)) in wrt]
    joint = grad_graph(graph, targets)
    joint.verify()
    fed = [n.value for n in graph.inputs] + seeds
    results = joint.run(*fed)
    got = dict(zip((leaf[id(n)] for n in targets), results[len(outs):]))
    for out, res in zip(outs, results[:len(outs)]):
        np.testing.assert_array_equal(out._data, res)
    for i, g in zip(wrt, eager):
        want = np.zeros(np.shape(arrays[i])) if g is None else g._data
        np.testing.assert_allclose(got[i], want, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")
        assert got[i].dtype == arrays[i].dtype


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_symbolic_grad_of_every_primitive_equals_eager(case):
    _compare(case.fn, case.inputs, 11, case.wrt)


def _mlp(x, w1, b1, w2, b2, target):
    h = hn.relu(x @ w1.T + b1)
    return F.cross_entropy(h @ w2.T + b2, target)


@pytest.mark.parametrize("name,fn,shapes", [
    ("softmax", lambda x: hn.softmax(x, -1), [(4, 5)]),
    ("log_softmax", lambda x: hn.log_softmax(x, 1), [(3, 6)]),
    ("logsumexp", lambda x: hn.logsumexp(x, 0), [(5, 2)]),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (6,), w, b), [(4, 6), (6,), (6,)]),
    ("gelu", lambda x: F.gelu(x), [(7,)]),
    ("var", lambda x: hn.var(x, 1), [(3, 4)]),
    ("max(dim)", lambda x: hn.max(x, 1).values, [(3, 5)]),
    ("tanh rnn", lambda x, wx, wh: _rnn(x, wx, wh), [(5, 2, 3), (4, 3), (4, 4)]),
    ("matmul broadcast", lambda a, b: (a @ b).sum(), [(2, 3, 4), (4, 5)]),
])
def test_symbolic_grad_of_composites_equals_eager(name, fn, shapes):
    class Spec:
        def __init__(self, shape):
            self.shape = shape

        def make(self, rng, dtype):
            return rng.standard_normal(self.shape).astype(dtype)

    _compare(fn, [Spec(s) for s in shapes], 3)


def test_symbolic_grad_of_an_mlp_loss_in_float32():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              [(8, 10), (16, 10), (16,), (3, 16), (3,)]] + [rng.integers(0, 3, 8)]
    _compare_arrays(_mlp, arrays, wrt=[1, 2, 3, 4])


def _compare_arrays(fn, arrays, wrt):
    _compare(fn, arrays, 0, wrt, dtype=np.float32, rtol=1e-5, atol=1e-6)


def _rnn(x, wx, wh):
    h = hn.zeros(x.shape[1], wh.shape[0], dtype=x.dtype)
    for t in range(x.shape[0]):
        h = (x[t] @ wx.T + h @ wh.T).tanh()
    return h.sum()


def test_an_unused_input_gets_a_zero_gradient():
    x = Node("input", (), {}, (3,), np.float32, True)
    y = Node("input", (), {}, (2,), np.float32, True)
    from compiler.emitter import GraphEmitter
    from compiler.ir import Graph
    e = GraphEmitter()
    out = e("exp", x)
    joint = grad_graph(Graph([x, y, out], [x, y], [out]))
    res = joint.run(np.zeros(3, np.float32), np.ones(2, np.float32), np.ones(3, np.float32))
    np.testing.assert_array_equal(res[1], np.ones(3, np.float32))
    np.testing.assert_array_equal(res[2], np.zeros(2, np.float32))


def test_backward_order_is_topological_not_by_creation():
    # a node created after its user (as a pass rewriting a graph would do)
    x = Node("input", (), {}, (3,), np.float32, True)
    late = Node("exp", (x,), {}, (3,), np.float32, True)
    user = Node("neg", (late,), {}, (3,), np.float32, True)
    user.seq, late.seq = late.seq, user.seq  # the user now looks older
    order = reachable([user])
    assert [n.op for n in order] == ["neg", "exp", "input"]


# ---- forward / backward partition --------------------------------------------------------


def _split_and_run(fn, arrays, wrt, recompute=False):
    from compiler.partition import partition
    tensors, outs, graph = _record(fn, arrays, wrt)
    leaf = {id(t._node): i for i, t in enumerate(tensors)
            if isinstance(t, hn.Tensor) and t._node is not None}
    targets = [n for n in graph.inputs if leaf.get(id(n)) in wrt]
    joint = grad_graph(graph, targets)
    rng = np.random.default_rng(5)
    seeds = [rng.standard_normal(o.shape).astype(o._data.dtype) for o in outs]
    fed = [n.value for n in graph.inputs]
    want = joint.run(*fed, *seeds)
    split = partition(joint, len(outs), len(seeds), recompute)
    split.forward.verify()
    split.backward.verify()
    fwd = split.forward.run(*fed)
    saved = fwd[len(outs):]
    assert len(saved) == split.saved
    grads = split.backward.run(*saved, *seeds)
    for a, b in zip(fwd[:len(outs)] + grads, want):
        np.testing.assert_array_equal(a, b)
    return split


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_partition_of_every_primitive_reproduces_the_joint_graph(case, recompute):
    arrays = make_inputs(case.inputs, np.float64, 11)
    wrt = case.wrt if case.wrt is not None else [
        i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and is_float(a)]
    _split_and_run(case.fn, arrays, wrt, recompute)


def test_partition_of_an_mlp_saves_forward_values_and_recomputes_nothing_late():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              [(8, 10), (16, 10), (16,), (3, 16), (3,)]] + [rng.integers(0, 3, 8)]
    split = _split_and_run(_mlp, arrays, [1, 2, 3, 4])
    fwd_ops = {n.op for n in split.forward.nodes}
    assert "matmul" in fwd_ops and split.saved > 0
    # the backward reads no forward input directly: everything it needs is saved or a seed
    assert all(n.op in ("input", "const") or any(i in split.backward.nodes for i in n.inputs)
               for n in split.backward.nodes)


def _compiled(graph):
    from compiler.lowering.numba_codegen import lower
    from compiler.passes.manager import optimize
    from runtime.numba_engine import compile_program
    opt, _ = optimize(graph)
    kernel = compile_program(lower(opt))

    def run(*arrays):  # (0-d values travel as 1-element arrays, as the executor does)
        outs = kernel(*[np.reshape(a, (1,)) if np.ndim(a) == 0 else a for a in arrays])
        outs = outs if isinstance(outs, tuple) else (outs,)
        return [np.reshape(o, n.shape) for o, n in zip(outs, opt.outputs)]
    return run


def test_an_mlps_forward_and_backward_compile_and_match_the_interpreter():
    from compiler.partition import partition
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              [(8, 10), (16, 10), (16,), (3, 16), (3,)]] + [rng.integers(0, 3, 8)]
    tensors, outs, graph = _record(_mlp, arrays, [1, 2, 3, 4])
    joint = grad_graph(graph, [t._node for t in tensors[1:5]])
    split = partition(joint, len(outs), 1)
    fed, seed = [n.value for n in graph.inputs], np.ones((), np.float32)
    fwd = _compiled(split.forward)(*fed)
    want_fwd = split.forward.run(*fed)
    for a, b in zip(fwd, want_fwd):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    bwd = _compiled(split.backward)(*fwd[len(outs):], seed)
    eager = hn.grad(outs, tensors[1:5])
    for a, b in zip(bwd, eager):
        np.testing.assert_allclose(a, b._data, rtol=1e-4, atol=1e-5)


def test_an_optimized_split_of_an_mlp_compiles_and_matches_eager():
    from compiler.gradient import split_gradient
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              [(8, 10), (16, 10), (16,), (3, 16), (3,)]] + [rng.integers(0, 3, 8)]
    tensors, outs, graph = _record(_mlp, arrays, [1, 2, 3, 4])
    split, report = split_gradient(graph, [t._node for t in tensors[1:5]])
    assert {r["name"] for r in report} == {"loop_grad", "constfold", "simplify", "cse", "dce"}
    assert not report[0]["changed"]  # (no loop)
    fed = [n.value for n in graph.inputs]
    fwd = _compiled(split.forward)(*fed)
    np.testing.assert_allclose(fwd[0], outs[0]._data, rtol=1e-6)
    grads = _compiled(split.backward)(*fwd[1:], np.ones((), np.float32))
    for g, t in zip(grads, hn.grad(outs, tensors[1:5])):
        np.testing.assert_allclose(g, t._data, rtol=1e-4, atol=1e-5)


def _gelu_mlp(x, w1, w2):
    return (F.gelu(F.gelu(x @ w1) @ w2) * 1.5).sum()


def test_the_recompute_policy_moves_cheap_elementwise_values_into_the_backward():
    from compiler.partition import partition
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in [(6, 5), (5, 7), (7, 4)]]
    split = _split_and_run(_gelu_mlp, arrays, [1, 2], recompute=True)  # (values equal the
    tensors, outs, graph = _record(_gelu_mlp, arrays, [1, 2])            # joint graph's)
    targets = [n for n in graph.inputs if n.requires_grad]
    joint = grad_graph(graph, targets)
    plain = partition(joint, 1, 1)
    assert split.recomputed, "gelu's terms should be recomputed"
    size = lambda g, k: sum(int(np.prod(n.shape)) for n in g.forward.outputs[-k:])  # noqa: E731
    assert size(split, split.saved) <= size(plain, plain.saved)
    fixed = {id(n) for n in joint.inputs} | {id(n) for n in joint.outputs[:1]}
    for node in split.recomputed:  # elementwise, never read from the call's inputs/results
        assert REGISTRY[node.op].has(Trait.ELEMENTWISE)
        assert not any(id(i) in fixed for i in node.inputs
                       if not any(i is s for s in plain.forward.outputs[1:]))
