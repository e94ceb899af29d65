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


@pytest.fixture
def two_threads():
    """As on a 2-core machine whatever this one is: large products get 2 threads."""
    saved = blas._wide[0]
    blas._wide[0] = 2
    yield
    blas._wide[0] = saved
    blas._set(1)


def test_import_puts_blas_on_one_thread():
    assert blas.threads() and _now() == {1}


def test_macs_counts_multiply_adds_with_batch():
    assert blas.macs((32, 128), (128, 64)) == 32 * 128 * 64
    assert blas.macs((5, 32, 128), (128, 64)) == 5 * 32 * 128 * 64
    assert blas.macs((32, 128), (5, 128, 64)) == 5 * 32 * 128 * 64
    assert blas.macs((128,), (128, 4)) == 128 * 4


@pytest.mark.usefixtures("two_threads")
def test_eager_products_choose_threads_by_size():
    small = hn.randn(32, 128) @ hn.randn(128, 128)
    assert _now() == {1}
    big_a, big_b = hn.randn(256, 256), hn.randn(256, 256)  # 2**24 multiply-adds
    big = big_a @ big_b
    assert _now() == {2}
    hn.randn(8, 8) @ hn.randn(8, 8)  # back to one thread for the next small product
    assert _now() == {1}
    np.testing.assert_allclose(big.numpy(), big_a.numpy() @ big_b.numpy(), rtol=1e-4)
    assert small.shape == (32, 128)


@pytest.mark.usefixtures("two_threads")
def test_backward_products_follow_the_rule():
    w = hn.randn(256, 256, requires_grad=True)
    x = hn.randn(256, 256)
    (x @ w).sum().backward()  # the vjp's products are large too
    assert _now() == {2}
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().T @ np.ones((256, 256), np.float32),
                               rtol=1e-4)


@pytest.mark.usefixtures("two_threads")
def test_compiled_kernels_choose_threads_by_size():
    layer = hn.trace(lambda x, w: hn.relu(x @ w.T))
    small = hn.trace(lambda x, w: hn.relu(x @ w.T))
    x, w = hn.randn(64, 784), hn.randn(256, 784)
    xs, ws = hn.randn(32, 128), hn.randn(128, 128)  # a small product through BLAS
    with hn.no_grad():
        for _ in range(3):
            out = layer(x, w)
            assert _now() == {2}
            small(xs, ws)
            assert _now() == {1}
    assert layer.stats.compiled_calls >= 1 and small.stats.compiled_calls >= 1
    assert "np.dot" in small.source  # (it does call BLAS)
    np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy() @ w.numpy().T, 0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("two_threads")
def test_every_product_threaded_restores_the_rule():
    with blas.every_product_threaded():
        assert _now() == {2}
        hn.randn(4, 4) @ hn.randn(4, 4)
        assert _now() == {2}
    assert _now() == {1} and blas._wide[0] == 2


@pytest.mark.parametrize("value,expected", [("3", {3}), ("keep", None)])
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
