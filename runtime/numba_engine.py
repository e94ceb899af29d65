"""The Numba engine: turn generated entry source into one jitted function.

The source is registered with `linecache` under a readable file name so
tracebacks and `inspect` show the generated code.
"""

import hashlib
import linecache
import time

import numpy as np

# Flags that keep IEEE inf/nan semantics (no 'nnan'/'ninf') but let LLVM vectorize
# reductions and fuse multiply-adds.
FASTMATH = {"reassoc", "contract", "nsz"}


class CompiledKernel:
    """A jitted entry plus its source; call it with the graph's input arrays."""

    def __init__(self, fn, source: str, filename: str, program):
        self.fn = fn
        self.source = source
        self.filename = filename
        self.program = program
        self.compile_seconds = 0.0
        self.compiled = False

    def __call__(self, *arrays):
        if not self.compiled:
            start = time.perf_counter()
            out = self.fn(*arrays)
            self.compile_seconds = time.perf_counter() - start
            self.compiled = True
            return out
        return self.fn(*arrays)

    @property
    def llvm_ir(self) -> str:
        """LLVM IR of every compiled signature (empty before the first call)."""
        return "\n".join(self.fn.inspect_llvm().values())

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.filename} compiled={self.compiled}>"


def compile_program(program) -> CompiledKernel:
    """exec the generated source and wrap its entry with numba.njit (compiled lazily)."""
    import numba

    digest = hashlib.sha256(program.source.encode()).hexdigest()[:12]
    filename = f"<hybridnet-kernel-{digest}>"
    linecache.cache[filename] = (len(program.source), None,
                                 program.source.splitlines(True), filename)
    namespace = dict(program.globals)
    namespace.setdefault("np", np)
    exec(compile(program.source, filename, "exec"), namespace)  # noqa: S102 (our own codegen)
    fn = numba.njit(error_model="numpy", fastmath=FASTMATH, nogil=True)(namespace[program.entry])
    return CompiledKernel(fn, program.source, filename, program)
