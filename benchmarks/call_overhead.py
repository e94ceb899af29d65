"""Per-call cost of a traced call as users write it: tanh(x*2+1) on 16 float32 elements.

Four ways to write it, each traced and called with the same tensor:
  (a) a lambda of one tensor that names no global,
  (b) a function that names globals (`hn`, a module-level scale tensor, a model),
  (c) a traced Module,
  (d) a function taking a list of tensors,
next to the bare compiled kernel call, NumPy, eager hybridnet, torch eager,
torch.compile and jax.jit where installed. Medians of repeated runs in one process;
ratios are against the bare kernel call and against (a).

    python benchmarks/call_overhead.py [--busy]

`--busy` runs the same table with a busy neighbour: a second process spinning on one
of the two cores.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import busy_neighbour, fmt_time, median_time, optional, print_table  # noqa: E402

import hybridnet as hn  # noqa: E402
import hybridnet.nn.functional as F  # noqa: E402

SCALE, OFFSET = 2.0, 1.0


class TanhAffine(hn.nn.Module):
    """tanh(x * 2 + 1) as a module with no parameters."""

    def forward(self, x):
        return hn.tanh(x * 2.0 + 1.0)


def with_globals(x):
    """The same math, naming globals: `F` and two module-level settings."""
    return F.tanh(x * SCALE + OFFSET)


def list_arg(xs):
    """Takes a list of tensors (the second is the offset)."""
    return hn.tanh(xs[0] * 2.0 + xs[1])


def _hn_rows(a):
    x, y = hn.from_numpy(a), hn.ones(1)
    cases = {
        "(a) traced lambda": (hn.trace(lambda t: hn.tanh(t * 2.0 + 1.0)), (x,)),
        "(b) traced fn naming globals": (hn.trace(with_globals), (x,)),
        "(c) traced Module": (hn.trace(TanhAffine()), (x,)),
        "(d) traced fn of a list": (hn.trace(list_arg), ([x, y],)),
    }
    row = {}
    with hn.no_grad():
        for name, (fn, args) in cases.items():
            fn(*args), fn(*args)
            row[name] = median_time(lambda fn=fn, args=args: fn(*args))
            assert fn.stats.compiled_calls > 0, fn.stats
        row["hn eager"] = median_time(lambda: hn.tanh(x * 2.0 + 1.0))
    traced = cases["(a) traced lambda"][0]
    kernel = next(iter(traced.specializations.values())).traces[0].result.kernel.fn
    row["bare numba kernel call"] = median_time(lambda: kernel(a))
    return row


def _peer_rows(a):
    row = {"numpy": median_time(lambda: np.tanh(a * np.float32(2) + np.float32(1)))}
    torch = optional("torch")
    if torch is not None:
        torch.set_num_threads(1)
        t = torch.from_numpy(a)
        tf = lambda v: torch.tanh(v * 2 + 1)  # noqa: E731
        row["torch eager"] = median_time(lambda: tf(t))
        try:
            cf = torch.compile(tf)
            cf(t)
            row["torch.compile"] = median_time(lambda: cf(t))
        except Exception as exc:  # noqa: BLE001  (report, don't crash the benchmark)
            print(f"  torch.compile unavailable: {type(exc).__name__}: {exc}"[:200])
    jax = optional("jax")
    if jax is not None:
        import jax.numpy as jnp
        jf = jax.jit(lambda v: jnp.tanh(v * 2 + 1))
        ja = jnp.asarray(a)
        jf(ja).block_until_ready()
        row["jax.jit"] = median_time(lambda: jf(ja).block_until_ready())
    return row


def run(title):
    a = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    row = _hn_rows(a)
    row.update(_peer_rows(a))
    bare, lam = row["bare numba kernel call"], row["(a) traced lambda"]
    rows = [{"impl": k, "t": v, "bare": v / bare, "lam": v / lam} for k, v in row.items()]
    print_table(title, rows, [("impl", "implementation", str), ("t", "per call", fmt_time),
                              ("bare", "vs bare kernel", lambda v: f"{v:.2f}x"),
                              ("lam", "vs (a)", lambda v: f"{v:.2f}x")])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", action="store_true",
                        help="also measure with a second process spinning on one core")
    args = parser.parse_args()
    run("Per-call cost, tanh(x*2+1) on 16 float32 elements (quiet machine)")
    if args.busy:
        with busy_neighbour():
            run("Per-call cost, same, with a busy neighbour on one core")


if __name__ == "__main__":
    main()
