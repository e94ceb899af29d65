"""Module machinery: registration, traversal, state dicts, modes and the containers."""

from collections import OrderedDict

import numpy as np
import pytest
from nn_refs import np_of

import hybridnet as hn

nn = hn.nn


class Block(nn.Module):
    """A small custom module: a Linear, a bare Parameter and two buffers."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.scale = nn.Parameter(hn.ones(2))
        self.register_buffer("running", hn.zeros(2))
        self.register_buffer("scratch", hn.zeros(4), persistent=False)

    def forward(self, x):
        return self.fc(x) * self.scale + self.running


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))

    def forward(self, x):
        return self.head(self.block(x))


NET_PARAMS = ["block.scale", "block.fc.weight", "block.fc.bias", "head.0.weight", "head.0.bias",
              "head.2.weight", "head.2.bias"]


def _names(pairs):
    return [n for n, _ in pairs]


def test_named_parameters_nested_names_and_order():
    net = Net()
    assert _names(net.named_parameters()) == NET_PARAMS
    params = list(net.parameters())
    assert len(params) == 7
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in params)
    assert params[0] is net.block.scale
    assert _names(net.block.named_parameters(prefix="b")) == ["b.scale", "b.fc.weight", "b.fc.bias"]
    assert _names(net.block.named_parameters(recurse=False)) == ["scale"]
    assert sum(p.numel() for p in net.parameters()) == 2 + 6 + 2 + 8 + 4 + 4 + 1


def test_sequential_parameter_names_like_pytorch():
    seq = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)))
    assert _names(seq.named_parameters()) == ["0.weight", "0.bias", "2.0.weight", "2.0.bias",
                                              "2.1.weight", "2.1.bias"]
    named = OrderedDict([("inp", nn.Linear(2, 2)), ("act", nn.ReLU())])
    assert _names(nn.Sequential(named).named_parameters()) == ["inp.weight", "inp.bias"]


def test_shared_module_and_tied_parameter_counted_once():
    lin = nn.Linear(4, 4)
    seq = nn.Sequential(lin, nn.ReLU(), lin)
    assert _names(seq.named_parameters()) == ["0.weight", "0.bias"]
    assert len(list(seq.modules())) == 3  # Sequential, Linear (once), ReLU

    a, b = nn.Linear(3, 5), nn.Linear(3, 5, bias=False)
    b.weight = a.weight  # tied weights
    assert b.weight is a.weight
    tied = nn.Sequential(a, b)
    assert _names(tied.named_parameters()) == ["0.weight", "0.bias"]
    # state_dict keeps every name, as PyTorch does
    assert list(tied.state_dict()) == ["0.weight", "0.bias", "1.weight"]


def test_buffers_persistent_and_not():
    blk = Block()
    assert _names(blk.named_buffers()) == ["running", "scratch"]
    assert len(list(blk.buffers())) == 2
    sd = blk.state_dict()
    assert list(sd) == ["scale", "running", "fc.weight", "fc.bias"]  # own entries first
    assert "scratch" not in sd
    assert not blk.running.requires_grad
    assert all(b is not blk.running for b in blk.parameters())
    # buffers of children are found with their qualified names
    assert _names(Net().named_buffers()) == ["block.running", "block.scratch"]
    # re-registering a buffer as persistent puts it back in the state dict
    blk.register_buffer("scratch", hn.ones(4), persistent=True)
    assert "scratch" in blk.state_dict()
    np.testing.assert_array_equal(np_of(blk.state_dict()["scratch"]), np.ones(4))
    # assigning to a registered buffer replaces it, and must be a tensor
    blk.running = hn.full((2,), 3.0)
    np.testing.assert_array_equal(np_of(blk.state_dict()["running"]), [3.0, 3.0])
    with pytest.raises(TypeError, match="running"):
        blk.running = [1.0, 2.0]


def test_children_and_named_modules():
    net = Net()
    assert [type(m).__name__ for m in net.children()] == ["Block", "Sequential"]
    assert _names(net.named_children()) == ["block", "head"]
    assert _names(net.named_modules()) == ["", "block", "block.fc", "head", "head.0", "head.1",
                                           "head.2"]
    mods = list(net.modules())
    assert mods[0] is net and mods[2] is net.block.fc
    assert len(mods) == 7


def test_state_dict_round_trip_and_copies():
    hn.manual_seed(0)
    src, dst = Net(), Net()
    assert not np.allclose(np_of(src.head[0].weight), np_of(dst.head[0].weight))
    src.block.running = hn.tensor([0.5, -0.5])
    result = dst.load_state_dict(src.state_dict())
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    for (n1, p1), (n2, p2) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert n1 == n2
        np.testing.assert_array_equal(np_of(p1), np_of(p2))
    x = hn.randn(5, 3)
    np.testing.assert_array_equal(np_of(src(x)), np_of(dst(x)))
    # loading copies values: changing the source later does not touch the target
    with hn.no_grad():
        src.head[0].weight.mul_(2.0)
    assert not np.allclose(np_of(src.head[0].weight), np_of(dst.head[0].weight))
    # the target's parameters stay the same objects (updated in place) and still train
    assert dst.head[0].weight.requires_grad and dst.head[0].weight.is_leaf


def test_state_dict_values_are_detached_and_share_memory():
    lin = nn.Linear(2, 2)
    sd = lin.state_dict()
    assert not sd["weight"].requires_grad
    with hn.no_grad():
        lin.weight.fill_(7.0)
    np.testing.assert_array_equal(np_of(sd["weight"]), np.full((2, 2), 7.0))


def test_load_state_dict_accepts_numpy_arrays():
    lin = nn.Linear(3, 2)
    lin.load_state_dict({"weight": np.arange(6.0).reshape(2, 3), "bias": np.array([1.0, 2.0])})
    np.testing.assert_array_equal(np_of(lin.weight), np.arange(6.0).reshape(2, 3))
    assert lin.weight.dtype == hn.float32


def test_load_state_dict_strict_errors_name_the_keys():
    net = Net()
    sd = dict(net.state_dict())
    del sd["head.2.bias"]
    sd["head.9.weight"] = hn.zeros(1)
    with pytest.raises(KeyError) as info:
        net.load_state_dict(sd)
    assert "head.2.bias" in str(info.value) and "head.9.weight" in str(info.value)
    # non-strict: loads what matches and reports the rest
    new = {k: hn.zeros(*v.shape) for k, v in sd.items() if k != "head.9.weight"}
    new["head.9.weight"] = hn.zeros(1)
    result = net.load_state_dict(new, strict=False)
    assert list(result.missing_keys) == ["head.2.bias"]
    assert list(result.unexpected_keys) == ["head.9.weight"]
    assert float(np.abs(np_of(net.head[0].weight)).sum()) == 0.0
    assert float(np.abs(np_of(net.head[2].bias)).sum()) > 0.0  # untouched


@pytest.mark.parametrize("strict", [True, False])
def test_load_state_dict_shape_mismatch_names_key(strict):
    net = Net()
    sd = net.state_dict()
    sd["head.0.weight"] = hn.zeros(3, 3)
    with pytest.raises(hn.ShapeError, match=r"head\.0\.weight"):
        net.load_state_dict(sd, strict=strict)


def test_train_eval_propagate_and_dropout():
    hn.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Sequential(nn.Dropout(0.9)))
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    x = hn.randn(4, 8)
    drop = net[1]
    assert drop(x) is x  # identity in eval
    np.testing.assert_array_equal(np_of(net(x)), np_of(net[0](x)))
    assert net.train() is net
    assert all(m.training for m in net.modules())
    assert (np_of(drop(hn.ones(1000))) == 0).any()
    net.train(False)
    assert not net[2][0].training


def test_zero_grad_and_requires_grad_():
    net = Net()
    net(hn.randn(4, 3)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not np_of(p.grad).any() for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())

    assert net.requires_grad_(False) is net
    assert not any(p.requires_grad for p in net.parameters())
    out = net(hn.randn(2, 3))
    assert not out.requires_grad
    net.requires_grad_()
    assert all(p.requires_grad for p in net.parameters())


def test_apply_visits_children_first_then_self():
    net = Net()
    order = []
    assert net.apply(lambda m: order.append(type(m).__name__)) is net
    assert order == ["Linear", "Block", "Linear", "ReLU", "Linear", "Sequential", "Net"]

    def init_linear(m):
        if isinstance(m, nn.Linear):
            hn.nn.init.constant_(m.weight, 0.25)

    net.apply(init_linear)
    for name, p in net.named_parameters():
        if name.endswith("weight"):
            assert np.all(np_of(p) == 0.25), name


def test_sequential_indexing_slicing_len_append():
    layers = [nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 4), nn.Tanh()]
    seq = nn.Sequential(*layers)
    assert len(seq) == 4
    assert seq[0] is layers[0] and seq[-1] is layers[3]
    assert list(seq) == layers
    tail = seq[1:3]
    assert isinstance(tail, nn.Sequential) and len(tail) == 2
    assert tail[0] is layers[1] and tail[1] is layers[2]
    assert _names(tail.named_parameters()) == ["2.weight", "2.bias"]  # names kept (PyTorch)
    with pytest.raises(IndexError):
        seq[4]
    extra = nn.Linear(4, 1)
    assert seq.append(extra) is seq
    assert len(seq) == 5 and seq[4] is extra
    assert "4.weight" in dict(seq.named_parameters())
    x = hn.randn(3, 2)
    expected = x
    for m in layers + [extra]:
        expected = m(expected)
    np.testing.assert_allclose(np_of(seq(x)), np_of(expected), rtol=1e-6)
    assert seq(x).shape == (3, 1)


def test_module_list():
    ml = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)])
    assert len(ml) == 2 and isinstance(ml[1], nn.Linear) and ml[-1].out_features == 3
    ml.append(nn.Linear(3, 1)).extend([nn.ReLU(), nn.Linear(1, 1)])
    assert len(ml) == 5
    assert [type(m).__name__ for m in ml] == ["Linear", "Linear", "Linear", "ReLU", "Linear"]
    assert _names(ml.named_parameters())[:4] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert "4.weight" in dict(ml.named_parameters())
    ml.insert(0, nn.Tanh())
    assert type(ml[0]).__name__ == "Tanh" and len(ml) == 6
    assert "1.weight" in dict(ml.named_parameters()) and "5.bias" in dict(ml.named_parameters())
    new = nn.Linear(1, 7)
    ml[5] = new
    assert ml[5] is new and "5.weight" in ml.state_dict()
    assert ml.state_dict()["5.weight"].shape == (7, 1)
    assert isinstance(ml[1:3], nn.ModuleList) and len(ml[1:3]) == 2

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))

    assert len(list(Holder().parameters())) == 6


def test_module_dict():
    md = nn.ModuleDict({"enc": nn.Linear(2, 3), "act": nn.ReLU()})
    assert len(md) == 2 and "enc" in md and "dec" not in md
    md["dec"] = nn.Linear(3, 2)
    assert list(md.keys()) == ["enc", "act", "dec"]
    assert list(md) == ["enc", "act", "dec"]
    assert md["dec"].out_features == 2
    assert [k for k, _ in md.items()] == ["enc", "act", "dec"]
    assert len(list(md.values())) == 3
    assert _names(md.named_parameters()) == ["enc.weight", "enc.bias", "dec.weight", "dec.bias"]
    del md["enc"]
    assert _names(md.named_parameters()) == ["dec.weight", "dec.bias"]
    with pytest.raises(KeyError):
        md["enc"]


def test_forgetting_super_init_gives_clear_error():
    class Broken(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    class BrokenParam(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(hn.zeros(2))

    for cls in (Broken, BrokenParam):
        with pytest.raises(AttributeError, match=r"super\(\)\.__init__\(\)"):
            cls()


def test_attribute_registration_and_deletion():
    m = nn.Module()
    m.w = nn.Parameter(hn.zeros(3))
    m.sub = nn.Linear(1, 1)
    m.plain = 5
    assert _names(m.named_parameters()) == ["w", "sub.weight", "sub.bias"]
    assert m.plain == 5 and "plain" not in m.state_dict()
    m.register_parameter("opt", None)
    assert m.opt is None and "opt" not in dict(m.named_parameters())
    m.add_module("extra", nn.Linear(1, 2))
    assert "extra.weight" in m.state_dict()
    del m.w
    assert "w" not in dict(m.named_parameters())
    # a plain tensor (or anything else) must not shadow a registered parameter or module
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="weight"):
        lin.weight = hn.zeros(2, 2)
    assert isinstance(lin.weight, nn.Parameter)
    lin.weight = nn.Parameter(hn.ones(2, 2))  # a new Parameter replaces it
    assert np_of(dict(lin.named_parameters())["weight"]).sum() == 4.0
    lin.bias = None
    assert lin.bias is None and list(dict(lin.named_parameters())) == ["weight"]
    with pytest.raises(TypeError, match="sub"):
        m.sub = "not a module"
    m.sub = None
    assert m.sub is None and "sub.weight" not in m.state_dict()
    with pytest.raises(AttributeError, match="nothing"):
        _ = m.nothing
    # a module without forward says so
    with pytest.raises(NotImplementedError, match="forward"):
        m(hn.zeros(1))


def test_parameter_basics_and_repr():
    p = nn.Parameter(hn.tensor([1.0, 2.0]))
    assert isinstance(p, hn.Tensor) and p.requires_grad and p.is_leaf
    assert not nn.Parameter(hn.zeros(2), requires_grad=False).requires_grad
    assert repr(p).startswith("Parameter containing")
    (p * p).sum().backward()
    np.testing.assert_array_equal(np_of(p.grad), [2.0, 4.0])
    text = repr(Net())
    assert "(block): Block" in text and "(head): Sequential" in text
    assert "in_features=2, out_features=4" in text


def test_call_runs_forward_and_gradients_flow():
    net = Net()
    x = hn.randn(6, 3)
    out = net(x)
    assert out.shape == (6, 1)
    out.sum().backward()
    assert net.block.scale.grad.shape == (2,)
    assert net.block.running.grad is None  # buffers are not trained
