"""BLAS threads (compiler/blas.py): one thread for small products, BLAS's threads for
large ones, eager and compiled; the environment switch; results unchanged."""

import os
import subprocess
import sys

import numpy as np
import pytest

import hybridnet as hn
from compiler import blas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _now():
    return set(blas.threads().values())


@pytest.fixture(autouse=True)
def size_rule(monkeypatch):
    """These tests check the size rule itself: products do not choose by timing here
    (compiler/thread_choice.py; tests/test_thread_choice.py)."""
    monkeypatch.setenv("HYBRIDNET_BLAS_CHOICE", "size")


def test_import_puts_blas_on_one_thread():
    assert blas.threads() and _now() == {1}


def test_macs_counts_one_blas_call():
    assert blas.macs((32, 128), (128, 64)) == 32 * 128 * 64
    assert blas.macs((5, 32, 128), (128, 64)) == 32 * 128 * 64  # (BLAS runs per item)
    assert blas.macs((128,), (128, 4)) == 128 * 4
    assert blas.macs((4, 128), (128,)) == 4 * 128


def test_a_kernel_is_large_when_large_products_dominate():
    mlp = [((256, 784), (784, 256)), ((256, 256), (256, 256)), ((256, 256), (256, 10))]
    rnn = [((8192, 128), (128, 128))] + [((32, 128), (128, 128))] * 256
    assert blas.kernel_is_large(mlp)
    assert not blas.kernel_is_large(rnn)  # half its work is in small recurrent products
    assert not blas.kernel_is_large([])


def test_a_loop_bodys_products_count_once_per_step():
    """Regression: a kernel's products were counted outside its loops only, so one large
    product beside a rerolled loop of small ones gave the whole kernel BLAS's threads
    (the loop's small products then ran 2-threaded)."""
    from compiler.lowering.node_rules import large_product
    from compiler.reroll import reroll

    w, u = hn.randn(128, 128), hn.randn(128, 128)

    def f(x, xs):
        y = x @ w  # one large product: 4096*128*128 multiply-adds
        h = hn.zeros(32, 128)
        for t in range(xs.shape[0]):  # 128 small ones of 32*128*128: as much work
            h = (xs[t] @ u + h @ u).tanh()
        return y.sum() + h

    traced = hn.trace(f)
    with hn.no_grad():
        traced(hn.randn(4096, 128), hn.randn(64, 32, 128))
    graph = next(iter(traced.specializations.values())).traces[0].tg.graph
    rolled, made = reroll(graph)
    assert made == 1
    assert large_product(graph) is False  # unrolled: every product is seen
    assert large_product(rolled) is False  # rolled: the body's, once per step


@pytest.fixture
def spy(monkeypatch):
    """Per large eager product: (which BLAS, NumPy's BLAS threads, SciPy's BLAS threads)
    inside it. A 2-D one runs in SciPy's BLAS (`_scipy_gemm`), the library compiled
    kernels call; a batched one in NumPy's (`threaded`)."""
    seen = []

    def both():
        t = blas.threads().items()
        return ({n for p, n in t if "numpy" in p}, {n for p, n in t if "numpy" not in p})

    original_gemm, original_threaded = blas._scipy_gemm, blas.threaded

    def gemm(*args):
        out = original_gemm(*args)
        seen.append(("scipy",) + both())
        return out

    def threaded(fn, *args):
        def probe(*a):
            seen.append(("numpy",) + both())
            return fn(*a)
        return original_threaded(probe, *args)
    monkeypatch.setattr(blas, "_scipy_gemm", gemm)
    monkeypatch.setattr(blas, "threaded", threaded)
    return seen


def _numpy_threads():
    return {n for p, n in blas.threads().items() if "numpy" in p}


@pytest.mark.usefixtures("two_threads")
def test_eager_products_choose_threads_by_size(spy):
    hn.randn(32, 128) @ hn.randn(128, 128)
    assert spy == []
    big_a, big_b = hn.randn(400, 400), hn.randn(400, 400)  # 6.4e7 multiply-adds
    big = big_a @ big_b
    # in SciPy's BLAS, on 2 threads; NumPy's stays on one
    assert spy == [("scipy", {1}, {2})]
    np.testing.assert_allclose(big.numpy(), big_a.numpy() @ big_b.numpy(), rtol=1e-4)
    hn.tensor(np.ones((400, 400), np.int64)) @ hn.tensor(np.ones((400, 400), np.int64))
    assert len(spy) == 1  # (integer products do not use BLAS)
    a3, b2 = hn.randn(2, 400, 400), hn.randn(400, 400)
    batched = a3 @ b2  # in NumPy's BLAS, threaded for the call only
    assert spy[1][:2] == ("numpy", {2}) and _numpy_threads() == {1}
    np.testing.assert_allclose(batched.numpy(), a3.numpy() @ b2.numpy(), rtol=1e-4)


@pytest.mark.usefixtures("two_threads")
def test_backward_products_follow_the_rule(spy):
    w = hn.randn(400, 400, requires_grad=True)
    x = hn.randn(400, 400)
    (x @ w).sum().backward()
    assert [s[0] for s in spy] == ["scipy", "scipy"]  # the forward and the vjp's product
    assert _numpy_threads() == {1}
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().T @ np.ones((400, 400), np.float32),
                               rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_eager_products_match_numpy_in_every_layout(dtype):
    """SciPy's Fortran gemm reads row-major, column-major and strided operands rightly."""
    rng = np.random.default_rng(0)
    a64, b64 = rng.standard_normal((300, 400)), rng.standard_normal((400, 200))
    a, b = a64.astype(dtype), b64.astype(dtype)
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-9)
    saved = blas._wide[0]
    blas._wide[0] = 2
    try:
        for x in (a, np.asfortranarray(a), np.repeat(a, 2, axis=1)[:, ::2]):
            for y in (b, np.asfortranarray(b), np.repeat(b, 2, axis=0)[::2]):
                out = blas.matmul(x, y)
                assert out.dtype == dtype and out.flags.c_contiguous
                np.testing.assert_allclose(out, a64 @ b64, **tol)
    finally:
        blas._wide[0] = saved
        blas._set(1)


def _kernel_threads():
    return {n for p, n in blas.threads().items() if "numpy" not in p}


@pytest.mark.usefixtures("two_threads")
def test_compiled_kernels_choose_threads_by_size(spy):
    layer = hn.trace(lambda x, w: hn.relu(x @ w.T), backend="numba")
    small = hn.trace(lambda x, w: hn.relu(x @ w.T), backend="numba")
    x, w = hn.randn(256, 784), hn.randn(256, 784)  # (5.1e7 multiply-adds)
    xs, ws = hn.randn(32, 128), hn.randn(128, 128)  # a small product through BLAS
    with hn.no_grad():
        for i in range(4):
            out = layer(x, w)  # (the first call runs eagerly; the second compiles)
            assert i < 2 or _kernel_threads() == {2}  # (SciPy's BLAS loads at the compile)
            small(xs, ws)
            assert i < 2 or _kernel_threads() == {1}
    assert _kernel_threads() == {1}
    assert layer.stats.compiled_calls >= 2 and small.stats.compiled_calls >= 2
    assert "np.dot" in small.source and "# BLAS: its threads" in layer.source
    assert "# BLAS" not in small.source
    # (the eager first call: SciPy's BLAS, the library the kernels call)
    assert [s[0] for s in spy] == ["scipy"] and _numpy_threads() == {1}
    np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy() @ w.numpy().T, 0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("two_threads")
def test_eager_and_compiled_products_taking_turns_use_one_threaded_pool(spy):
    """Regression: eager products ran on NumPy's OpenBLAS threads and compiled ones on
    SciPy's; both pools' workers spin after a call, so a traced model's calls between
    eager ones were 10x slower (3.5 ms instead of 0.3 ms; 50-80 ms next to a busy
    process). Now only SciPy's pool ever has threads."""
    hn.manual_seed(0)
    model = hn.nn.Sequential(hn.nn.Linear(784, 256), hn.nn.ReLU(), hn.nn.Linear(256, 10))
    traced = hn.trace(model)
    x = hn.randn(256, 784)  # (its first product: 5.1e7 multiply-adds)
    with hn.no_grad():
        for _ in range(4):
            a = traced(x)
            assert _numpy_threads() == {1}
            b = model(x)
            assert _numpy_threads() == {1}
    assert traced.stats.compiled_calls >= 2
    assert spy and all(s[:2] == ("scipy", {1}) for s in spy)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("two_threads")
def test_every_product_threaded_restores_the_rule():
    with blas.every_product_threaded():
        assert _now() == {2}
        hn.randn(4, 4) @ hn.randn(4, 4)
        assert _now() == {2}
    assert _now() == {1} and blas._wide[0] == 2


def test_a_product_that_raises_leaves_one_thread():
    with pytest.raises(ValueError):
        blas.threaded(np.matmul, np.ones((3, 4)), np.ones((5, 6)))
    assert _now() == {1}


@pytest.mark.parametrize("value,expected", [("3", {3}), ("keep", None), ("KEEP", None)])
def test_the_environment_fixes_or_keeps_the_thread_count(value, expected):
    code = ("import numpy, threadpoolctl; c = threadpoolctl.ThreadpoolController(); "
            "before = {l.num_threads for l in c.select(user_api='blas').lib_controllers}; "
            "import hybridnet as hn; from compiler import blas; "
            "hn.randn(300, 300) @ hn.randn(300, 300); "
            "now = {l.num_threads for l in threadpoolctl.ThreadpoolController()"
            ".select(user_api='blas').lib_controllers}; print(before, now)")
    env = dict(os.environ, PYTHONPATH=ROOT, HYBRIDNET_BLAS_THREADS=value,
               OPENBLAS_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    before, now = proc.stdout.strip().split("} {")
    assert now.strip("{}") == (before.strip("{}") if expected is None else "3")


def test_a_bad_environment_value_is_named_at_import():
    env = dict(os.environ, PYTHONPATH=ROOT, HYBRIDNET_BLAS_THREADS="1.5")
    proc = subprocess.run([sys.executable, "-c", "import hybridnet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "HYBRIDNET_BLAS_THREADS='1.5'" in proc.stderr


@pytest.mark.parametrize("given,expected", [(None, blas.SPIN), ("25", "25")])
def test_scipy_blas_loads_with_a_short_spin_unless_the_environment_says(given, expected):
    """OPENBLAS_THREAD_TIMEOUT is in the environment before SciPy's OpenBLAS loads (its
    idle workers then sleep after 2**18 cycles), and a value the user set is kept."""
    code = ("import os, hybridnet as hn; from compiler import blas; "
            "before = 'scipy.linalg.cython_blas' in __import__('sys').modules; "
            "blas.scipy_pointers(['sgemm']); print(before, os.environ['OPENBLAS_THREAD_TIMEOUT'])")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env.update(PYTHONPATH=ROOT, **({} if given is None else {"OPENBLAS_THREAD_TIMEOUT": given}))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", expected]


@pytest.mark.usefixtures("two_threads")
def test_an_llvm_kernel_threads_only_its_large_products(monkeypatch):
    """A kernel with one large product (an RNN's input projection, hoisted out of its
    loop) and a small one per step: it runs on one thread and switches BLAS to its
    threads around the large product only (each small product threaded could wait for
    a busy neighbour's core: a language model's step 2x slower). The setter is spied on
    through the kernel's function table."""
    import ctypes

    def f(xs, w, u):
        h = hn.zeros(32, 128)
        for t in range(xs.shape[0]):
            h = (xs[t] @ w + h @ u).tanh()
        return h
    xs, w, u = hn.randn(16, 32, 1024), hn.randn(1024, 128) * 0.03, hn.randn(128, 128) * 0.1
    # (the size rule alone: timing would choose a mode per call, tests/test_thread_choice)
    monkeypatch.setenv("HYBRIDNET_BLAS_CHOICE", "size")
    traced = hn.trace(f, backend="llvm")
    with hn.no_grad():
        traced(xs, w, u)
        want = traced(xs, w, u).numpy()
        kernel = next(iter(traced.specializations.values())).traces[0].result.kernel.kernel()
        assert blas.SET_THREADS in kernel.program.fns and not kernel._large
        assert kernel.threads_choice is None
        slot = kernel.program.fns.index(blas.SET_THREADS)
        assert kernel._fns[slot] != 0  # (SciPy's openblas_set_num_threads)
        calls = []
        spy = ctypes.CFUNCTYPE(None, ctypes.c_int)(calls.append)
        kernel._fns[slot] = ctypes.cast(spy, ctypes.c_void_p).value
        got = traced(xs, w, u).numpy()
    assert calls == [2, 1]  # (the 16 steps' products: none)
    assert _kernel_threads() == {1}
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, f(xs, w, u).numpy(), rtol=1e-4, atol=1e-5)
