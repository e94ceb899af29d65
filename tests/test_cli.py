"""The `hybridnet` command line (hybridnet/cli.py, hybridnet/cli_bench.py): each command's
help, a real `bench` run with its JSON and plot, `explain` and `export` on a module file,
and the error paths (one `hybridnet: error:` line on stderr, no traceback, non-zero)."""

import inspect
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hybridnet as hn
from hybridnet import cli, cli_bench
from hybridnet.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

MODULE_SOURCE = '''
import hybridnet as hn
import hybridnet.nn.functional as F


def predict(x, w):
    return F.relu(x @ w).sum(1) + hn.tanh(x).mean()


class Net(hn.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = hn.nn.Linear(4, 3)

    def forward(self, x):
        return F.softmax(self.fc(x), 1)


def fails(x):
    raise hn.ShapeError("fails: the shapes do not fit\\nsecond line of the message")


not_callable = 3
'''


@pytest.fixture
def module_file(tmp_path, monkeypatch):
    """A module file in tmp_path (the current directory), with sys.path restored after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cli_example_model.py"
    path.write_text(MODULE_SOURCE)
    (tmp_path / "cli_broken_model.py").write_text("import no_such_module_for_the_cli_test\n")
    return path


def _run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _assert_one_error_line(status, err, *needles):
    assert status != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hybridnet: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


# ---- help -------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,needles", [
    ([], ["bench", "explain", "export", "info"]),
    (["bench"], ["--sizes", "--repeat", "--plot", "--json", "--quiet", "mlp-train", "rnn",
                 "break-even", "examples:"]),
    (["explain"], ["MODULE:FUNCTION", "--example-shapes", "--dtype", "2x3,4", "examples:"]),
    (["export"], ["--format", "-o", "--example-shapes", "json", "onnx", "dot", "llvm",
                  "examples:"]),
])
def test_help_of_each_command_exits_0_and_names_its_options(capsys, argv, needles):
    status, out, _ = _run(capsys, *argv, "--help")
    assert status == 0
    for needle in needles:
        assert needle in out


def test_info_prints_versions(capsys):
    status, out, _ = _run(capsys, "info")
    assert status == 0
    assert out.startswith(f"hybridnet {hn.__version__}\nnumpy {np.__version__}")


# ---- bench --------------------------------------------------------------------------------

def test_bench_json_holds_positive_medians_for_the_sizes_asked(capsys, tmp_path):
    out_json = tmp_path / "out.json"
    status, out, _ = _run(capsys, "bench", "elementwise", "--sizes", "16", "--repeat", "2",
                          "--json", str(out_json), "--no-peers", "--quiet")
    assert status == 0
    doc = json.loads(out_json.read_text())
    rows = {r["impl"]: r for r in doc["rows"]}
    assert {"hn eager", "hn traced", "numpy"} <= set(rows)
    assert {r["size"] for r in doc["rows"]} == {16}
    assert {r["workload"] for r in doc["rows"]} == {"elementwise"}
    assert all(r["median_s"] > 0 for r in doc["rows"])
    assert rows["hn eager"]["speedup"] == 1.0
    assert rows["hn traced"]["compile_s"] > 0
    assert rows["hn traced"]["break_even_baseline"] == "hn eager"
    assert rows["hn eager"]["compile_s"] is None
    assert doc["repeat"] == 2
    assert doc["machine"]["cpu_count"] == os.cpu_count()
    assert doc["machine"]["backend"] in ("llvm", "numba")
    assert doc["machine"]["numpy"] == np.__version__
    assert "numba" in doc["machine"] and "llvmlite" in doc["machine"]
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary file left behind
    assert "hn traced" in out and "break-even" in out and "vs hn eager" in out


def test_bench_plot_writes_a_png(capsys, tmp_path):
    png = tmp_path / "out.png"
    status, out, _ = _run(capsys, "bench", "mlp", "--sizes", "8", "--repeat", "2",
                          "--plot", str(png), "--no-peers", "--quiet")
    assert status == 0
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert f"wrote {png}" in out
    assert os.listdir(tmp_path) == ["out.png"]


def test_bench_plot_without_matplotlib_fails_before_running(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    png = tmp_path / "out.png"
    status, out, err = _run(capsys, "bench", "elementwise", "--sizes", "16", "--plot",
                            str(png), "--quiet")
    _assert_one_error_line(status, err, "pip install 'hybridnet[plot]'")
    assert out == ""  # nothing was timed
    assert not png.exists()


def test_an_unknown_workload_exits_2_naming_the_known_ones(capsys):
    status, out, err = _run(capsys, "bench", "elementwise", "nosuchload", "--quiet")
    assert status == 2
    _assert_one_error_line(status, err, "'nosuchload'", *cli_bench.WORKLOADS)
    assert out == ""


def test_an_unknown_command_fails(capsys):
    status, _, err = _run(capsys, "frobnicate")
    assert status == 2
    assert "invalid choice" in err and "frobnicate" in err


@pytest.mark.parametrize("argv", [["--repeat", "0"], ["--sizes", "0"]])
def test_bench_rejects_nonpositive_numbers(capsys, argv):
    status, _, err = _run(capsys, "bench", "elementwise", *argv, "--quiet")
    assert status == 2
    _assert_one_error_line(status, err, argv[0])


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal_and_not_with_quiet(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with cli_bench._progress(3, quiet=False) as bar:
        assert not bar.disable
        bar.update()
    assert "bench" in sys.stderr.getvalue()  # drawn on stderr
    with cli_bench._progress(3, quiet=True) as bar:
        assert bar.disable
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    with cli_bench._progress(3, quiet=False) as bar:
        assert bar.disable


def _rows(**medians):
    return [{"workload": "w", "size": 1, "impl": impl, "median_s": median,
             "compile_s": compile_s} for impl, (median, compile_s) in medians.items()]


def test_speedups_and_break_even_against_each_frameworks_eager():
    rows = cli_bench._finish(_rows(**{"jax.jit": (1e-3, 0.5), "hn eager": (4e-3, None),
                                      "hn traced": (1e-3, 0.3), "torch": (2e-3, None),
                                      "torch.compile": (3e-3, 2.0)}))
    by = {r["impl"]: r for r in rows}
    assert [r["impl"] for r in rows] == ["hn eager", "hn traced", "torch", "torch.compile",
                                         "jax.jit"]
    assert by["hn traced"]["speedup"] == pytest.approx(4.0)
    assert by["hn traced"]["break_even_calls"] == pytest.approx(0.3 / 3e-3)
    assert by["torch.compile"]["break_even_baseline"] == "torch"
    assert by["torch.compile"]["break_even_calls"] is None  # slower: never pays
    assert by["jax.jit"]["break_even_baseline"] is None
    table = "\n".join(cli_bench._table(rows))
    assert "100 calls" in table and "never" in table and "4.00x" in table


def test_json_is_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old")
    rows = _rows(**{"hn eager": (1e-3, None)})
    with pytest.raises(ValueError):  # NaN is not JSON: nothing is written
        cli_bench.write_json(str(path), [dict(rows[0], median_s=float("nan"))], [], {}, 1)

    def broken_fsync(fd):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):  # fails halfway: the old file stays
        cli_bench.write_json(str(path), rows, [], {}, 1)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]
    monkeypatch.undo()
    cli_bench.write_json(str(path), rows, ["a note"], {"cpu_count": 2}, 1)
    assert json.loads(path.read_text())["notes"] == ["a note"]


def _first_result(value):
    value = value[0] if isinstance(value, (tuple, list)) else value
    return np.asarray(value.detach() if hasattr(value, "detach") else value, np.float64)


def _agreement(workload, impls):
    """{implementation: max |difference| from hybridnet eager} on the first call."""
    data = workload.data(4 if workload.name == "rnn" else 8)
    fn, args, _ = workload.hn(data)
    expected = _first_result(fn(*args))
    out = {}
    for impl, build in impls:
        got = _first_result(build(data)())
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5, err_msg=impl)
        out[impl] = float(np.abs(got - expected).max())
    return out


@pytest.mark.parametrize("name", list(cli_bench.WORKLOADS))
def test_the_numpy_version_of_a_workload_computes_the_same(name):
    workload = cli_bench.WORKLOADS[name]
    assert set(_agreement(workload, [("numpy", workload.numpy)])) == {"numpy"}


PEER_CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import test_cli
from hybridnet import cli_bench
peers, _ = cli_bench.load_peers()
done = {}
for w in cli_bench.WORKLOADS.values():
    impls = [("numpy", w.numpy)]
    if "torch" in peers:
        impls.append(("torch", lambda d, w=w: w.torch(peers["torch"], d, lambda f: f)))
    if "jax" in peers:
        impls.append(("jax.jit", lambda d, w=w: w.jax(peers["jax"], d)))
    done[w.name] = sorted(test_cli._agreement(w, impls))
print(json.dumps({"peers": sorted(peers), "done": done}))
"""


def test_installed_peers_compute_the_same_as_hybridnet():
    """PyTorch eager and jax.jit (those installed) agree with hybridnet eager; in a
    subprocess, so that importing them leaves this test process as it was."""
    proc = subprocess.run([sys.executable, "-c", PEER_CHECK, os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    impls = sorted(["numpy"] + [{"torch": "torch", "jax": "jax.jit"}[p]
                                for p in result["peers"]])
    assert result["done"] == {name: impls for name in cli_bench.WORKLOADS}


def test_the_numpy_rnn_backward_matches_hybridnet_gradients():
    workload = cli_bench.WORKLOADS["rnn"]
    data = workload.data(5)
    fn, args, _ = workload.hn(data)
    cell = inspect.getclosurevars(fn).nonlocals["cell"]
    fn(*args)
    _, grads = workload.numpy(data)()
    for name, grad in zip(cli_bench.RNN_PARAMS, grads):
        np.testing.assert_allclose(getattr(cell, name).grad.numpy(), grad, atol=1e-6)


# ---- explain --------------------------------------------------------------------------------

def test_explain_a_function_in_a_module_file(capsys, module_file):
    status, out, err = _run(capsys, "explain", f"{module_file}:predict",
                            "--example-shapes", "2x3,3x4")
    assert status == 0, err
    assert "== hn.explain: predict ==" in out
    assert "float32[2, 3], float32[3, 4]" in out


def test_explain_a_module_class_by_dotted_name_in_float64(capsys, module_file):
    status, out, err = _run(capsys, "explain", "cli_example_model:Net", "--example-shapes",
                            "5x4", "--no-grad", "--dtype", "float64")
    assert status == 0, err
    assert "== hn.explain: Net ==" in out
    assert "float64[5, 4]" in out


@pytest.mark.parametrize("target,shapes,needles", [
    ("cli_broken_model:predict", "2", ["importing 'cli_broken_model' failed",
                                       "no_such_module_for_the_cli_test"]),
    ("cli_broken_model.py:predict", "2", ["importing", "no_such_module_for_the_cli_test"]),
    ("no_such_cli_module_xyz:f", "2", ["cannot import module 'no_such_cli_module_xyz'"]),
    ("missing_file_xyz.py:f", "2", ["no such file"]),
    ("cli_example_model:nope", "2", ["has no 'nope'", "Net", "predict"]),
    ("cli_example_model:not_callable", "2", ["not a function or module"]),
    ("cli_example_model", "2", ["expected MODULE:FUNCTION"]),
    ("cli_example_model:predict", "2xq", ["'q' is not a size", "2x3,4"]),
    ("cli_example_model:predict", "2x3,,4", ["is not a size"]),
    ("cli_example_model:fails", "2", ["ShapeError: fails: the shapes do not fit second line"]),
])
def test_explain_errors_are_one_line_without_a_traceback(capsys, module_file, target, shapes,
                                                         needles):
    status, out, err = _run(capsys, "explain", target, "--example-shapes", shapes)
    _assert_one_error_line(status, err, *needles)
    assert out == ""


def test_usage_errors_exit_2_and_runtime_errors_1(capsys, module_file):
    assert main(["explain", "cli_example_model:predict", "--example-shapes", "2xq"]) == 2
    assert main(["explain", "cli_example_model:fails", "--example-shapes", "2"]) == 1
    capsys.readouterr()


def test_traceback_option_shows_the_traceback(capsys, module_file):
    status, _, err = _run(capsys, "explain", "cli_example_model:fails", "--example-shapes",
                          "2", "--traceback")
    assert status == 1
    assert "Traceback" in err and "raise hn.ShapeError" in err
    assert err.strip().splitlines()[-1].startswith("hybridnet: error: ShapeError")


def test_parse_shapes():
    assert cli.parse_shapes("2x3,4") == [(2, 3), (4,)]
    assert cli.parse_shapes(" 5 , 1X2x3 ") == [(5,), (1, 2, 3)]
    for bad in ("", "2x", "x3", "-1", "2.5", "2;3"):
        with pytest.raises(cli.CLIError):
            cli.parse_shapes(bad)


def _python_m(*argv, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "hybridnet", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_python_dash_m_explain_and_its_error(module_file):
    ok = _python_m("explain", "cli_example_model:predict", "--example-shapes", "2x3,3x4",
                   cwd=module_file.parent)
    assert ok.returncode == 0, ok.stderr
    assert "== hn.explain: predict ==" in ok.stdout
    bad = _python_m("explain", "cli_example_model:nope", "--example-shapes", "2",
                    cwd=module_file.parent)
    assert bad.returncode == 1
    _assert_one_error_line(bad.returncode, bad.stderr, "has no 'nope'")


# ---- export ---------------------------------------------------------------------------------

def test_export_without_hn_export_is_a_clear_error(capsys, module_file, monkeypatch):
    monkeypatch.delattr(hn, "export", raising=False)
    status, _, err = _run(capsys, "export", "cli_example_model:predict", "--example-shapes",
                          "2x3,3x4", "-o", "out.json")
    _assert_one_error_line(status, err, "hn.export")
    assert not os.path.exists("out.json")


def test_export_errors_are_one_line(capsys, module_file, monkeypatch):
    error = getattr(hn, "ExportError", ValueError)

    def refuses(*args, **kwargs):
        raise error("export: the op 'frob' has no json form\n(use format='dot')")
    monkeypatch.setattr(hn, "export", refuses, raising=False)
    status, _, err = _run(capsys, "export", "cli_example_model:predict", "--example-shapes",
                          "2x3,3x4", "--format", "json", "-o", "out.json")
    _assert_one_error_line(status, err, "the op 'frob' has no json form (use format='dot')")


def test_export_passes_the_inputs_path_and_format(capsys, module_file, monkeypatch):
    seen = {}

    def fake_export(fn, *args, path=None, format="json"):
        seen.update(fn=fn, shapes=[a.shape for a in args], format=format)
        with open(path, "w") as f:
            f.write("12345")
        return "12345"
    monkeypatch.setattr(hn, "export", fake_export, raising=False)
    status, out, err = _run(capsys, "export", f"{module_file}:Net", "--example-shapes", "2x4",
                            "--format", "llvm", "-o", "net.ll")
    assert status == 0, err
    assert isinstance(seen["fn"], hn.nn.Module) and seen["fn"].fc.in_features == 4
    assert seen["shapes"] == [(2, 4)] and seen["format"] == "llvm"
    assert out.strip() == "wrote llvm to net.ll (5 bytes)"


# These run the real hn.export (hybridnet/export_load.py).

def test_export_json_writes_a_graph_file(capsys, module_file):
    status, out, err = _run(capsys, "export", "cli_example_model:predict", "--example-shapes",
                            "2x3,3x4", "--format", "json", "-o", "predict.json")
    assert status == 0, err
    size = os.path.getsize("predict.json")
    assert out.strip() == f"wrote json to predict.json ({size:,} bytes)"
    assert isinstance(json.loads(open("predict.json").read()), dict)


def test_export_dot_writes_graphviz(capsys, module_file):
    status, out, err = _run(capsys, "export", "cli_example_model:Net", "--example-shapes",
                            "2x4", "--format", "dot", "-o", "net.dot")
    assert status == 0, err
    assert open("net.dot").read().lstrip().startswith("digraph")
    assert out.startswith("wrote dot to net.dot (")
