"""The `hybridnet` command line."""

import argparse
import sys

import numpy

import hybridnet


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridnet",
        description="hybridnet: define-by-run neural networks with a tracing JIT.",
        epilog="The demo lives in examples/quickstart.py (pip install 'hybridnet[examples]').")
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="print hybridnet, NumPy, Numba and llvmlite versions")
    return parser


def _info() -> str:
    lines = [f"hybridnet {hybridnet.__version__}", f"numpy {numpy.__version__}"]
    for name in ("numba", "llvmlite", "networkx", "scipy"):
        try:
            mod = __import__(name)
            lines.append(f"{name} {mod.__version__}")
        except ImportError:
            lines.append(f"{name} (not installed)")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Entry point of the `hybridnet` console script."""
    args = _parser().parse_args(argv)
    if args.version or args.command == "info":
        print(_info())
        return 0
    _parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
