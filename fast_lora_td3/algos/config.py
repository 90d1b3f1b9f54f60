"""The algorithm config shared by FastTD3 and FastSAC (one schema so Hydra can validate overrides)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fast_lora_td3.errors import ConfigError

ALGO_NAMES = ("fasttd3", "fastsac", "ppo")
"""Valid values of `AlgoConfig.name` (the off-policy learners of `algos.LEARNERS`, and rsl_rl PPO)."""
REPLAY_OBS_DTYPES = ("float32", "bfloat16")
"""Valid replay storage dtypes of observations."""
REPLAY_ACTION_DTYPES = ("float32", "bfloat16", "float16")
"""Valid replay storage dtypes of actions."""


def check_choice(key: str, value: object, valid: tuple[str, ...]) -> None:
    """ConfigError naming `key` and the valid values when `value` is not one of them."""
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid: use one of {', '.join(valid)}")


@dataclass
class AlgoConfig:
    """Off-policy algorithm settings. Defaults follow the FastTD3 Isaac Lab humanoid recipe;
    `configs/algo/fastsac.yaml` overrides them with the FastSAC recipe."""

    name: str = "fasttd3"
    """`fasttd3`, `fastsac` or `ppo` (the rsl_rl baseline)."""
    gamma: float = 0.99
    """Discount per environment step."""
    n_step: int = 8
    """n of the n-step return; windows stop at the first terminated or truncated step."""
    num_updates: int = 4
    """Critic updates per environment step (each env step adds num_envs transitions)."""
    policy_frequency: int = 2
    """One actor update every `policy_frequency` critic updates."""
    batch_size: int = 32768
    """Global batch per update, sampled evenly across envs: must be divisible by env.num_envs."""
    buffer_size: int = 10240
    """Replay capacity PER ENVIRONMENT (total transitions = buffer_size × env.num_envs)."""
    replay_obs_dtype: str = "float32"
    """Replay storage dtype of observations: `float32` or `bfloat16` (halves their bytes)."""
    replay_action_dtype: str = "float32"
    """Replay storage dtype of actions: `float32`, `bfloat16` or `float16`. Under amp=bf16 the critic
    rounds actions to bf16 anyway, so bf16 storage loses nothing there (the GPU presets use it)."""
    learning_starts: int = 10
    """Environment steps (per env) collected before updates start."""
    v_min: float | None = None
    """Lower end of the C51 support in return units. Unset (with v_max): the automatic range, which
    scales rewards by the running scale of discounted returns (`return_scale_max`) and uses the
    support ±2·return_scale_max. Set both to fix the support and train on raw rewards."""
    v_max: float | None = None
    """Upper end of the C51 support; set with v_min (see v_min)."""
    return_scale_max: float = 5.0
    """Automatic range (v_min/v_max unset): rewards are divided by max(σ_G, G_max/return_scale_max),
    G the running discounted return, so every observed return lies within ±return_scale_max; the
    support spans twice that, headroom for returns that grow past what was seen (SimbaV2's
    normalized_g_max is 5)."""
    num_atoms: int = 251
    """Number of C51 atoms."""
    tau: float = 0.1
    """Polyak rate of the target critic, applied after every critic update."""
    critic_lr: float = 3e-4
    """Critic learning rate."""
    actor_lr: float = 3e-4
    """Actor learning rate."""
    lr_min: float | None = None
    """If set, cosine-anneal both learning rates to this value over the run (stepped per env step)."""
    weight_decay: float = 0.1
    """AdamW weight decay of dense critics and of the actor."""
    adapter_weight_decay: float = 6e-4
    """AdamW weight decay of LoRA adapters (A, B); other critic params of LoRA critics get 0."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    max_grad_norm: float = 0.0
    """Clip gradient norm to this value; 0 disables clipping."""
    policy_noise: float = 0.001
    """TD3 target-policy smoothing noise std."""
    noise_clip: float = 0.5
    """TD3 target-policy smoothing noise clip."""
    std_min: float = 0.001
    """TD3 exploration: per-env noise std drawn from U(std_min, std_max), redrawn at episode end."""
    std_max: float = 0.4
    """See std_min."""
    use_target_actor: bool = False
    """TD3: use a Polyak-averaged target actor for a' (the reference uses the online actor)."""
    actor_q_reduce: str = "min"
    """How the actor loss reduces the Q ensemble: `min` (TD3) or `mean` (SAC)."""
    use_cdq: bool = True
    """Clipped double Q in distributional form (TD3). FastSAC: False, each Q regresses to its own target."""
    alpha_init: float = 0.001
    """SAC: initial entropy temperature α (log α starts at ln alpha_init)."""
    alpha_lr: float = 3e-4
    """SAC: learning rate of log α (AdamW with `betas`, like the networks)."""
    alpha_weight_decay: float = 0.0
    """SAC: AdamW weight decay of log α. 0 by default: decay would pull log α toward 0 (α toward 1);
    the FastSAC reference leaves torch's AdamW default, 0.01."""
    autotune_alpha: bool = True
    """SAC: learn α to reach target_entropy."""
    target_entropy: float = 0.0
    """SAC: target entropy (per action vector)."""
    obs_normalization: bool = True
    """Normalise observations with running statistics of rollout observations."""
    normalizer_until: int | None = None
    """Freeze the normalisers after this many observed samples (None: never)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError on the first invalid setting (also run on the final config by
        `validate`, since the CPU defaults may change fields after construction)."""
        check_choice("algo", self.name, ALGO_NAMES)
        check_choice("algo.actor_q_reduce", self.actor_q_reduce, ("min", "mean"))
        if self.name == "ppo":  # PPO reads none of the replay / C51 settings below
            return
        check_choice("algo.replay_obs_dtype", self.replay_obs_dtype, REPLAY_OBS_DTYPES)
        check_choice("algo.replay_action_dtype", self.replay_action_dtype, REPLAY_ACTION_DTYPES)
        if (self.v_min is None) != (self.v_max is None):
            raise ConfigError(
                f"algo.v_min={self.v_min} and algo.v_max={self.v_max}: set both (a fixed support) "
                "or neither (the automatic range)"
            )
        if self.v_min is not None and self.v_min >= self.v_max:  # type: ignore[operator]
            raise ConfigError(f"algo.v_min ({self.v_min}) must be < algo.v_max ({self.v_max})")
        if not self.return_scale_max > 0:
            raise ConfigError(f"algo.return_scale_max must be > 0 (got {self.return_scale_max})")
        if self.num_atoms < 2:
            raise ConfigError(f"algo.num_atoms must be >= 2 (got {self.num_atoms})")
        if self.buffer_size <= self.n_step:
            raise ConfigError(
                f"algo.buffer_size={self.buffer_size} (capacity per env) must exceed "
                f"algo.n_step={self.n_step}"
            )
        if self.n_step < 1 or self.num_updates < 1 or self.policy_frequency < 1:
            raise ConfigError(
                "algo.n_step, algo.num_updates and algo.policy_frequency must be >= 1"
            )
        if not 0.0 < self.gamma <= 1.0:
            raise ConfigError(f"algo.gamma must be in (0, 1] (got {self.gamma})")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"algo.tau must be in (0, 1] (got {self.tau})")

    @property
    def auto_value_range(self) -> bool:
        """Whether the run scales rewards and uses the automatic support (v_min/v_max unset)."""
        return self.v_min is None and self.v_max is None

    def support_bounds(self) -> tuple[float, float]:
        """(v_min, v_max) of the C51 support: as set, or ±2·return_scale_max when automatic."""
        if self.v_min is None or self.v_max is None:
            return -2.0 * self.return_scale_max, 2.0 * self.return_scale_max
        return float(self.v_min), float(self.v_max)
