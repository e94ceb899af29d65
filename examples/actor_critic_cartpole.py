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

The training driver, the padding, the traced-against-eager check and the table are shared
with examples/reinforce_cartpole.py (examples/_rl_common.py); this file has what is the
actor-critic's: the model, acting, the update and what an episode gives it.
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


def make_optimizer(model):
    return optim.Adam(model.parameters(), lr=3e-2)


def select_action(model, state):
    """Sample an action for one state (eagerly: sampling is random)."""
    state = torch.from_numpy(state).float()
    with torch.no_grad():  # the update recomputes what it needs
        probs, _ = model(state)
    m = Categorical(probs)
    return m.sample().item()


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


def run_episode(env, model):
    """Play one episode; returns its states and actions, and the rewards."""
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
    return (torch.from_numpy(np.stack(states)), torch.tensor(actions)), rewards


def episode_batch(tensors, rewards, gamma):
    """The update's arguments for one episode: states, actions, returns, weights (all 1)."""
    states, actions = tensors
    return states, actions, discounted_returns(rewards, gamma), torch.ones(len(rewards))


ACTOR_CRITIC = _rl_common.Algorithm(
    name="actor-critic", Policy=Policy, make_optimizer=make_optimizer, make_update=make_update,
    run_episode=run_episode, episode_batch=episode_batch)
train = partial(_rl_common.train, ACTOR_CRITIC)  # train(mode="eager", episodes=1000, ...)
check_traced_update = partial(_rl_common.check_traced_update, ACTOR_CRITIC)


def main(argv=None):
    return _rl_common.main(ACTOR_CRITIC, argv)


if __name__ == "__main__":
    main()
