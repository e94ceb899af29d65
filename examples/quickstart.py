"""Quickstart: train an MLP on the handwritten digits data set, eagerly.

    pip install -e ".[examples]" && python examples/quickstart.py

Prints the training loss and the test accuracy after every epoch.
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


def train(epochs=10, batch=64, seed=0):
    hn.manual_seed(seed)
    images, labels = load_digits()
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train_idx, test_idx = order[:split], order[split:]
    x_test, y_test = hn.tensor(images[test_idx]), hn.tensor(labels[test_idx])
    model = MLP()
    opt = hn.optim.Adam(model.parameters(), lr=1e-3)
    print(f"{'epoch':>5} {'loss':>8} {'test acc':>9} {'time':>7}")
    for epoch in range(1, epochs + 1):
        start, total, seen = time.perf_counter(), 0.0, 0
        shuffled = np.random.default_rng(seed + epoch).permutation(train_idx)
        for i in progress(range(0, len(shuffled), batch), f"epoch {epoch}"):
            idx = shuffled[i:i + batch]
            x, y = hn.tensor(images[idx]), hn.tensor(labels[idx])
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            seen += len(idx)
        elapsed = time.perf_counter() - start
        print(f"{epoch:>5} {total / seen:>8.4f} {accuracy(model, x_test, y_test):>9.3f} "
              f"{elapsed:>6.2f}s")
    return model


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    train(args.epochs, args.batch)
