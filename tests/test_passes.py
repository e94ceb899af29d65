"""Optimization passes: golden IR before/after each pass, semantics, and the manager."""

from textwrap import dedent

import numpy as np
import pytest

import hybridnet as hn
from compiler import interpret
from compiler.ir import Graph, Node
from compiler.passes import (
    AlgebraicSimplification,
    CommonSubexpressionElimination,
    ConstantFolding,
    DeadCodeElimination,
    PassManager,
    PassVerifyError,
    default_pipeline,
    optimize,
)
from compiler.registry import REGISTRY

F32 = np.dtype(np.float32)


def recorded(fn, *shapes):
    """Record `fn` on fresh float32 inputs; returns a clone passes may edit."""
    xs = [hn.tensor(np.random.default_rng(i).standard_normal(s).astype(np.float32))
          for i, s in enumerate(shapes)]
    with hn.record() as r:
        fn(*xs)
    return r.graph.clone()


def inp(*shape):
    return Node("input", (), {}, shape, F32)


def const(value, dtype="float32"):
    return Node("const", (), {"value": value, "dtype": dtype}, np.shape(value), dtype)


def op(name, *inputs, **attrs):
    """A node whose shape and dtype come from the op's own rule."""
    shape, dtype = REGISTRY[name].check([i.shape for i in inputs], [i.dtype for i in inputs], attrs)
    return Node(name, tuple(inputs), attrs, shape, dtype)


def graph(outputs, inputs):
    g = Graph.from_outputs(outputs)
    g.inputs = list(inputs)
    g.nodes = inputs + [n for n in g.nodes if n.op != "input"]
    g.verify()
    return g


def golden(p, g, before, after):
    """Run pass `p` on `g`, checking the exact IR text before and after."""
    assert str(g) == dedent(before).strip()
    g, changed = p.run(g)
    assert changed and str(g) == dedent(after).strip()
    g.verify()
    return g


# ---- golden IR, one pass at a time ------------------------------------------------------


def test_dce_golden_drops_what_no_output_needs():
    g = recorded(lambda x: (x.exp(), (x * 2.0).sum()), (2, 3))
    g.outputs = g.outputs[:1]
    g = golden(DeadCodeElimination(), g, """
        graph(%0: float32[2, 3]) {
          %1 = exp(%0) : float32[2, 3]
          %2 = const(value=2.0, dtype='float32') : float32[]
          %3 = mul(%0, %2) : float32[2, 3]
          %4 = sum(%3, dims=(0, 1), keepdim=False) : float32[]
          return (%1)
        }""", """
        graph(%0: float32[2, 3]) {
          %1 = exp(%0) : float32[2, 3]
          return (%1)
        }""")
    assert DeadCodeElimination().run(g)[1] is False


def test_cse_golden_merges_commutative_and_repeats_not_sub():
    g = recorded(lambda x, y: x * y + y * x + x.exp() + x.exp() - (x - y) + (y - x),
                 (2, 3), (2, 3))
    golden(CommonSubexpressionElimination(), g, """
        graph(%0: float32[2, 3], %1: float32[2, 3]) {
          %2 = mul(%0, %1) : float32[2, 3]
          %3 = mul(%1, %0) : float32[2, 3]
          %4 = add(%2, %3) : float32[2, 3]
          %5 = exp(%0) : float32[2, 3]
          %6 = add(%4, %5) : float32[2, 3]
          %7 = exp(%0) : float32[2, 3]
          %8 = add(%6, %7) : float32[2, 3]
          %9 = sub(%0, %1) : float32[2, 3]
          %10 = sub(%8, %9) : float32[2, 3]
          %11 = sub(%1, %0) : float32[2, 3]
          %12 = add(%10, %11) : float32[2, 3]
          return (%12)
        }""", """
        graph(%0: float32[2, 3], %1: float32[2, 3]) {
          %2 = mul(%0, %1) : float32[2, 3]
          %3 = add(%2, %2) : float32[2, 3]
          %4 = exp(%0) : float32[2, 3]
          %5 = add(%3, %4) : float32[2, 3]
          %6 = add(%5, %4) : float32[2, 3]
          %7 = sub(%0, %1) : float32[2, 3]
          %8 = sub(%6, %7) : float32[2, 3]
          %9 = sub(%1, %0) : float32[2, 3]
          %10 = add(%8, %9) : float32[2, 3]
          return (%10)
        }""")


def test_constfold_golden_folds_chains_with_the_ops_impl():
    x = inp(3)
    three = op("add", const(1.0), const(2.0))
    vec = op("mul", op("expand", three, shape=(3,)), const(np.arange(3, dtype=np.float32)))
    g = golden(ConstantFolding(), graph([op("add", x, vec), op("sqrt", three)], [x]), """
        graph(%0: float32[3]) {
          %1 = const(value=1.0, dtype='float32') : float32[]
          %2 = const(value=2.0, dtype='float32') : float32[]
          %3 = add(%1, %2) : float32[]
          %4 = expand(%3, shape=(3,)) : float32[3]
          %5 = const(value=array([0.0, 1.0, 2.0]), dtype='float32') : float32[3]
          %6 = mul(%4, %5) : float32[3]
          %7 = add(%0, %6) : float32[3]
          %8 = sqrt(%3) : float32[]
          return (%7, %8)
        }""", """
        graph(%0: float32[3]) {
          %1 = const(value=1.0, dtype='float32') : float32[]
          %2 = const(value=2.0, dtype='float32') : float32[]
          %3 = const(value=3.0, dtype='float32') : float32[]
          %4 = expand(%3, shape=(3,)) : float32[3]
          %5 = const(value=array([0.0, 1.0, 2.0]), dtype='float32') : float32[3]
          %6 = const(value=array([0.0, 3.0, 6.0]), dtype='float32') : float32[3]
          %7 = add(%0, %6) : float32[3]
          %8 = const(value=1.7320507764816284, dtype='float32') : float32[]
          return (%7, %8)
        }""")
    assert type(g.outputs[1].attrs["value"]) is float  # 0-d results are Python scalars
    assert isinstance(g.nodes[6].attrs["value"], np.ndarray)


def test_simplify_golden_identities_and_chains():
    def fn(x):
        a = hn.neg(hn.neg(x * 1.0 + -0.0)).T.T
        b = a.reshape(6).reshape(2, 3) ** 1.0 / 1.0
        return hn.sum(b - 0.0, dim=()) * 0.0 - b
    # Replaced nodes go; operands they leave unused (%3..%9 after) are for dce.
    golden(AlgebraicSimplification(), recorded(fn, (2, 3)), """
        graph(%0: float32[2, 3]) {
          %1 = const(value=1.0, dtype='float32') : float32[]
          %2 = mul(%0, %1) : float32[2, 3]
          %3 = const(value=-0.0, dtype='float32') : float32[]
          %4 = add(%2, %3) : float32[2, 3]
          %5 = neg(%4) : float32[2, 3]
          %6 = neg(%5) : float32[2, 3]
          %7 = permute(%6, dims=(1, 0)) : float32[3, 2]
          %8 = permute(%7, dims=(1, 0)) : float32[2, 3]
          %9 = reshape(%8, shape=(6,)) : float32[6]
          %10 = reshape(%9, shape=(2, 3)) : float32[2, 3]
          %11 = const(value=1.0, dtype='float32') : float32[]
          %12 = pow(%10, %11) : float32[2, 3]
          %13 = const(value=1.0, dtype='float32') : float32[]
          %14 = div(%12, %13) : float32[2, 3]
          %15 = const(value=0.0, dtype='float32') : float32[]
          %16 = sub(%14, %15) : float32[2, 3]
          %17 = sum(%16, dims=(), keepdim=False) : float32[2, 3]
          %18 = const(value=0.0, dtype='float32') : float32[]
          %19 = mul(%17, %18) : float32[2, 3]
          %20 = sub(%19, %14) : float32[2, 3]
          return (%20)
        }""", """
        graph(%0: float32[2, 3]) {
          %1 = const(value=1.0, dtype='float32') : float32[]
          %2 = const(value=-0.0, dtype='float32') : float32[]
          %3 = neg(%0) : float32[2, 3]
          %4 = permute(%0, dims=(1, 0)) : float32[3, 2]
          %5 = reshape(%0, shape=(6,)) : float32[6]
          %6 = const(value=1.0, dtype='float32') : float32[]
          %7 = const(value=1.0, dtype='float32') : float32[]
          %8 = const(value=0.0, dtype='float32') : float32[]
          %9 = const(value=0.0, dtype='float32') : float32[]
          %10 = mul(%0, %9) : float32[2, 3]
          %11 = sub(%10, %0) : float32[2, 3]
          return (%11)
        }""")


# ---- rules that must not fire -----------------------------------------------------------


def test_adding_positive_zero_is_kept_for_floats_only():
    def fn(x):
        return x + 0.0
    g, changed = AlgebraicSimplification().run(recorded(fn, (3,)))
    assert not changed  # -0.0 + 0.0 is +0.0: not an identity in IEEE arithmetic
    xi = hn.tensor([1, 2, 3])
    with hn.record() as rec:
        xi + 0
    g, changed = AlgebraicSimplification().run(rec.graph)
    assert changed and g.outputs[0].op == "input"


def test_simplify_never_changes_shape_or_dtype_and_keeps_unsafe_forms():
    x, v = inp(3), inp(2, 3)
    keep = [op("mul", x, const(np.ones((2, 3), np.float32))),  # result is bigger than x
            op("add", const(np.zeros((2, 3), np.float32)), x),
            op("sub", const(0.0), x),  # 0 - x is not x
            op("mul", x, const(0.0)),  # nan * 0 is nan
            op("sub", x, x),  # inf - inf is nan
            op("permute", v, dims=(1, 0)),
            op("mul", x, const(1.5))]
    g = graph(keep, [x, v])
    before = str(g)
    g, changed = AlgebraicSimplification().run(g)
    assert not changed and str(g) == before


def test_simplify_rebuilds_permute_and_expand_chains():
    v = inp(2, 3, 4)
    twice = op("permute", op("permute", v, dims=(1, 2, 0)), dims=(0, 2, 1))
    wide = op("expand", op("expand", op("sum", v, dims=(0, 1), keepdim=False), shape=(3, 4)),
              shape=(5, 3, 4))
    original = graph([twice, wide], [v])
    g = DeadCodeElimination().run(AlgebraicSimplification().run(original.clone())[0])[0]
    assert str(g).splitlines()[1:4] == [
        "  %1 = permute(%0, dims=(1, 0, 2)) : float32[3, 2, 4]",
        "  %2 = sum(%0, dims=(0, 1), keepdim=False) : float32[4]",
        "  %3 = expand(%2, shape=(5, 3, 4)) : float32[5, 3, 4]"]
    g.verify()
    arg = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for a, b in zip(g.run(arg), original.run(arg)):
        np.testing.assert_array_equal(a, b)


def test_simplify_cast_and_full_slice_to_the_operand():
    x = inp(2, 1)
    outs = [op("cast", x, dtype="float32"), op("slice", x, index=((0, 2, 1), (0, 1, 3))),
            op("cast", x, dtype="float64"), op("slice", x, index=((1, 2, 1), (0, 1, 1)))]
    g, changed = AlgebraicSimplification().run(graph(outs, [x]))
    assert changed and g.outputs[0] is x and g.outputs[1] is x
    assert [o.op for o in g.outputs[2:]] == ["cast", "slice"]


def test_constfold_leaves_big_and_failing_ops_for_run_time():
    big = op("expand", const(1.0), shape=(4097,))
    bad = op("take", const(np.arange(3.0, dtype=np.float32)), const(np.array([5]), "int64"), dim=0)
    ok = op("expand", const(np.ones(1, np.float32)), shape=(4096,))
    g, changed = ConstantFolding().run(graph([big, bad, ok], []))
    assert [o.op for o in g.outputs] == ["expand", "take", "expand"]
    assert g.outputs[2].inputs[0].op == "const" and g.outputs[2].inputs[0].shape == ()


def test_constfold_keeps_a_uniform_result_as_its_one_value_broadcast():
    """(an array whose size follows a loop's length would stop generalizing: the
    gradient seed of `out.sum() * c`, folded, is c broadcast) Only what is folded from
    one-element or broadcast constants: an array can be uniform by chance (arange(n) < 8
    while n <= 8) and must stay what it is at other sizes."""
    seed = op("expand", const(np.ones((1, 1), np.float32)), shape=(2, 3))
    zeros = op("expand", const(0.0), shape=(2, 3))
    two = op("mul", seed, const(2.0))
    neg = op("neg", zeros)  # all -0.0
    mixed = op("neg", const(np.array([0.0, -0.0], np.float32)))
    chance = op("lt", const(np.arange(3, dtype=np.float32)), const(8.0))
    g, changed = ConstantFolding().run(graph([two, neg, mixed, chance], []))
    two, zero, kept, chance = g.outputs
    assert two.op == "expand" and two.inputs[0].attrs["value"] == 2.0 and two.shape == (2, 3)
    assert zero.op == "expand" and np.signbit(zero.inputs[0].attrs["value"])
    assert kept.op == "const" and list(np.signbit(kept.attrs["value"])) == [True, False]
    assert chance.op == "const" and chance.attrs["value"].all()
    g2, changed2 = ConstantFolding().run(g)
    assert not changed2  # (the broadcast form is final)


def test_cse_consts_by_value_and_dtype_keeps_signed_zero_apart():
    c = [const(1.0), const(1), const(1.0, "float64"), const(0.0), const(-0.0),
         const(np.ones(2, np.float32)), const(np.ones(2, np.float32))]
    g, changed = CommonSubexpressionElimination().run(graph(c, []))
    out = g.outputs
    assert changed and out[0] is out[1] and out[5] is out[6]
    assert len({id(n) for n in out}) == 5 and len(g.nodes) == 5


def test_cse_compares_attrs_by_value():
    x = inp(2, 3)
    outs = [op("sum", x, dims=(0,), keepdim=False), op("sum", x, dims=(0,), keepdim=False),
            op("sum", x, dims=(1,), keepdim=False), op("sum", x, dims=(0,), keepdim=True)]
    outs[1].requires_grad = True  # recorded with grad on: the kept node must keep that
    g, _ = CommonSubexpressionElimination().run(graph(outs, [x]))
    assert g.outputs[0] is g.outputs[1] and len({id(o) for o in g.outputs}) == 3
    assert g.outputs[0].requires_grad


def test_dce_keeps_unused_inputs_and_outputs_that_are_inputs():
    x, unused = inp(3), inp(4)
    g = graph([x, op("exp", x)], [x, unused])
    g.nodes.insert(2, op("neg", x))  # dead
    g, changed = DeadCodeElimination().run(g)
    assert changed and g.inputs == [x, unused] and g.outputs[0] is x
    assert [n.op for n in g.nodes] == ["input", "input", "exp"]


def test_outputs_keep_positions_when_they_become_inputs_or_consts():
    x = inp(3)
    g = graph([op("mul", x, const(1.0)), op("mul", const(2.0), const(3.0)), op("exp", x)], [x])
    out, _ = optimize(g, verify=True)
    assert out.outputs[0] is out.inputs[0] and out.outputs[1].attrs["value"] == 6.0
    assert out.outputs[2].op == "exp"


# ---- semantics: optimized == original on random inputs, verify after every pass --------


def _direct_consts():
    x = inp(2, 3)
    k = op("mul", op("exp", const(np.full((2, 3), 0.5, np.float32))), const(2.0))
    return graph([op("where", op("gt", x, k), op("add", x, k), op("neg", op("neg", k)))], [x])


SEMANTIC_CASES = {
    "mlp": lambda: recorded(lambda x, w, b: (x @ w + b).tanh().sum(dim=1) * 1.0,
                            (4, 3), (3, 5), (5,)),
    "softmax": lambda: recorded(lambda x: hn.softmax(x, dim=-1) + hn.softmax(x, dim=-1),
                                (3, 4)),
    "layer_norm": lambda: recorded(lambda x: hn.nn.functional.layer_norm(x, (4,)), (2, 4)),
    "movement": lambda: recorded(
        lambda x: x.T.T.reshape(4, 3).reshape(12)[2:9].expand(2, 7).expand(3, 2, 7) + 0.0,
        (3, 4)),
    "relu_gelu": lambda: recorded(lambda x: hn.relu(x) - hn.neg(hn.neg(hn.gelu(x))) ** 1.0, (5,)),
    "cat_reduce": lambda: recorded(
        lambda x, y: hn.cat([x * y, y * x], dim=0).amax(dim=0) + hn.mean(x), (2, 3), (2, 3)),
    "consts": _direct_consts,
}


@pytest.mark.parametrize("name", sorted(SEMANTIC_CASES))
def test_optimized_graph_computes_the_same_outputs(name):
    original = SEMANTIC_CASES[name]()
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(n.shape).astype(n.dtype) for n in original.inputs]
    expected = interpret.run(original, *args)
    g = original.clone()
    for p in default_pipeline() * 2:  # each pass alone keeps the graph valid
        g, _ = p.run(g)
        g.verify()
    optimized, report = optimize(original, verify=True)
    assert report[-1]["nodes_after"] <= report[0]["nodes_before"]
    for got in (interpret.run(g, *args), interpret.run(optimized, *args)):
        for a, b in zip(got, expected):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    assert len(optimized.nodes) < len(original.nodes)


# ---- the pass manager -------------------------------------------------------------------


class AlwaysChanged:
    name = "restless"
    run = staticmethod(lambda g: (g, True))


class CorruptShape:
    """A broken pass: records a wrong shape on the last node."""

    name = "corrupt"

    def run(self, g):
        g.nodes[-1].shape = (99,)
        return g, False


def test_manager_reports_every_pass_run_and_reaches_a_fixed_point():
    g = recorded(lambda x: (x * 1.0).exp() + (x * 1.0).exp(), (3,))
    out, report = PassManager(default_pipeline()).run(g)
    names = [r["name"] for r in report]
    assert names[:4] == ["constfold", "simplify", "cse", "dce"] and len(names) % 4 == 0
    assert not any(r["changed"] for r in report[-4:]) and any(r["changed"] for r in report)
    assert set(report[0]) == {"name", "changed", "seconds", "nodes_before", "nodes_after"}
    assert all(r["seconds"] >= 0 for r in report) and report[-1]["nodes_after"] == 3
    _, report = PassManager([AlwaysChanged()]).run(recorded(lambda x: x.exp(), (2,)))
    assert len(report) == 10  # capped at 10 rounds


def test_print_after_env_prints_chosen_passes(monkeypatch, capsys):
    monkeypatch.setenv("HYBRIDNET_PRINT_AFTER", "cse, dce")
    optimize(recorded(lambda x: x.exp() + x.exp(), (2,)))
    err = capsys.readouterr().err
    assert "=== after cse ===\ngraph(%0: float32[2]) {" in err and "=== after dce ===" in err
    assert "=== after simplify ===" not in err


def test_print_after_all_and_argument(monkeypatch, capsys):
    monkeypatch.delenv("HYBRIDNET_PRINT_AFTER", raising=False)
    g = recorded(lambda x: x.exp(), (2,))
    PassManager(default_pipeline(), print_after="all").run(g.clone())
    assert capsys.readouterr().err.count("=== after ") == 4
    PassManager(default_pipeline()).run(g.clone())
    assert capsys.readouterr().err == ""


def test_verify_names_the_pass_that_broke_the_graph(monkeypatch):
    monkeypatch.delenv("HYBRIDNET_DEBUG", raising=False)
    g = recorded(lambda x: x.exp().sum(), (2,))
    PassManager([CorruptShape()]).run(g.clone())  # unchecked: nothing notices
    with pytest.raises(PassVerifyError, match="pass 'corrupt'"):
        PassManager([CorruptShape()], verify=True).run(g.clone())
    monkeypatch.setenv("HYBRIDNET_DEBUG", "1")
    with pytest.raises(PassVerifyError, match="pass 'corrupt'"):
        PassManager([CorruptShape()]).run(g.clone())


class DropInput:
    name = "drop_input"
    run = staticmethod(lambda g: (Graph(g.nodes, g.inputs[1:], g.outputs), True))


def test_verify_catches_a_pass_that_drops_an_input():
    g = recorded(lambda x, y: x.exp(), (2,), (2,))
    with pytest.raises(PassVerifyError, match="drop_input.*inputs changed"):
        PassManager([DropInput()], verify=True).run(g)


def test_optimize_leaves_the_original_graph_alone():
    g = recorded(lambda x: (x * 1.0).exp(), (2,))
    before = str(g)
    out, _ = optimize(g)
    assert str(g) == before and str(out) != before


def _ops(g):
    return [n.op for n in g.nodes if not n.is_source]


def test_simplify_moves_the_transpose_of_a_product_onto_its_operands():
    # the gradient of x @ w.T with respect to w: (x.T @ g).T -> g.T @ x, no transposed copy
    x, gr, w = inp(4, 3), inp(4, 2), inp(2, 3)
    dw = op("permute", op("matmul", op("permute", x, dims=(1, 0)), gr), dims=(1, 0))
    batched = op("permute", op("matmul", inp(5, 2, 3), inp(5, 3, 4)), dims=(0, 2, 1))
    original = graph([dw, op("matmul", x, op("permute", w, dims=(1, 0))), batched],
                     [x, gr, w, batched.inputs[0].inputs[0], batched.inputs[0].inputs[1]])
    g = DeadCodeElimination().run(AlgebraicSimplification().run(original.clone())[0])[0]
    g.verify()
    first = g.outputs[0]
    assert first.op == "matmul" and first.inputs[1] is g.inputs[0]  # x itself
    assert first.inputs[0].op == "permute" and first.inputs[0].inputs[0] is g.inputs[1]
    assert g.outputs[2].op == "matmul"
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(n.shape).astype(np.float32) for n in original.inputs]
    for a, b in zip(g.run(*args), original.run(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_simplify_keeps_a_transposed_product_that_has_other_users():
    a, b = inp(3, 4), inp(4, 5)
    prod = op("matmul", a, b)
    original = graph([op("permute", prod, dims=(1, 0)), prod], [a, b])
    g = DeadCodeElimination().run(AlgebraicSimplification().run(original.clone())[0])[0]
    assert _ops(g) == ["matmul", "permute"]  # one product, not two
    broadcast = op("permute", op("matmul", inp(2, 3, 4), inp(4, 5)), dims=(0, 2, 1))
    g2 = AlgebraicSimplification().run(graph([broadcast], list(
        broadcast.inputs[0].inputs)))[0]
    assert g2.outputs[0].op == "permute"  # batch broadcasting: left as it is


def test_simplify_lets_an_elementwise_op_broadcast_a_scalar_itself():
    """x * expand(c) -> x * c (the broadcast's size leaves the graph); not where the
    broadcast gives the shape, nor for an operand that is not 0-d."""
    x = inp(4, 3)
    c = const(2.0)
    by = op("mul", x, op("expand", c, shape=(4, 3)))
    grows = op("add", op("expand", c, shape=(4, 3)), const(np.ones(3, np.float32)))
    other = op("mul", x, op("expand", const(np.full(1, 2.0, np.float32)), shape=(4, 3)))
    g, changed = AlgebraicSimplification().run(graph([by, grows, other], [x]))
    one, two, three = g.outputs
    assert changed and one.op == "mul" and one.inputs[1] is c
    assert two.inputs[0].op == "expand"  # (the operands alone would give (3,))
    assert three.inputs[1].op == "expand"
    arrays = [np.arange(12, dtype=np.float32).reshape(4, 3)]
    np.testing.assert_array_equal(interpret.run(g, *arrays)[0], arrays[0] * 2)
