"""FastSAC: tanh-Gaussian actor, C51 critics without clipped double Q, auto-tuned α.

Reads top to bottom: soft target distribution (+ α loss from next-state log-probs) → critic loss →
actor loss → exploration.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from fast_lora_td3.algos.base import OffPolicyLearner, cross_entropy
from fast_lora_td3.algos.common import make_adamw
from fast_lora_td3.nn.actor import build_actor
from fast_lora_td3.nn.config import ActorConfig
from fast_lora_td3.nn.distributional import project_distribution


class FastSACLearner(OffPolicyLearner):
    """FastSAC with any critic family; each Q-net regresses to its own soft target."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_alpha = torch.tensor(
            math.log(self.algo.alpha_init), device=self.device, requires_grad=True
        )
        # The recipe's optimiser for α: AdamW with the algorithm's betas, like the networks.
        alpha_group = {
            "name": "log_alpha",
            "params": [self.log_alpha],
            "weight_decay": self.algo.alpha_weight_decay,
        }
        self.alpha_optimizer = make_adamw(
            [alpha_group], self.algo.alpha_lr, self.algo.betas, self.device
        )
        # Data parallel: log α's gradient rides in the critic's bucket so α stays equal on all ranks.
        self.critic_sync_params = [*self.critic_params, self.log_alpha]

    def _build_actor(self, actor_cfg: ActorConfig) -> nn.Module:
        return build_actor(actor_cfg, self.obs_dim, self.action_dim, kind="sac")

    @torch.no_grad()
    def target_distribution(self, batch: Any) -> tuple[Tensor, Tensor]:
        """Per-member projected soft target `r − γ^k·bootstrap·α·log π(a'|s')` ([E, B, A]) and the
        next-state log-probs ([B]) used by the α loss."""
        next_obs, next_cobs = self.normalize(batch.next_obs, batch.next_critic_obs)
        alpha = self.log_alpha.detach().exp()
        with self.autocast():
            next_actions, next_log_prob = self.actor.sample(next_obs)
            next_logits = self.critic_target(next_cobs, next_actions.float())
        next_log_prob = next_log_prob.float()
        next_probs = torch.softmax(next_logits.float(), dim=-1)
        members = next_probs.shape[0]
        rewards = self.scaled_rewards(batch.rewards)  # entropy is weighed in the critic's units
        soft_rewards = rewards - batch.discount * batch.bootstrap * alpha * next_log_prob
        projected = project_distribution(
            next_probs.flatten(0, 1),
            soft_rewards.repeat(members),
            batch.bootstrap.repeat(members),
            batch.discount.repeat(members),
            self.support,
        ).view_as(next_probs)
        return projected, next_log_prob

    def critic_loss(self, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """Cross-entropy per member against its own target, plus the α loss
        `−α·mean(log π(a'|s') + H̄)` with `α = exp(log α)` differentiated through the exp (added to
        the graph but touching only log α)."""
        target, next_log_prob = self.target_distribution(batch)
        cobs = self.norm_critic_obs(batch.critic_obs)
        with self.autocast():
            logits = self.critic(cobs, batch.actions)
        loss = cross_entropy(logits, target)
        alpha_loss = -(self.log_alpha.exp() * (next_log_prob + self.algo.target_entropy)).mean()
        metrics = {
            "critic_loss": loss.detach(),
            **self.value_metrics(logits, target),
            "alpha": self.log_alpha.detach().exp(),
            "alpha_loss": alpha_loss.detach(),
            "entropy": -next_log_prob.mean(),
            # Auto-α steers the entropy to this: a row shows how far it is (in the critic's units).
            "entropy_target": torch.full((), self.algo.target_entropy, device=self.device),
        }
        return loss + (alpha_loss if self.algo.autotune_alpha else 0.0), metrics

    def critic_update(self, batch: Any) -> dict[str, Tensor]:
        """Critic update; α steps with it (its loss was part of the critic graph)."""
        self.alpha_optimizer.zero_grad(set_to_none=True)
        metrics = super().critic_update(batch)
        if self.algo.autotune_alpha:
            self.alpha_optimizer.step()
        return metrics

    def actor_loss(self, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """`mean(α·log π(a|s) − mean_e Q_e(s, a))` with a ~ π(·|s)."""
        obs, cobs = self.normalize(batch.obs, batch.critic_obs)
        alpha = self.log_alpha.detach().exp()
        with self.autocast():
            actions, log_prob = self.actor.sample(obs)
            logits = self.critic_logits_frozen(cobs, actions)
        q = self.q_values(logits)
        q = q.mean(0) if self.algo.actor_q_reduce == "mean" else q.min(0).values
        loss = (alpha * log_prob.float() - q).mean()
        return loss, {
            "actor_loss": loss.detach(),
            "policy_entropy": -log_prob.detach().mean(),
            "actor/saturated_actions": (actions.detach().abs() > 0.95).float().mean(),
        }

    @torch.no_grad()
    def explore(self, obs: Tensor, noise_std: Tensor | None = None) -> Tensor:
        """Sample from the policy (noise_std is unused: SAC explores through its own σ)."""
        obs_n = self.norm_obs(obs)
        actions, _ = self.actor.sample(obs_n)
        return actions.float()

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        """Deterministic action tanh(mean) for evaluation and export."""
        obs_n = self.norm_obs(obs)
        return self.actor.act(obs_n, deterministic=True).float()

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "alpha_optimizer": self.alpha_optimizer}

    def free_tensors(self) -> dict[str, Tensor]:
        return {"log_alpha": self.log_alpha}
