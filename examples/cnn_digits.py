"""A small CNN on the handwritten digits, trained eagerly and with the whole step traced.

    pip install -e . && python examples/cnn_digits.py

The 8x8 digit images bundled with the tests (tests/data/digits.csv.gz, no download)
go through Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d twice, then a Linear layer. The
same model is trained from the same seed twice, eagerly and with the whole training
step (forward, cross-entropy, backward, Adam step, zero_grad) under `@hn.trace`, and
each epoch prints its loss, test accuracy and time. Then a table compares the speed of
both, and of eager and compiled inference, as medians.
"""

import argparse
import gzip
import os
import time

import numpy as np

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import nn

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                    "digits.csv.gz")


def load_digits():
    """(images float32 (N, 1, 8, 8) in [0, 1], labels int64 (N,))."""
    with gzip.open(DATA, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    images = (table[:, :64] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return images, table[:, 64].astype(np.int64)


class DigitsCNN(nn.Module):
    """(1, 8, 8) -> conv 16 -> pool (4x4) -> conv 32 -> pool (2x2) -> 10 classes."""

    def __init__(self):
        super().__init__()
        # (no conv bias before a batch norm, which subtracts it again: its gradient is 0 up
        # to round-off, and Adam would turn that noise into steps of size lr)
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2))
        self.classifier = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def accuracy(model, x, y):
    """Test accuracy in eval mode (BatchNorm uses its running statistics)."""
    model.eval()
    with hn.no_grad():
        acc = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return acc


def train(epochs, batch, seed, traced):
    """Train from `seed`; returns (model, per-epoch seconds, the traced step or None)."""
    hn.manual_seed(seed)
    images, labels = load_digits()
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train_idx, test_idx = order[:split], order[split:]
    x_test, y_test = hn.tensor(images[test_idx]), hn.tensor(labels[test_idx])
    model = DigitsCNN()
    opt = hn.optim.Adam(model.parameters(), lr=3e-3)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    run = hn.trace(step) if traced else step
    print(f"\n{'traced step (@hn.trace)' if traced else 'eager'}")
    print(f"{'epoch':>5} {'loss':>8} {'test acc':>9} {'time':>7}")
    times = []
    for epoch in range(1, epochs + 1):
        start, total, seen = time.perf_counter(), 0.0, 0
        shuffled = np.random.default_rng(seed + epoch).permutation(train_idx)
        # (drop the last partial batch: one batch shape, so one compiled specialization)
        for i in range(0, len(shuffled) - batch + 1, batch):
            idx = shuffled[i:i + batch]
            loss = run(hn.tensor(images[idx]), hn.tensor(labels[idx]))
            total += loss.item() * len(idx)
            seen += len(idx)
        times.append(time.perf_counter() - start)
        print(f"{epoch:>5} {total / seen:>8.4f} {accuracy(model, x_test, y_test):>9.3f} "
              f"{times[-1]:>6.2f}s")
    return model, times, (run if traced else None)


def median_seconds(fn, repeat=21):
    """Median wall time of fn() over `repeat` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(epochs, batch, seed=0):
    _, eager_times, _ = train(epochs, batch, seed, traced=False)
    model, traced_times, step = train(epochs, batch, seed, traced=True)
    eager = float(np.median(eager_times))
    warm = float(np.median(traced_times[1:])) if epochs > 1 else traced_times[0]
    steps = step.stats.calls // epochs
    compile_s = step.stats.compile_seconds + step.stats.trace_seconds
    images, _ = load_digits()
    x = hn.tensor(images[:256])
    model.eval()
    forward = hn.trace(model)
    with hn.no_grad():
        forward(x)
        forward(x)
        infer_eager = median_seconds(lambda: model(x))
        infer_traced = median_seconds(lambda: forward(x))
        diff = float((model(x) - forward(x)).abs().max())
    print(f"\n{steps} steps of batch {batch} per epoch; median epoch (the traced one after "
          "the first, which compiles); inference on 256 images")
    print(f"{'':<22}{'eager':>10}{'traced':>10}{'speedup':>9}")
    print(f"{'train, per step':<22}{eager / steps * 1e3:>7.2f} ms{warm / steps * 1e3:>7.2f} ms"
          f"{eager / warm:>8.2f}x")
    print(f"{'inference, per call':<22}{infer_eager * 1e3:>7.2f} ms{infer_traced * 1e3:>7.2f} ms"
          f"{infer_eager / infer_traced:>8.2f}x")
    print(f"compile {compile_s:.2f} s (tracing and {step.stats.compiles} compiles); "
          f"{step.stats.compiled_calls} of {step.stats.calls} steps ran compiled; "
          f"max |eager - compiled| inference = {diff:.1e}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    main(args.epochs, args.batch)
