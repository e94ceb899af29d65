"""hn.save / hn.load_state: npz round trips, atomic writes and every kind of bad file; hn.load
deciding by content; hn.onnx.export; hn.set_num_threads. (PyTorch files: test_torch_pt.py.)"""

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from nn_refs import np_of

import hybridnet as hn
from compiler.errors import ExportError

nn = hn.nn
META = "__hybridnet__"


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.emb = nn.Embedding(5, 2, dtype=hn.float64)
        self.register_buffer("count", hn.tensor([3, 1, 4], dtype=hn.int64))
        self.register_buffer("mask", hn.tensor([True, False]))

    def forward(self, x):
        return self.fc(x)


def _listing(folder):
    return sorted(os.listdir(folder))


def _write_npz(path, meta=None, **arrays):
    if meta is not None:
        raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
        arrays[META] = np.frombuffer(raw, dtype=np.uint8)
    np.savez(path, **arrays)
    return path


# ---- round trips ------------------------------------------------------------------------------


def test_model_state_dict_round_trip(tmp_path):
    hn.manual_seed(0)
    src = Model()
    path = tmp_path / "model.npz"
    assert hn.save(src.state_dict(), path) is None
    loaded = hn.load_state(path)
    sd = src.state_dict()
    assert list(loaded) == list(sd) == ["count", "mask", "fc.weight", "fc.bias", "emb.weight"]
    for key in sd:
        assert isinstance(loaded[key], hn.Tensor), key
        assert loaded[key].dtype == sd[key].dtype, key
        np.testing.assert_array_equal(np_of(loaded[key]), np_of(sd[key]))
    dst = Model()
    dst.load_state_dict(loaded)
    x = hn.randn(2, 4)
    np.testing.assert_array_equal(np_of(dst(x)), np_of(src(x)))
    np.testing.assert_array_equal(np_of(dst.emb.weight), np_of(src.emb.weight))
    assert _listing(tmp_path) == ["model.npz"]  # no temporary file left behind


def test_optimizer_state_dict_round_trip_and_resume(tmp_path):
    def loss_of(p):
        return (p * p * p).sum() + (p * 2.0).sum()

    def train(p, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            loss_of(p).backward()
            opt.step()

    start = np.linspace(-1, 1, 6).reshape(2, 3)
    ref = hn.tensor(start, requires_grad=True)
    ref_opt = hn.optim.Adam([ref], lr=0.05, betas=(0.8, 0.9), amsgrad=True)
    train(ref, ref_opt, 6)

    p = hn.tensor(start, requires_grad=True)
    opt = hn.optim.Adam([p], lr=0.05, betas=(0.8, 0.9), amsgrad=True)
    train(p, opt, 3)
    hn.save({"model": {"p": p}, "optim": opt.state_dict(), "epoch": 3}, tmp_path / "ckpt.npz")
    ckpt = hn.load_state(str(tmp_path / "ckpt.npz"))
    assert ckpt["epoch"] == 3 and type(ckpt["epoch"]) is int
    sd = ckpt["optim"]
    assert list(sd["state"]) == [0]                      # int keys stay ints
    group = sd["param_groups"][0]
    assert group["betas"] == (0.8, 0.9) and isinstance(group["betas"], tuple)
    assert group["amsgrad"] is True and group["maximize"] is False
    assert group["lr"] == 0.05 and isinstance(group["lr"], float)
    assert group["params"] == [0]
    state = sd["state"][0]
    assert sorted(state) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"]
    for key, value in opt.state_dict()["state"][0].items():
        np.testing.assert_array_equal(np_of(state[key]), np_of(value))

    resumed = hn.tensor(np_of(ckpt["model"]["p"]), requires_grad=True)
    opt2 = hn.optim.Adam([resumed], lr=1.0)
    opt2.load_state_dict(sd)
    train(resumed, opt2, 3)
    np.testing.assert_array_equal(np_of(resumed), np_of(ref))


def test_nested_python_values_round_trip(tmp_path):
    obj = {
        "ints": [1, -2, 3],
        7: {"flag": True, "off": False, "none": None, "name": "adam", "pi": 3.25},
        "pair": (1.5, (2, "x")),
        "arrays": [np.arange(3, dtype=np.int32), hn.ones(2, 2, dtype=hn.float64),
                   np.float32(2.5), np.array(True)],
        "empty": {}, "nothing": [],
    }
    hn.save(obj, tmp_path / "obj.npz")
    back = hn.load_state(tmp_path / "obj.npz")
    assert list(back) == ["ints", 7, "pair", "arrays", "empty", "nothing"]
    assert back["ints"] == [1, -2, 3]
    assert back[7] == {"flag": True, "off": False, "none": None, "name": "adam", "pi": 3.25}
    assert back[7]["flag"] is True
    assert back["pair"] == (1.5, (2, "x")) and isinstance(back["pair"][1], tuple)
    a0, a1, scalar, flag = back["arrays"]
    assert a0.dtype == hn.int32 and np_of(a0).tolist() == [0, 1, 2]
    assert a1.dtype == hn.float64 and np_of(a1).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert scalar == 2.5 and bool(np_of(flag)) is True
    assert back["empty"] == {} and back["nothing"] == []


def test_tricky_keys_do_not_collide(tmp_path):
    # names np.savez itself uses, and keys whose array paths would coincide
    obj = {"file": hn.ones(1), "allow_pickle": hn.full((1,), 2.0), 0: hn.full((1,), 3.0),
           "0": hn.full((1,), 4.0), "a": {"b": hn.full((1,), 5.0)}, "a/b": hn.full((1,), 6.0),
           META: hn.full((1,), 7.0), "value": hn.full((1,), 8.0)}
    hn.save(obj, tmp_path / "k.npz")
    back = hn.load_state(tmp_path / "k.npz")
    assert list(back) == list(obj)
    values = [float(np_of(v if k != "a" else v["b"])[0]) for k, v in back.items()]
    assert values == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    scalar = tmp_path / "bare.npz"
    hn.save(hn.arange(0, 4), scalar)  # a bare tensor as the root
    np.testing.assert_array_equal(np_of(hn.load_state(scalar)), [0, 1, 2, 3])


def test_file_is_a_plain_npz_readable_without_pickle(tmp_path):
    model = Model()
    path = tmp_path / "m.npz"
    hn.save(model.state_dict(), path)
    assert zipfile.is_zipfile(path)
    with np.load(path, allow_pickle=False) as archive:
        names = set(archive.files)
        assert META in names
        assert archive[META].dtype == np.uint8
        meta = json.loads(archive[META].tobytes().decode())
        assert meta["format"] == 1
        arrays = {n: archive[n] for n in names - {META}}
    assert len(arrays) == 5
    weight = [a for n, a in arrays.items() if "fc.weight" in n]
    assert len(weight) == 1
    np.testing.assert_array_equal(weight[0], np_of(model.fc.weight))
    assert all(a.dtype != object for a in arrays.values())


def test_plain_numeric_npz_loads_as_dict_of_tensors(tmp_path):
    path = _write_npz(tmp_path / "plain.npz", w=np.eye(2), n=np.arange(3))
    back = hn.load_state(path)
    assert sorted(back) == ["n", "w"]
    assert back["w"].dtype == hn.float64 and back["n"].dtype == hn.int64
    np.testing.assert_array_equal(np_of(back["w"]), np.eye(2))


def test_tensor_requiring_grad_is_saved_detached(tmp_path):
    p = hn.tensor([1.0, 2.0], requires_grad=True)
    hn.save({"p": p}, tmp_path / "p.npz")
    back = hn.load_state(tmp_path / "p.npz")["p"]
    assert not back.requires_grad and np_of(back).tolist() == [1.0, 2.0]


# ---- atomic writes ------------------------------------------------------------------------


def test_overwrite_replaces_file_atomically(tmp_path):
    path = tmp_path / "x.npz"
    hn.save({"v": hn.zeros(2)}, path)
    hn.save({"v": hn.ones(3)}, path)
    assert _listing(tmp_path) == ["x.npz"]
    np.testing.assert_array_equal(np_of(hn.load_state(path)["v"]), np.ones(3))


def test_saved_file_gets_the_usual_permissions(tmp_path):
    ordinary = tmp_path / "ordinary.bin"
    ordinary.write_bytes(b"x")  # what open() gives under the current umask
    hn.save({"v": hn.zeros(1)}, tmp_path / "s.npz")
    assert (tmp_path / "s.npz").stat().st_mode == ordinary.stat().st_mode


@pytest.mark.parametrize("bad", [object(), {"s": {1, 2}}, {"c": np.array([1 + 2j])},
                                 {"u": np.array(["text"])}, {(1, 2): hn.zeros(1)},
                                 {"o": np.array([None, 1], dtype=object)}],
                         ids=["object", "set", "complex", "str-array", "tuple-key", "obj-array"])
def test_failed_save_leaves_no_file(tmp_path, bad):
    path = tmp_path / "bad.npz"
    with pytest.raises(hn.SerializationError):
        hn.save(bad, path)
    assert _listing(tmp_path) == []
    # over an existing file: the old contents survive
    hn.save({"keep": hn.full((2,), 5.0)}, path)
    with pytest.raises(hn.SerializationError):
        hn.save(bad, path)
    assert _listing(tmp_path) == ["bad.npz"]
    np.testing.assert_array_equal(np_of(hn.load_state(path)["keep"]), [5.0, 5.0])


def test_crash_while_writing_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    hn.save({"keep": hn.ones(2)}, path)

    def exploding_savez(file, **arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", exploding_savez)
    with pytest.raises(OSError, match="disk full"):
        hn.save({"new": hn.zeros(3)}, path)
    monkeypatch.undo()
    assert _listing(tmp_path) == ["c.npz"]
    np.testing.assert_array_equal(np_of(hn.load_state(path)["keep"]), [1.0, 1.0])


# ---- bad files ----------------------------------------------------------------------------


def test_serialization_error_is_a_value_error():
    assert issubclass(hn.SerializationError, ValueError)


def test_truncated_files(tmp_path):
    good = tmp_path / "good.npz"
    model = Model()
    opt = hn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(hn.ones(1, 4)).sum().backward()
    opt.step()
    hn.save({"model": model.state_dict(), "optim": opt.state_dict()}, good)
    data = good.read_bytes()
    cut = tmp_path / "cut.npz"
    lengths = sorted(set(range(0, len(data), 13)) | {1, 4, 30, len(data) // 2, len(data) - 1})
    for n in lengths:
        cut.write_bytes(data[:n])
        with pytest.raises(hn.SerializationError):
            hn.load_state(cut)
    assert len(lengths) > 50


@pytest.mark.parametrize("content", [
    b"",
    bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)),
    b"PK\x03\x04" + bytes(np.random.default_rng(1).integers(0, 256, 500, dtype=np.uint8)),
    b"\x80\x04\x95 not really a pickle",
    b"just some text\n",
], ids=["empty", "random", "zip-magic", "pickle-magic", "text"])
def test_not_an_npz(tmp_path, content):
    path = tmp_path / "junk.npz"
    path.write_bytes(content)
    with pytest.raises(hn.SerializationError, match="junk.npz"):
        hn.load_state(path)


def test_single_npy_file_is_rejected(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(4.0))
    with pytest.raises(hn.SerializationError, match="npy"):
        hn.load_state(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        hn.load_state("/nonexistent/dir/none.npz")


def test_object_and_string_arrays_are_rejected(tmp_path):
    obj = tmp_path / "obj.npz"
    np.savez(obj, x=np.array([{"a": 1}, None], dtype=object))  # stored pickled
    with pytest.raises(hn.SerializationError, match="obj.npz"):
        hn.load_state(obj)
    text = _write_npz(tmp_path / "text.npz", {"format": 1, "tree": {"t": "array", "k": "s"}},
                      s=np.array(["abc"]))
    with pytest.raises(hn.SerializationError, match="non-numeric"):
        hn.load_state(text)


class Payload:
    """Unpickling this runs os.mkdir(marker): the load must never get that far."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_loading_never_executes_code(tmp_path):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([Payload(marker)], dtype=object))
    meta_path = _write_npz(tmp_path / "evil2.npz", {"format": 1, "tree": {"t": "array", "k": "x"}},
                           x=np.array([Payload(marker)], dtype=object))
    for p in (path, meta_path):
        with pytest.raises(hn.SerializationError):
            hn.load_state(p)
    assert not os.path.exists(marker)
    # the payload is live: unpickling it (which hn never does) would run it
    with np.load(path, allow_pickle=True) as archive:
        archive["x"]
    assert os.path.isdir(marker)


DAMAGED = [
    b"\xff\xfe\x00not utf-8",
    b"{\"format\": 1, \"tree\": ",
    b"[1, 2, 3]",
    json.dumps({"format": 1}).encode(),
    json.dumps({"format": 1, "tree": [1]}).encode(),
    json.dumps({"format": 1, "tree": {"t": "dict", "items": 5}}).encode(),
    json.dumps({"format": 1, "tree": {"t": "dict", "items": [[1]]}}).encode(),
    json.dumps({"format": 1, "tree": {"t": "dict", "items": [[[1], {"t": "value"}]]}}).encode(),
    json.dumps({"format": 1, "tree": {"t": "array", "k": "missing"}}).encode(),
    json.dumps({"format": 1, "tree": {"t": "array", "k": ["x"]}}).encode(),
    json.dumps({"format": 1, "tree": {"t": "module", "v": "os.system"}}).encode(),
    json.dumps({"format": 1, "tree": {"t": "list", "items": [{"t": "nope"}]}}).encode(),
    (b"{\"format\": 1, \"tree\": " + b"{\"t\": \"list\", \"items\": [" * 20000
     + b"{\"t\": \"value\", \"v\": 1}" + b"]}" * 20000 + b"}"),
]


@pytest.mark.parametrize("raw", DAMAGED, ids=[f"damaged{i}" for i in range(len(DAMAGED))])
def test_damaged_structure_record(tmp_path, raw):
    path = _write_npz(tmp_path / "d.npz", raw, x=np.zeros(2))
    with pytest.raises(hn.SerializationError, match="d.npz"):
        hn.load_state(path)


@pytest.mark.parametrize("fmt", [2, 99, 0, "1", None])
def test_other_format_numbers(tmp_path, fmt):
    path = _write_npz(tmp_path / "f.npz", {"format": fmt, "tree": {"t": "value", "v": 1}})
    with pytest.raises(hn.SerializationError, match="format"):
        hn.load_state(path)


# ---- file objects ---------------------------------------------------------------------


def test_save_and_load_through_file_objects(tmp_path):
    model = Model()
    buf = io.BytesIO()
    hn.save(model.state_dict(), buf)
    for reader in (hn.load_state, hn.load):
        buf.seek(0)
        back = reader(buf)
        assert list(back) == list(model.state_dict())
        np.testing.assert_array_equal(np_of(back["fc.weight"]), np_of(model.fc.weight))
    path = tmp_path / "f.bin"
    with open(path, "wb") as f:
        f.write(b"header")  # (read from the file's current position, as torch does)
        start = f.tell()
        hn.save({"x": hn.ones(2)}, f)
    with open(path, "rb") as f:
        f.seek(start)
        assert np_of(hn.load(f)["x"]).tolist() == [1.0, 1.0]
        assert not f.closed
    with open(path, "w") as text, pytest.raises(TypeError, match="binary mode"):
        hn.save({"x": hn.ones(1)}, text)
    with pytest.raises(TypeError, match="path .* or a binary file object"):
        hn.save({"x": hn.ones(1)}, 42)


@pytest.mark.parametrize("kind", ["model", "optimizer", "nested"])
def test_saving_a_whole_model_or_optimizer_says_to_save_its_state_dict(tmp_path, kind):
    model = Model()
    obj = {"model": model, "optim": hn.optim.SGD(model.parameters(), lr=0.1)}
    target = obj if kind == "nested" else obj["model" if kind == "model" else "optim"]
    word = "optimizer" if kind == "optimizer" else "model"
    with pytest.raises(hn.SerializationError,
                       match=rf"whole .*\({word}\).*hn.save\({word}.state_dict\(\), path\)"):
        hn.save(target, tmp_path / "m.npz")
    assert _listing(tmp_path) == []


# ---- hn.load: decided by the content --------------------------------------------------


def test_load_reads_hn_save_files_whatever_their_name(tmp_path):
    path = tmp_path / "model.pt"
    hn.save({"w": hn.full((2,), 3.0), "step": 4}, path)
    back = hn.load(path)
    assert back["step"] == 4 and np_of(back["w"]).tolist() == [3.0, 3.0]
    plain = _write_npz(tmp_path / "plain.npz", a=np.arange(3))
    assert np_of(hn.load(plain)["a"]).tolist() == [0, 1, 2]


def test_load_reads_graphs_from_paths_and_file_objects(tmp_path):
    model = nn.Linear(3, 2)
    x = hn.randn(4, 3)
    path = tmp_path / "g.json"
    hn.export(model, x, path=path)
    want = np_of(model(x))
    with open(path, "rb") as f:
        for source in (path, str(path), f, io.BytesIO(path.read_bytes())):
            loaded = hn.load(source)
            assert isinstance(loaded, hn.LoadedFunction)
            np.testing.assert_allclose(np_of(loaded(x)), want, rtol=1e-6)
    big = nn.Linear(600, 600)  # weights in a sidecar next to the graph file
    hn.export(big, hn.randn(1, 600), path=path)
    with open(path, "rb") as f:
        assert isinstance(hn.load(f), hn.LoadedFunction)
    with pytest.raises(ExportError, match="sidecar"):
        hn.load(io.BytesIO(path.read_bytes()))


@pytest.mark.parametrize("content,message", [
    (b"", "an empty file"),
    (b"\x00\x01garbage", "unknown content"),
    (b"just text\n", "unknown content"),
    (pickle.dumps({"a": 1}), "plain pickle"),
    (b"PK\x03\x04" + bytes(200), "damaged or truncated zip"),
], ids=["empty", "binary", "text", "pickle", "bad-zip"])
def test_load_of_unknown_content(tmp_path, content, message):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(hn.SerializationError, match=message):
        hn.load(path)


def test_load_of_other_zip_archives(tmp_path):
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(hn.SerializationError, match="neither hn.save"):
        hn.load(path)


def test_load_of_truncated_hn_save_files(tmp_path):
    good = tmp_path / "good.npz"
    hn.save({"w": hn.ones(30), "n": [1, 2]}, good)
    data = good.read_bytes()
    for n in range(1, len(data), 41):
        with pytest.raises(hn.SerializationError):
            hn.load(io.BytesIO(data[:n]))


def test_load_of_missing_or_unreadable_files(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        hn.load(tmp_path / "missing.pt")
    assert isinstance(info.value, ExportError) and "cannot read" in str(info.value)
    with pytest.raises(OSError, match="cannot read"):
        hn.load(tmp_path)


# ---- hn.onnx.export -------------------------------------------------------------------


def test_onnx_export_with_pytorch_arguments(tmp_path):
    import onnxruntime as ort
    hn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    x = hn.randn(2, 4)
    path = tmp_path / "m.onnx"
    data = hn.onnx.export(model, (x,), path, input_names=["input"], output_names=["logits"],
                          opset_version=18, verbose=False, do_constant_folding=True,
                          dynamo=False)
    assert path.read_bytes() == data
    buf = io.BytesIO()
    assert hn.onnx.export(model, x, buf, input_names=["input"], output_names=["logits"],
                          opset_version=18) == data
    assert buf.getvalue() == data
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input"]
    assert [o.name for o in sess.get_outputs()] == ["logits"]
    np.testing.assert_allclose(sess.run(None, {"input": np_of(x)})[0], np_of(model(x)),
                               rtol=1e-6)
    assert hn.onnx.export(model, x) == hn.export(model, x, format="onnx")  # f=None: bytes


def test_onnx_export_keyword_arguments_and_refused_options():
    import onnx  # noqa: F401

    def fn(a, b, scale=2.0):
        return a * scale + b

    a, b = hn.ones(2), hn.ones(2)
    assert hn.onnx.export(fn, (a,), kwargs={"b": b}) == hn.onnx.export(fn, (a, b))
    for option, value in [("dynamic_axes", {"a": {0: "batch"}}), ("export_params", False),
                          ("keep_initializers_as_inputs", True), ("custom_opsets", {"x": 1})]:
        with pytest.raises(ExportError, match=f"{option} is not supported"):
            hn.onnx.export(fn, (a, b), **{option: value})
    with pytest.raises(ExportError, match="at most 2 non-empty strings"):
        hn.onnx.export(fn, (a, b), input_names=["a", "b", "c"])
    with pytest.raises(ExportError, match="used twice"):
        hn.onnx.export(fn, (a, b), input_names=["x", "x"])
    with pytest.raises(ExportError, match="opset 11 is not supported"):
        hn.onnx.export(fn, (a, b), opset_version=11)


# ---- threads --------------------------------------------------------------------------


def test_set_num_threads_in_a_fresh_process():
    code = (
        "import numpy as np, hybridnet as hn\n"
        "from compiler import blas\n"
        "from runtime import llvm_kernel\n"
        "assert hn.get_num_threads() >= 1\n"
        "hn.set_num_threads(1)\n"
        "assert hn.get_num_threads() == 1 and blas._wide[0] == 1\n"
        "assert set(blas.threads().values()) == {1}\n"
        "hn.set_num_threads(3)\n"
        "assert hn.get_num_threads() == 3 and llvm_kernel.threads() == 3\n"
        "assert blas._wide[0] == 3\n"
        "f = hn.trace(lambda a, b: (a * b + 1.0).sum(1))\n"
        "a, b = hn.randn(1024, 1100), hn.randn(1024, 1100)\n"
        "np.testing.assert_allclose(f(a, b).numpy(), ((a * b + 1.0).sum(1)).numpy(), "
        "rtol=1e-4)\n"
        "for bad in (0, -1, 1.5, True):\n"
        "    try:\n"
        "        hn.set_num_threads(bad)\n"
        "    except RuntimeError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(bad)\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYBRIDNET_THREADS", "HYBRIDNET_BLAS_THREADS")}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
