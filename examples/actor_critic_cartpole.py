"""Actor-critic on CartPole-v1 (pytorch/examples reinforcement_learning/actor_critic.py) with
the update compiled by `hn.trace`.

    python examples/actor_critic_cartpole.py [--episodes 1000] [--seed 543]
        [--log-interval 10] [--mode all|eager|traced|bucketed] [--quick]

One shared Linear(4, 128) + ReLU feeds an action head (Linear(128, 2), softmax) and a value
head (Linear(128, 1)); Adam (lr 3e-2) minimises, per episode, the policy loss
sum(-log_prob * (R - value)) (the value taken as a constant, pytorch's `value.item()`)
plus sum(smooth_l1(value, R)), with R the discounted (gamma 0.99), normalised returns.
It runs until the running reward exceeds the environment's threshold (475) or --episodes
ran out, in three modes from one seed, then prints a table of eager against traced:

- eager: the update as PyTorch runs it;
- traced: the update under `hn.trace`, called with each episode as it comes;
- bucketed: the same, each episode padded to the next power of two (16, 32, ... 512).

As in examples/reinforce_cartpole.py: actions are sampled eagerly (compiled code cannot
replay random draws) and the update recomputes the probabilities and values of the whole
episode in one batch (the same numbers the pytorch script kept from acting: the model has
no dropout and does not change during an episode). Every new episode length is a new
specialization for the llvm backend (a batch dim, not a loop's trip count), so the
`traced` mode compiles a kernel per length until `cache_limit` (8), then runs the lengths
it kept compiled (once the policy balances, most episodes last the full 500 steps) and
every other length eagerly, probing a new length now and then (see the `hn.explain` lines
printed at the end); padding to buckets with a 0/1 weight per row (padded rows weigh 0 in
both losses) makes 6 compiles serve every episode.
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

SMALLEST_BUCKET = 16
eps = np.finfo(np.float32).eps.item()


class Policy(nn.Module):
    """Actor and critic in one model."""

    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)  # actor
        self.value_head = nn.Linear(128, 1)  # critic

    def forward(self, x):
        x = F.relu(self.affine1(x))
        action_prob = F.softmax(self.action_head(x), dim=-1)
        state_values = self.value_head(x)
        return action_prob, state_values


def select_action(model, state):
    """Sample an action for one state (eagerly: sampling is random)."""
    state = torch.from_numpy(state).float()
    with torch.no_grad():  # the update recomputes what it needs
        probs, _ = model(state)
    m = Categorical(probs)
    return m.sample().item()


def discounted_returns(rewards, gamma):
    """Discounted returns of one episode, normalised to mean 0 and std 1."""
    R = 0
    returns = deque()
    for r in rewards[::-1]:
        R = r + gamma * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    return (returns - returns.mean()) / (returns.std() + eps)


def make_update(model, optimizer):
    """The actor-critic step over one episode: the function `hn.trace` compiles.
    `weights` is 1 for the episode's steps and 0 for padding."""
    def update(states, actions, returns, weights):
        probs, values = model(states)
        values = values.squeeze(-1)
        log_probs = Categorical(probs).log_prob(actions)
        advantage = returns - values.detach()
        policy_loss = (-log_probs * advantage * weights).sum()
        value_loss = (F.smooth_l1_loss(values, returns, reduction="none") * weights).sum()
        loss = policy_loss + value_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()
    return update


def bucket(n):
    """The smallest power of two >= n (and >= SMALLEST_BUCKET)."""
    size = SMALLEST_BUCKET
    while size < n:
        size *= 2
    return size


def pad_episode(states, actions, returns, weights, size):
    """Pad an episode to `size` steps with rows of weight 0."""
    pad = size - states.shape[0]
    if pad == 0:
        return states, actions, returns, weights
    return (torch.cat([states, torch.zeros(pad, 4)]),
            torch.cat([actions, torch.zeros(pad, dtype=torch.int64)]),
            torch.cat([returns, torch.zeros(pad)]),
            torch.cat([weights, torch.zeros(pad)]))


def run_episode(env, model):
    """Play one episode; returns its states, actions and rewards."""
    states, actions, rewards = [], [], []
    state = env.reset()
    for _ in range(1, 10000):
        action = select_action(model, state)
        states.append(state)
        actions.append(action)
        state, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    return torch.from_numpy(np.stack(states)), torch.tensor(actions), rewards


def episode_batch(states, actions, rewards, gamma, bucketed):
    batch = (states, actions, discounted_returns(rewards, gamma), torch.ones(len(rewards)))
    return pad_episode(*batch, bucket(len(rewards))) if bucketed else batch


def train(mode="eager", episodes=1000, seed=543, gamma=0.99, log_interval=10, log=print):
    """Train a fresh model from `seed`; `mode` is "eager", "traced" or "bucketed".
    Returns a dict of what happened (rewards, update times, the traced update...)."""
    env = _cartpole.make("CartPole-v1")
    env.reset(seed=seed)
    torch.manual_seed(seed)
    model = Policy()
    optimizer = optim.Adam(model.parameters(), lr=3e-2)
    update = make_update(model, optimizer)
    if mode != "eager":
        update = hn.trace(update)
    running_reward = 10
    rewards, losses, update_s, compiled, rollout_s = [], [], [], [], 0.0
    solved_at = None
    start = time.perf_counter()
    for i_episode in range(1, episodes + 1):
        t0 = time.perf_counter()
        states, actions, ep_rewards = run_episode(env, model)
        rollout_s += time.perf_counter() - t0
        ep_reward = sum(ep_rewards)
        rewards.append(ep_reward)
        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        batch = episode_batch(states, actions, ep_rewards, gamma, mode == "bucketed")
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
                update=update if mode != "eager" else None, model=model)


def check_traced_update(seed=0, calls=4, bucketed=True, repeat=0):
    """Apply the update `calls` times to one episode, eagerly to one model and traced to an
    identical twin (the episode padded to its bucket when `bucketed`). Returns the largest
    parameter and loss differences over the calls and the traced stats. (The first call
    runs eagerly as Adam creates its state, the second is recorded, then compiled.)"""
    torch.manual_seed(seed)
    eager_model, traced_model = Policy(), Policy()
    traced_model.load_state_dict(eager_model.state_dict())
    eager_update = make_update(eager_model, optim.Adam(eager_model.parameters(), lr=3e-2))
    traced_update = hn.trace(make_update(traced_model,
                                         optim.Adam(traced_model.parameters(), lr=3e-2)))
    env = _cartpole.make("CartPole-v1")
    env.reset(seed=seed)
    states, actions, rewards = run_episode(env, eager_model)
    batch = episode_batch(states, actions, rewards, 0.99, False)
    padded = episode_batch(states, actions, rewards, 0.99, bucketed)
    param_diff = loss_diff = 0.0
    for _ in range(calls):
        eager_loss = eager_update(*batch)
        traced_loss = traced_update(*padded)
        loss_diff = max(loss_diff, abs(eager_loss.item() - traced_loss.item()))
        for p, q in zip(eager_model.parameters(), traced_model.parameters()):
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
    parser = argparse.ArgumentParser(description="hybridnet actor-critic example")
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
