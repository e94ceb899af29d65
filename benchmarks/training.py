"""Training benchmarks: W2 (an MLP training step) and W4 (an RNN trained over sequences of
many lengths), hybridnet eager and traced against NumPy, PyTorch and JAX when installed.

    python benchmarks/training.py [w2] [w4] [lm] [--quick] [--busy]

W2: batch 64, 784-256-256-10, ReLU, softmax cross-entropy, SGD (lr 0.01), float32; the
whole step (zero_grad, forward, loss, backward, step) as users write it. Rows: the step
under `@hn.trace` (compiled forward, backward and update: one kernel; numba backend,
then llvm), `hn.trace(model)`
with an eager loss, backward and step (compiled forward and backward), hybridnet eager,
a hand-written NumPy step, torch eager, torch.compile, jax.jit (value_and_grad + update).
Medians of repeated runs in this one process, as ratios to the traced step.

W4: a tanh RNNCell(64, 128), batch 32, over a stream of sequences of lengths 8..64: the
forward over the sequence, an MSE loss on the last state, backward; against torch eager,
torch.compile of the loss (one compile per length, up to its cache limit) and jax.jit
with lax.scan (one compile per length). Total time of the first pass over the stream
(every compile included, into an empty kernel cache) and of a second, warm pass. The
whole loss traced with each backend: llvm (the default) merges three traced lengths into
one kernel for every length (others are probed once), numba compiles size-generic code.
"""

import argparse
import contextlib
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import busy_neighbour, fmt_time, median_time, optional, print_table  # noqa: E402

import hybridnet as hn  # noqa: E402
import hybridnet.nn.functional as F  # noqa: E402
from hybridnet import nn  # noqa: E402
from hybridnet.cli_bench import numpy_train_step, training_step  # noqa: E402

SIZES = (784, 256, 256, 10)


@contextlib.contextmanager
def empty_kernel_cache():
    """Compile into an empty on-disk kernel cache (as a first run on a new machine)."""
    before = os.environ.get("HYBRIDNET_CACHE_DIR")
    with tempfile.TemporaryDirectory() as path:
        os.environ["HYBRIDNET_CACHE_DIR"] = path
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("HYBRIDNET_CACHE_DIR", None)
            else:
                os.environ["HYBRIDNET_CACHE_DIR"] = before
BATCH, LR = 64, 0.01


# ---- W2: an MLP training step --------------------------------------------------------------

def _hn_model():
    hn.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def _numpy_step(ws):
    """A hand-written NumPy forward, backward and SGD step on [(W, b), ...]."""
    return lambda x, y: numpy_train_step(ws, x, y, LR)


def _torch_rows(torch, a, labels, repeat):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for i in range(3):
        layers.append(torch.nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = torch.from_numpy(a), torch.from_numpy(labels)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    rows = {"torch eager": median_time(step, repeat)}
    try:
        compiled = torch.compile(step)
        for _ in range(3):
            compiled()
        rows["torch.compile"] = median_time(compiled, repeat)
    except Exception as exc:  # noqa: BLE001  (no compiler toolchain: report and go on)
        print(f"torch.compile unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    return rows


def _jax_row(jax, ws, a, labels, repeat):
    jnp = jax.numpy
    params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in ws]

    def loss_fn(params, x, y):
        for i, (w, b) in enumerate(params):
            x = x @ w.T + b
            if i < len(params) - 1:
                x = jnp.maximum(x, 0)
        logp = jax.nn.log_softmax(x, axis=1)
        return -jnp.take_along_axis(logp, y[:, None], 1).mean()

    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, grads)], loss

    x, y = jnp.asarray(a), jnp.asarray(labels)
    state = [params]

    def run():
        state[0], loss = step(state[0], x, y)
        loss.block_until_ready()
    run()
    return median_time(run, repeat)


def bench_w2(quick):
    repeat = 5 if quick else 9
    rng = np.random.default_rng(0)
    a = rng.standard_normal((BATCH, 784)).astype(np.float32)
    labels = rng.integers(0, 10, BATCH)
    x, y = hn.from_numpy(a), hn.tensor(labels)
    times, notes = {}, []
    for name, how in (("hn @trace on the whole step (llvm, the default)", "llvm"),
                      ("hn @trace(backend='numba') on the whole step", "step"),
                      ("hn trace(model) (llvm), eager loss/backward/step", "model"),
                      ("hn eager", None)):
        model = _hn_model()
        opt = hn.optim.SGD(model.parameters(), lr=LR)
        forward = hn.trace(model) if how == "model" else model
        step = training_step(forward, opt)
        if how in ("step", "llvm"):
            step = hn.trace(step, backend="numba" if how == "step" else "llvm")
        start = time.perf_counter()
        with empty_kernel_cache():
            for _ in range(3):  # trace, compile, first compiled call
                step(x, y)
        warmup = time.perf_counter() - start
        times[name] = median_time(lambda step=step: step(x, y), repeat)
        traced = step if how in ("step", "llvm") else forward if how == "model" else None
        if traced is not None:
            notes.append(f"{name}: first 3 calls (empty kernel cache) {warmup:.2f} s; "
                         f"{traced.stats}")
    ws = [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy())
          for m in _hn_model() if isinstance(m, nn.Linear)]
    times["hand-written NumPy step"] = median_time(lambda: _numpy_step(ws)(a, labels), repeat)
    torch, jax = optional("torch"), optional("jax")
    if torch is not None:
        times.update(_torch_rows(torch, a, labels, repeat))
    if jax is not None:
        times["jax.jit"] = _jax_row(jax, ws, a, labels, repeat)
    base = times["hn @trace on the whole step (llvm, the default)"]
    rows = [{"impl": k, "t": v, "ratio": v / base} for k, v in times.items()]
    print_table("W2: MLP training step, batch 64, 784-256-256-10, ReLU, cross-entropy, SGD "
                "(float32; median per step)", rows,
                [("impl", "implementation", str), ("t", "per step", fmt_time),
                 ("ratio", "vs hn @trace step", lambda v: f"{v:.2f}x")])
    for note in notes:
        print("  " + note)
    return rows


# ---- W4: an RNN trained over sequences of many lengths -------------------------------------

def _w4_stream(n_seq):
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 65, n_seq)
    return [(rng.standard_normal((int(n), 32, 64)).astype(np.float32),
             rng.standard_normal((32, 128)).astype(np.float32)) for n in lengths]


def _hn_w4(stream, mode, backend=None):
    hn.manual_seed(0)
    cell = nn.RNNCell(64, 128)
    step = hn.trace(cell, backend=backend) if mode == "cell" else cell

    def loss_of(xs, target):
        h = hn.zeros(32, 128)
        for t in range(xs.shape[0]):
            h = step(xs[t], h)
        return F.mse_loss(h, target)
    loss_fn = hn.trace(loss_of, backend=backend) if mode == "loss" else loss_of
    data = [(hn.from_numpy(xs), hn.from_numpy(t)) for xs, t in stream]

    def run():
        start = time.perf_counter()
        for xs, target in data:
            cell.zero_grad()
            loss_fn(xs, target).backward()
        return time.perf_counter() - start
    cold, warm = run(), run()
    traced = step if mode == "cell" else loss_fn if mode == "loss" else None
    return cold, warm, traced


def _torch_w4(torch, stream, compiled=False):
    """torch eager, or the loss under torch.compile (`compiled`: dynamo unrolls the
    Python loop, so each new length recompiles until its cache limit, 8 by default,
    after which new lengths run eagerly)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cell = torch.nn.RNNCell(64, 128)
    data = [(torch.from_numpy(xs), torch.from_numpy(t)) for xs, t in stream]

    def loss_of(xs, target):
        h = torch.zeros(32, 128)
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
        return torch.nn.functional.mse_loss(h, target)
    loss_fn = torch.compile(loss_of) if compiled else loss_of

    def run():
        start = time.perf_counter()
        for xs, target in data:
            cell.zero_grad()
            loss_fn(xs, target).backward()
        return time.perf_counter() - start
    return run(), run()


def _jax_w4(jax, stream):
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    k = 1 / np.sqrt(128)
    params = [jnp.asarray(rng.uniform(-k, k, s).astype(np.float32))
              for s in ((128, 64), (128, 128), (128,), (128,))]

    def loss_fn(params, xs, target):
        wi, wh, bi, bh = params

        def body(h, x):
            return jnp.tanh(x @ wi.T + bi + h @ wh.T + bh), None
        h, _ = jax.lax.scan(body, jnp.zeros((32, 128), jnp.float32), xs)
        return ((h - target) ** 2).mean()
    grad = jax.jit(jax.grad(loss_fn))
    data = [(jnp.asarray(xs), jnp.asarray(t)) for xs, t in stream]

    def run():
        start = time.perf_counter()
        for xs, target in data:
            jax.block_until_ready(grad(params, xs, target))
        return time.perf_counter() - start
    return run(), run()


def bench_w4(quick):
    stream = _w4_stream(40 if quick else 200)
    rows, notes = [], []
    for name, mode, backend in (
            ("hn @trace on the cell", "cell", None),
            ("hn @trace on the whole loss (llvm, the default)", "loss", "llvm"),
            ("hn @trace(backend='numba') on the whole loss", "loss", "numba"),
            ("hn eager", None, None)):
        with empty_kernel_cache():
            cold, warm, traced = _hn_w4(stream, mode, backend)
        rows.append({"impl": name, "cold": cold, "warm": warm})
        if traced is not None:
            notes.append(f"{name}: {traced.stats}")
    torch, jax = optional("torch"), optional("jax")
    if torch is not None:
        cold, warm = _torch_w4(torch, stream)
        rows.append({"impl": "torch eager", "cold": cold, "warm": warm})
        try:
            cold, warm = _torch_w4(torch, stream, compiled=True)
            rows.append({"impl": "torch.compile (default cache limit)", "cold": cold,
                         "warm": warm})
        except Exception as exc:  # noqa: BLE001  (no compiler toolchain, say)
            print(f"torch.compile unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    if jax is not None:
        cold, warm = _jax_w4(jax, stream)
        rows.append({"impl": "jax.jit(grad) with lax.scan", "cold": cold, "warm": warm})
    steps = sum(len(xs) for xs, _ in stream)
    base = rows[0]
    for r in rows:
        r["cold_ratio"], r["warm_ratio"] = r["cold"] / base["cold"], r["warm"] / base["warm"]
    print_table(f"W4: tanh RNNCell(64, 128), batch 32, {len(stream)} sequences of lengths "
                f"8..64 ({steps} steps), forward + MSE + backward", rows,
                [("impl", "implementation", str), ("cold", "first pass (with compiles)",
                                                    fmt_time),
                 ("cold_ratio", "vs hn cell", lambda v: f"{v:.2f}x"),
                 ("warm", "second pass", fmt_time),
                 ("warm_ratio", "vs hn cell", lambda v: f"{v:.2f}x")])
    for note in notes:
        print("  " + note)
    return rows


# ---- LM: a 2-layer LSTM language model's whole training step --------------------------------

LM = dict(vocab=1000, d=200, layers=2, bptt=35, batch=20)


class _LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(LM["vocab"], LM["d"])
        self.rnn = nn.LSTM(LM["d"], LM["d"], LM["layers"])
        self.head = nn.Linear(LM["d"], LM["vocab"])

    def forward(self, x):
        out, _ = self.rnn(self.embed(x))
        return self.head(out.reshape(-1, LM["d"]))


def _lm_batches(lengths):
    rng = np.random.default_rng(0)
    return [(rng.integers(0, LM["vocab"], (n, LM["batch"])),
             rng.integers(0, LM["vocab"], n * LM["batch"])) for n in lengths]


def _hn_lm(batches, traced):
    hn.manual_seed(0)
    model = _LM()
    opt = hn.optim.SGD(model.parameters(), lr=0.1)

    step = training_step(model, opt)
    fn = hn.trace(step) if traced else step
    data = [(hn.from_numpy(x), hn.from_numpy(y)) for x, y in batches]
    times = []
    for x, y in data:
        start = time.perf_counter()
        fn(x, y).item()
        times.append(time.perf_counter() - start)
    return times, fn


def _torch_lm(torch, batches):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    embed = torch.nn.Embedding(LM["vocab"], LM["d"])
    rnn = torch.nn.LSTM(LM["d"], LM["d"], LM["layers"])
    head = torch.nn.Linear(LM["d"], LM["vocab"])
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    times = []
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        start = time.perf_counter()
        opt.zero_grad()
        out, _ = rnn(embed(x))
        loss = torch.nn.functional.cross_entropy(head(out.reshape(-1, LM["d"])), y)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - start)
    return times


def bench_lm(quick):
    """The LM step over batches of 35 steps, then a shorter one (as a corpus split into
    bptt chunks ends), then 35 again. The traced step's first three calls hold its
    compile: the first runs eagerly (the optimizer creates its state), the second is
    traced, the third compiles (LLVM) and runs."""
    lengths = [35] * (14 if quick else 24) + [17, 35, 35]  # (the kernel compares its
    # BLAS thread modes over its 6 calls after the first: compiler/thread_choice.py)
    batches = _lm_batches(lengths)
    rows = []
    with empty_kernel_cache():
        traced_times, fn = _hn_lm(batches, True)
    eager_times, _ = _hn_lm(batches, False)
    runs = [("hn @trace on the whole step", traced_times), ("hn eager", eager_times)]
    torch = optional("torch")
    if torch is not None:
        runs.append(("torch eager", _torch_lm(torch, batches)))
    for name, t in runs:
        rows.append({"impl": name, "first": sum(t[:3]), "step": float(np.median(t[3:-3]))})
    base = rows[0]["step"]
    for r in rows:
        r["ratio"] = r["step"] / base
    print_table(f"LM: 2-layer LSTM language model (vocab {LM['vocab']}, {LM['d']}/{LM['d']}, "
                f"bptt {LM['bptt']}, batch {LM['batch']}), SGD, whole step", rows,
                [("impl", "implementation", str), ("first", "first three calls", fmt_time),
                 ("step", "median step", fmt_time), ("ratio", "vs traced", lambda v: f"{v:.2f}x")])
    kernels = [e.traces[0].result.kernel for e in fn.specializations.values()]
    llvm = sum(v for k in kernels if k.compiled for p, v in k.phases.items() if p != "lower")
    print(f"  traced: calls {', '.join(fmt_time(t) for t in traced_times[:3])} (eager, "
          f"traced, compiled: LLVM {fmt_time(llvm)}"
          f"); a 17-step batch {fmt_time(traced_times[-3])} (traced), then "
          f"{fmt_time(traced_times[-2])}; {fn.stats}")
    for k in kernels:
        chooser = getattr(k.kernel() if hasattr(k, "_backend") else k, "threads_choice", None)
        if chooser is not None:
            print(f"  BLAS threads: {chooser.describe()}")
    return rows


WORKLOADS = {"w2": bench_w2, "w4": bench_w4, "lm": bench_lm}


def process_start() -> float:
    """The one-time cost of a process's first compiled kernel (importing the llvm
    lowering and llvmlite's binding, starting LLVM), paid before any row so that every
    row's first pass counts its own tracing and compiling only; printed, not hidden."""
    start = time.perf_counter()
    with empty_kernel_cache(), hn.no_grad():
        f = hn.trace(lambda a: (a @ a).tanh())
        x = hn.randn(3, 3)
        f(x), f(x)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sequences")
    parser.add_argument("--busy", action="store_true",
                        help="with a second process spinning on one core")
    args = parser.parse_args()
    print(f"One-time per process, before the rows: the first compiled kernel "
          f"{fmt_time(process_start())} (imports and LLVM's start; a program's first "
          f"traced function pays it)")
    for name in args.workloads:
        if args.busy:
            with busy_neighbour():
                WORKLOADS[name](args.quick)
        else:
            WORKLOADS[name](args.quick)


if __name__ == "__main__":
    main()
