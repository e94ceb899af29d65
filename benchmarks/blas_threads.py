"""BLAS threads for matrix products: hybridnet's size rule against BLAS's own threading,
on a quiet machine and next to a busy process.

    python benchmarks/blas_threads.py [--repeat 7]

Rows: a (32,128) x (128,128).T product (an RNN's hidden update), an eager tanh-RNN
forward and backward over 64 steps (batch 32, input 64, hidden 128), a compiled
(64,784)x(784,256) layer, a compiled nn.RNN(128, 128) over 64 steps (one large input
projection, 64 small recurrent products), a (256,128)x(128,128) product (4.2 million
multiply-adds: below the threshold, where a quiet machine loses the second thread's
gain), and a 512^3 product; then a traced MLP and the same model eagerly called in
turns, with eager large products in SciPy's BLAS pool (the kernels' pool; now) against
NumPy's own pool (before). Columns: "rule" is
hybridnet's default (one BLAS thread below compiler.blas.LARGE_MACS multiply-adds per
BLAS call, BLAS's threads above; a kernel gets them when most of its work is large),
"all threads" lets every product use BLAS's threads (what NumPy does by default).
Medians of repeated runs (the two columns alternated three times), all in this one
process; the busy neighbour is a second
process spinning on one of the two cores. Last, a compiled step with large products
forced to BLAS's threads, forced to one thread, and choosing by timing its own calls
(compiler/thread_choice.py), quiet, next to one busy process and next to two.
"""

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import busy_neighbour, fmt_time, median_time, print_table  # noqa: E402

import hybridnet as hn  # noqa: E402
from compiler import blas  # noqa: E402


def _cases():
    rng = np.random.default_rng(0)
    h = hn.tensor(rng.standard_normal((32, 128)).astype(np.float32))
    w = hn.tensor(rng.standard_normal((128, 128)).astype(np.float32))
    xs = [hn.tensor(rng.standard_normal((32, 64)).astype(np.float32)) for _ in range(64)]
    wx = hn.tensor(rng.standard_normal((128, 64)).astype(np.float32) * 0.1, requires_grad=True)
    wh = hn.tensor(rng.standard_normal((128, 128)).astype(np.float32) * 0.1,
                   requires_grad=True)
    big_a = hn.tensor(rng.standard_normal((512, 512)).astype(np.float32))
    mid = hn.tensor(rng.standard_normal((256, 128)).astype(np.float32))
    x = hn.tensor(rng.standard_normal((64, 784)).astype(np.float32))
    w1 = hn.tensor(rng.standard_normal((256, 784)).astype(np.float32))
    layer = hn.trace(lambda x, w: hn.relu(x @ w.T))
    rnn_module = hn.trace(hn.nn.RNN(128, 128))
    seq = hn.tensor(rng.standard_normal((64, 32, 128)).astype(np.float32))

    def rnn():
        state = hn.zeros(32, 128)
        for xt in xs:
            state = (xt @ wx.T + state @ wh.T).tanh()
        state.sum().backward()
        wx.grad = wh.grad = None

    def compiled_layer():
        with hn.no_grad():
            layer(x, w1)

    def compiled_rnn():
        with hn.no_grad():
            rnn_module(seq)

    return {"(32,128)x(128,128).T": lambda: h @ w.T, "eager RNN fwd+bwd, 64 steps": rnn,
            "compiled (64,784)x(784,256) layer": compiled_layer,
            "compiled nn.RNN, 64 steps": compiled_rnn,
            "(256,128)x(128,128).T (4.2M, below)": lambda: mid @ w.T,
            "512x512x512 product": lambda: big_a @ big_a}


def run(title, repeat):
    rows = []
    for name, fn in _cases().items():
        for _ in range(3):  # (compiles the traced ones; loads SciPy's BLAS, which gets the rule)
            fn()
        rules, everys = [], []
        for _ in range(3):  # (alternated: a neighbour's bursts fall on both columns)
            rules.append(median_time(fn, repeat))
            with blas.every_product_threaded():
                everys.append(median_time(fn, repeat))
        rule, every = statistics.median(rules), statistics.median(everys)
        rows.append({"case": name, "rule": rule, "all": every, "ratio": every / rule})
    print_table(title, rows, [("case", "case", str), ("rule", "rule", fmt_time),
                              ("all", "all threads", fmt_time),
                              ("ratio", "all / rule", lambda v: f"{v:.2f}x")])


def _turns():
    """A traced 784-256-10 MLP and the same model eagerly, called in turns."""
    hn.manual_seed(0)
    model = hn.nn.Sequential(hn.nn.Linear(784, 256), hn.nn.ReLU(), hn.nn.Linear(256, 10))
    traced = hn.trace(model)
    x = hn.randn(64, 784)

    def turn():
        with hn.no_grad():
            traced(x)
            model(x)
    return turn


def run_turns(title, repeat):
    """Eager large products in SciPy's BLAS pool, the one compiled kernels use (now),
    against NumPy's own pool (before: two pools with spinning workers)."""
    turn = _turns()
    for _ in range(3):
        turn()
    now, before = [], []
    for _ in range(3):
        now.append(median_time(turn, repeat))
        saved = dict(blas.GEMM)
        blas.GEMM.clear()  # (matmul then threads NumPy's own pool for the product)
        try:
            before.append(median_time(turn, repeat))
        finally:
            blas.GEMM.update(saved)
    row = {"case": "traced + eager MLP (784-256-10, batch 64), in turns",
           "now": statistics.median(now), "before": statistics.median(before)}
    row["ratio"] = row["before"] / row["now"]
    print_table(title, [row], [("case", "case", str),
                               ("now", "one threaded pool (now)", fmt_time),
                               ("before", "two pools (before)", fmt_time),
                               ("ratio", "before / now", lambda v: f"{v:.2f}x")])


def _choosing_kernel():
    """A traced step with large products (a language model's head: (700,200)x(200,1000),
    its softmax and both gradient products) and its compiled kernel."""
    hn.manual_seed(0)
    head = hn.nn.Linear(200, 1000)
    x, y = hn.randn(700, 200, requires_grad=True), hn.randint(0, 1000, (700,))

    def step(x, y):
        head.zero_grad()
        loss = hn.nn.functional.cross_entropy(head(x), y)
        loss.backward()
        return loss
    traced = hn.trace(step)
    for _ in range(3):
        traced(x, y)
    kernel = next(iter(traced.specializations.values())).traces[-1].result.kernel
    kernel = kernel.kernel() if callable(getattr(kernel, "kernel", None)) else kernel
    return (lambda: traced(x, y)), kernel


def run_choice(title, repeat):
    """The kernel forced to BLAS's threads, forced to one thread, and choosing by timing
    (compiler/thread_choice.py: after its comparison; calls alternate the three)."""
    call, kernel = _choosing_kernel()
    chooser = kernel.threads_choice
    if chooser is None:
        print(f"\n{title}: no kernel chooses here (one core, or HYBRIDNET_BLAS_CHOICE=size)")
        return
    fns, slot, setter = kernel._fns, chooser._slot, chooser.setter

    def forced(word):
        def run():
            kernel._chooser, fns[slot] = None, word
            call()
        return run

    def chosen():
        kernel._chooser = chooser
        fns[slot] = setter if chooser.threaded else 0
        call()
    for _ in range(8):  # (its first comparison)
        chosen()
    times = {"wide": [], "one": [], "chosen": []}
    for _ in range(3):
        times["wide"].append(median_time(forced(setter), repeat))
        times["one"].append(median_time(forced(0), repeat))
        times["chosen"].append(median_time(chosen, repeat))
    row = {k: statistics.median(v) for k, v in times.items()}
    row["case"] = "traced LM head step (700x200 @ 200x1000, backward)"
    row["ratio"] = row["chosen"] / min(row["wide"], row["one"])
    row["pick"] = "threads" if chooser.threaded else "one"
    kernel._chooser = chooser
    print_table(title, [row], [("case", "case", str), ("wide", "BLAS threads", fmt_time),
                               ("one", "one thread", fmt_time), ("chosen", "chosen", fmt_time),
                               ("pick", "pick", str),
                               ("ratio", "chosen / best", lambda v: f"{v:.2f}x")])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"BLAS libraries: {blas.threads()} (threads for large products: {blas._wide[0]}, "
          f"from {blas.LARGE_MACS} multiply-adds)")
    run("Quiet machine", args.repeat)
    run_turns("Quiet machine: eager and compiled products in turns", args.repeat)
    run_choice("Quiet machine: a kernel choosing its BLAS threads by timing", args.repeat)
    with busy_neighbour():
        run("With a busy neighbour on one core", args.repeat)
        run_turns("With a busy neighbour: eager and compiled products in turns",
                  args.repeat)
        run_choice("With a busy neighbour: a kernel choosing its BLAS threads",
                   args.repeat)
    with busy_neighbour(2):
        run_choice("With two busy neighbours (both cores): a kernel choosing its BLAS "
                   "threads", args.repeat)


if __name__ == "__main__":
    main()
