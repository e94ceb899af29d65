"""What examples/reinforce_cartpole.py and examples/actor_critic_cartpole.py share: the
discounted returns, padding episodes to power-of-two buckets, the three-mode training driver
(eager, traced, bucketed), the traced-against-eager check, the comparison table and the
command line. An example describes its algorithm in an `Algorithm`:

    REINFORCE = Algorithm(name="REINFORCE", Policy=Policy, make_optimizer=make_optimizer,
                          make_update=make_update, run_episode=run_episode,
                          episode_batch=episode_batch)
    results = train(REINFORCE, "bucketed")

Padding appends rows of zeros to every tensor of an episode's batch, so an update must
give a row of zeros no weight (REINFORCE: return 0, so -log_prob * 0; actor-critic: an
explicit 0/1 weight per row).
"""

import argparse
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import _cartpole
import numpy as np

import hybridnet as hn
import hybridnet as torch

SMALLEST_BUCKET = 16
eps = np.finfo(np.float32).eps.item()


@dataclass(frozen=True)
class Algorithm:
    """What differs between the examples."""

    name: str  # in --help: "hybridnet <name> example"
    Policy: Callable  # () -> the model, a fresh nn.Module
    make_optimizer: Callable  # model -> its optimizer
    make_update: Callable  # (model, optimizer) -> update(*batch), what `hn.trace` compiles
    run_episode: Callable  # (env, model) -> (tensors of the episode, its rewards)
    episode_batch: Callable  # (tensors, rewards, gamma) -> update's arguments, a row a step
    model_key: str = "model"  # the key of the trained model in train()'s result


def discounted_returns(rewards, gamma):
    """Discounted returns of one episode, normalised to mean 0 and std 1."""
    R = 0
    returns = deque()
    for r in rewards[::-1]:
        R = r + gamma * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    return (returns - returns.mean()) / (returns.std() + eps)


def bucket(n):
    """The smallest power of two >= n (and >= SMALLEST_BUCKET)."""
    size = SMALLEST_BUCKET
    while size < n:
        size *= 2
    return size


def pad_episode(batch, size):
    """Pad every tensor of an episode's batch with rows of zeros to `size` steps."""
    pad = size - batch[0].shape[0]
    if pad == 0:
        return tuple(batch)
    return tuple(torch.cat([t, torch.zeros(pad, *t.shape[1:], dtype=t.dtype)]) for t in batch)


def train(algo, mode="eager", episodes=1000, seed=543, gamma=0.99, log_interval=10,
          log=print):
    """Train a fresh model from `seed`; `mode` is "eager", "traced" or "bucketed".
    Returns a dict of what happened (rewards, update times, the traced update...)."""
    env = _cartpole.make("CartPole-v1")
    env.reset(seed=seed)
    torch.manual_seed(seed)
    model = algo.Policy()
    update = algo.make_update(model, algo.make_optimizer(model))
    if mode != "eager":
        update = hn.trace(update)
    running_reward = 10
    rewards, losses, update_s, compiled, rollout_s = [], [], [], [], 0.0
    solved_at = None
    start = time.perf_counter()
    for i_episode in range(1, episodes + 1):
        t0 = time.perf_counter()
        tensors, ep_rewards = algo.run_episode(env, model)
        rollout_s += time.perf_counter() - t0
        ep_reward = sum(ep_rewards)
        rewards.append(ep_reward)
        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        batch = algo.episode_batch(tensors, ep_rewards, gamma)
        if mode == "bucketed":
            batch = pad_episode(batch, bucket(len(ep_rewards)))
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
    return {"mode": mode, "rewards": rewards, "losses": losses, "update_seconds": update_s,
            "compiled": compiled, "rollout_seconds": rollout_s, "solved_at": solved_at,
            "running_reward": running_reward, "seconds": time.perf_counter() - start,
            "update": update if mode != "eager" else None, algo.model_key: model}


def check_traced_update(algo, seed=0, calls=4, bucketed=True, repeat=0):
    """Apply the update `calls` times to one episode, eagerly to one model and traced to an
    identical twin (the episode padded to its bucket when `bucketed`), then time each
    `repeat` more times. Returns the largest parameter and loss differences over the calls,
    the median times and the traced stats. (The first call runs eagerly as Adam creates its
    state, the second is recorded, then the compiled update runs.)"""
    torch.manual_seed(seed)
    eager_model, traced_model = algo.Policy(), algo.Policy()
    traced_model.load_state_dict(eager_model.state_dict())
    eager_update = algo.make_update(eager_model, algo.make_optimizer(eager_model))
    traced_update = hn.trace(algo.make_update(traced_model, algo.make_optimizer(traced_model)))
    env = _cartpole.make("CartPole-v1")
    env.reset(seed=seed)
    tensors, rewards = algo.run_episode(env, eager_model)
    batch = algo.episode_batch(tensors, rewards, 0.99)
    padded = pad_episode(batch, bucket(len(rewards))) if bucketed else batch
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


def main(algo, argv=None):
    """The examples' command line: train in the chosen modes, print the table and the
    traced-against-eager check. Returns the training results and the check."""
    parser = argparse.ArgumentParser(description=f"hybridnet {algo.name} example")
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
    results = [train(algo, m, args.episodes, args.seed, args.gamma, args.log_interval)
               for m in modes]
    summarize(results)
    check = check_traced_update(algo, args.seed, repeat=5 if args.quick else 50)
    stats = check["stats"]
    print(f"\none {check['steps']}-step episode (padded to {check['padded_to']}), updated "
          f"eagerly and traced from one model, {stats.calls} times each "
          f"({stats.compiled_calls} ran compiled):\n  max |param diff| after the first 4: "
          f"{check['param_diff']:.2e}, max |loss diff| {check['loss_diff']:.2e}; median "
          f"update eager {check['eager'] * 1e3:.3f} ms, traced {check['traced'] * 1e3:.3f} ms "
          f"({check['eager'] / check['traced']:.1f}x)")
    return results, check
