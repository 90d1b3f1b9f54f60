"""The learner skeleton shared by FastTD3 and FastSAC: networks, normalisers, optimisers, steps.

A learner owns everything the update touches. Its `critic_update` / `actor_step` are pure tensor code
(metrics stay on device as 0-d tensors, no host synchronisation), so they can be compiled and captured;
`fast_lora_td3.training.update_step.UpdateStep` calls them (the only update path) and keeps the update count.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from fast_lora_td3.algos.common import (
    PolyakUpdater,
    adapter_norms,
    load_optimizer_state_,
    make_adamw,
    make_target,
    param_groups,
)
from fast_lora_td3.algos.config import AlgoConfig
from fast_lora_td3.nn.config import ActorConfig, CriticConfig
from fast_lora_td3.nn.critic import build_critic
from fast_lora_td3.nn.distributional import C51Support, expected_value
from fast_lora_td3.nn.layers import project_weights_
from fast_lora_td3.nn.normalizer import EmpiricalNormalizer
from fast_lora_td3.nn.reward_scaler import RewardScaler

SCHEDULER_ORDER_WARNING = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
"""PyTorch's warning when a schedule advances before its optimiser's first step."""


class OffPolicyLearner(ABC):
    """Common state of the distributional off-policy learners (see FastTD3Learner, FastSACLearner)."""

    actor: nn.Module

    def __init__(
        self,
        algo: AlgoConfig,
        critic_cfg: CriticConfig,
        actor_cfg: ActorConfig,
        obs_dim: int,
        critic_obs_dim: int,
        action_dim: int,
        device: torch.device | str,
        total_iterations: int = 0,
        amp: str = "none",
    ) -> None:
        self.algo = algo
        self.device = torch.device(device)
        self.obs_dim, self.critic_obs_dim, self.action_dim = obs_dim, critic_obs_dim, action_dim
        self.amp_dtype = torch.bfloat16 if amp == "bf16" else None
        self.support = C51Support(*algo.support_bounds(), algo.num_atoms).to(self.device)
        # Automatic value range: rewards scaled by the running scale of discounted returns.
        self.reward_scaler = RewardScaler(algo.return_scale_max) if algo.auto_value_range else None
        if self.reward_scaler is not None:
            self.reward_scaler.to(self.device)
        self.actor = self._build_actor(actor_cfg).to(self.device)
        self.critic = build_critic(critic_cfg, critic_obs_dim, action_dim, algo.num_atoms)
        self.critic.to(self.device)
        project_weights_(self.critic)  # HyperDense / LoRA-WN rows start on the unit sphere
        self.critic_target = make_target(self.critic)
        self.critic_polyak = PolyakUpdater(self.critic, self.critic_target)
        normalizer = partial(
            EmpiricalNormalizer, eps=algo.obs_norm_eps, until=algo.normalizer_until
        )
        self.obs_normalizer = normalizer(obs_dim)
        critic_eps = algo.critic_obs_norm_eps
        if critic_eps is None:  # the critic follows the actor's floor
            critic_eps = algo.obs_norm_eps
        self.critic_obs_normalizer = normalizer(critic_obs_dim, eps=critic_eps)
        self.obs_normalizer.to(self.device)
        self.critic_obs_normalizer.to(self.device)

        self.critic_params = [p for p in self.critic.parameters() if p.requires_grad]
        self.actor_params = [p for p in self.actor.parameters() if p.requires_grad]
        # Tensors whose gradients the critic update all-reduces (FastSAC adds log α).
        self.critic_sync_params: list[Tensor] = self.critic_params
        betas = algo.betas
        self.critic_optimizer = make_adamw(
            param_groups(self.critic, algo.weight_decay, algo.adapter_weight_decay),
            algo.critic_lr,
            betas,
            self.device,
        )
        self.actor_optimizer = make_adamw(
            param_groups(self.actor, algo.weight_decay), algo.actor_lr, betas, self.device
        )
        self.schedulers = []
        self.total_iterations = total_iterations
        if algo.lr_min is not None and total_iterations > 0:
            for opt in (self.critic_optimizer, self.actor_optimizer):
                self.schedulers.append(
                    torch.optim.lr_scheduler.CosineAnnealingLR(
                        opt, T_max=total_iterations, eta_min=algo.lr_min
                    )
                )
        # CUDA-graph capture needs autocast's weight-cast cache off (PyTorch CUDA graph docs).
        self.autocast_cache = True
        # Data parallel: averages gradients across ranks between backward and step, so every rank
        # takes the same optimiser step.
        self.grad_sync: Callable[[list[Tensor]], None] | None = None

    # -- subclass hooks -------------------------------------------------------------------------
    @abstractmethod
    def _build_actor(self, actor_cfg: ActorConfig) -> nn.Module:
        """The algorithm's actor (deterministic for TD3, tanh-Gaussian for SAC)."""

    @abstractmethod
    def critic_loss(self, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """Return (loss, metrics) for one critic update."""

    @abstractmethod
    def actor_loss(self, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """Return (loss, metrics) for one actor update."""

    # -- shared machinery ---------------------------------------------------------------------
    def autocast(self) -> torch.autocast:
        """bf16 autocast with fp32 master weights when amp=bf16; a disabled context otherwise."""
        return torch.autocast(
            self.device.type,
            dtype=self.amp_dtype or torch.bfloat16,
            enabled=self.amp_dtype is not None,
            cache_enabled=self.autocast_cache,
        )

    def normalize(self, obs: Tensor, critic_obs: Tensor) -> tuple[Tensor, Tensor]:
        """Apply the (not updated) observation normalisers."""
        return self.norm_obs(obs), self.norm_critic_obs(critic_obs)

    def norm_obs(self, obs: Tensor) -> Tensor:
        """Actor-side normalisation (identity when obs_normalization=false)."""
        return self.obs_normalizer(obs) if self.algo.obs_normalization else obs

    def norm_critic_obs(self, critic_obs: Tensor) -> Tensor:
        """Critic-side normalisation (identity when obs_normalization=false)."""
        if not self.algo.obs_normalization:
            return critic_obs
        return self.critic_obs_normalizer(critic_obs)

    def q_values(self, logits: Tensor) -> Tensor:
        """Expected value of each member's distribution: [E, B, A] logits → [E, B]."""
        return expected_value(logits, self.support, from_logits=True)

    def critic_logits_frozen(self, critic_obs: Tensor, actions: Tensor) -> Tensor:
        """Critic forward whose parameters are detached: the actor's backward then skips the
        critic weight gradients the recipe would discard anyway (the actor step never applies them)."""
        params = {n: p.detach() for n, p in self.critic.named_parameters()}
        params.update(dict(self.critic.named_buffers()))
        return torch.func.functional_call(self.critic, params, (critic_obs, actions))

    def _clip(self, params: list[Tensor], metrics: dict[str, Tensor], name: str) -> None:
        if self.algo.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.algo.max_grad_norm, foreach=True)
            metrics[name] = norm

    def critic_update(self, batch: Any) -> dict[str, Tensor]:
        """One critic update + weight projection + target Polyak: pure tensor code with no host
        state, so UpdateStep can compile it and capture it in a CUDA graph."""
        loss, metrics = self.critic_loss(batch)
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_sync is not None:
            self.grad_sync(self.critic_sync_params)
        self._clip(self.critic_params, metrics, "critic_grad_norm")
        self.critic_optimizer.step()
        project_weights_(self.critic)
        self.critic_polyak.update(self.algo.tau)
        return metrics

    def actor_step(self, batch: Any) -> dict[str, Tensor]:
        """One actor update (critic weights receive no gradient); pure tensor code like
        `critic_update`."""
        loss, metrics = self.actor_loss(batch)
        self.actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_sync is not None:
            self.grad_sync(self.actor_params)  # actor only: critic grads are never all-reduced here
        self._clip(self.actor_params, metrics, "actor_grad_norm")
        self.actor_optimizer.step()
        project_weights_(self.actor)
        return metrics

    def step_schedulers(self) -> None:
        """Called once per environment step (the recipe's schedule unit)."""
        with warnings.catch_warnings():
            # The schedule counts env steps: the actor's may advance before its first (delayed) step.
            warnings.filterwarnings("ignore", message=SCHEDULER_ORDER_WARNING, category=UserWarning)
            for s in self.schedulers:
                s.step()

    def update_normalizers(self, obs: Tensor, critic_obs: Tensor) -> None:
        """Update running statistics from rollout observations only (replayed samples would count
        old observations again and again)."""
        if self.algo.obs_normalization:
            self.obs_normalizer.update(obs)
            self.critic_obs_normalizer.update(critic_obs)

    def update_reward_scale(self, discounted_returns: Tensor) -> None:
        """Merge the rollout's running discounted returns (`[num_envs]`) into the reward scale
        (automatic value range only; the collector keeps G per env)."""
        if self.reward_scaler is not None:
            self.reward_scaler.update(discounted_returns)

    def scaled_rewards(self, rewards: Tensor) -> Tensor:
        """Rewards (or n-step reward sums) in the critic's units: scaled under the automatic value
        range, raw with a fixed support."""
        return rewards if self.reward_scaler is None else self.reward_scaler(rewards)

    def value_metrics(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        """Where the critic sits on its support (device tensors, no host sync): the share of the
        target mass on each end atom, the spread of Q as a fraction of the support, the scale."""
        q = self.q_values(logits.detach())
        lo, hi = self.support.v_min, self.support.v_max
        metrics = {
            "q_mean": q.mean(),
            "q_max": q.max(),
            "q_min": q.min(),
            "target_q_mean": expected_value(target[0], self.support).mean(),
            "value/end_mass_low": target[..., 0].mean(),
            "value/end_mass_high": target[..., -1].mean(),
            "value/q_min_pos": (q.min() - lo) / (hi - lo),
            "value/q_max_pos": (q.max() - lo) / (hi - lo),
        }
        if self.reward_scaler is not None:
            metrics["value/reward_scale"] = self.reward_scaler.scale()
        return metrics

    def adapter_norms(self) -> dict[str, Tensor]:
        """Norms of every critic LoRA ΔW (device tensors; read at logging time)."""
        return adapter_norms(self.critic)

    # -- state ----------------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        """Every module whose state is checkpointed."""
        return {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "obs_normalizer": self.obs_normalizer,
            "critic_obs_normalizer": self.critic_obs_normalizer,
        } | ({"reward_scaler": self.reward_scaler} if self.reward_scaler is not None else {})

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimiser an update steps (all are checkpointed)."""
        return {"critic_optimizer": self.critic_optimizer, "actor_optimizer": self.actor_optimizer}

    def free_tensors(self) -> dict[str, Tensor]:
        """Trained tensors outside any module (FastSAC's log α); checkpointed like the modules."""
        return {}

    def state_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """Every tensor an update may change, by a stable name: module parameters and buffers
        (`<module>.<key>`), free tensors (`log_alpha`), optimiser state (`optimizer<i>.<j>.<key>`).

        UpdateStep restores them after its CUDA-graph warm-up; verify_compile compares them."""
        for mod_name, module in self.modules().items():
            for name, t in module.state_dict(keep_vars=True).items():
                if isinstance(t, Tensor):
                    yield f"{mod_name}.{name}", t
        yield from self.free_tensors().items()
        for i, opt in enumerate(self.optimizers().values()):
            for j, state in enumerate(opt.state.values()):
                for key, t in state.items():
                    if isinstance(t, Tensor):
                        yield f"optimizer{i}.{j}.{key}", t

    def state_dict(self) -> dict[str, Any]:
        """Full learner state (modules, free tensors, optimisers, schedulers). The update count is
        UpdateStep's (it saves it beside this state, under `num_critic_updates`)."""
        state: dict[str, Any] = {k: m.state_dict() for k, m in self.modules().items()}
        state.update({k: t.detach().clone() for k, t in self.free_tensors().items()})
        state.update({k: o.state_dict() for k, o in self.optimizers().items()})
        state["schedulers"] = [s.state_dict() for s in self.schedulers]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of state_dict. A cosine schedule saved with another total (a resume that extends
        or shortens `total_steps`) follows this learner's total (`follow_total`)."""
        for k, m in self.modules().items():
            m.load_state_dict(state[k])
        with torch.no_grad():
            for k, t in self.free_tensors().items():
                t.copy_(state[k])  # in place: optimisers and compiled steps hold this tensor
        for k, o in self.optimizers().items():
            load_optimizer_state_(o, state[k])
        if not self.schedulers:  # an inference learner (play / export) has no schedule
            return
        for s, sd in zip(self.schedulers, state["schedulers"], strict=True):
            s.load_state_dict(sd)
            follow_total(s, self.total_iterations)


def follow_total(scheduler: torch.optim.lr_scheduler.CosineAnnealingLR, total: int) -> None:
    """Re-plan a restored cosine schedule over `total` steps: from its current step on, the LR is
    the one a run started with `total` has at that step (and the schedule continues from there);
    at or past `total` (a shortened run, which ends at once) it is `lr_min`. Unchanged when
    `total` is the saved one (bit-exact resume)."""
    if scheduler.T_max == total:
        return
    scheduler.T_max = total
    step = min(scheduler.last_epoch, total)
    cos = (1 + math.cos(math.pi * step / total)) / 2
    lrs = [scheduler.eta_min + (base - scheduler.eta_min) * cos for base in scheduler.base_lrs]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports until the next step


def cross_entropy(logits: Tensor, target_probs: Tensor) -> Tensor:
    """Batch-mean cross-entropy per ensemble member, summed over members: [E, B, A] → scalar."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return -(target_probs * log_probs).sum(-1).mean(-1).sum()
