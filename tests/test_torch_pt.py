"""hn.load of PyTorch .pt files (hybridnet/torch_pt.py): real files from torch.save, and
crafted ones that must be refused without running anything."""

import io
import os
import pickle
import struct
import tracemalloc
import warnings
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch  # noqa: E402  (the oracle: a test extra)
from nn_refs import np_of

import hybridnet as hn
from hybridnet import torch_pt


def _saved(obj, **kwargs) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    buf.seek(0)
    return buf


def _same(loaded, ref):
    """loaded (hybridnet) holds what ref (torch) holds: values, dtypes, structure."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(loaded, hn.Tensor), type(loaded)
        want = ref.detach().numpy()
        assert loaded.dtype == want.dtype and loaded.shape == want.shape
        np.testing.assert_array_equal(np_of(loaded), want)
    elif isinstance(ref, dict):
        assert type(loaded) is type(ref) and list(loaded) == list(ref)
        for k in ref:
            _same(loaded[k], ref[k])
    elif isinstance(ref, (list, tuple)):
        assert type(loaded) is type(ref) and len(loaded) == len(ref)
        for a, b in zip(loaded, ref):
            _same(a, b)
    else:
        assert loaded == ref and type(loaded) is type(ref)


# ---- real files from torch.save -------------------------------------------------------


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 5 * 5, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class HnNet(hn.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = hn.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = hn.nn.BatchNorm2d(4)
        self.fc = hn.nn.Linear(4 * 5 * 5, 3)

    def forward(self, x):
        return self.fc(hn.relu(self.bn(self.conv(x))).flatten(1))


def test_state_dict_of_a_model_loads_into_the_same_hybridnet_model(tmp_path):
    torch.manual_seed(0)
    net = TorchNet()
    for _ in range(3):  # running statistics and num_batches_tracked move
        net(torch.randn(8, 3, 5, 5))
    net.eval()
    path = tmp_path / "net.pt"
    torch.save(net.state_dict(), path)
    sd = hn.load(path)
    assert isinstance(sd, OrderedDict)
    _same(sd, OrderedDict((k, v) for k, v in net.state_dict().items()))
    count = sd["bn.num_batches_tracked"]
    assert count.dtype == hn.int64 and count.shape == () and int(np_of(count)) == 3
    assert sd._metadata["bn"] == {"version": 2}  # (kept, as torch.load keeps it)
    model = HnNet()
    model.load_state_dict(hn.load(str(path)))
    model.eval()
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np_of(model(hn.tensor(x))), want, rtol=1e-5, atol=1e-5)


def test_dict_of_tensors_lists_and_numbers():
    obj = {"w": torch.randn(3, 2, dtype=torch.float64),
           "steps": torch.tensor([1, 2], dtype=torch.int64),
           "mask": torch.tensor([True, False, True]), "i32": torch.arange(4, dtype=torch.int32),
           "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
           "meta": {"epoch": 7, "lr": 0.125, "name": "adam", "none": None, "flag": True,
                    "pair": (1, "a"), "list": [1.5, [2, 3]], 4: "int key", "big": 2 ** 70},
           "list": [torch.ones(2), 3]}
    _same(hn.load(_saved(obj)), obj)


def test_non_contiguous_views_and_shared_storages():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    obj = {"t": base.t()[1:], "strided": base[:, ::2], "row": base[2], "base": base,
           "expanded": torch.arange(3.0).reshape(3, 1).expand(3, 4),
           "offset": base.flatten()[5:9]}
    buf = _saved(obj)
    assert sum(n.split("/")[1] == "data" for n in zipfile.ZipFile(buf).namelist()) == 2
    buf.seek(0)
    loaded = hn.load(buf)
    _same(loaded, {k: v.contiguous() for k, v in obj.items()})
    loaded["row"].add_(100.0)  # copies: no longer shared
    assert float(np_of(loaded["base"])[2, 0]) == 12.0


def test_parameters_keep_requires_grad():
    obj = {"p": torch.nn.Parameter(torch.ones(2)),
           "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
           "t": torch.ones(2, requires_grad=True)}
    loaded = hn.load(_saved(obj))
    assert isinstance(loaded["p"], hn.nn.Parameter) and loaded["p"].requires_grad
    assert isinstance(loaded["frozen"], hn.nn.Parameter) and not loaded["frozen"].requires_grad
    assert loaded["t"].requires_grad and type(loaded["t"]) is hn.Tensor


def test_smaller_dtypes_are_widened_with_a_warning():
    obj = {"h": torch.tensor([1.5, -2.25], dtype=torch.float16),
           "bf": torch.tensor([1.5, -3.0e38], dtype=torch.bfloat16),
           "i8": torch.tensor([-128, 127], dtype=torch.int8),
           "u8": torch.tensor([0, 255], dtype=torch.uint8),
           "i16": torch.tensor([-5, 7], dtype=torch.int16),
           "u16": torch.ones(2, dtype=torch.uint16)}
    with pytest.warns(UserWarning, match="bfloat16 -> float32.*float16 -> float32.*int16 -> int32"):
        loaded = hn.load(_saved(obj))
    for key, ref in obj.items():
        want = ref.to(torch.float32 if ref.is_floating_point() else torch.int64).numpy()
        assert loaded[key].dtype in (hn.float32, hn.int32)
        np.testing.assert_array_equal(np_of(loaded[key]), want)


@pytest.mark.parametrize("make", [lambda: torch.ones(2, dtype=torch.complex64),
                                  lambda: torch.ones(2, dtype=torch.float8_e4m3fn),
                                  lambda: torch.ones(2, dtype=torch.uint64)],
                         ids=["complex64", "float8", "uint64"])
def test_dtypes_hybridnet_lacks_are_refused(make):
    with pytest.raises(hn.SerializationError, match="hybridnet has no"):
        hn.load(_saved({"x": make()}))


def test_python_values_torch_allows():
    obj = {"size": torch.Size([2, 3]), "dev": torch.device("cpu"), "dtype": torch.float32,
           "long": torch.int64, "bytes": b"\x00\xffabc", "set": {1, 2}, "frozen": frozenset({3}),
           "complex": 1 + 2j, "ba": bytearray(b"xy")}
    loaded = hn.load(_saved(obj))
    assert loaded["size"] == (2, 3) and loaded["dev"] == hn.device("cpu")
    assert loaded["dtype"] is hn.float32 and loaded["long"] is hn.int64
    assert loaded["bytes"] == b"\x00\xffabc" and loaded["set"] == {1, 2}
    assert loaded["frozen"] == frozenset({3}) and loaded["complex"] == 1 + 2j
    assert loaded["ba"] == bytearray(b"xy")
    with pytest.raises(hn.SerializationError, match="torch.float16 as a value"):
        hn.load(_saved({"d": torch.float16}))
    with pytest.raises(hn.SerializationError, match="bare storage"):
        hn.load(_saved(torch.ones(2).untyped_storage()))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_protocols(protocol):
    obj = {"a": torch.arange(6.0).reshape(2, 3), "n": [1, "x"], "od": OrderedDict(k=torch.ones(1))}
    _same(hn.load(_saved(obj, pickle_protocol=protocol)), obj)


def test_paths_file_objects_and_streams(tmp_path):
    obj = {"w": torch.randn(2, 2)}
    path = tmp_path / "weights.bin"  # (the name does not matter: the content decides)
    torch.save(obj, path)
    _same(hn.load(path), obj)
    _same(hn.load(os.fspath(path)), obj)
    with open(path, "rb") as f:
        _same(hn.load(f), obj)
        assert not f.closed

    class Stream(io.RawIOBase):  # read() only, no seek
        def __init__(self, data):
            self.data = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, b):
            return self.data.readinto(b)

    _same(hn.load(Stream(path.read_bytes())), obj)


def test_big_endian_files():
    ref = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    src = zipfile.ZipFile(_saved({"x": ref, "i": torch.tensor([1, -2], dtype=torch.int32)}))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in name:
                width = 8 if len(data) == 48 else 4
                data = np.frombuffer(data, f"<u{width}").astype(f">u{width}").tobytes()
            z.writestr(name, data)
    loaded = hn.load(io.BytesIO(out.getvalue()))
    np.testing.assert_array_equal(np_of(loaded["x"]), ref.numpy())
    np.testing.assert_array_equal(np_of(loaded["i"]), [1, -2])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_legacy_and_torchscript_files_are_refused_clearly(tmp_path):
    legacy = tmp_path / "old.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(hn.SerializationError, match="legacy format"):
        hn.load(legacy)
    script = tmp_path / "script.pt"
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(script))
    with pytest.raises(hn.SerializationError, match="TorchScript"):
        hn.load(script)


def test_load_options():
    obj = {"w": torch.ones(2)}
    for where in ("cpu", torch.device("cpu"), hn.device("cpu"), {"cuda:0": "cpu"},
                  lambda storage, location: storage):
        _same(hn.load(_saved(obj), map_location=where), obj)
    _same(hn.load(_saved(obj), weights_only=True, mmap=True, encoding="latin1"), obj)
    with pytest.raises(RuntimeError, match="CPU only"):
        hn.load(_saved(obj), map_location="cuda")
    with pytest.raises(RuntimeError, match="CPU only"):
        hn.load(_saved(obj), map_location={"cpu": "cuda:0"})
    with pytest.warns(UserWarning, match="never executes pickled code"):
        _same(hn.load(_saved(obj), weights_only=False), obj)  # read as weights_only=True
    with pytest.raises(hn.SerializationError, match="pickle_module"):
        hn.load(_saved(obj), pickle_module=pickle)
    with pytest.raises(TypeError, match="unexpected arguments fix_imports"):
        hn.load(_saved(obj), fix_imports=False)


# ---- crafted files --------------------------------------------------------------------


def G(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def U(text):
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def I(n):  # noqa: E743
    return pickle.dumps(n, protocol=2)[2:-1]  # (BININT*, LONG1: no memo entry)


def T(*parts):
    return b"(" + b"".join(parts) + b"t"


def P(*parts):
    return b"\x80\x02" + b"".join(parts) + b"."


ODICT = G("collections", "OrderedDict") + b")R"


def PID(kind="FloatStorage", key="0", numel=4, location="cpu"):
    return T(U("storage"), G("torch", kind), U(key), U(location), I(numel)) + b"Q"


def TENSOR(pid=None, offset=0, size=(2, 2), stride=(2, 1)):
    return G("torch._utils", "_rebuild_tensor_v2") + T(
        pid or PID(), I(offset), T(*map(I, size)), T(*map(I, stride)), b"\x89", ODICT) + b"R"


def archive(pkl, records=None, prefix="archive", extra=()):
    buf = io.BytesIO()
    records = {"data/0": np.arange(4, dtype=np.float32).tobytes()} if records is None else records
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        for name, data in records.items():
            z.writestr(f"{prefix}/{name}", data)
        z.writestr(f"{prefix}/byteorder", b"little")
        z.writestr(f"{prefix}/version", b"3\n")
        for name, data in extra:
            z.writestr(name, data)
    buf.seek(0)
    return buf


def test_crafted_files_read_as_torch_reads_them():
    buf = archive(P(b"}", U("t"), TENSOR(offset=1, size=(3,), stride=(1,)), b"s"))
    want = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    _same(hn.load(buf), want)
    assert np_of(hn.load(io.BytesIO(buf.getvalue()))["t"]).tolist() == [1.0, 2.0, 3.0]


class Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return os.system, (self.cmd,)


def _payloads(marker):
    marker = os.fspath(marker)
    touch = f"touch {marker}"
    return {
        "os.system": P(G("os", "system"), T(U(touch)), b"R"),
        "builtins.eval": P(G("builtins", "eval"), T(U(f"__import__('os').system('{touch}')")),
                           b"R"),
        "builtins.eval (py2 name)": P(G("__builtin__", "eval"), T(U("1")), b"R"),
        "subprocess.Popen": P(G("subprocess", "Popen"), T(T(U("touch"), U(marker)) + b"l"),
                              b"R"),
        "posix.system": pickle.dumps({"w": Evil(touch)}, protocol=2),
        "posix.system (STACK_GLOBAL)": pickle.dumps([Evil(touch)], protocol=4),
        "pickle.loads": P(G("pickle", "loads"),
                          T(b"C" + bytes([len(pickle.dumps(Evil(touch)))])
                            + pickle.dumps(Evil(touch))), b"R"),
        "torch.load": P(G("torch", "load"), T(U("x.pt")), b"R"),
        "builtins.getattr": P(G("builtins", "getattr"), T(ODICT, U("clear")), b"R"),
        "torch.serialization._get_layout": P(G("torch.serialization", "_get_layout"),
                                             T(U("torch.strided")), b"R"),
        "opcode INST": b"(S'" + touch.encode() + b"'\nios\nsystem\n.",
        "opcode OBJ": b"\x80\x02(" + G("collections", "OrderedDict") + b"o.",
        "opcode EXT1": b"\x80\x02\x82\x01)R.",
        "call torch.Tensor": P(G("torch", "Tensor"), b")R"),
        "set the state of Tensor": P(TENSOR(), b"}" + U("_data") + U("x") + b"sb"),
        "set the state of collections.OrderedDict": P(G("collections", "OrderedDict"), b"}" + U("a")
                                        + I(1) + b"sb"),
        "set the state of OrderedDict": P(ODICT, b"}" + U("items") + I(1) + b"sb"),
        "APPEND on a Tensor": P(TENSOR(), I(1), b"a"),
        "SETITEM on a Tensor": P(TENSOR(), I(0), I(1), b"s"),
        "refused to call": P(G("torch", "FloatStorage"), b")R"),
        "persistent id": P(T(U("module"), U("os")) + b"Q"),
        "_codecs.encode": P(G("_codecs", "encode"), T(U("x"), U("rot13")), b"R"),
        "bytearray": P(G("builtins", "bytearray"), T(I(10 ** 12)), b"R"),
        "create a": P(G("torch._utils", "_rebuild_tensor_v2"), b")\x81"),
    }


def test_malicious_pickles_are_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    for what, payload in _payloads(marker).items():
        with pytest.raises(hn.SerializationError, match="refused") as info:
            hn.load(archive(payload))
        assert what.split(" (")[0] in str(info.value), (what, str(info.value))
        assert not marker.exists(), what
    # the payloads are live: a plain unpickler runs them (hybridnet never does)
    pickle.loads(_payloads(marker)["posix.system"])
    assert marker.exists()


def test_storage_records_are_checked_before_reading():
    cases = {
        "no record 'data/7'": P(TENSOR(PID(key="7"))),
        "holds 16 bytes, its tensors need 4000000000000000": P(TENSOR(PID(numel=10 ** 15))),
        "reaches past its storage": P(TENSOR(size=(10 ** 6, 10 ** 6), stride=(10 ** 6, 1))),
        "expanded view": P(TENSOR(size=(10 ** 6, 10 ** 6), stride=(0, 0))),
        "offset -1": P(TENSOR(offset=-1)),
        "size must be": P(TENSOR(size=(-2, 2))),
        "do not fit size": P(TENSOR(size=(2, 2), stride=(1,))),
        "declared twice": P(T(TENSOR(), TENSOR(PID(kind="DoubleStorage"))))}
    for message, payload in cases.items():
        tracemalloc.start()
        try:
            with pytest.raises(hn.SerializationError, match=message):
                hn.load(archive(payload))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 20 << 20, (message, peak)
    short = archive(P(TENSOR()), records={"data/0": b"\x00" * 15})
    with pytest.raises(hn.SerializationError, match="holds 15 bytes, its tensors need 16"):
        hn.load(short)


@pytest.mark.parametrize("name", ["../evil/data.pkl", "/abs/data.pkl", "archive/../../x",
                                  "other/data/0", "archive\\..\\x", "top"])
def test_bad_record_names_are_refused(name):
    with pytest.raises(hn.SerializationError, match="record name"):
        hn.load(archive(P(TENSOR()), extra=[(name, b"x")]))


def test_damaged_archives():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zipfile warns of the duplicate)
        twice = archive(P(TENSOR()), extra=[("archive/data/0", b"\x00" * 16)])
    with pytest.raises(hn.SerializationError, match="twice"):
        hn.load(twice)
    odd = io.BytesIO()
    with zipfile.ZipFile(odd, "w") as z:
        z.writestr("a/data.pkl", P(I(1)))
        z.writestr("a/byteorder", b"middle")
    with pytest.raises(hn.SerializationError, match="unknown byte order"):
        hn.load(io.BytesIO(odd.getvalue()))


def test_truncated_and_corrupted_files_raise_serialization_errors():
    data = _saved({"w": torch.randn(3, 3), "n": [1, 2.5, "x"], "b": torch.ones(2, dtype=torch.bool)}
                  ).getvalue()
    for n in sorted(set(range(0, len(data), 37)) | {1, 3, 4, len(data) - 1}):
        with pytest.raises(hn.SerializationError):
            hn.load(io.BytesIO(data[:n]))
    pkl = zipfile.ZipFile(io.BytesIO(data)).read("archive/data.pkl")
    for n in range(len(pkl)):  # every truncation of data.pkl inside a good archive
        with pytest.raises(hn.SerializationError):
            hn.load(archive(pkl[:n], records={}))
    rng = np.random.default_rng(0)
    for _ in range(300):  # random byte flips: loaded or refused, never another error
        bad = bytearray(pkl)
        for i in rng.integers(0, len(bad), 3):
            bad[i] = int(rng.integers(0, 256))
        try:
            hn.load(archive(bytes(bad), records={}))
        except hn.SerializationError:
            pass


def test_pickle_size_limit(monkeypatch):
    monkeypatch.setattr(torch_pt, "PICKLE_LIMIT", 100)
    with pytest.raises(hn.SerializationError, match="more than the 100 read"):
        hn.load(_saved({"w": torch.ones(2), "pad": "x" * 200}))


def test_a_torch_training_checkpoint_resumes_in_hybridnet():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)

    def torch_step():
        opt.zero_grad()
        net(torch.from_numpy(x)).square().sum().backward()
        opt.step()
    torch_step()
    ckpt = hn.load(_saved({"model": net.state_dict(), "optim": opt.state_dict(), "epoch": 1}))
    assert ckpt["epoch"] == 1 and ckpt["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)
    model = hn.nn.Linear(3, 2)
    model.load_state_dict(ckpt["model"])
    hopt = hn.optim.Adam(model.parameters(), lr=0.5)
    hopt.load_state_dict(ckpt["optim"])
    for _ in range(3):
        torch_step()
        hopt.zero_grad()
        model(hn.tensor(x)).square().sum().backward()
        hopt.step()
    np.testing.assert_allclose(np_of(model.weight), net.weight.detach().numpy(), atol=1e-6)


def test_tensors_with_python_attributes_are_refused():
    t = torch.ones(2)
    t.note = "x"
    with pytest.raises(hn.SerializationError, match="tensor with Python attributes"):
        hn.load(_saved({"t": t}))
    p = torch.nn.Parameter(torch.ones(2))
    p.note = "x"
    with pytest.raises(hn.SerializationError, match="Parameter with Python attributes"):
        hn.load(_saved({"p": p}))


def test_a_whole_pickled_model_is_refused_with_advice(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(TorchNet(), path)
    with pytest.raises(hn.SerializationError, match=r"refused the global .*TorchNet.*"
                       r"save model.state_dict\(\)"):
        hn.load(path)
