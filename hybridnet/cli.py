"""The `hybridnet` command line: `info`, `bench`, `explain` and `export` (docs/cli.md).

`main(argv)` returns the exit status instead of exiting, so tests call it in-process.
Errors print one line, `hybridnet: error: ...`, on stderr (`--traceback` shows the
traceback too): 2 for a usage error (an unknown workload, bad shapes), 1 otherwise.
"""

import argparse
import importlib
import importlib.util
import os
import sys
import traceback

import numpy

import hybridnet
from hybridnet import cli_bench
from hybridnet.cli_bench import BenchError

EXPORT_FORMATS = ("json", "onnx", "dot", "llvm")


class CLIError(BenchError):
    """A user-facing error: printed as one line, exit status `.status`."""


# ---- parsers ---------------------------------------------------------------------------

BENCH_EPILOG = """\
workloads (default sizes):
{workloads}

columns: median (time per call), vs hn eager (hn eager's median / this median),
compile (the first two calls of a compiled implementation: trace and compile),
break-even (calls after which compiling paid for itself against the same framework's
eager run). PyTorch and JAX rows appear when they are installed.

examples:
  hybridnet bench                          # every workload at its default sizes
  hybridnet bench mlp rnn --repeat 9
  hybridnet bench elementwise --sizes 1000 1000000 --json w1.json --plot w1.png
"""

EXPLAIN_EPILOG = """\
FUNCTION is a function of tensors, an hn.nn.Module instance, or an hn.nn.Module class
(instantiated with no arguments). SHAPES gives one random input per argument
(hn.randn): sizes joined by 'x', arguments separated by commas; '2x3,4' means two
arguments shaped (2, 3) and (4,).

examples:
  hybridnet explain mymodel:predict --example-shapes 32x784
  hybridnet explain path/to/model.py:Net --example-shapes 8x16 --no-grad
"""

EXPORT_EPILOG = """\
Loads FUNCTION and builds the example inputs as `hybridnet explain` does, then calls
hn.export(fn, *inputs, path=FILE, format=FORMAT).

examples:
  hybridnet export mymodel:Net --example-shapes 1x784 --format json -o net.json
  hybridnet export mymodel:predict --example-shapes 2x3,3 --format dot -o predict.dot
"""


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true",
                        help="on an error, show the Python traceback too")
    return common


def _target_options(p):
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="a dotted module importable from the current directory, or a .py "
                        "file, then ':' and a function or hn.nn.Module in it")
    p.add_argument("--example-shapes", required=True, metavar="SHAPES",
                   help="shapes of the random example inputs, e.g. 2x3,4")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="dtype of the example inputs (default float32)")
    p.add_argument("--seed", type=int, default=0, help="hn.manual_seed (default 0)")
    p.add_argument("--no-grad", action="store_true", help="run under hn.no_grad()")


def _add_bench(sub, common):
    p = sub.add_parser(
        "bench", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="time built-in workloads: hybridnet eager and traced, NumPy, installed peers",
        description="Time built-in workloads with hybridnet eager and traced (hn.trace), a\n"
                    "hand-written NumPy version, PyTorch eager, torch.compile and jax.jit\n"
                    "(when installed); print medians, speedups, compile time and break-even.",
        epilog=BENCH_EPILOG.format(workloads="\n".join(
            f"  {w.name:12} {w.summary} ({w.size_name}: {' '.join(map(str, w.sizes))})"
            for w in cli_bench.WORKLOADS.values())))
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                   help=f"workloads to run (default: all): {', '.join(cli_bench.WORKLOADS)}")
    p.add_argument("--sizes", nargs="+", type=int, metavar="N",
                   help="sizes to run instead of each workload's defaults")
    p.add_argument("--repeat", type=int, default=5, metavar="N",
                   help="timed runs per row; the median is reported (default 5)")
    p.add_argument("--json", metavar="OUT.json", help="also write the rows as JSON")
    p.add_argument("--plot", metavar="OUT.png",
                   help="also plot time against size (needs matplotlib)")
    p.add_argument("--no-peers", action="store_true",
                   help="skip PyTorch and JAX even when installed")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridnet",
        description="hybridnet: define-by-run neural networks with a tracing JIT.",
        epilog="`hybridnet COMMAND --help` describes each command; docs/cli.md has more. "
               "The demo lives in examples/quickstart.py (pip install 'hybridnet[examples]').")
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _common()
    sub.add_parser("info", parents=[common],
                   help="print hybridnet, NumPy, Numba and llvmlite versions")
    _add_bench(sub, common)
    _target_options(sub.add_parser(
        "explain", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="trace a function on random inputs and print hn.explain's report",
        description="Import MODULE, trace FUNCTION on random inputs shaped by\n"
                    "--example-shapes and print hn.explain(fn, *inputs): the captured and\n"
                    "optimized graphs, fused kernels, guards, events and compile times.",
        epilog=EXPLAIN_EPILOG))
    export = sub.add_parser(
        "export", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="export a function or module with hn.export",
        description="Import MODULE and write FUNCTION, traced on random inputs shaped by\n"
                    "--example-shapes, with hn.export: json (the graph and its weights,\n"
                    "for hn.load), onnx, dot (Graphviz) or llvm (the kernels' LLVM IR).",
        epilog=EXPORT_EPILOG)
    _target_options(export)
    export.add_argument("--format", default="json", choices=EXPORT_FORMATS,
                        help="output format (default json)")
    export.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="the file to write")
    return parser


# ---- info and bench --------------------------------------------------------------------

def _info() -> str:
    lines = [f"hybridnet {hybridnet.__version__}", f"numpy {numpy.__version__}"]
    for name in ("numba", "llvmlite", "networkx", "scipy"):
        try:
            mod = importlib.import_module(name)
            lines.append(f"{name} {mod.__version__}")
        except ImportError:
            lines.append(f"{name} (not installed)")
    return "\n".join(lines)


def _bench(args) -> int:
    workloads = cli_bench.check_workloads(args.workloads)
    if args.repeat < 1:
        raise CLIError(f"--repeat must be at least 1, got {args.repeat}", status=2)
    if args.sizes and min(args.sizes) < 1:
        raise CLIError(f"--sizes must be positive, got {args.sizes}", status=2)
    if args.plot:
        cli_bench.require_matplotlib()  # fail before the run, not after it
    peers, notes = cli_bench.load_peers(not args.no_peers)
    machine = cli_bench.machine_info(peers)
    rows, run_notes = cli_bench.run(workloads, args.sizes, args.repeat, peers, args.quiet)
    notes += run_notes
    print(cli_bench.format_table(rows, notes, machine, args.repeat))
    if args.json:
        cli_bench.write_json(args.json, rows, notes, machine, args.repeat)
        print(f"wrote {args.json} ({len(rows)} rows)")
    if args.plot:
        cli_bench.write_plot(args.plot, rows)
        print(f"wrote {args.plot}")
    return 0


# ---- explain and export: loading MODULE:FUNCTION ------------------------------------------

def parse_shapes(text: str) -> list:
    """'2x3,4' -> [(2, 3), (4,)]; CLIError (status 2) on bad syntax."""
    hint = "expected sizes joined by 'x', arguments separated by ',', e.g. 2x3,4"
    if not text.strip():
        raise CLIError(f"--example-shapes is empty; {hint}", status=2)
    shapes = []
    for arg in text.split(","):
        dims = []
        for dim in arg.strip().lower().split("x"):
            if not dim.strip().isdecimal():
                raise CLIError(f"bad --example-shapes {text!r}: {dim.strip()!r} is not a "
                               f"size; {hint}", status=2)
            dims.append(int(dim))
        shapes.append(tuple(dims))
    return shapes


def _import_module(spec: str):
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        return _import_file(spec)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name and spec.split(".")[0] == exc.name.split(".")[0]:
            raise CLIError(f"cannot import module {spec!r}: no such module (from the "
                           f"current directory {os.getcwd()})") from exc
        raise CLIError(f"importing {spec!r} failed: {_one_line(exc)}") from exc
    except Exception as exc:
        raise CLIError(f"importing {spec!r} failed: {_one_line(exc)}") from exc


def _import_file(path: str):
    if not os.path.isfile(path):
        raise CLIError(f"cannot import {path!r}: no such file")
    name = "_hybridnet_cli_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the file may import modules beside it
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise CLIError(f"importing {path!r} failed: {_one_line(exc)}") from exc
    return module


def load_target(target: str):
    """'module:function' or 'file.py:Name' -> the callable (Module classes instantiated)."""
    module_spec, sep, attr = target.rpartition(":")
    if not sep or not module_spec or not attr:
        raise CLIError(f"expected MODULE:FUNCTION, got {target!r} (e.g. mymodel:predict)",
                       status=2)
    obj = _import_module(module_spec)
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(obj) if not n.startswith("_")
                           and callable(getattr(obj, n)))
            raise CLIError(f"{module_spec!r} has no {attr!r}" +
                           (f" (callables there: {', '.join(names)})" if names else ""))
        obj = getattr(obj, part)
    if isinstance(obj, type) and issubclass(obj, hybridnet.nn.Module):
        try:
            obj = obj()
        except Exception as exc:
            raise CLIError(f"cannot instantiate {attr}() with no arguments: "
                           f"{_one_line(exc)}") from exc
    if not callable(obj):
        raise CLIError(f"{target!r} is a {type(obj).__name__}, not a function or module")
    return obj


def _example_inputs(args):
    hybridnet.manual_seed(args.seed)
    dtype = getattr(hybridnet, args.dtype)
    return [hybridnet.randn(*shape, dtype=dtype) for shape in parse_shapes(args.example_shapes)]


def _prepare(args):
    inputs = _example_inputs(args)  # (bad shapes fail before importing anything)
    return load_target(args.target), inputs


def _grad_mode(args):
    return hybridnet.no_grad() if args.no_grad else hybridnet.enable_grad()


def _explain(args) -> int:
    fn, inputs = _prepare(args)
    with _grad_mode(args):
        report = hybridnet.explain(fn, *inputs)
    print(report)
    return 0


def _export(args) -> int:
    export = getattr(hybridnet, "export", None)
    if export is None:
        raise CLIError("this hybridnet has no hn.export yet: export is not available")
    fn, inputs = _prepare(args)
    with _grad_mode(args):
        export(fn, *inputs, path=args.output, format=args.format)
    size = os.path.getsize(args.output)
    print(f"wrote {args.format} to {args.output} ({size:,} bytes)")
    return 0


# ---- main --------------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, BenchError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


COMMANDS = {"bench": _bench, "explain": _explain, "export": _export}


def _dispatch(args, parser) -> int:
    if args.version or args.command == "info":
        print(_info())
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("hybridnet: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.traceback:
            traceback.print_exc()
        print(f"hybridnet: error: {_one_line(exc)}", file=sys.stderr)
        return exc.status if isinstance(exc, BenchError) else 1


def main(argv=None) -> int:
    """Entry point of the `hybridnet` console script; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    return _dispatch(args, parser)


if __name__ == "__main__":
    sys.exit(main())
