"""Quickstart: train an MLP on the handwritten digits data set eagerly and with the whole
training step compiled, then compare compiled inference.

    pip install -e ".[examples]" && python examples/quickstart.py

Trains the same model from the same seed twice: eagerly, and with the whole step
(forward, loss, backward, Adam step, zero_grad) under `@hn.trace`, printing each epoch's
time, loss and test accuracy. Then a table: time per epoch and per step of each, the
speedup, the compile time and the step count after which compiling paid off; then the
trained model's inference eagerly and compiled (medians of repeated runs).
"""

import argparse
import time

import numpy as np

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn


def load_digits():
    """8x8 digit images scaled to [0, 1], and int64 labels (scikit-learn's copy)."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError:
        raise SystemExit("this demo needs scikit-learn for its data set: "
                         "pip install -e '.[examples]'") from None
    data = sk_load_digits()
    return data.data.astype(np.float32) / 16.0, data.target.astype(np.int64)


def progress(iterable, desc):
    """A tqdm progress bar when tqdm is installed, else the bare iterable."""
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, leave=False)


class MLP(nn.Module):
    """64 -> hidden -> hidden -> 10 with ReLU."""

    def __init__(self, hidden=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def accuracy(model, x, y):
    """Fraction of correct predictions, computed without recording anything."""
    with hn.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def make_step(model, opt):
    """One training step as PyTorch users write it; returns the loss (no history)."""
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def train(epochs=10, batch=64, seed=0, traced=False):
    """Train from `seed`; `traced`: the whole step under `hn.trace`. Returns the model,
    the per-epoch times and the traced step (or None)."""
    hn.manual_seed(seed)
    images, labels = load_digits()
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train_idx, test_idx = order[:split], order[split:]
    x_test, y_test = hn.tensor(images[test_idx]), hn.tensor(labels[test_idx])
    model = MLP()
    opt = hn.optim.Adam(model.parameters(), lr=1e-3)
    step = make_step(model, opt)
    if traced:
        step = hn.trace(step)
    print(f"\n{'traced step (@hn.trace)' if traced else 'eager'}")
    print(f"{'epoch':>5} {'loss':>8} {'test acc':>9} {'time':>7}")
    times = []
    for epoch in range(1, epochs + 1):
        start, total, seen = time.perf_counter(), 0.0, 0
        shuffled = np.random.default_rng(seed + epoch).permutation(train_idx)
        for i in progress(range(0, len(shuffled), batch), f"epoch {epoch}"):
            idx = shuffled[i:i + batch]
            loss = step(hn.tensor(images[idx]), hn.tensor(labels[idx]))
            total += loss.item() * len(idx)
            seen += len(idx)
        times.append(time.perf_counter() - start)
        print(f"{epoch:>5} {total / seen:>8.4f} {accuracy(model, x_test, y_test):>9.3f} "
              f"{times[-1]:>6.2f}s")
    return model, times, (step if traced else None)


def compare_training(epochs, batch):
    """Eager and traced training from one seed, then the comparison table."""
    _, eager_times, _ = train(epochs, batch)
    model, traced_times, step = train(epochs, batch, traced=True)
    steps = step.stats.calls // epochs
    eager = float(np.median(eager_times))
    warm = float(np.median(traced_times[1:])) if epochs > 1 else traced_times[0]
    compile_s = step.stats.compile_seconds + step.stats.trace_seconds
    gain = (eager - warm) / steps  # seconds saved per step once compiled
    be = compile_s / gain if gain > 0 else float("inf")
    print(f"\ntraining, {steps} steps per epoch of batch {batch} (median epoch; the traced "
          "one after the first, which compiles)")
    print(f"{'mode':<24}{'per epoch':>11}{'per step':>12}")
    for name, seconds in (("eager", eager), ("traced step", warm)):
        print(f"{name:<24}{seconds:>10.3f}s{seconds / steps * 1e3:>9.3f} ms")
    print(f"speedup {eager / warm:.2f}x, compile {compile_s:.2f} s (tracing and "
          f"{step.stats.compiles} compiles), break-even after "
          f"{'never' if be == float('inf') else f'{be:,.0f} steps'}; "
          f"{step.stats.compiled_calls} of {step.stats.calls} steps ran compiled")
    return model


def compare_inference(model, batch=256):
    """Eager vs compiled inference on one batch of test images, printed as a table."""
    images, labels = load_digits()
    x = hn.tensor(images[:batch])
    model.eval()
    traced = hn.trace(model)
    with hn.no_grad():
        eager_out = model(x)
        result = hn.benchmark(traced, x, repeat=9)  # traces, compiles, then times both
        compiled_out = traced(x)
    assert traced.stats.compiled_calls > 0, traced.stats.events
    agree = float((eager_out.argmax(1) == compiled_out.argmax(1)).float().mean())
    diff = float((eager_out - compiled_out).abs().max())
    rows = [("eager", result.eager_seconds), ("compiled (hn.trace)", result.compiled_seconds)]
    print(f"\ninference on a batch of {batch} images")
    print(f"{'mode':<22}{'time per call':>15}")
    for name, seconds in rows:
        print(f"{name:<22}{seconds * 1e6:>12.1f} us")
    be = result.break_even_calls
    print(f"speedup {result.speedup:.2f}x, compile {result.compile_seconds:.3f} s, break-even "
          f"after {'never' if be == float('inf') else f'{be:,.0f} calls'}; "
          f"max |eager - compiled| = {diff:.1e}, same predictions: {agree:.0%}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    compare_inference(compare_training(args.epochs, args.batch))
