"""hn_call: llvm kernels gather their buffer pointers in machine code
(compiler.lowering.llvm_call, runtime.llvm_kernel). Every input it does not accept (a
strided, unaligned, wrong-typed or wrong-sized array, an ndarray subclass, not an array
at all) must reach the checked Python path, which converts it or raises a clear error;
never a wrong answer or a crash.

Oracles: NumPy float64/float32 references, eager hybridnet, and the checked path itself
(HYBRIDNET_FAST_CALL=0 in a child process).
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import hybridnet as hn
from runtime import llvm_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _kernel(fn, *args):
    tf = hn.trace(fn, backend="llvm")
    with hn.no_grad():
        tf(*args)
        tf(*args)
    entry = next(iter(tf.specializations.values()))
    return tf, entry.traces[-1].result.kernel


def _relu_bias(shape=(6, 5)):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    return x, b, np.maximum(x + b, 0)


def test_this_python_has_the_fast_layout_and_kernels_use_it():
    assert llvm_kernel.fast_layout() is not None
    x, b, want = _relu_bias()
    _, k = _kernel(lambda x, b: (x + b).relu(), hn.tensor(x), hn.tensor(b))
    assert k.fast
    np.testing.assert_array_equal(k(x, b), want)
    assert "hn_call" in k.source


def test_the_call_checks_are_left_unoptimized_and_the_kernel_is_not():
    """hn_call (per-input checks) is optnone, so LLVM spends its time on the kernel."""
    x, b, want = _relu_bias()
    _, k = _kernel(lambda x, b: (x + b).relu(), hn.tensor(x), hn.tensor(b))
    emitted = [ln for ln in k.source.splitlines() if ln.startswith("define")]
    call = [ln for ln in emitted if '"hn_call"' in ln]
    assert len(call) == 1 and "optnone" in call[0] and "noinline" in call[0]
    assert sum("optnone" in ln for ln in emitted) == 1
    # (in the optimized IR: hn_call's attribute group, and only its, says optnone)
    ir_lines = k.llvm_ir.splitlines()
    groups = {ln.split()[1]: ln for ln in ir_lines if ln.startswith("attributes #")}
    defs = {ln.split("@")[1].split("(")[0]: ln.split()[-2] for ln in ir_lines
            if ln.startswith("define")}
    assert [name.endswith("_c") for name, g in defs.items() if "optnone" in groups[g]] == [True]
    np.testing.assert_array_equal(k(x, b), want)


@pytest.mark.parametrize("how", ["strided", "fortran", "unaligned", "readonly", "subclass"])
def test_inputs_the_fast_path_refuses_still_give_the_right_answer(how):
    x, b, want = _relu_bias()
    _, k = _kernel(lambda x, b: (x + b).relu(), hn.tensor(x), hn.tensor(b))
    if how == "strided":
        x = np.repeat(x, 2, axis=1)[:, ::2]
    elif how == "fortran":
        x = np.asfortranarray(x)
    elif how == "unaligned":
        raw = np.zeros(x.nbytes + 1, np.uint8)[1:]
        x = np.frombuffer(raw.data, np.float32).reshape(x.shape)
        x[...] = want * 0 + x  # (zeros)
        want = np.maximum(x + b, 0)
        assert not x.flags.aligned
    elif how == "readonly":
        x = x.copy()
        x.flags.writeable = False
    else:
        x = x.view(type("Sub", (np.ndarray,), {}))
    np.testing.assert_array_equal(np.asarray(k(x, b)), want)


@pytest.mark.parametrize("bad", ["dtype", "shape", "rank", "list", "count"])
def test_wrong_inputs_raise_a_clear_error_not_a_crash(bad):
    x, b, _ = _relu_bias()
    _, k = _kernel(lambda x, b: (x + b).relu(), hn.tensor(x), hn.tensor(b))
    args = {"dtype": (x.astype(np.float64), b), "shape": (x[:3].copy(), b),
            "rank": (x.reshape(-1), b), "list": (x.tolist(), b), "count": (x,)}[bad]
    with pytest.raises((ValueError, TypeError, AttributeError)) as info:
        k(*args)
    assert "compiled kernel" in str(info.value) or bad == "list"


def test_out_of_range_index_raises_through_the_fast_path():
    emb = hn.nn.Embedding(4, 3)
    idx = np.array([0, 3, 1])
    tf, k = _kernel(lambda i: emb(i) * 2.0, hn.tensor(idx))
    assert k.fast
    table = emb.weight.detach().numpy()
    graph = next(iter(tf.specializations.values())).traces[0].result.optimized
    inputs = [table if len(n.shape) == 2 else idx for n in graph.inputs]
    np.testing.assert_array_equal(k(*inputs), table[idx] * 2)
    with pytest.raises(IndexError, match="out of range"):
        k(*[a if a is table else np.array([0, 4, 1]) for a in inputs])
    np.testing.assert_array_equal(k(*inputs), table[idx] * 2)


def test_temporaries_and_constants():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    c = hn.tensor(rng.standard_normal((8, 16)).astype(np.float32))

    def fn(x, w):
        h = (x @ w).tanh()
        s = hn.softmax(h * 3.0 + c, -1)
        return s, (s @ w.T).sum(0)
    tf, k = _kernel(fn, hn.tensor(x), hn.tensor(w))
    assert k.fast and k.program.temps
    with hn.no_grad():
        want = [t.numpy() for t in fn(hn.tensor(x), hn.tensor(w))]
        got = tf(hn.tensor(x), hn.tensor(w))
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.numpy(), e, rtol=2e-5, atol=2e-5)


def test_threads_calling_one_kernel_at_once_get_their_own_results():
    x, b, _ = _relu_bias((64, 33))
    _, k = _kernel(lambda x, b: (x * 2.0 + b).tanh(), hn.tensor(x), hn.tensor(b))
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            xi = rng.standard_normal(x.shape).astype(np.float32)
            got = k(xi, b)
            if np.abs(got - np.tanh(xi * 2 + b)).max() > 1e-5:
                errors.append(seed)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_without_the_fast_path_the_same_results():
    code = """
import numpy as np, hybridnet as hn
from runtime import llvm_kernel
x = hn.tensor(np.linspace(-2, 2, 30, dtype=np.float32).reshape(5, 6))
tf = hn.trace(lambda x: (x.exp() - 1.0).sum(1), backend="llvm")
with hn.no_grad():
    tf(x)
    y = tf(x)
k = next(iter(tf.specializations.values())).traces[0].result.kernel
print(llvm_kernel.fast_layout() is None, k.fast, repr(y.numpy().tobytes()))
"""
    outs = []
    for flag in ("0", "1"):
        env = dict(os.environ, PYTHONPATH=ROOT, HYBRIDNET_FAST_CALL=flag)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=120, check=True).stdout.split(" ", 2)
        outs.append(out)
    assert outs[0][:2] == ["True", "False"] and outs[1][:2] == ["False", "True"]
    assert outs[0][2] == outs[1][2]
