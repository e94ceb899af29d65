"""Word-level LSTM language model (pytorch/examples word_language_model) trained on this
repository's own documentation, eagerly and with the whole training step under `hn.trace`.

    python examples/word_language_model.py [--emsize 64] [--nhid 64] [--nlayers 2]
        [--lr 20] [--clip 0.25] [--epochs 6] [--batch_size 20] [--bptt 35]
        [--dropout 0.2] [--tied] [--seed 1111] [--log-interval 5]
        [--mode all|eager|traced] [--quick]

The corpus is README.md and docs/*.md, lowercased, one sentence per line as pytorch's
data.py reads its files (the words of a line, then <eos>); line i goes to the validation
set when i % 10 == 8, to the test set when i % 10 == 9 and to the training set otherwise
(80/10/10). The model is pytorch's RNNModel: Embedding, a 2-layer nn.LSTM, Linear
decoder (tied to the embedding with --tied), dropout on the embeddings, between the LSTM
layers and on its output; trained with truncated backpropagation through time (bptt 35,
batch 20, the hidden state carried over and detached between batches), gradient norm
clipped to 0.25 by `hn.nn.utils.clip_grad_norm_`, SGD at lr 20 divided by 4 whenever the
validation loss does not improve. Sizes default to 64/64 (pytorch's are 200/200) so that
a run takes well under a minute on 2 cores.

It trains twice from one seed, eagerly and with the whole step (zero_grad, forward, loss,
backward, clipping, SGD update) traced, then prints a table. What tracing meets here:

- Dropout draws random masks: each compiled call draws them again from hybridnet's
  generator, in eager's order, so the traced step compiles with dropout and gives the
  eager losses.
- The update is `torch.optim.SGD` (its lr is a runtime input of the kernel, so the
  annealing never recompiles); pytorch's own `p.data.add_(p.grad, alpha=-lr)` also
  compiles.
- The step returns the new hidden state already detached (pytorch detaches it at the
  start of the next batch: the same values): a traced step that returns the LSTM's
  hidden state with its history runs eagerly ("an in-place update inside the call
  changed a value its backward needs").
- The last batch of an epoch is shorter than bptt: its length is a second compile (the
  LSTM's time loop is rerolled, one kernel per length for the first two lengths).
"""

import argparse
import glob
import math
import os
import time

import numpy as np

import hybridnet as hn  # the JIT (hn.trace, hn.explain); the rest is the PyTorch script's
import hybridnet as torch
import hybridnet.nn as nn
import hybridnet.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- data (pytorch's data.py, reading lines instead of files) ---------------------------

class Dictionary:
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus:
    """The project's docs, split 80/10/10 by lines into train, valid and test."""

    def __init__(self, root=ROOT):
        paths = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs",
                                                                                "*.md")))
        lines = []
        for path in paths:
            with open(path, encoding="utf8") as f:
                lines.extend(line.lower() for line in f)
        self.dictionary = Dictionary()
        self.train = self.tokenize([ln for i, ln in enumerate(lines) if i % 10 < 8])
        self.valid = self.tokenize([ln for i, ln in enumerate(lines) if i % 10 == 8])
        self.test = self.tokenize([ln for i, ln in enumerate(lines) if i % 10 == 9])

    def tokenize(self, lines):
        """Add the words to the dictionary; return the ids of all lines as one tensor."""
        idss = []
        for line in lines:
            words = line.split() + ["<eos>"]
            idss.append(torch.tensor([self.dictionary.add_word(w) for w in words],
                                     dtype=torch.int64))
        return torch.cat(idss)


def batchify(data, bsz):
    """Arrange the token stream into `bsz` columns (dropping what does not fit)."""
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def repackage_hidden(h):
    """Wrap hidden states in new tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


# ---- model (pytorch's model.py, LSTM) ---------------------------------------------------

class RNNModel(nn.Module):
    """Encoder, recurrent module, decoder."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


# ---- training ----------------------------------------------------------------------------

def make_train_step(model, criterion, optimizer, clip):
    """One step of truncated BPTT: the function `hn.trace` compiles."""
    def train_step(data, targets, hidden):
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss.detach(), repackage_hidden(hidden)
    return train_step


def evaluate(model, criterion, data_source, bptt, eval_batch_size=10):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i, bptt)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def build(args, corpus):
    """Model, criterion, optimizer and step, from args.seed."""
    torch.manual_seed(args.seed)
    model = RNNModel(len(corpus.dictionary), args.emsize, args.nhid, args.nlayers,
                     args.dropout, args.tied)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    return model, criterion, optimizer, make_train_step(model, criterion, optimizer, args.clip)


def train(args, corpus, mode="eager", log=print):
    """Train from args.seed, the step eager or traced; returns a dict of what happened."""
    model, criterion, optimizer, step = build(args, corpus)
    if mode == "traced":
        step = hn.trace(step)
    train_data = batchify(corpus.train, args.batch_size)
    val_data = batchify(corpus.valid, 10)
    test_data = batchify(corpus.test, 10)
    lr = args.lr
    best_val_loss = None
    best_state = None
    losses, step_s, compiled, val_losses = [], [], [], []
    nbatches = (train_data.size(0) - 1 + args.bptt - 1) // args.bptt
    if args.max_batches:
        nbatches = min(nbatches, args.max_batches)
    start_all = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        epoch_start_time = time.time()
        model.train()
        total_loss = 0.0
        start_time = time.time()
        hidden = model.init_hidden(args.batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            if batch >= nbatches:
                break
            data, targets = get_batch(train_data, i, args.bptt)
            # Starting each batch, we detach the hidden state from how it was previously
            # produced (the step returns it detached already: see the module docstring).
            hidden = repackage_hidden(hidden)
            before = step.stats.compiled_calls if mode == "traced" else 0
            t0 = time.perf_counter()
            loss, hidden = step(data, targets, hidden)
            step_s.append(time.perf_counter() - t0)
            compiled.append(mode == "traced" and step.stats.compiled_calls > before)
            losses.append(loss.item())
            total_loss += losses[-1]
            if (batch + 1) % args.log_interval == 0:
                cur_loss = total_loss / args.log_interval
                elapsed = time.time() - start_time
                log(f"[{mode}] | epoch {epoch:3d} | {batch + 1:5d}/{nbatches:5d} batches | "
                    f"lr {lr:05.2f} | ms/batch {elapsed * 1000 / args.log_interval:7.2f} | "
                    f"loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}")
                total_loss = 0.0
                start_time = time.time()
        val_loss = evaluate(model, criterion, val_data, args.bptt)
        val_losses.append(val_loss)
        log("-" * 89)
        log(f"[{mode}] | end of epoch {epoch:3d} | time: {time.time() - epoch_start_time:5.2f}s "
            f"| valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}")
        log("-" * 89)
        if not best_val_loss or val_loss < best_val_loss:
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
            best_val_loss = val_loss
        else:
            # Anneal the learning rate if no improvement has been seen in the validation set.
            lr /= 4.0
            for group in optimizer.param_groups:
                group["lr"] = lr
    seconds = time.perf_counter() - start_all
    model.load_state_dict(best_state)  # the best model (pytorch saves and reloads it)
    test_loss = evaluate(model, criterion, test_data, args.bptt)
    log("=" * 89)
    log(f"[{mode}] | End of training | test loss {test_loss:5.2f} | "
        f"test ppl {math.exp(test_loss):8.2f}")
    log("=" * 89)
    return dict(mode=mode, losses=losses, step_seconds=step_s, compiled=compiled,
                val_losses=val_losses, test_loss=test_loss, seconds=seconds,
                step=step if mode == "traced" else None, model=model)


def check_traced_step(args, corpus, steps=4):
    """Run `steps` training steps on the same batches eagerly and traced, from one seed.
    Returns the largest loss and parameter differences and the traced stats."""
    eager_model, _, _, eager_step = build(args, corpus)
    traced_model, _, _, traced_step = build(args, corpus)
    traced_step = hn.trace(traced_step)
    train_data = batchify(corpus.train, args.batch_size)
    h_eager = eager_model.init_hidden(args.batch_size)
    h_traced = traced_model.init_hidden(args.batch_size)
    loss_diff = param_diff = 0.0
    eager_losses, traced_losses = [], []
    for k in range(steps):
        data, targets = get_batch(train_data, k * args.bptt, args.bptt)
        torch.manual_seed(args.seed + k)  # the same dropout masks (when they run eagerly)
        eager_loss, h_eager = eager_step(data, targets, h_eager)
        torch.manual_seed(args.seed + k)
        traced_loss, h_traced = traced_step(data, targets, h_traced)
        eager_losses.append(eager_loss.item())
        traced_losses.append(traced_loss.item())
        loss_diff = max(loss_diff, abs(eager_losses[-1] - traced_losses[-1]))
    for p, q in zip(eager_model.parameters(), traced_model.parameters()):
        param_diff = max(param_diff, float((p - q).abs().max()))
    return dict(loss_diff=loss_diff, param_diff=param_diff, eager_losses=eager_losses,
                traced_losses=traced_losses, stats=traced_step.stats)


def summarize(results):
    """The eager vs traced table, and why the traced step ran eagerly when it did."""
    def ms(values):
        return f"{np.median(values) * 1e3:10.2f}" if len(values) else "         -"

    print("\ntraining step times: median over all steps, and over the steps that ran compiled")
    print(f"{'mode':<8}{'steps':>6}{'median ms':>11}{'compiled ms':>12}{'train s':>9}"
          f"{'compiled':>14}{'compiles':>9}{'compile s':>10}{'valid ppl':>10}{'test ppl':>9}")
    for r in results:
        times = np.array(r["step_seconds"])
        flags = np.array(r["compiled"], dtype=bool)
        stats = r["step"].stats if r["step"] is not None else None
        frac = (f"{stats.compiled_calls}/{stats.calls} {stats.compiled_calls / stats.calls:4.0%}"
                if stats else "-")
        comp_s = f"{stats.compile_seconds + stats.trace_seconds:10.2f}" if stats else "         -"
        print(f"{r['mode']:<8}{len(times):>6}{ms(times)} {ms(times[flags])}{r['seconds']:>9.2f}"
              f"{frac:>14}{stats.compiles if stats else '-':>9}{comp_s}"
              f"{math.exp(min(r['val_losses'])):>10.1f}{math.exp(r['test_loss']):>9.1f}")
    eager = [r for r in results if r["mode"] == "eager"]
    for r in results:
        if r["step"] is None:
            continue
        stats = r["step"].stats
        if eager and stats.compiled_calls:
            flags = np.array(r["compiled"], dtype=bool)
            speedup = np.median(eager[0]["step_seconds"]) / np.median(
                np.array(r["step_seconds"])[flags])
            print(f"\ncompiled step {speedup:.1f}x faster than eager (medians)")
        report = hn.explain(r["step"]).to_dict()
        print(f"hn.explain(train_step): {len(report['specializations'])} specializations")
        for spec in report["specializations"]:
            print(f"  {spec['inputs']}" + (f": runs eagerly: {spec['fallback']}"
                                           if spec["fallback"] else ""))
        if stats.compiled_calls == 0:
            print("  (the traced step never ran compiled; with --dropout 0 it does)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="hybridnet word-level LSTM language model")
    parser.add_argument("--emsize", type=int, default=64, help="size of word embeddings")
    parser.add_argument("--nhid", type=int, default=64, help="hidden units per layer")
    parser.add_argument("--nlayers", type=int, default=2, help="number of layers")
    parser.add_argument("--lr", type=float, default=20, help="initial learning rate")
    parser.add_argument("--clip", type=float, default=0.25, help="gradient clipping")
    parser.add_argument("--epochs", type=int, default=6, help="upper epoch limit")
    parser.add_argument("--batch_size", type=int, default=20, metavar="N", help="batch size")
    parser.add_argument("--bptt", type=int, default=35, help="sequence length")
    parser.add_argument("--dropout", type=float, default=0.2,
                        help="dropout applied to layers (0 = no dropout)")
    parser.add_argument("--tied", action="store_true",
                        help="tie the word embedding and softmax weights")
    parser.add_argument("--seed", type=int, default=1111, help="random seed")
    parser.add_argument("--log-interval", type=int, default=5, metavar="N",
                        help="report interval")
    parser.add_argument("--max-batches", type=int, default=0,
                        help="at most this many batches per epoch (0: all)")
    parser.add_argument("--mode", default="all", choices=["all", "eager", "traced"],
                        help="eager, traced or both and a table (default)")
    parser.add_argument("--quick", action="store_true",
                        help="one short epoch (for tests): --epochs 1 --max-batches 24")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.max_batches = 1, args.max_batches or 24
    return args


def main(argv=None):
    args = parse_args(argv)
    corpus = Corpus()
    print(f"corpus: {len(corpus.dictionary)} words; train {len(corpus.train)}, valid "
          f"{len(corpus.valid)}, test {len(corpus.test)} tokens")
    modes = ["eager", "traced"] if args.mode == "all" else [args.mode]
    results = [train(args, corpus, m) for m in modes]
    summarize(results)
    check = check_traced_step(args, corpus)
    print(f"\n4 steps on the same batches from one seed, eager and traced "
          f"({check['stats'].compiled_calls} ran compiled): max |loss diff| "
          f"{check['loss_diff']:.2e}, max |param diff| {check['param_diff']:.2e}")
    return results, check


if __name__ == "__main__":
    main()
