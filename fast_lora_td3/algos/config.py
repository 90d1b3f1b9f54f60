"""The algorithm config shared by FastTD3 and FastSAC (one schema so Hydra can validate overrides)."""

from __future__ import annotations

from dataclasses import dataclass

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.fields import check_fields, setting

ALGO_NAMES = ("fasttd3", "fastsac", "ppo")
"""Valid values of `AlgoConfig.name` (the off-policy learners of `algos.LEARNERS`, and rsl_rl PPO)."""
DEFAULT_ACTOR_PREACT_L2 = 0.01
"""FastTD3's actor pre-tanh penalty when `algo.actor_preact_l2` is unset. On the untuned suite (3 seeds,
600 s) it cut the saturated-action share to <= 0.1 on every task and lifted HalfCheetah, Ant,
Humanoid and the cartpole per env step; Hopper did worse (docs/RESULTS.md, untuned)."""
REPLAY_OBS_DTYPES = ("float32", "bfloat16")
"""Valid replay storage dtypes of observations."""
REPLAY_ACTION_DTYPES = ("float32", "bfloat16", "float16")
"""Valid replay storage dtypes of actions."""


def check_choice(key: str, value: object, valid: tuple[str, ...]) -> None:
    """ConfigError naming `key` and the valid values when `value` is not one of them."""
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid: use one of {', '.join(valid)}")


ALGO_ONLY_KEYS: dict[str, tuple[str, ...]] = {
    "fasttd3": ("policy_noise", "noise_clip", "std_min", "std_max", "use_target_actor", "use_cdq"),
    "fastsac": ("alpha_init", "alpha_lr", "alpha_weight_decay", "autotune_alpha", "target_entropy"),
}
"""`algo.` keys that only one off-policy algorithm reads (the other would ignore them silently)."""


@dataclass
class AlgoConfig:
    """Off-policy algorithm settings. Defaults follow the FastTD3 Isaac Lab humanoid recipe;
    `configs/algo/fastsac.yaml` overrides them with the FastSAC recipe."""

    name: str = setting("fasttd3", choices=ALGO_NAMES)
    """`fasttd3`, `fastsac` or `ppo` (the rsl_rl baseline)."""
    gamma: float = setting(0.99, gt=0, le=1)
    """Discount per environment step."""
    n_step: int = setting(8, ge=1)
    """n of the n-step return; windows stop at the first terminated or truncated step."""
    num_updates: int = setting(4, ge=1)
    """Critic updates per environment step (each env step adds num_envs transitions)."""
    policy_frequency: int = setting(2, ge=1)
    """One actor update every `policy_frequency` critic updates."""
    batch_size: int = setting(32768, ge=1)
    """Global batch per update, sampled evenly across envs: must be divisible by env.num_envs."""
    buffer_size: int = setting(10240, ge=2)
    """Replay capacity PER ENVIRONMENT (total transitions = buffer_size × env.num_envs)."""
    replay_obs_dtype: str = setting("float32", choices=REPLAY_OBS_DTYPES)
    """Replay storage dtype of observations: `float32` or `bfloat16` (halves their bytes)."""
    replay_action_dtype: str = setting("float32", choices=REPLAY_ACTION_DTYPES)
    """Replay storage dtype of actions: `float32`, `bfloat16` or `float16`. Under amp=bf16 the critic
    rounds actions to bf16 anyway, so bf16 storage loses nothing there (the GPU presets use it)."""
    learning_starts: int = setting(10, ge=0)
    """Environment steps (per env) collected before updates start."""
    v_min: float | None = None
    """Lower end of the C51 support in return units. Unset (with v_max): the automatic range, which
    scales rewards by the running scale of discounted returns (`return_scale_max`) and uses the
    support ±2·return_scale_max. Set both to fix the support and train on raw rewards."""
    v_max: float | None = None
    """Upper end of the C51 support; set with v_min (see v_min)."""
    return_scale_max: float = setting(5.0, gt=0)
    """Automatic range (v_min/v_max unset): rewards are divided by max(σ_G, G_max/return_scale_max),
    G the running discounted return, so every observed return lies within ±return_scale_max; the
    support spans twice that, headroom for returns that grow past what was seen (SimbaV2's
    normalized_g_max is 5)."""
    num_atoms: int = setting(251, ge=2)
    """Number of C51 atoms."""
    tau: float = setting(0.1, gt=0, le=1)
    """Polyak rate of the target critic, applied after every critic update."""
    critic_lr: float = setting(3e-4, gt=0)
    """Critic learning rate."""
    actor_lr: float = setting(3e-4, gt=0)
    """Actor learning rate (the GPU recipe's). On a CPU, FastTD3 with the CPU-sized batch gets
    `cpu_defaults.CPU_TD3_ACTOR_LR` unless this is set."""
    lr_min: float | None = setting(None, ge=0)
    """If set, cosine-anneal both learning rates to this value over the run (stepped per env step)."""
    weight_decay: float = setting(0.1, ge=0)
    """AdamW weight decay of dense critics and of the actor."""
    adapter_weight_decay: float = setting(6e-4, ge=0)
    """AdamW weight decay of LoRA adapters (A, B); other critic params of LoRA critics get 0."""
    betas: list[float] = setting(factory=lambda: [0.9, 0.999], length=2, ge=0, lt=1)
    """AdamW betas."""
    max_grad_norm: float = setting(0.0, ge=0)
    """Clip gradient norm to this value; 0 disables clipping."""
    policy_noise: float = setting(0.001, ge=0)
    """TD3 target-policy smoothing noise std."""
    noise_clip: float = setting(0.5, ge=0)
    """TD3 target-policy smoothing noise clip."""
    std_min: float = setting(0.001, ge=0)
    """TD3 exploration: per-env noise std drawn from U(std_min, std_max), redrawn at episode end."""
    std_max: float = setting(0.4, ge=0)
    """See std_min."""
    use_target_actor: bool = False
    """TD3: use a Polyak-averaged target actor for a' (the reference uses the online actor)."""
    actor_preact_l2: float | None = setting(None, ge=0)
    """TD3: weight of an L2 penalty on the actor's pre-tanh output, `c · mean(u²)`, added to the actor
    loss (the policy regulariser of the original SAC code, there 5e-4 on the Gaussian mean). It keeps
    a deterministic tanh actor from locking into full-scale actions while the critic is still young.
    Unset: `DEFAULT_ACTOR_PREACT_L2` under FastTD3 (chosen on the untuned suite, docs/RESULTS.md) and
    off under FastSAC, whose entropy term does this job; 0 turns it off."""
    actor_q_reduce: str = setting("min", choices=("min", "mean"))
    """How the actor loss reduces the Q ensemble: `min` (TD3) or `mean` (SAC)."""
    use_cdq: bool = True
    """Clipped double Q in distributional form (TD3). FastSAC: False, each Q regresses to its own target."""
    alpha_init: float = setting(0.001, gt=0)
    """SAC: initial entropy temperature α (log α starts at ln alpha_init)."""
    alpha_lr: float = setting(3e-4, gt=0)
    """SAC: learning rate of log α (AdamW with `betas`, like the networks)."""
    alpha_weight_decay: float = setting(0.0, ge=0)
    """SAC: AdamW weight decay of log α. 0 by default: decay would pull log α toward 0 (α toward 1);
    the FastSAC reference leaves torch's AdamW default, 0.01."""
    autotune_alpha: bool = True
    """SAC: learn α to reach target_entropy."""
    target_entropy: float = 0.0
    """SAC: target entropy (per action vector)."""
    obs_normalization: bool = True
    """Normalise observations with running statistics of rollout observations."""
    normalizer_until: int | None = setting(None, ge=1)
    """Freeze the normalisers after this many observed samples (None: never)."""
    obs_norm_eps: float = setting(1e-2, gt=0)
    """The normalisers' σ floor: features become (x − μ)/(σ + eps). FastTD3's 0.01 scales a feature
    with σ ≈ 0.001 up ~100×. A larger eps keeps small-σ features small: 1.0 lifted Ant-v5's first
    minute on a CPU but cost Hopper, HalfCheetah and Humanoid later (docs/RESULTS.md, untuned)."""
    critic_obs_norm_eps: float | None = setting(None, gt=0)
    """The critic normaliser's σ floor (None: `obs_norm_eps`; the actor's floor, and so the exported
    policy, stay `obs_norm_eps`). On a CPU, 1.0 lifted Ant-v5's first minute (329 against 205 at
    60 s) with other tasks level or lower by the mean, so it is not a default (docs/RESULTS.md,
    untuned)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError on the first invalid setting (also run on the final config by
        `validate`, since the CPU defaults may change fields after construction)."""
        check_fields(self, "algo")
        if self.name == "ppo":  # PPO reads none of the replay / C51 settings below
            return
        if self.name == "fastsac" and self.preact_l2_weight > 0:  # FastSAC would ignore it
            raise ConfigError(
                f"algo.actor_preact_l2={self.actor_preact_l2} is a FastTD3 setting: use algo=fasttd3, "
                "or leave it at 0 with algo=fastsac (its entropy term keeps actions off the bounds)"
            )
        if (self.v_min is None) != (self.v_max is None):
            raise ConfigError(
                f"algo.v_min={self.v_min} and algo.v_max={self.v_max}: set both (a fixed support) "
                "or neither (the automatic range)"
            )
        if self.v_min is not None and self.v_min >= self.v_max:  # type: ignore[operator]
            raise ConfigError(f"algo.v_min ({self.v_min}) must be < algo.v_max ({self.v_max})")
        if self.buffer_size <= self.n_step:
            raise ConfigError(
                f"algo.buffer_size={self.buffer_size} (capacity per env) must exceed "
                f"algo.n_step={self.n_step}"
            )
        if self.std_min > self.std_max:
            raise ConfigError(
                f"algo.std_min={self.std_min} must be <= algo.std_max={self.std_max} "
                "(exploration noise std is drawn from U(std_min, std_max))"
            )
        if self.lr_min is not None and self.lr_min > min(self.critic_lr, self.actor_lr):
            raise ConfigError(
                f"algo.lr_min={self.lr_min} must be <= algo.critic_lr={self.critic_lr} and "
                f"algo.actor_lr={self.actor_lr} (the cosine schedule anneals down to it)"
            )

    @property
    def auto_value_range(self) -> bool:
        """Whether the run scales rewards and uses the automatic support (v_min/v_max unset)."""
        return self.v_min is None and self.v_max is None

    @property
    def preact_l2_weight(self) -> float:
        """The actor pre-tanh penalty weight in force: as set, else FastTD3's default, 0 under FastSAC."""
        if self.actor_preact_l2 is not None:
            return float(self.actor_preact_l2)
        return DEFAULT_ACTOR_PREACT_L2 if self.name == "fasttd3" else 0.0

    def support_bounds(self) -> tuple[float, float]:
        """(v_min, v_max) of the C51 support: as set, or ±2·return_scale_max when automatic."""
        if self.v_min is None or self.v_max is None:
            return -2.0 * self.return_scale_max, 2.0 * self.return_scale_max
        return float(self.v_min), float(self.v_max)
