"""The examples in examples/ run in quick mode, in-process, and do what they claim: the
CartPole port follows gym's equations, the RL updates compiled by hn.trace (padded to
buckets) give the parameters an eager update gives, and the LSTM language model learns and
its traced training step computes the eager step's loss."""

import importlib.util
import math
import os
import sys

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def load(name):
    """Import examples/<name>.py (examples/ on sys.path for its `import _cartpole`)."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ---- CartPole ---------------------------------------------------------------------------

def test_cartpole_step_follows_gym_equations():
    env = load("_cartpole").make("CartPole-v1")
    env.reset(seed=0)
    env.state = np.zeros(4)
    obs, reward, terminated, truncated, info = env.step(1)
    # from rest, pushing right: temp = 10 / 1.1, thetaacc = -temp / (0.5 * (4/3 - 0.1/1.1)),
    # xacc = temp - 0.05 * thetaacc / 1.1; euler: velocities move by 0.02 * acceleration
    temp = 10 / 1.1
    thetaacc = -temp / (0.5 * (4 / 3 - 0.1 / 1.1))
    xacc = temp - 0.05 * thetaacc / 1.1
    np.testing.assert_allclose(obs, [0.0, 0.02 * xacc, 0.0, 0.02 * thetaacc], rtol=1e-6)
    assert obs.dtype == np.float32 and reward == 1.0 and not terminated and not truncated
    assert info == {}


def test_cartpole_reset_seeding_and_termination():
    cp = load("_cartpole")
    env = cp.make()
    a, b = env.reset(seed=3), env.reset(seed=3)
    np.testing.assert_array_equal(a, b)
    assert np.all(np.abs(a) <= 0.05)
    assert not np.array_equal(a, env.reset())  # the generator moves on without a seed
    # always pushing right: the pole falls (|theta| > 12 degrees) within a few dozen steps
    env.reset(seed=0)
    for _ in range(100):
        obs, reward, terminated, truncated, _ = env.step(1)
        if terminated:
            break
    assert terminated and not truncated and reward == 1.0 and env.elapsed_steps < 50
    assert abs(obs[2]) > 12 * 2 * math.pi / 360 or abs(obs[0]) > 2.4
    with pytest.warns(UserWarning, match="terminated"):
        assert env.step(0)[1] == 0.0
    with pytest.raises(ValueError):
        env.step(2)


def test_cartpole_balanced_episode_is_truncated_at_500():
    env = load("_cartpole").make()
    obs = env.reset(seed=1)
    for _ in range(1000):
        x, x_dot, theta, theta_dot = obs
        action = int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)  # a PD controller
        obs, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    assert truncated and not terminated and env.elapsed_steps == 500


# ---- reinforcement learning ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["reinforce_cartpole", "actor_critic_cartpole"])
def test_rl_example_quick(name, capsys):
    example = load(name)
    results, check = example.main(["--quick", "--mode", "bucketed"])
    (run,) = results
    assert len(run["rewards"]) == 12 and all(r >= 8 for r in run["rewards"])
    assert np.all(np.isfinite(run["losses"]))
    # every episode padded to a power of two: after the first few calls all run compiled
    stats = run["update"].stats
    assert stats.compiled_calls >= 6 and stats.compiles <= 4, stats
    assert all(run["compiled"][-4:]), run["compiled"]
    # the traced update on the padded episode gives the eager update's parameters
    assert check["stats"].compiled_calls >= 2
    assert check["padded_to"] > check["steps"]
    assert check["param_diff"] < 1e-5 and check["loss_diff"] < 1e-4, check
    out = capsys.readouterr().out
    assert "hn.explain(bucketed update)" in out and "bucketed" in out


def test_reinforce_padding_changes_nothing_eagerly():
    rl = load("reinforce_cartpole")
    common = load("_rl_common")
    rl.torch.manual_seed(0)
    env = load("_cartpole").make()
    env.reset(seed=0)
    policy = rl.Policy()
    tensors, rewards = rl.run_episode(env, policy)
    batch = rl.episode_batch(tensors, rewards, 0.99)
    padded = common.pad_episode(batch, common.bucket(len(rewards)) * 2)
    assert padded[0].shape[0] == common.bucket(len(rewards)) * 2 > len(rewards)
    assert [t.dtype for t in padded] == [t.dtype for t in batch]
    grads = []
    for b in (batch, padded):
        policy.zero_grad()
        probs = policy(b[0], b[2])
        loss = (-rl.Categorical(probs).log_prob(b[1]) * b[3]).sum()
        loss.backward()
        grads.append([p.grad.numpy().copy() for p in policy.parameters()])
    for g, h in zip(*grads):
        np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-6)


# ---- word language model ------------------------------------------------------------------

def test_word_language_model_quick():
    lm = load("word_language_model")
    args = lm.parse_args(["--quick", "--dropout", "0", "--mode", "traced"])
    corpus = lm.Corpus()
    assert "<eos>" in corpus.dictionary.word2idx and len(corpus.valid) > 0
    assert len(corpus.train) > 6 * len(corpus.test)
    run = lm.train(args, corpus, "traced", log=lambda *a: None)
    losses = run["losses"]
    assert len(losses) >= 20 and np.all(np.isfinite(losses))
    # starts near log(vocabulary size), drops by a good margin within the epoch
    assert abs(losses[0] - math.log(len(corpus.dictionary))) < 0.5
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
    assert math.isfinite(run["test_loss"]) and run["test_loss"] < losses[0]
    stats = run["step"].stats
    assert stats.compiled_calls >= len(losses) - 4, stats
    # the traced step's loss and update are the eager step's, on the same batches
    check = lm.check_traced_step(args, corpus, steps=4)
    assert check["stats"].compiled_calls >= 2
    np.testing.assert_allclose(check["traced_losses"], check["eager_losses"], rtol=1e-5)
    assert check["param_diff"] < 1e-4, check
