"""hn.export / hn.load: JSON round trips (also in a fresh process), guards, signatures,
the DOT and LLVM formats, and files that are not what they claim (issue 11)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn.functional as F
from compiler.errors import ExportError
from hybridnet.export_load import loads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mlp():
    hn.manual_seed(0)
    return hn.nn.Sequential(hn.nn.Linear(8, 16), hn.nn.Tanh(), hn.nn.Linear(16, 3))


def _close(a, b, tol=1e-5):
    a = a.detach().numpy() if isinstance(a, hn.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, hn.Tensor) else np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


CELL = None


def _rnn(xs, h):
    for t in range(xs.shape[0]):
        h = CELL(xs[t], h)
    return h


def _chain(x):
    return ((x * 2 + 1).tanh() * x.sigmoid() - x.exp() * 0.1).sum(dim=1)


def _xent(logits, labels):
    return F.cross_entropy(logits, labels)


def _branch(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def _cases():
    global CELL
    hn.manual_seed(1)
    CELL = hn.nn.RNNCell(4, 6)
    mlp = _mlp()
    return {
        "mlp": (mlp, (hn.randn(5, 8),)),
        "rnn": (_rnn, (hn.randn(7, 3, 4), hn.zeros(3, 6))),
        "chain": (_chain, (hn.randn(4, 9),)),
        "xent": (_xent, (hn.randn(6, 5), hn.tensor(np.array([0, 1, 4, 2, 3, 1])))),
        "branch": (_branch, (hn.ones(3),)),
    }


@pytest.mark.parametrize("name", ["mlp", "rnn", "chain", "xent", "branch"])
def test_round_trip_matches_eager(name, tmp_path):
    fn, args = _cases()[name]
    path = tmp_path / f"{name}.json"
    text = hn.export(fn, *args, path=path)
    assert path.read_text() == text
    loaded = hn.load(path)
    with hn.no_grad():
        want = fn(*args)
    _close(loaded(*args), want)
    # other values of the same shapes
    other = tuple(hn.from_numpy(np.asarray(a.numpy() * 0.5 + 0.25, dtype=a.numpy().dtype))
                  if a.dtype.is_floating_point else a for a in args)
    with hn.no_grad():
        _close(loaded(*other), fn(*other))


def test_export_is_deterministic_and_names_its_inputs():
    fn, args = _cases()["mlp"]
    a, b = hn.export(fn, *args), hn.export(fn, *args)
    assert a == b
    doc = json.loads(a)
    assert doc["format"] == "hybridnet.graph" and doc["version"] == 1
    assert [(i["name"], i["kind"]) for i in doc["inputs"]] == [
        ("input", "arg"), ("0.weight", "weight"), ("0.bias", "weight"),
        ("2.weight", "weight"), ("2.bias", "weight")]
    assert doc["inputs"][1]["shape"] == [16, 8] and doc["inputs"][1]["dtype"] == "float32"
    assert [o["name"] for o in doc["outputs"]] == ["output"]
    assert {n["op"] for n in doc["nodes"]} >= {"matmul", "tanh"}


def test_a_function_naming_a_global_model_names_weights_after_it():
    global MODEL
    MODEL = _mlp()

    def f(x):
        return F.relu(MODEL(x))
    doc = json.loads(hn.export(f, hn.randn(2, 8)))
    assert [i["name"] for i in doc["inputs"]] == [
        "x", "MODEL.0.weight", "MODEL.0.bias", "MODEL.2.weight", "MODEL.2.bias"]


def test_the_branch_not_taken_raises_naming_the_guard():
    fn, args = _cases()["branch"]
    loaded = loads(hn.export(fn, *args))
    _close(loaded(hn.full((3,), 2.0)), hn.full((3,), 4.0))
    with pytest.raises(ExportError, match="branched on was True at export and is False"):
        loaded(-hn.ones(3))


def test_a_float_read_as_a_number_holds_for_the_example_and_fails_for_others():
    """Compiled code sums in another order than eager: the float a guard compares bit for
    bit is checked again as eager computes it (the interpreter) before refusing."""
    hn.manual_seed(0)
    for n in (10, 1000, 100_000):
        x = hn.randn(n)
        loaded = loads(hn.export(lambda x: x * x.sum().item(), x))
        _close(loaded(x), x * x.sum().item(), tol=0)
        with pytest.raises(ExportError, match="read as a Python number"):
            loaded(x * 2)


def test_inputs_are_checked_by_name_and_numpy_arrays_are_taken():
    fn, args = _cases()["rnn"]
    loaded = loads(hn.export(fn, *args))
    with hn.no_grad():
        want = fn(*args)
    _close(loaded(args[0].numpy(), args[1].numpy()), want)
    with pytest.raises(ExportError, match=r"input 'h' is float32\[2, 6\]; .* float32\[3, 6\]"):
        loaded(args[0], hn.zeros(2, 6))
    with pytest.raises(ExportError, match=r"input 'xs' is float64"):
        loaded(args[0].double(), args[1])
    with pytest.raises(ExportError, match="takes 2 positional arguments, got 1"):
        loaded(args[0])
    with pytest.raises(ExportError, match="must be a tensor or a NumPy array"):
        loaded(args[0], [[0.0] * 6] * 3)


def test_structures_of_arguments_and_results_round_trip():
    def f(pair, scale, d):
        a, b = pair
        return {"sum": (a + b) * scale, "parts": [a * d["w"], b]}
    args = ((hn.randn(3), hn.randn(3)), 2, {"w": hn.randn(3)})
    loaded = loads(hn.export(f, *args))
    got = loaded(*args)
    want = f(*args)
    assert set(got) == {"sum", "parts"} and isinstance(got["parts"], list)
    _close(got["sum"], want["sum"])
    _close(got["parts"][0], want["parts"][0])
    _close(got["parts"][1], want["parts"][1])
    with pytest.raises(ExportError, match="was 2 at export, got 3"):
        loaded(args[0], 3, args[2])


def test_a_fresh_process_without_the_code_runs_the_file(tmp_path):
    fn, args = _cases()["rnn"]
    path = tmp_path / "rnn.json"
    hn.export(fn, *args, path=path)
    np.save(tmp_path / "xs.npy", args[0].numpy())
    np.save(tmp_path / "h.npy", args[1].numpy())
    code = ("import sys, numpy as np, hybridnet as hn\n"
            "d = sys.argv[1]\n"
            "f = hn.load(d + '/rnn.json')\n"
            "y = f(np.load(d + '/xs.npy'), np.load(d + '/h.npy'))\n"
            "np.save(d + '/out.npy', y.numpy())\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    with hn.no_grad():
        _close(np.load(tmp_path / "out.npy"), fn(*args))


def test_large_weights_go_to_a_sidecar_with_fixed_bytes(tmp_path):
    hn.manual_seed(3)
    model = hn.nn.Linear(600, 600)  # 1.4 MB of weights
    x = hn.randn(2, 600)
    path = tmp_path / "big.json"
    text = hn.export(model, x, path=path)
    data = json.loads(text)["inputs"][1]["data"]
    side = tmp_path / data["sidecar"]
    assert side.exists() and len(text) < 10_000
    assert data["sidecar"].startswith("big.json.") and data["sidecar"].endswith(".weights.npz")
    assert len(data["sha256"]) == 64
    first = side.read_bytes()
    assert hn.export(model, x, path=path) == text and side.read_bytes() == first
    hn.manual_seed(4)
    other = hn.nn.Linear(600, 600)
    hn.export(other, x, path=path)  # new weights: a new sidecar, the old one removed
    assert not side.exists() and len(list(tmp_path.glob("big.json.*.weights.npz"))) == 1
    hn.export(model, x, path=path)
    with hn.no_grad():
        _close(hn.load(path)(x), model(x), tol=1e-4)
    side.unlink()
    with pytest.raises(ExportError, match="cannot read the sidecar"):
        hn.load(path)


def test_training_steps_and_in_place_updates_are_refused():
    model = _mlp()
    opt = hn.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss
    with pytest.raises(ExportError, match="export step"):
        hn.export(step, hn.randn(2, 8))

    def bump(x):
        x.add_(1)
        return x * 2
    with pytest.raises(ExportError, match="in place"):
        hn.export(bump, hn.randn(3))
    with pytest.raises(ExportError, match="unknown format 'pt'"):
        hn.export(_chain, hn.randn(2, 2), format="pt")


def test_dot_draws_fusion_groups_as_clusters_and_networkx_has_them():
    fn, args = _cases()["mlp"]
    dot = hn.export(fn, *args, format="dot")
    assert dot.startswith("digraph hybridnet {") and "subgraph cluster_kernel" in dot
    assert '"%' in dot and "tanh" in dot
    from compiler.passes.fusion import partition
    from hybridnet.export_load import _compiled
    from hybridnet.jit.capture_graph import capture
    g = _compiled(capture(fn, args)[0]).optimized
    groups = {id(n): u.index for u in partition(g) for n in u.nodes}
    nx_graph = g.to_networkx(groups)
    fused = [v for v, a in nx_graph.nodes(data=True) if a["op"] == "tanh"]
    assert fused and nx_graph.nodes[fused[0]]["fusion_group"] is not None


def test_llvm_ir_also_when_the_kernel_comes_from_the_disk_cache(tmp_path):
    fn, args = _cases()["chain"]
    here = hn.export(fn, *args, format="llvm")
    assert "define" in here and "fmul" in here
    code = ("import hybridnet as hn\n"
            "def f(x):\n"
            "    return ((x * 2 + 1).tanh() * x.sigmoid() - x.exp() * 0.1).sum(dim=1)\n"
            "hn.manual_seed(0)\n"
            "print(len(hn.export(f, hn.randn(4, 9), format='llvm')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > 500


# ---- files that are not what they claim ---------------------------------------------------


def _doc():
    fn, args = _cases()["mlp"]
    return json.loads(hn.export(fn, *args))


def _bad(doc_or_bytes, match):
    data = doc_or_bytes if isinstance(doc_or_bytes, bytes) else json.dumps(doc_or_bytes)
    start = time.perf_counter()
    with pytest.raises(ExportError, match=match):
        loads(data)
    assert time.perf_counter() - start < 2.0


def test_bad_files_raise_export_error_quickly():
    text = json.dumps(_doc()).encode()
    _bad(text[: len(text) // 2], "does not parse.*truncated")
    _bad({}, "not a hybridnet graph file")
    _bad([1, 2], "holds a list")
    _bad(b"", "does not parse")
    doc = _doc()
    doc["version"] = 99
    _bad(doc, "schema version 99, newer")
    doc = _doc()
    doc["nodes"][1]["op"] = "conv9d"
    _bad(doc, "unknown op 'conv9d'")
    doc = _doc()
    doc["inputs"][1]["shape"] = [16, 9]  # the weight's data holds 16 x 8
    _bad(doc, "'0.weight' declares float32\\[16, 9\\]")
    doc = _doc()
    doc["inputs"][1]["shape"] = [1 << 28]  # a declared 1 GB tensor
    _bad(doc, "declares float32\\[268435456\\]")
    doc = _doc()
    doc["inputs"][0]["shape"] = [1 << 20, 1 << 20]  # an argument of 10^12 elements
    _bad(doc, "more than")
    doc = _doc()
    doc["nodes"][-1]["shape"] = [5, 4]
    _bad(doc, "gives float32\\[5, 3\\], the file declares float32\\[5, 4\\]")
    doc = _doc()
    doc["nodes"][2]["inputs"] = ["%99"]
    _bad(doc, "every input must name an earlier value")
    doc = _doc()
    doc["outputs"][0]["value"] = "nowhere"
    _bad(doc, "names no value")
    doc = _doc()
    doc["inputs"][2]["data"] = {"base64": "!!!!" * 22}
    _bad(doc, "not base64")


def test_code_in_every_field_is_never_run(tmp_path):
    marker = tmp_path / "pwned"
    code = f"__import__('os').system('touch {marker}')"
    base = _doc()
    edits = [
        lambda d: d["nodes"][0].__setitem__("op", code),
        lambda d: d["nodes"][0].__setitem__("name", code),
        lambda d: d["inputs"][0].__setitem__("dtype", code),
        lambda d: d["inputs"][0].__setitem__("kind", code),
        lambda d: d["nodes"][1]["attrs"].__setitem__(code, {"int": 1}),
        lambda d: d["nodes"][1]["attrs"].__setitem__("dims", {code: 1}),
        lambda d: d["nodes"][1]["attrs"].__setitem__("dims", {"dtype": code}),
        lambda d: d["guards"].append({"output": 0, "kind": code, "expected": {"int": 1}}),
        lambda d: d.__setitem__("results", {"t": code}),
        lambda d: d.__setitem__("format", code),
        lambda d: d["inputs"][1].__setitem__("data", {"sidecar": code}),
    ]
    for edit in edits:
        doc = json.loads(json.dumps(base))
        edit(doc)
        with pytest.raises(ExportError):
            loads(json.dumps(doc))
    assert not marker.exists()


def test_more_forged_files_raise_export_error():
    _bad(b"[" * 100000 + b"]" * 100000, "not a valid hybridnet graph file|does not parse")
    doc = _doc()
    doc["nodes"][1]["attrs"]["dims"] = "__DEEP__"  # an attribute nested 5000 deep
    deep = '{"tuple":[' * 5000 + '{"int":1}' + "]}" * 5000
    _bad(json.dumps(doc).replace('"__DEEP__"', deep).encode(), ".")
    base = json.loads(hn.export(lambda x: x * 2 + 1, hn.ones(3)))
    for value, dtype in (({"float": "nan"}, "int64"), ({"str": "abc"}, "float32"),
                         ({"float": 1e300}, "float32"), ({"int": 1 << 40}, "int32"),
                         ({"int": 10 ** 400}, "int64")):
        doc = json.loads(json.dumps(base))
        const = next(n for n in doc["nodes"] if n["op"] == "const")
        const["attrs"]["value"], const["attrs"]["dtype"], const["dtype"] = \
            value, {"str": dtype}, dtype
        _bad(doc, ".")
    doc = _doc()
    doc["results"] = {"t": "tuple", "items": [{"t": "tensor"}, {"t": "tensor"}]}
    _bad(doc, "structures hold")
    doc = json.loads(hn.export(lambda x: x.sum(dim=0), hn.ones(3, 2)))
    node = next(n for n in doc["nodes"] if n["op"] == "sum")
    node["attrs"]["dims"] = {"tuple": [{"float": 0.0}]}
    _bad(doc, "integers, not floats")


def test_arguments_that_alias_or_are_reached_by_name_are_refused():
    x, y = hn.tensor([1.0, 2.0, 3.0]), hn.tensor([5.0, 0.0, 1.0])
    with pytest.raises(ExportError, match="arguments 0 and 1 are the same tensor"):
        hn.export(lambda a, b: a - b, x, x)
    loaded = loads(hn.export(lambda a, b: a - b, x, x.clone()))
    _close(loaded(x, y), x - y)
    lin = hn.nn.Linear(3, 3)
    with pytest.raises(ExportError, match="also a tensor the function reaches by name"):
        hn.export(lambda w, v: v @ lin.weight.T + w.sum(), lin.weight, x.reshape(1, 3))


def test_formatting_a_tensor_as_text_cannot_be_exported_or_compiled():
    def f(x):
        return x * 0 if "-" in repr(x) else x
    with pytest.raises(ExportError, match="formats a tensor's values as text"):
        hn.export(f, hn.tensor([1.0, 2.0]))
    traced = hn.trace(f)
    for v in ([1.0, 2.0], [-1.0, 2.0], [1.0, 2.0], [-1.0, -2.0]):
        x = hn.tensor(v)
        _close(traced(x), f(x))
    assert traced.stats.compiled_calls == 0


def test_names_like_value_names_and_outputs_still_round_trip():
    class M(hn.nn.Module):
        def __init__(self):
            super().__init__()
            self.v0 = hn.nn.Parameter(hn.ones(3))

        def forward(self, output):
            return output * self.v0
    m = M()
    x = hn.tensor([1.0, 2.0, 3.0])
    loaded = loads(hn.export(m, x))
    with hn.no_grad():
        _close(loaded(x), m(x))
    assert isinstance(hn.export(m, x, format="onnx"), bytes)


def test_size_0_dims_load_and_run_through_the_interpreter():
    loaded = loads(hn.export(lambda e: e * 2, hn.zeros(0, 3)))
    assert loaded(hn.zeros(0, 3)).shape == (0, 3) and "interpreter" in loaded.backend
    with pytest.raises(ExportError, match="format='dot'"):
        hn.export(lambda e: e * 2, hn.zeros(0, 3), format="dot")
    with pytest.raises(ExportError, match="takes 1 positional arguments, got 2"):
        loaded(hn.zeros(0, 3), hn.zeros(0, 3))


def test_sidecars_must_be_the_regular_file_the_graph_names(tmp_path):
    hn.manual_seed(3)
    model = hn.nn.Linear(600, 600)
    x = hn.randn(2, 600)
    path = tmp_path / "m.json"
    data = json.loads(hn.export(model, x, path=path))["inputs"][1]["data"]
    side = tmp_path / data["sidecar"]
    good = side.read_bytes()
    side.write_bytes(good[:-10] + b"0123456789")  # another archive: the digest differs
    with pytest.raises(ExportError, match="SHA-256 differs"):
        hn.load(path)
    side.unlink()
    os.mkfifo(side)  # a FIFO would block a reader forever
    with pytest.raises(ExportError, match="not a regular file"):
        hn.load(path)
    side.unlink()
    outside = tmp_path / "elsewhere.npz"
    outside.write_bytes(good)
    side.symlink_to(outside)
    with pytest.raises(ExportError, match="not a regular file"):
        hn.load(path)


def test_load_of_a_missing_file_names_it(tmp_path):
    with pytest.raises(ExportError, match="cannot read"):
        hn.load(tmp_path / "nope.json")


@pytest.mark.parametrize("name", ["mlp", "rnn", "chain", "xent", "branch"])
def test_onnx_export_runs_in_onnxruntime_and_matches(name):
    import onnx
    import onnxruntime as ort

    fn, args = _cases()[name]
    data = hn.export(fn, *args, format="onnx")
    assert isinstance(data, bytes) and data == hn.export(fn, *args, format="onnx")
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    assert len(feeds) == len(args)
    outs = session.run(None, feeds)
    with hn.no_grad():
        _close(outs[0], fn(*args))
    if name == "branch":  # the guard is an output, its expected value in the metadata
        meta = {p.key: p.value for p in model.metadata_props}
        assert json.loads(meta["hybridnet.guards"])[0]["expected"] is True
        assert bool(outs[1]) is True
