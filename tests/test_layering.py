"""The layering rules: `compiler` never imports `runtime` or `hybridnet`, `runtime` never
imports `hybridnet`; no import cycle anywhere in the three packages, counting imports
inside functions too; and imports inside functions only for the heavy dependencies
that `import hybridnet` deliberately does not load.

The import graph is read from the source (every `import`/`from ... import` statement,
at any depth, relative ones resolved), not from `sys.modules`, so an import hidden in a
function that would close a cycle at run time fails here.
"""

import ast
import os
import subprocess
import sys

import networkx as nx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("hybridnet", "runtime", "compiler")

# Imports allowed inside functions, with the reason: each is heavy to import, and is
# needed only by the code path that imports it.
LAZY_OK = {
    "numba": "Numba takes ~0.15 s to import; only compiling needs it",
    "compiler.lowering.mathlib": "it imports Numba (its SIMD math is compiled Numba code)",
    "scipy.special": "~0.2 s to import; only the erf reference implementation needs it",
    "networkx": "only Graph.to_networkx() needs it",
    "importlib.metadata": "~10 ms (it loads email, csv, socket); only disk-cache keys need it",
    "llvmlite": "llvmlite.binding loads LLVM (~65 ms); only the llvm backend's compiles need it",
    "compiler.lowering.llvm_emit": "it imports llvmlite.ir (~10 ms); only the llvm backend "
                                   "needs it",
    "scipy.linalg": "~0.1 s; only llvm kernels that call BLAS need its function pointers",
    "onnx": "an optional dependency (hybridnet[onnx]), ~0.2 s; only format='onnx' needs it",
}


def _python_files(package):
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(dirpath, f)


def _module_name(path) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _targets(module, is_package, node, known):
    """The dotted names an import statement in `module` brings in: `from a import b` is
    a when b is a name defined in a module of `known`, else a.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module
    return [prefix if prefix in known and f"{prefix}.{a.name}" not in known
            else f"{prefix}.{a.name}" for a in node.names]


def import_graph(sources):
    """(graph of module -> module it imports, [(module, line, target) inside functions]).

    `sources` maps module name -> (source text, is_package)."""
    graph, lazy = nx.DiGraph(), []
    for module, (text, is_package) in sources.items():
        graph.add_node(module)
        tree = ast.parse(text)
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _targets(module, is_package, node, sources)
            if id(node) not in top:
                lazy.extend((module, node.lineno, name) for name in names)
            for name in names:
                while name not in sources and "." in name:
                    name = name.rsplit(".", 1)[0]  # `from pkg.mod import fn` -> pkg.mod
                if name in sources and name != module:
                    graph.add_edge(module, name)
    return graph, lazy


def _sources():
    out = {}
    for package in PACKAGES:
        for path in _python_files(package):
            with open(path, encoding="utf-8") as f:
                out[_module_name(path)] = (f.read(), path.endswith("__init__.py"))
    return out


def _cycles(graph):
    return [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]


def test_no_import_cycle_in_hybridnet_runtime_or_compiler():
    graph, _ = import_graph(_sources())
    assert len(graph) > 60
    cycles = _cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_check_sees_cycles_through_function_level_imports():
    sources = {
        "pkg": ("", True),
        "pkg.low": ("def f():\n    from .high import g\n    return g\n", False),
        "pkg.high": ("from .low import f\n", False),
        "pkg.other": ("import pkg.low\n", False),
    }
    graph, lazy = import_graph(sources)
    assert _cycles(graph) == [["pkg.high", "pkg.low"]]
    assert lazy == [("pkg.low", 2, "pkg.high")]


def test_imports_inside_functions_are_only_the_heavy_dependencies():
    _, lazy = import_graph(_sources())
    bad = [(m, line, name) for m, line, name in lazy
           if not any(name == ok or name.startswith(ok + ".") for ok in LAZY_OK)]
    assert not bad, f"imports inside functions (move them to the top of the module): {bad}"


def test_the_tensor_type_sits_at_the_bottom_of_the_user_layer():
    graph, _ = import_graph(_sources())
    below = {m for m in nx.descendants(graph, "hybridnet.tensor") if m.startswith("hybridnet")}
    assert below <= {"hybridnet", "hybridnet._state", "hybridnet.dtypes"}, below
    # dispatch knows the tensor type and the hook table, nothing that records or traces
    above = {"hybridnet.capture", "hybridnet.autograd", "hybridnet.jit", "hybridnet.nn"}
    assert not nx.descendants(graph, "hybridnet.dispatch") & above


@pytest.mark.parametrize("package,forbidden", [("compiler", {"hybridnet", "runtime"}),
                                               ("runtime", {"hybridnet"})])
def test_lower_layers_never_import_upper_ones(package, forbidden):
    sources = {m: s for m, s in _sources().items() if m.split(".")[0] == package}
    assert sources
    graph, lazy = import_graph(_sources())
    bad = sorted((a, b) for a, b in graph.edges if a in sources and b.split(".")[0] in forbidden)
    bad += [(m, name) for m, _, name in lazy if m in sources and name.split(".")[0] in forbidden]
    assert not bad, f"layering violated: {bad}"


@pytest.mark.parametrize("code", [
    # the lower layers load on their own
    "import compiler.ops, compiler.ir, compiler.interpret, compiler.autodiff, runtime; "
    "import sys; assert not any(m.startswith('hybridnet') for m in sys.modules)",
    # eager hybridnet does not pay for Numba
    "import hybridnet, sys; hybridnet.tensor([1.0]) + 1.0; "
    "assert 'numba' not in sys.modules, 'numba imported by import hybridnet'",
])
def test_what_an_import_loads(code):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
