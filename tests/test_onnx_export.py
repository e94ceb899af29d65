"""ONNX export (compiler.export.onnx_export), checked in onnxruntime.

Oracles: the reference interpreter (`Graph.run`) for every primitive case of
test_primitives (float32 and float64) plus the dtype and NaN edge cases below, eager
hybridnet for whole models; `onnx.checker.check_model(full_check=True)` for every model.
"""

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from oracles import R, S, V, make_inputs, seed_of, wrap
from test_primitives import CASES, P

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from compiler.errors import ExportError
from compiler.export.exported import ExportedGraph
from compiler.export.onnx_export import CONVERTERS, UNSUPPORTED, to_onnx
from compiler.ir import Graph, Node
from compiler.registry import REGISTRY
from compiler.reroll import reroll
from hybridnet.dispatch import apply, node_of
from hybridnet.jit.capture_graph import capture

TRANSCENDENTAL = {"erf", "tanh", "sigmoid"}
TOL = {np.float32: 1e-6, np.float64: 1e-12}

# ---- edge cases beyond test_primitives: NaNs, bool/int32 operands, steps, empties -------

NAN = V([[1.0, np.nan, 3.0], [2.0, 5.0, -1.0], [np.nan, 0.0, np.nan]])
B = np.array([[True, False, True], [False, False, True]])
B2 = np.array([[False, True, True]])
I32 = np.array([[3, -1, 0], [2, 5, -4]], dtype=np.int32)
I64T = np.array([[3, 7, 7], [-2, -2, 1]], dtype=np.int64)
ERF_X = np.array([-np.inf, -7.0, -6.0, -5.5, -2.0, -1e-300, -0.0, 0.0, 1e-8, 0.3, 1.0, 2.5,
                  5.9, 6.0, 30.0, np.inf, np.nan])

EXTRA = (
    [P(op, f"onnx-nan-{name}", (NAN,), attrs, grad=False)
     for op in ("max", "min") for name, attrs in [
         ("d1", {"dims": (1,), "keepdim": False}), ("d01k", {"dims": (0, 1), "keepdim": True})]]
    + [P(op, f"onnx-nan-{name}", (NAN,), attrs, grad=False)
       for op in ("argmax", "argmin") for name, attrs in [
           ("d1", {"dim": 1, "keepdim": False}), ("d0k", {"dim": 0, "keepdim": True}),
           ("none", {"dim": None, "keepdim": False}), ("nonek", {"dim": None, "keepdim": True})]]
    + [P(op, "onnx-nan", (V([np.nan, 1.0, 2.0]), V([0.0, np.nan, 3.0])), grad=False)
       for op in ("maximum", "minimum", "add", "lt", "eq", "ne")]
    + [P("sum", "onnx-bool", (B,), {"dims": (1,), "keepdim": False}, grad=False),
       P("sum", "onnx-bool-all", (B,), {"dims": (0, 1), "keepdim": True}, grad=False),
       P("sum", "onnx-bool-size0", (np.zeros((0, 3), bool),), {"dims": (0,), "keepdim": False},
         grad=False),
       P("sum", "onnx-int32", (I32,), {"dims": (0,), "keepdim": True}, grad=False),
       P("max", "onnx-bool", (B,), {"dims": (0,), "keepdim": False}, grad=False),
       P("min", "onnx-bool", (B,), {"dims": (1,), "keepdim": True}, grad=False),
       P("min", "onnx-int32", (I32,), {"dims": (1,), "keepdim": False}, grad=False),
       P("argmax", "onnx-bool", (B,), {"dim": 1, "keepdim": False}, grad=False),
       P("argmin", "onnx-bool-none", (B,), {"dim": None, "keepdim": False}, grad=False),
       P("argmax", "onnx-int64-ties", (I64T,), {"dim": 1, "keepdim": True}, grad=False),
       P("argmin", "onnx-int32", (I32,), {"dim": 0, "keepdim": False}, grad=False)]
    + [P(op, "onnx-bool", (B, B2), grad=False)
       for op in ("lt", "le", "gt", "ge", "eq", "ne", "maximum", "minimum")]
    + [P(op, "onnx-int32", (I32, I32[:1].copy()), grad=False)
       for op in ("add", "sub", "mul", "maximum", "lt", "eq")]
    + [P("neg", "onnx-int32", (I32,), grad=False),
       P("abs", "onnx-bool", (B,), grad=False),
       P("sign", "onnx-zeros-nan", (V([-2.0, -0.0, 0.0, 3.0, np.nan]),), grad=False),
       P("pow", "onnx-nan", (V([-2.0, 4.0, 0.0]), V([0.5, 0.5, -1.0])), grad=False),
       P("div", "onnx-by-zero", (V([1.0, -1.0, 0.0]), V([0.0, 0.0, 0.0])), grad=False),
       P("log", "onnx-edges", (V([0.0, -1.0, np.inf]),), grad=False),
       P("erf", "onnx-wide", (ERF_X,), grad=False),
       P("erf", "onnx-wide-f32", (ERF_X.astype(np.float32),), grad=False),
       P("matmul", "onnx-int32", (I32, I32.T.copy()), grad=False),
       P("where", "onnx-bool", (B, B[::-1].copy(), np.array(True)), grad=False),
       P("where", "onnx-int32", (B, I32, np.array(7, np.int32)), grad=False),
       P("detach", "onnx-bool", (B,), grad=False)]
    + [P("cast", f"onnx-{name}", (x,), {"dtype": dt}, grad=False) for name, x, dt in [
        ("bool-int64", B, "int64"), ("int64-bool", I64T, "bool"), ("int64-int32", I64T, "int32"),
        ("int32-float64", I32, "float64"), ("f-int32", V([-2.7, -0.5, 0.5, 2.7]), "int32"),
        ("f-float64", R((2, 2)), "float64"), ("f-float32", R((2, 2)), "float32")]]
    + [P("slice", "onnx-bool-step", (B,), {"index": ((1, 2, 1), (0, 3, 2))}, grad=False),
       P("slice", "onnx-step-past-end", (R((3, 5)),), {"index": ((2, 3, 5), (1, 5, 7))}),
       P("slice", "onnx-0d", (R(()),), {"index": ()}),
       P("pad_slice", "onnx-3d-steps", (R((2, 3, 2)),),
         {"shape": (5, 7, 4), "index": ((1, 5, 3), (0, 7, 3), (1, 4, 2))}),
       P("pad_slice", "onnx-bool-steps", (B,), {"shape": (4, 7),
                                                "index": ((1, 4, 2), (0, 7, 3))}, grad=False),
       P("pad_slice", "onnx-int64", (I64T,), {"shape": (3, 5), "index": ((1, 3, 1), (2, 5, 1))},
         grad=False),
       P("pad_slice", "onnx-empty", (R((0, 3)),), {"shape": (4, 3),
                                                   "index": ((2, 2, 1), (0, 3, 1))}),
       P("pad_slice", "onnx-big-step", (R((1, 2)),), {"shape": (3, 5),
                                                      "index": ((2, 3, 5), (0, 5, 4))}),
       P("pad_slice", "onnx-0d", (R(()),), {"shape": (), "index": ()}),
       P("take", "onnx-neg-int32", (R((3, 4)), np.array([-1, 0, -4], np.int32)), {"dim": 1}),
       P("take", "onnx-bool", (B, np.array([[1, 0], [0, 0]])), {"dim": 0}, grad=False),
       P("scatter_add", "onnx-neg", (R((2, 3)), np.array([-1, 0, -1])), {"dim": 1, "size": 2}),
       P("scatter_add", "onnx-0d-index", (R((2, 3)), np.array(-1)), {"dim": 1, "size": 4}),
       P("scatter_add", "onnx-empty", (R((2, 0)), np.zeros((0,), np.int64)),
         {"dim": 1, "size": 3}),
       P("scatter_add", "onnx-3d", (R((2, 2, 2, 3)), np.array([[0, 2], [2, 2]], np.int32)),
         {"dim": 1, "size": 3}),
       P("scatter_add", "onnx-bool", (B, np.array([1, 1, 0])), {"dim": 1, "size": 2},
         grad=False),
       P("scatter_add", "onnx-int64", (I64T, np.array([0, 0])), {"dim": 0, "size": 3},
         grad=False),
       P("cat", "onnx-bool", (B, B2, np.zeros((0, 3), bool)), {"dim": 0}, grad=False),
       P("cat", "onnx-dim2", (R((2, 1, 2)), R((2, 1, 3))), {"dim": 2}),
       P("reshape", "onnx-bool", (B,), {"shape": (3, 1, 2)}, grad=False),
       P("reshape", "onnx-same", (R((2, 3)),), {"shape": (2, 3)}),
       P("expand", "onnx-int-0d", (np.array(4, np.int64),), {"shape": (2, 3)}, grad=False),
       P("expand", "onnx-bool", (B2,), {"shape": (2, 2, 3)}, grad=False),
       P("permute", "onnx-bool", (B,), {"dims": (1, 0)}, grad=False),
       P("permute", "onnx-identity", (R((2, 3)),), {"dims": (0, 1)}),
       P("mul", "onnx-const-f", (R((2, 3)), S(-1.5))),
       P("add", "onnx-0d-int", (np.array(3, np.int64), I64T), grad=False)]
    + [P("unfold", "onnx-int64", (np.arange(2 * 2 * 5 * 6).reshape(2, 2, 5, 6),),
         {"kernel": (2, 3), "dilation": (2, 1), "stride": (1, 2)}, grad=False),
       P("unfold", "onnx-bool", (np.arange(30).reshape(1, 2, 3, 5) % 3 == 0,),
         {"kernel": (2, 2), "dilation": (1, 1), "stride": (1, 1)}, grad=False),
       P("unfold", "onnx-empty-batch", (R((0, 2, 4, 4)),),
         {"kernel": (3, 3), "dilation": (1, 1), "stride": (1, 1)}),
       P("fold", "onnx-int64", (np.arange(2 * 2 * 2 * 3 * 2 * 2).reshape(2, 2, 2, 3, 2, 2),),
         {"size": (3, 3), "kernel": (2, 2), "dilation": (1, 1), "stride": (1, 1)}, grad=False),
       P("fold", "onnx-bool", (np.arange(36).reshape(1, 3, 3, 1, 2, 2) % 4 == 0,),
         {"size": (4, 4), "kernel": (2, 2), "dilation": (1, 1), "stride": (1, 1)}, grad=False),
       P("fold", "onnx-empty-batch", (R((0, 2, 2, 3, 3, 3)),),
         {"size": (4, 4), "kernel": (3, 3), "dilation": (1, 1), "stride": (1, 1)})]
)
ALL_CASES = CASES + EXTRA


def _has_float_spec(case) -> bool:
    return any(not isinstance(spec, np.ndarray) for spec in case.inputs)


PARAMS = [pytest.param(c, np.float32, id=f"{c.id}-f32") for c in ALL_CASES] + [
    pytest.param(c, np.float64, id=f"{c.id}-f64") for c in ALL_CASES if _has_float_spec(c)]


# ---- helpers ---------------------------------------------------------------------------------


def _session(data: bytes):
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _run(data: bytes, feeds: dict) -> list:
    return _session(data).run(None, {k: np.asarray(v, order="C") for k, v in feeds.items()})


def _assert_same(got, expected, rtol=1e-6, atol=1e-6):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, expected)


def _record_op(case, arrays):
    with hn.record():
        out = apply(case.op, wrap(arrays), case.attrs)
        graph = Graph.from_outputs([node_of(out)])
    return graph


def _feed(graph, arrays, values):
    """Arrays for the graph's inputs: the k-th case array's node gets values[k]."""
    fed = []
    for node in graph.inputs:
        k = next((k for k, a in enumerate(arrays) if node.value is a), None)
        fed.append(node.value if k is None else values[k])
    return fed


def _args_only(graph, name="op") -> ExportedGraph:
    names = [f"x{i}" for i in range(len(graph.inputs))]
    return ExportedGraph(graph, names, len(names), {}, ["y"], 1, name=name)


# ---- the tables --------------------------------------------------------------------------------


def test_every_registry_op_is_converted_or_refused_with_a_reason():
    missing = sorted(set(REGISTRY) - set(CONVERTERS) - set(UNSUPPORTED))
    assert not missing, f"ops with neither an ONNX converter nor a refusal: {missing}"
    assert not set(CONVERTERS) & set(UNSUPPORTED)
    assert set(CONVERTERS) | set(UNSUPPORTED) <= set(REGISTRY), "stale table entries"
    assert all(isinstance(r, str) and len(r) > 20 for r in UNSUPPORTED.values())
    assert {"loop", "loop_out"} <= set(UNSUPPORTED)


def test_every_converted_op_has_a_case_here():
    covered = {c.op for c in ALL_CASES} | {"const"}  # constants: the scalar operand cases
    assert set(CONVERTERS) <= covered, sorted(set(CONVERTERS) - covered)


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_each_primitive_case_runs_in_onnxruntime_as_the_interpreter(case, dtype):
    arrays = make_inputs(case.inputs, dtype, seed_of(case.id))
    graph = _record_op(case, arrays)
    exported = _args_only(graph)
    if case.op in UNSUPPORTED:
        with pytest.raises(ExportError, match=case.op):
            to_onnx(exported)
        return
    data = to_onnx(exported)
    names = exported.input_names
    tol = 1e-5 if case.op in TRANSCENDENTAL and dtype == np.float32 else TOL[dtype]
    fresh = make_inputs(case.inputs, dtype, seed_of(case.id) + 7)
    for values in (arrays, fresh):
        fed = _feed(graph, arrays, values)
        (expected,) = graph.run(*fed)
        (got,) = _run(data, dict(zip(names, fed)))
        _assert_same(got, expected, tol, tol)


# ---- whole models ---------------------------------------------------------------------------


def _record_model(fn, args, arg_names, module=None):
    """(ExportedGraph, eager results): arguments first, then the module's parameters (by
    named_parameters), then any other leaf the call read (a literal) as a weight."""
    params = list(module.named_parameters()) if module is not None else []
    with hn.record():
        outs = fn(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        graph = Graph.from_outputs([node_of(t) for t in outs])
        arg_nodes = [node_of(a) for a in args]
        param_nodes = [(name, node_of(p)) for name, p in params]
    present = {id(n) for n in graph.inputs}
    weights = [(name, n) for name, n in param_nodes if id(n) in present]
    known = {id(n) for n in arg_nodes} | {id(n) for _, n in weights}
    weights += [(f"captured{k}", n) for k, n in
                enumerate(n for n in graph.inputs if id(n) not in known)]
    inputs = arg_nodes + [n for _, n in weights]
    assert {id(n) for n in inputs} == present
    graph = Graph(graph.nodes, inputs, graph.outputs)
    names = [f"out{k}" for k in range(len(outs))]
    exported = ExportedGraph(graph, list(arg_names) + [name for name, _ in weights],
                             len(args), {name: np.asarray(n.value) for name, n in weights},
                             names, len(outs))
    return exported, [t.detach().numpy() for t in outs]


def _check_model(exported, eager, fresh_args=None, rtol=1e-5, atol=1e-6):
    data = to_onnx(exported)
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == exported.input_names[:exported.n_args]
    assert {i.name for i in model.graph.initializer} >= set(exported.weights)
    assert model.producer_name == "hybridnet" and model.opset_import[0].version == 17
    args = [node.value for node in exported.arg_inputs]
    got = _run(data, dict(zip(exported.input_names, args)))
    for g, e in zip(got, eager, strict=True):
        _assert_same(g, e, rtol, atol)
    if fresh_args is not None:  # new arguments: onnxruntime == the interpreter
        expected = exported.graph.run(*fresh_args, *exported.weight_arrays())
        got = _run(data, dict(zip(exported.input_names, fresh_args)))
        for g, e in zip(got, expected, strict=True):
            _assert_same(g, e, rtol, atol)
    return data


def _mlp():
    hn.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_an_mlp_exports_and_matches_eager():
    model = _mlp()
    x = hn.randn(5, 4)
    exported, eager = _record_model(model, (x,), ["x"], model)
    assert exported.input_names[1:] == [n for n, _ in model.named_parameters()]
    _check_model(exported, eager, [np.random.default_rng(1).standard_normal((5, 4))
                                   .astype(np.float32)])


def test_softmax_cross_entropy_with_int_labels_and_an_ignored_one():
    logits = hn.randn(6, 5)
    labels = hn.tensor(np.array([0, 4, -100, 1, 3, 2]))
    exported, eager = _record_model(F.cross_entropy, (logits, labels), ["logits", "labels"])
    assert labels.numpy().dtype == np.int64 and eager[0].shape == ()
    rng = np.random.default_rng(2)
    fresh = [rng.standard_normal((6, 5)).astype(np.float32) * 10,
             np.array([4, 4, 0, -100, 1, 2])]
    _check_model(exported, eager, fresh)


def test_an_elementwise_chain_exports_and_matches_eager():
    def chain(x, y):
        z = hn.tanh(x) * hn.sigmoid(y) + hn.sqrt(hn.abs(x) + 1.0) - hn.exp(-x * x) / 2.0
        z = hn.where(x > y, z, z ** 2)
        return hn.maximum(z, y).sum(1), (z.amax(0) >= 0)

    x, y = hn.randn(3, 4), hn.randn(4)
    exported, eager = _record_model(chain, (x, y), ["x", "y"])
    rng = np.random.default_rng(3)
    _check_model(exported, eager, [rng.standard_normal((3, 4)).astype(np.float32),
                                   rng.standard_normal(4).astype(np.float32)])


def _rnn(steps=5):
    hn.manual_seed(1)
    cell = nn.RNNCell(4, 6)

    def run(xs, h):
        outs = []
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
            outs.append(h)
        return h, hn.stack(outs)

    return cell, run, (hn.randn(steps, 3, 4), hn.zeros(3, 6))


def test_an_rnn_cell_unrolled_over_5_steps_exports_and_matches_eager():
    cell, run, args = _rnn()
    exported, eager = _record_model(run, args, ["xs", "h0"], cell)
    assert exported.n_args == 2 and len(exported.weights) == 4
    rng = np.random.default_rng(4)
    _check_model(exported, eager, [rng.standard_normal((5, 3, 4)).astype(np.float32),
                                   rng.standard_normal((3, 6)).astype(np.float32)])


def test_a_float64_model_stays_float64():
    hn.manual_seed(5)
    model = nn.Linear(3, 2, dtype=hn.float64)
    x = hn.randn(4, 3, dtype=hn.float64)
    exported, eager = _record_model(lambda t: hn.erf(model(t)), (x,), ["x"], model)
    data = _check_model(exported, eager, rtol=1e-12, atol=1e-12)
    model_proto = onnx.load_from_string(data)
    double = onnx.TensorProto.DOUBLE
    assert model_proto.graph.output[0].type.tensor_type.elem_type == double
    assert all(i.data_type == double for i in model_proto.graph.initializer
               if i.name in exported.weights)


class _SmallCNN(nn.Module):
    """Conv, batch norm, pools (max, avg with ceil_mode, adaptive), grouped and strided
    conv, a transposed-conv branch: every conv and pool is unfold/fold underneath."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2, groups=2)
        self.avg = nn.AvgPool2d(2, ceil_mode=True)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 3)
        self.up = nn.ConvTranspose2d(6, 2, 3, stride=2, output_padding=1)

    def forward(self, x):
        h = self.pool(F.relu(self.bn(self.conv1(x))))
        h = self.conv2(h)  # (N, 6, 3, 3)
        logits = self.fc(hn.flatten(self.gap(self.avg(h)), 1))
        return logits, self.up(h)


def test_a_small_cnn_exported_with_hn_export_matches_hybridnet():
    hn.manual_seed(7)
    model = _SmallCNN()
    x = hn.randn(2, 1, 14, 14)
    model.train()
    model(x * 2.0 + 0.5)  # one training-mode forward: running stats move off 0 and 1
    assert not np.allclose(model.bn.running_mean.numpy(), 0.0)
    model.eval()  # export refuses graphs that update state
    data = hn.export(model, x, format="onnx")
    graph_ops = {n.op_type for n in onnx.load_from_string(data).graph.node}
    assert {"Gather", "ScatterElements"} <= graph_ops  # unfold and fold
    rng = np.random.default_rng(8)
    fresh = rng.standard_normal((2, 1, 14, 14)).astype(np.float32)
    session = _session(data)
    (name,) = [i.name for i in session.get_inputs()]
    for arg in (x.numpy(), fresh):
        got = session.run(None, {name: arg})
        with hn.no_grad():
            want = model(hn.from_numpy(arg))
        assert len(got) == 2 and got[0].shape == (2, 3) and got[1].shape == (2, 2, 8, 8)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w.numpy(), rtol=1e-5, atol=1e-6)


# ---- guards, names, opsets ---------------------------------------------------------------------


def test_guards_of_a_captured_call_are_outputs_with_their_expected_values():
    logits, labels = hn.randn(4, 3), hn.tensor(np.array([0, 2, 1, 1]))
    exported, result = capture(F.cross_entropy, (logits, labels))
    assert exported.guards, "cross_entropy branches on its targets' range"
    data = to_onnx(exported)
    model = onnx.load_from_string(data)
    meta = {p.key: p.value for p in model.metadata_props}
    guards = json.loads(meta["hybridnet.guards"])
    names = [o.name for o in model.graph.output]
    assert names == exported.output_names
    assert [g["output"] for g in guards] == names[exported.n_results:]
    assert [(g["kind"], g["expected"]) for g in guards] == \
        [(kind, value) for _, kind, value in exported.guards]
    doc = model.graph.output[exported.n_results].doc_string
    assert "guard" in doc and repr(exported.guards[0][2]) in doc
    outs = _run(data, dict(zip(exported.input_names, [logits.numpy(), labels.numpy()])))
    _assert_same(outs[0], result.numpy(), 1e-6, 1e-6)
    assert [o.item() for o in outs[exported.n_results:]] == [v for _, _, v in exported.guards]


def test_guard_outputs_are_named_guard_k_when_only_results_are_named():
    x = hn.randn(3)
    with hn.record():
        y = hn.exp(x)
        positive = y.sum() > 1.0
        graph = Graph.from_outputs([node_of(y), node_of(positive)])
    exported = ExportedGraph(graph, ["x"], 1, {}, ["y"], 1, [(1, "bool", True)])
    model = onnx.load_from_string(to_onnx(exported))
    assert [o.name for o in model.graph.output] == ["y", "guard0"]
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["hybridnet.guards"]) == [
        {"output": "guard0", "kind": "bool", "expected": True}]
    out = _run(model.SerializeToString(), {"x": x.numpy()})
    assert out[1].dtype == np.bool_ and out[1].item() is True


def test_user_names_that_look_like_internal_names_do_not_clash():
    with hn.record():
        a, b = hn.randn(2, 3), hn.randn(2, 3)
        out = a * b + 2.0
        graph = Graph.from_outputs([node_of(out)])
    exported = ExportedGraph(graph, ["v1", "c0"], 2, {}, ["v2"], 1)
    got = _run(to_onnx(exported), {"v1": a.numpy(), "c0": b.numpy()})
    _assert_same(got[0], out.numpy())


@pytest.mark.parametrize("opset", [18, 21])
def test_later_opsets_take_reduce_axes_as_inputs_and_still_run(opset):
    case = P("max", "opset", (NAN,), {"dims": (1,), "keepdim": True}, grad=False)
    arrays = make_inputs(case.inputs, np.float32, 0)
    graph = _record_op(case, arrays)
    data = to_onnx(_args_only(graph), opset=opset)
    model = onnx.load_from_string(data)
    assert model.opset_import[0].version == opset
    reduce_max = next(n for n in model.graph.node if n.op_type == "ReduceMax")
    assert len(reduce_max.input) == 2 and not reduce_max.attribute[1:]
    (got,) = _run(data, {"x0": graph.inputs[0].value})
    _assert_same(got, graph.run(graph.inputs[0].value)[0])


def test_an_opset_below_17_is_refused():
    graph = _record_op(P("neg", "o", (R((2,)),)), [np.ones(2, np.float32)])
    with pytest.raises(ExportError, match="opset 16"):
        to_onnx(_args_only(graph), opset=16)


def test_the_same_graph_gives_the_same_bytes():
    model = _mlp()
    x = hn.randn(5, 4)
    first, _ = _record_model(model, (x,), ["x"], model)
    again, _ = _record_model(model, (x,), ["x"], model)  # new nodes, same structure
    data = to_onnx(first)
    assert data == to_onnx(first) == to_onnx(again)
    names = [n.name for n in onnx.load_from_string(data).graph.node]
    assert len(set(names)) == len(names)


# ---- refusals -------------------------------------------------------------------------------


def test_a_rerolled_loop_is_refused_naming_the_op():
    cell, run, args = _rnn(steps=8)
    exported, _ = _record_model(run, args, ["xs", "h0"], cell)
    looped, made = reroll(exported.graph)
    assert made >= 1 and any(n.op == "loop" for n in looped.nodes)
    bad = ExportedGraph(looped, exported.input_names, exported.n_args, exported.weights,
                        exported.output_names, exported.n_results)
    with pytest.raises(ExportError, match=r"op 'loop'.*rerolling"):
        to_onnx(bad)
    to_onnx(exported)  # the unrolled graph itself exports


def test_an_op_without_a_converter_is_refused_naming_it():
    x = Node("input", (), {"shape": (2,), "dtype": "float32"}, (2,), np.float32)
    odd = Node("frobnicate", (x,), {}, (2,), np.float32)
    with pytest.raises(ExportError, match="frobnicate"):
        to_onnx(ExportedGraph(Graph([x, odd], [x], [odd]), ["x"], 1, {}, ["y"], 1))


def test_a_node_whose_recorded_type_disagrees_with_onnx_fails_the_checker():
    x = Node("input", (), {"shape": (2,), "dtype": "float32"}, (2,), np.float32)
    wrong = Node("neg", (x,), {}, (2,), np.float64)  # neg of float32 recorded as float64
    out = Node("neg", (wrong,), {}, (2,), np.float64)
    with pytest.raises(ExportError, match="checker"):
        to_onnx(ExportedGraph(Graph([x, wrong, out], [x], [out]), ["x"], 1, {}, ["y"], 1))


def test_a_weight_missing_from_the_weights_is_refused():
    model = _mlp()
    exported, _ = _record_model(model, (hn.randn(2, 4),), ["x"], model)
    del exported.weights["0.bias"]
    with pytest.raises(ExportError, match="0.bias"):
        to_onnx(exported)


def test_without_the_onnx_package_the_error_says_how_to_install_it(monkeypatch):
    graph = _record_op(P("neg", "o", (R((2,)),)), [np.ones(2, np.float32)])
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.raises(ExportError) as info:
        to_onnx(_args_only(graph))
    assert str(info.value) == ("format='onnx' needs the onnx package: "
                               "pip install 'hybridnet[onnx]'")
