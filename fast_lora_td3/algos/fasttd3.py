"""FastTD3: twin C51 critics with distributional clipped double Q, deterministic actor.

Reads top to bottom: target distribution → critic loss → actor loss → exploration.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from fast_lora_td3.algos.base import OffPolicyLearner, cross_entropy
from fast_lora_td3.algos.common import PolyakUpdater
from fast_lora_td3.nn.actor import build_actor
from fast_lora_td3.nn.config import ActorConfig
from fast_lora_td3.nn.distributional import C51Support, expected_value, project_distribution


def select_cdq_target(projected: Tensor, support: C51Support) -> Tensor:
    """Distributional clipped double Q: per sample, the projected target of the member with the
    smallest mean. [E, B, A] → [B, A]."""
    means = expected_value(projected, support)  # [E, B]
    idx = means.argmin(dim=0)  # [B]
    return projected.gather(0, idx.view(1, -1, 1).expand(1, *projected.shape[1:])).squeeze(0)


class FastTD3Learner(OffPolicyLearner):
    """FastTD3 with any critic family (mlp, simbav2, simbav2_lora, mlp_lora)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor_target: nn.Module | None = None
        if self.algo.use_target_actor:
            self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
            self.actor_polyak = PolyakUpdater(self.actor, self.actor_target)

    def _build_actor(self, actor_cfg: ActorConfig) -> nn.Module:
        return build_actor(actor_cfg, self.obs_dim, self.action_dim, kind="td3")

    @torch.no_grad()
    def target_distribution(self, batch: Any) -> Tensor:
        """The projected n-step target distribution every online critic regresses to: [E, B, A]
        (identical members under CDQ)."""
        next_obs, next_cobs = self.normalize(batch.next_obs, batch.next_critic_obs)
        policy = self.actor_target if self.actor_target is not None else self.actor
        with self.autocast():
            next_actions = policy(next_obs).float()
            noise = torch.randn_like(next_actions) * self.algo.policy_noise
            noise = noise.clamp(-self.algo.noise_clip, self.algo.noise_clip)
            next_actions = (next_actions + noise).clamp(-1.0, 1.0)
            next_logits = self.critic_target(next_cobs, next_actions)
        next_probs = torch.softmax(next_logits.float(), dim=-1)  # [E, B, A]
        members = next_probs.shape[0]
        projected = project_distribution(
            next_probs.flatten(0, 1),
            self.scaled_rewards(batch.rewards).repeat(members),
            batch.bootstrap.repeat(members),
            batch.discount.repeat(members),
            self.support,
        ).view_as(next_probs)
        if self.algo.use_cdq:
            chosen = select_cdq_target(projected, self.support)
            return chosen.unsqueeze(0).expand_as(projected)
        return projected

    def critic_loss(self, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """Cross-entropy of both online critics against the target distribution."""
        target = self.target_distribution(batch)
        cobs = self.norm_critic_obs(batch.critic_obs)
        with self.autocast():
            logits = self.critic(cobs, batch.actions)
        loss = cross_entropy(logits, target)
        return loss, {"critic_loss": loss.detach(), **self.value_metrics(logits, target)}

    def actor_loss(self, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """−mean over the batch of min (or mean) over critics of Q(s, actor(s))."""
        obs, cobs = self.normalize(batch.obs, batch.critic_obs)
        with self.autocast():
            preact = self.actor.preactivation(obs)
            actions = torch.tanh(preact)
            logits = self.critic_logits_frozen(cobs, actions)
        q = self.q_values(logits)  # [E, B]
        q = q.min(0).values if self.algo.actor_q_reduce == "min" else q.mean(0)
        loss = -q.mean()
        if (c := self.algo.preact_l2_weight) > 0:  # a config float: no work and no sync when off
            loss = loss + c * preact.float().square().mean()
        # A tanh actor stuck at its bounds stops learning: the share of saturated action components.
        saturated = (actions.detach().abs() > 0.95).float().mean()
        return loss, {"actor_loss": loss.detach(), "actor/saturated_actions": saturated}

    def actor_step(self, batch: Any) -> dict[str, Tensor]:
        """Actor update, then Polyak of the optional target actor."""
        metrics = super().actor_step(batch)
        if self.actor_target is not None:
            self.actor_polyak.update(self.algo.tau)
        return metrics

    @torch.no_grad()
    def explore(self, obs: Tensor, noise_std: Tensor) -> Tensor:
        """Per-env Gaussian exploration: `clamp(actor(s) + N(0, σ_env), −1, 1)`; σ_env is [N, 1]."""
        actions = self.act(obs)
        return (actions + torch.randn_like(actions) * noise_std).clamp(-1.0, 1.0)

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        """Deterministic action for evaluation and export."""
        obs_n = self.norm_obs(obs)
        return self.actor(obs_n).float()

    def modules(self) -> dict[str, nn.Module]:
        mods = super().modules()
        if self.actor_target is not None:
            mods["actor_target"] = self.actor_target
        return mods
