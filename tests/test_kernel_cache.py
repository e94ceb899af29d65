"""The on-disk kernel cache: reused across processes, damaged entries rebuilt."""

import os
import subprocess
import sys
import textwrap

import numpy as np

_SCRIPT = textwrap.dedent("""
    import numpy as np, hybridnet as hn
    f = hn.trace(lambda x: (x * 1.5 + 0.1).tanh() * hn.sigmoid(x), backend="numba")
    x = hn.tensor(np.linspace(-3, 3, 64, dtype=np.float32))
    f(x)
    y = f(x)
    kernel = next(iter(f.specializations.values())).traces[0].result.kernel
    ref = np.tanh(x.numpy() * 1.5 + 0.1) / (1 + np.exp(-x.numpy()))
    hits = sum(kernel.fn.stats.cache_hits.values())  # Numba loaded machine code from disk
    print(hits, f.stats.compiled_calls, float(np.abs(y.numpy() - ref).max()))
    print(len(f.llvm_ir))
""")


def _run(cache_dir):
    env = dict(os.environ, HYBRIDNET_CACHE_DIR=str(cache_dir))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, check=True, timeout=300)
    out = proc.stdout.split()
    # (the LLVM IR is there also for code Numba loaded from disk, without its warning)
    assert int(out[3]) > 1000 and "Inspection disabled" not in proc.stderr
    return int(out[0]), int(out[1]), float(out[2])


def _files(cache_dir, suffix):
    found = []
    for root, _, names in os.walk(cache_dir):
        found += [os.path.join(root, n) for n in names if n.endswith(suffix)]
    return found


def test_kernels_are_written_reused_and_rebuilt_when_damaged(tmp_path):
    hits, compiled, err = _run(tmp_path)
    assert hits == 0 and compiled == 1 and err < 1e-5
    modules, machine_code = _files(tmp_path, ".py"), _files(tmp_path, ".nbc")
    assert len(modules) == 1 and machine_code, "the kernel and Numba's cache are on disk"
    hits, compiled, _ = _run(tmp_path)
    assert hits == 1 and compiled == 1  # a second process loads it instead of compiling
    assert _files(tmp_path, ".py") == modules  # same content, same file name
    for path in machine_code:
        with open(path, "wb") as f:
            f.write(b"not a numba cache entry")
    with open(modules[0], "a") as f:
        f.write("\nraise RuntimeError('tampered')\n")
    _, compiled, err = _run(tmp_path)
    assert compiled == 1 and err < 1e-5  # still compiled, still right
    with open(modules[0]) as f:
        assert "tampered" not in f.read()  # the module was rewritten from the expected source


def test_cache_can_be_disabled(tmp_path, monkeypatch):
    from runtime.numba_engine import cache_dir
    monkeypatch.setenv("HYBRIDNET_CACHE_DIR", str(tmp_path))
    assert cache_dir() == os.path.join(str(tmp_path), "kernels")
    monkeypatch.setenv("HYBRIDNET_CACHE", "0")
    assert cache_dir() is None


def test_module_source_is_self_contained():
    import hybridnet as hn
    from compiler.lowering.numba_codegen import lower
    from compiler.passes import optimize
    from runtime.numba_engine import module_source
    with hn.record() as rec:
        (hn.tensor(np.ones(3, np.float32)) * 0.1 + float("inf")).exp()
    text = module_source(lower(optimize(rec.graph)[0]))
    namespace = {}
    exec(compile(text, "<k>", "exec"), namespace)  # noqa: S102 (our own generated code)
    assert callable(namespace["entry"])
    consts = [v for k, v in namespace.items() if k.startswith("K")]
    assert any(isinstance(v, np.float32) and np.isclose(v, np.float32(0.1)) for v in consts)
