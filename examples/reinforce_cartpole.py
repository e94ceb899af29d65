"""REINFORCE on CartPole-v1 (pytorch/examples reinforcement_learning/reinforce.py) with the
policy-gradient update compiled by `hn.trace`.

    python examples/reinforce_cartpole.py [--episodes 1000] [--seed 543] [--log-interval 10]
                                          [--mode all|eager|traced|bucketed] [--quick]

The policy is Linear(4, 128) - Dropout(0.6) - ReLU - Linear(128, 2) - softmax, trained
with Adam (lr 1e-2) on the discounted (gamma 0.99), normalised returns of each episode,
loss = sum(-log_prob * R), until the running reward exceeds the environment's threshold
(475) or --episodes ran out. The environment is a NumPy port of gym's CartPole-v1
(examples/_cartpole.py).

The script trains three times from one seed and ends with a table (eager against traced):

- eager: the update runs as PyTorch would run it.
- traced: the update under `hn.trace`, called with each episode as it comes.
- bucketed: the same, each episode padded to the next power of two (16, 32, ... 512 steps).

What is traced, and why it is written this way:

- Sampling stays eager: hybridnet cannot replay random draws in compiled code (a traced
  function that samples runs eagerly, the reason in `traced.stats.events`). So actions are
  sampled eagerly under `no_grad`, and the update takes the whole episode (states,
  actions, returns) and recomputes the log-probabilities in one batch.
- Dropout draws a new random mask at every call, so recomputing the log-probabilities
  would see other masks than the actions were sampled with (and would make the update
  random, hence eager). The acting step therefore draws the mask itself, with the
  policy's own `nn.Dropout` applied to ones, and keeps it; the update multiplies by the
  stored masks. The gradient is the one pytorch's reinforce.py computes (it backpropagates
  through the log-probs taken while acting, masks included).
- Episode lengths vary (8 to 500 steps). The llvm backend compiles exact shapes, and the
  episode length is not the trip count of a loop (which `hn.trace` would make symbolic)
  but the row count of a batched product, so `hn.explain` shows one specialization per
  length: "recompile: new specialization: tensor input 0: float32[21, 4] (was float32[20,
  4])", each costing a compile (about 0.5 s here) for a call saving about a millisecond.
  After `cache_limit` (8) lengths, the lengths it kept run compiled (a policy that
  balances plays many full 500-step episodes) and new lengths run eagerly, with
  exponentially spaced probes that evict the least recently used length. Padding each
  episode to a power of two with zero returns (the padded rows add -log_prob * 0 = 0 to
  the loss and nothing to the gradients) makes 6 buckets serve every episode: 6 compiles,
  then every call compiled.
"""

import argparse
import re
import time
from collections import deque

import _cartpole
import numpy as np

import hybridnet as hn  # the JIT (hn.trace, hn.explain); the rest is the PyTorch script's
import hybridnet as torch
import hybridnet.nn as nn
import hybridnet.nn.functional as F
import hybridnet.optim as optim
from hybridnet.distributions import Categorical

HIDDEN = 128
SMALLEST_BUCKET = 16
eps = np.finfo(np.float32).eps.item()


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, HIDDEN)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(HIDDEN, 2)

    def forward(self, x, dropout_mask=None):
        x = self.affine1(x)
        # a stored mask (see select_action) makes the forward repeatable
        x = self.dropout(x) if dropout_mask is None else x * dropout_mask
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


def select_action(policy, state):
    """Sample an action for one state (eagerly: sampling is random). Returns the action
    and the dropout mask used, so that the update can recompute the same probabilities."""
    state = torch.from_numpy(state).float().unsqueeze(0)
    with torch.no_grad():
        mask = policy.dropout(torch.ones(1, HIDDEN))  # 0 or 1/(1-p), as nn.Dropout scales
        probs = policy(state, mask)
    m = Categorical(probs)
    action = m.sample()
    return action.item(), mask


def discounted_returns(rewards, gamma):
    """Discounted returns of one episode, normalised to mean 0 and std 1."""
    R = 0
    returns = deque()
    for r in rewards[::-1]:
        R = r + gamma * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    return (returns - returns.mean()) / (returns.std() + eps)


def make_update(policy, optimizer):
    """The policy-gradient step over one episode: the function `hn.trace` compiles."""
    def update(states, actions, masks, returns):
        probs = policy(states, masks)
        log_probs = Categorical(probs).log_prob(actions)
        policy_loss = (-log_probs * returns).sum()
        optimizer.zero_grad()
        policy_loss.backward()
        optimizer.step()
        return policy_loss.detach()
    return update


def bucket(n):
    """The smallest power of two >= n (and >= SMALLEST_BUCKET)."""
    size = SMALLEST_BUCKET
    while size < n:
        size *= 2
    return size


def pad_episode(states, actions, masks, returns, size):
    """Pad an episode to `size` steps. The padded rows have return 0, so they add
    -log_prob * 0 = 0 to the loss and nothing to any gradient."""
    pad = size - states.shape[0]
    if pad == 0:
        return states, actions, masks, returns
    return (torch.cat([states, torch.zeros(pad, 4)]),
            torch.cat([actions, torch.zeros(pad, dtype=torch.int64)]),
            torch.cat([masks, torch.zeros(pad, HIDDEN)]),
            torch.cat([returns, torch.zeros(pad)]))


def run_episode(env, policy):
    """Play one episode with the current policy; returns its batch and the rewards."""
    states, actions, masks, rewards = [], [], [], []
    state = env.reset()
    for _ in range(1, 10000):
        action, mask = select_action(policy, state)
        states.append(state)
        actions.append(action)
        masks.append(mask)
        state, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    batch = (torch.from_numpy(np.stack(states)), torch.tensor(actions), torch.cat(masks))
    return batch, rewards


def train(mode="eager", episodes=1000, seed=543, gamma=0.99, log_interval=10, log=print):
    """Train a fresh policy from `seed`; `mode` is "eager", "traced" or "bucketed".
    Returns a dict of what happened (rewards, update times, the traced update...)."""
    env = _cartpole.make("CartPole-v1")
    env.reset(seed=seed)
    torch.manual_seed(seed)
    policy = Policy()
    optimizer = optim.Adam(policy.parameters(), lr=1e-2)
    update = make_update(policy, optimizer)
    if mode != "eager":
        update = hn.trace(update)
    running_reward = 10
    rewards, losses, update_s, compiled, rollout_s = [], [], [], [], 0.0
    solved_at = None
    start = time.perf_counter()
    for i_episode in range(1, episodes + 1):
        t0 = time.perf_counter()
        (states, actions, masks), ep_rewards = run_episode(env, policy)
        rollout_s += time.perf_counter() - t0
        ep_reward = sum(ep_rewards)
        rewards.append(ep_reward)
        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        batch = (states, actions, masks, discounted_returns(ep_rewards, gamma))
        if mode == "bucketed":
            batch = pad_episode(*batch, bucket(len(ep_rewards)))
        before = update.stats.compiled_calls if mode != "eager" else 0
        t0 = time.perf_counter()
        loss = update(*batch)
        update_s.append(time.perf_counter() - t0)
        compiled.append(mode != "eager" and update.stats.compiled_calls > before)
        losses.append(loss.item())
        if i_episode % log_interval == 0:
            log(f"[{mode}] Episode {i_episode}\tLast reward: {ep_reward:.2f}\t"
                f"Average reward: {running_reward:.2f}")
        if running_reward > env.spec.reward_threshold:
            solved_at = i_episode
            log(f"[{mode}] Solved! Running reward is now {running_reward:.2f} and the last "
                f"episode runs to {len(ep_rewards)} time steps!")
            break
    return dict(mode=mode, rewards=rewards, losses=losses, update_seconds=update_s,
                compiled=compiled, rollout_seconds=rollout_s, solved_at=solved_at,
                running_reward=running_reward, seconds=time.perf_counter() - start,
                update=update if mode != "eager" else None, policy=policy)


def check_traced_update(seed=0, calls=4, bucketed=True, repeat=0):
    """Apply the update `calls` times to one episode, eagerly to one policy and traced to
    an identical twin (the episode padded to its bucket when `bucketed`). Returns the
    largest parameter and loss differences over the calls and the traced stats. (The
    first call runs eagerly as Adam creates its state, the second is recorded, then the
    compiled update runs.)"""
    torch.manual_seed(seed)
    eager_policy, traced_policy = Policy(), Policy()
    traced_policy.load_state_dict(eager_policy.state_dict())
    eager_update = make_update(eager_policy, optim.Adam(eager_policy.parameters(), lr=1e-2))
    traced_update = hn.trace(make_update(traced_policy,
                                         optim.Adam(traced_policy.parameters(), lr=1e-2)))
    env = _cartpole.make("CartPole-v1")
    env.reset(seed=seed)
    (states, actions, masks), rewards = run_episode(env, eager_policy)
    batch = (states, actions, masks, discounted_returns(rewards, 0.99))
    padded = pad_episode(*batch, bucket(len(rewards))) if bucketed else batch
    param_diff = loss_diff = 0.0
    for _ in range(calls):
        eager_loss = eager_update(*batch)
        traced_loss = traced_update(*padded)
        loss_diff = max(loss_diff, abs(eager_loss.item() - traced_loss.item()))
        for p, q in zip(eager_policy.parameters(), traced_policy.parameters()):
            param_diff = max(param_diff, float((p - q).abs().max()))
    timings = {}
    for name, fn, args in (("eager", eager_update, batch), ("traced", traced_update, padded)):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
        timings[name] = float(np.median(times)) if times else float("nan")
    return dict(param_diff=param_diff, loss_diff=loss_diff, steps=len(rewards),
                padded_to=padded[0].shape[0], stats=traced_update.stats, **timings)


def summarize(results):
    """The eager vs traced table."""
    def ms(values):
        return f"{np.median(values) * 1e3:8.3f}" if len(values) else "       -"

    print("\nupdate times: median over all calls, and over the calls that ran compiled")
    print(f"{'mode':<10}{'episodes':>9}{'mean len':>9}{'solved at':>10}{'median ms':>10}"
          f"{'compiled ms':>12}{'updates s':>10}{'rollouts s':>11}{'compiled':>14}"
          f"{'compiles':>9}{'compile s':>10}")
    for r in results:
        times = np.array(r["update_seconds"])
        flags = np.array(r["compiled"], dtype=bool)
        stats = r["update"].stats if r["update"] is not None else None
        frac = (f"{stats.compiled_calls}/{stats.calls} {stats.compiled_calls / stats.calls:4.0%}"
                if stats else "-")
        comp_s = f"{stats.compile_seconds + stats.trace_seconds:10.2f}" if stats else "         -"
        print(f"{r['mode']:<10}{len(r['rewards']):>9}{np.mean(r['rewards']):>9.1f}"
              f"{r['solved_at'] or '-':>10}{ms(times)}  {ms(times[flags])}  "
              f"{times.sum():>10.2f}{r['rollout_seconds']:>11.2f}{frac:>14}"
              f"{stats.compiles if stats else '-':>9}{comp_s}")
    for r in results:
        if r["update"] is None:
            continue
        report = hn.explain(r["update"]).to_dict()
        kinds = {}
        for ev in report["stats"]["events"]:
            kinds[ev["kind"]] = kinds.get(ev["kind"], 0) + 1
        lengths = sorted(int(re.search(r"\[(\d+)", s["inputs"]).group(1))
                         for s in report["specializations"])
        print(f"\nhn.explain({r['mode']} update): {len(lengths)} specializations cached "
              f"(episode lengths {', '.join(map(str, lengths))}); recent events: "
              + ", ".join(f"{k} x{n}" for k, n in kinds.items()))
        stats = r["update"].stats
        shapes = {bucket(int(n)) if r["mode"] == "bucketed" else int(n) for n in r["rewards"]}
        print(f"  {len(shapes)} distinct update shapes (episode lengths"
              f"{', padded' if r['mode'] == 'bucketed' else ''}) -> {stats.compiles} compiles; "
              f"{stats.compiled_calls} of {stats.calls} calls ran compiled, the others eagerly")
        interesting = [ev for ev in report["stats"]["events"]
                       if ev["kind"] in ("recompile", "cache_limit", "fallback")]
        for ev in interesting[:2]:
            print(f"  call {ev['call']}: {ev['kind']}: {ev['detail']}")
    print("\nAll runs sample the same random numbers; compiled arithmetic may round "
          "differently in the last bit,\nso trajectories can part after a while (compare "
          "parameters on one batch: check_traced_update).")


def main(argv=None):
    parser = argparse.ArgumentParser(description="hybridnet REINFORCE example")
    parser.add_argument("--gamma", type=float, default=0.99, metavar="G",
                        help="discount factor (default: 0.99)")
    parser.add_argument("--seed", type=int, default=543, metavar="N",
                        help="random seed (default: 543)")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N",
                        help="interval between training status logs (default: 10)")
    parser.add_argument("--episodes", type=int, default=1000, metavar="N",
                        help="stop after this many episodes if not solved (default: 1000)")
    parser.add_argument("--mode", default="all", choices=["all", "eager", "traced", "bucketed"],
                        help="which update to run (default: all three, then the table)")
    parser.add_argument("--quick", action="store_true",
                        help="a few episodes (for tests): --episodes 12 --log-interval 4")
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.log_interval = 12, 4
    modes = ["eager", "bucketed", "traced"] if args.mode == "all" else [args.mode]
    results = [train(m, args.episodes, args.seed, args.gamma, args.log_interval)
               for m in modes]
    summarize(results)
    check = check_traced_update(args.seed, repeat=5 if args.quick else 50)
    stats = check["stats"]
    print(f"\none {check['steps']}-step episode (padded to {check['padded_to']}), updated "
          f"eagerly and traced from one model, {stats.calls} times each "
          f"({stats.compiled_calls} ran compiled):\n  max |param diff| after the first 4: "
          f"{check['param_diff']:.2e}, max |loss diff| {check['loss_diff']:.2e}; median "
          f"update eager {check['eager'] * 1e3:.3f} ms, traced {check['traced'] * 1e3:.3f} ms "
          f"({check['eager'] / check['traced']:.1f}x)")
    return results, check


if __name__ == "__main__":
    main()
