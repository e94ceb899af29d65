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

The training driver, the padding, the traced-against-eager check and the table are shared
with examples/actor_critic_cartpole.py (examples/_rl_common.py); this file has what is
REINFORCE's: the policy, acting, the update and what an episode gives it.
"""

from functools import partial

import _rl_common
import numpy as np
from _rl_common import discounted_returns

import hybridnet as torch
import hybridnet.nn as nn
import hybridnet.nn.functional as F
import hybridnet.optim as optim
from hybridnet.distributions import Categorical

HIDDEN = 128


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


def make_optimizer(policy):
    return optim.Adam(policy.parameters(), lr=1e-2)


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


def make_update(policy, optimizer):
    """The policy-gradient step over one episode: the function `hn.trace` compiles.
    Rows padded with return 0 add -log_prob * 0 = 0 to the loss and nothing to any
    gradient."""
    def update(states, actions, masks, returns):
        probs = policy(states, masks)
        log_probs = Categorical(probs).log_prob(actions)
        policy_loss = (-log_probs * returns).sum()
        optimizer.zero_grad()
        policy_loss.backward()
        optimizer.step()
        return policy_loss.detach()
    return update


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


def episode_batch(tensors, rewards, gamma):
    """The update's arguments for one episode: states, actions, masks, returns."""
    states, actions, masks = tensors
    return states, actions, masks, discounted_returns(rewards, gamma)


REINFORCE = _rl_common.Algorithm(
    name="REINFORCE", Policy=Policy, make_optimizer=make_optimizer, make_update=make_update,
    run_episode=run_episode, episode_batch=episode_batch, model_key="policy")
train = partial(_rl_common.train, REINFORCE)  # train(mode="eager", episodes=1000, ...)
check_traced_update = partial(_rl_common.check_traced_update, REINFORCE)


def main(argv=None):
    return _rl_common.main(REINFORCE, argv)


if __name__ == "__main__":
    main()
