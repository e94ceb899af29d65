"""Lowering: optimized graphs to backend code (Numba loop source; LLVM IR later)."""
