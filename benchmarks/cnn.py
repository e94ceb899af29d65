"""CNN benchmarks: a LeNet-sized network, forward and whole training step, hybridnet
eager and traced against PyTorch eager and torch.compile (when installed).

    python benchmarks/cnn.py [--quick] [--busy] [--batch 64]

LeNet-5 as usually written today: Conv2d(1, 6, 5, padding=2), ReLU, MaxPool2d(2),
Conv2d(6, 16, 5), ReLU, MaxPool2d(2), Linear(400, 120), ReLU, Linear(120, 84), ReLU,
Linear(84, 10); input (batch, 1, 28, 28) float32. The training step is the one users
write (forward, cross_entropy, zero_grad, backward, SGD with momentum 0.9), under
`@hn.trace` whole. PyTorch runs with 1 thread and with its default (2 on this machine),
the traced code with its defaults. Medians of repeated runs in this one process,
printed with their ratio to PyTorch eager (1 thread); `--busy` runs everything again
next to a process spinning on one core. Compile time: the first traced call into an
empty kernel cache (tracing, optimizing, LLVM), as a first run on a new machine has.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import busy_neighbour, fmt_time, median_time, optional, print_table  # noqa: E402
from training import empty_kernel_cache  # noqa: E402

import hybridnet as hn  # noqa: E402
import hybridnet.nn.functional as F  # noqa: E402
from hybridnet import nn  # noqa: E402


def lenet(lib):
    """LeNet-5 built from `lib`'s nn module (hybridnet.nn or torch.nn)."""
    return lib.Sequential(
        lib.Conv2d(1, 6, 5, padding=2), lib.ReLU(), lib.MaxPool2d(2),
        lib.Conv2d(6, 16, 5), lib.ReLU(), lib.MaxPool2d(2), lib.Flatten(),
        lib.Linear(400, 120), lib.ReLU(), lib.Linear(120, 84), lib.ReLU(), lib.Linear(84, 10))


def _data(batch):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((batch, 1, 28, 28)).astype(np.float32),
            rng.integers(0, 10, batch).astype(np.int64))


def _hn_rows(batch, repeat):
    hn.manual_seed(0)
    model = lenet(nn)
    a, labels = _data(batch)
    x, y = hn.tensor(a), hn.tensor(labels)
    rows = {}
    with empty_kernel_cache():
        forward = hn.trace(model)
        with hn.no_grad():
            start = time.perf_counter()
            forward(x)
            rows["compile_fwd"] = time.perf_counter() - start
            rows["hn eager"] = median_time(lambda: model(x), repeat)
            rows["hn traced"] = median_time(lambda: forward(x), repeat)
        opt = hn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        traced = hn.trace(step)
        start = time.perf_counter()
        traced()
        traced()  # (the first call records; the second compiles and runs compiled)
        rows["compile_step"] = time.perf_counter() - start
        rows["hn eager step"] = median_time(step, repeat)
        rows["hn traced step"] = median_time(traced, repeat)
        rows["compiled"] = f"{traced.stats.compiled_calls}/{traced.stats.calls}"
    return rows


def _torch_rows(torch, batch, repeat, threads):
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = lenet(torch.nn)
    a, labels = _data(batch)
    x, y = torch.from_numpy(a), torch.from_numpy(labels)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    rows = {}
    with torch.no_grad():
        rows["fwd"] = median_time(lambda: model(x), repeat)
    rows["step"] = median_time(step, repeat)
    if threads != 1:
        return rows
    try:
        fwd, cstep = torch.compile(model), torch.compile(step)
        with torch.no_grad():
            start = time.perf_counter()
            fwd(x)
            rows["compile_fwd"] = time.perf_counter() - start
            rows["compiled fwd"] = median_time(lambda: fwd(x), repeat)
        start = time.perf_counter()
        cstep()
        rows["compile_step"] = time.perf_counter() - start
        rows["compiled step"] = median_time(cstep, repeat)
    except Exception as exc:  # noqa: BLE001  (no compiler toolchain: report and go on)
        print(f"torch.compile unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    return rows


def _ratio(v) -> str:
    return "-" if v != v else f"{v:.2f}x"


def _compile_s(c) -> str:
    return "-" if c is None else f"{c[0]:.2f} s / {c[1]:.2f} s"


def run(batch, repeat, label):
    """One table: every row's forward and training-step medians and ratios."""
    ours = _hn_rows(batch, repeat)
    torch = optional("torch")
    peers = {}
    if torch is not None:
        peers["torch eager, 1 thread"] = _torch_rows(torch, batch, repeat, 1)
        peers["torch eager, default threads"] = _torch_rows(torch, batch, repeat, 2)
    base = peers.get("torch eager, 1 thread", {})
    rows = [{"name": "hybridnet eager", "fwd": ours["hn eager"], "step": ours["hn eager step"]},
            {"name": "hybridnet traced (@hn.trace)", "fwd": ours["hn traced"],
             "step": ours["hn traced step"], "compile": (ours["compile_fwd"],
                                                         ours["compile_step"])}]
    for name, r in peers.items():
        rows.append({"name": name, "fwd": r["fwd"], "step": r["step"]})
    if "compiled fwd" in base:
        rows.append({"name": "torch.compile, 1 thread", "fwd": base["compiled fwd"],
                     "step": base["compiled step"],
                     "compile": (base["compile_fwd"], base["compile_step"])})
    for r in rows:
        r["fwd_x"] = r["fwd"] / base["fwd"] if base else float("nan")
        r["step_x"] = r["step"] / base["step"] if base else float("nan")
    print_table(f"LeNet-5, batch {batch}, float32 ({label}); ratios: time / torch eager "
                f"1 thread; traced step ran compiled {ours['compiled']} calls",
                rows, [("name", "", str), ("fwd", "forward", fmt_time),
                       ("fwd_x", "x torch", _ratio), ("step", "train step", fmt_time),
                       ("step_x", "x torch", _ratio),
                       ("compile", "compile fwd / step", _compile_s)])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--busy", action="store_true",
                        help="also run next to a process spinning on one core")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else 9
    run(args.batch, repeat, "quiet machine")
    if args.busy:
        with busy_neighbour():
            run(args.batch, repeat, "next to a busy process")


if __name__ == "__main__":
    main()
