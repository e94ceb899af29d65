"""The recorded graph: graph_of, record(), printing, verify, run, networkx, DOT."""

import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import hybridnet as hn
from compiler.errors import OpError


def _mlp_graph():
    x = hn.randn(4, 3)
    w = hn.randn(3, 2, requires_grad=True)
    b = hn.randn(2, requires_grad=True)
    y = ((x @ w + b).tanh() * 2.0).sum()
    return x, w, b, y


def test_graph_of_lists_leaves_nodes_and_outputs():
    x, w, b, y = _mlp_graph()
    g = hn.graph_of(y)
    assert isinstance(g, hn.Graph)
    assert [n.op for n in g.inputs] == ["input"] * 3
    assert [n.shape for n in g.inputs] == [(4, 3), (3, 2), (2,)]
    ops = [n.op for n in g.nodes if not n.is_source]
    assert ops == ["matmul", "add", "tanh", "mul", "sum"]
    assert g.outputs[0].shape == () and g.outputs[0].op == "sum"
    g.verify()


def test_graph_text_is_readable_and_stable():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x + 1.0).sum()
    text = str(hn.graph_of(y))
    assert text.splitlines() == [
        "graph(%0: float32[2]) {",
        "  %1 = mul(%0, %0) : float32[2]",
        "  %2 = const(value=1.0, dtype='float32') : float32[]",
        "  %3 = add(%1, %2) : float32[2]",
        "  %4 = sum(%3, dims=(0,), keepdim=False) : float32[]",
        "  return (%4)",
        "}",
    ]


def test_graph_run_reexecutes_on_new_inputs():
    x, w, b, y = _mlp_graph()
    g = hn.graph_of(y)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs]
    (out,) = g.run(*xs)
    ref = (np.tanh(xs[0] @ xs[1] + xs[2]) * 2).sum()
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_graph_run_rejects_wrong_inputs():
    _, _, _, y = _mlp_graph()
    g = hn.graph_of(y)
    with pytest.raises(OpError, match="expected 3 input arrays"):
        g.run(np.zeros((4, 3), np.float32))
    with pytest.raises(OpError, match="input 0 should be float32"):
        g.run(np.zeros((5, 3)), np.zeros((3, 2)), np.zeros(2))


def test_structural_hash_depends_on_structure_not_values():
    def build(v):
        x = hn.tensor(v, requires_grad=True)
        return hn.graph_of((x.exp() * 2.0).sum())
    h1 = build([1.0, 2.0]).structural_hash()
    h2 = build([5.0, -2.0]).structural_hash()
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    h3 = hn.graph_of((x.tanh() * 2.0).sum()).structural_hash()
    assert h1 == h2 and h1 != h3


def test_verify_catches_corrupted_shape():
    _, _, _, y = _mlp_graph()
    g = hn.graph_of(y)
    node = next(n for n in g.nodes if n.op == "tanh")
    node.shape = (9, 9)
    with pytest.raises(OpError, match="recorded as"):
        g.verify()


def test_record_block_records_ops_without_grad():
    with hn.record() as rec:
        a = hn.tensor([1.0, 2.0])
        b = (a * 3.0).exp()
        c = b.sum()
    g = rec.graph
    assert [n.op for n in g.nodes if not n.is_source] == ["mul", "exp", "sum"]
    assert g.outputs[-1].op == "sum"
    assert not c.requires_grad
    (out,) = g.run(np.array([0.0, 1.0], np.float32))
    np.testing.assert_allclose(out, np.exp([0.0, 3.0]).sum(), rtol=1e-6)


def test_no_history_outside_record_without_grad():
    a = hn.randn(3)
    b = a * 2.0 + 1.0
    assert b._node is None and b.grad_fn is None


def test_to_networkx_and_dot():
    x, w, b, y = _mlp_graph()
    g = hn.graph_of(y)
    nxg = g.to_networkx()
    assert nxg.number_of_nodes() == len(g.nodes)
    ops = {d["op"] for _, d in nxg.nodes(data=True)}
    assert {"matmul", "tanh", "sum", "input"} <= ops
    import networkx as nx
    assert nx.is_directed_acyclic_graph(nxg)
    order = [nxg.nodes[n]["op"] for n in nx.topological_sort(nxg)]
    assert order.index("matmul") < order.index("tanh") < order.index("sum")
    dot = g.to_dot()
    assert dot.startswith("digraph") and dot.count("->") == nxg.number_of_edges()
    assert "tanh" in dot


def test_long_inference_loop_keeps_memory_flat():
    x = hn.zeros(64)
    for _ in range(1000):  # warm up allocator
        x = x * 0.5 + 1.0
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(100_000):
        x = x * 0.5 + 1.0
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert grown < 64 * 1024, f"memory grew by {grown} bytes over 100k steps"
    np.testing.assert_allclose(x.numpy(), 2.0, rtol=1e-6)


def test_graph_values_are_freed_after_backward():
    w = hn.randn(256, 256, requires_grad=True)
    h = (w * 2.0).tanh()
    probe = weakref.ref(h._node.value)
    loss = h.sum()
    del h
    gc.collect()
    assert probe() is not None  # kept alive by the graph until backward
    loss.backward()
    gc.collect()
    assert probe() is None
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_graph_is_released_when_outputs_die():
    w = hn.randn(128, 128, requires_grad=True)
    y = (w.exp() * 3.0).sum()
    probe = weakref.ref(y._node)
    del y
    gc.collect()
    assert probe() is None
