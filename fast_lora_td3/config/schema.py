"""The root training config: typed dataclasses registered with Hydra's ConfigStore.

Every field has a docstring; Hydra validates overrides against these types, so an unknown key or a
wrong type is an error, not silently ignored. Each field declares its valid values where it is
defined (`setting(default, ge=…, choices=…)`, fast_lora_td3/fields.py); each dataclass checks them in
`__post_init__` (run by `OmegaConf.to_object` on the composed values) and again in `check()`, which
`validate` calls on the final config; rules that span groups live in fast_lora_td3/config/validate.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from fast_lora_td3.algos.config import AlgoConfig
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.fields import check_fields, setting
from fast_lora_td3.nn.config import ActorConfig, CriticConfig

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def parse_flag(name: str, value: Any) -> str:
    """Normalise a `compile` / `cuda_graph` value (bool, None or string) to auto / true / false."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text in _TRUE:
        return "true"
    if text in _FALSE:
        return "false"
    raise ConfigError(
        f"{name}={value!r} is not valid: use {name}=auto, {name}=true or {name}=false"
    )


AMP_MODES = ("none", "bf16")
"""Valid values of `amp` (autocast of the update step)."""
FLAG_VALUES = ("auto", *_TRUE, *_FALSE)
"""Valid values of `compile` and `cuda_graph` (any case; `parse_flag` normalises them)."""


@dataclass
class EvalConfig:
    """Deterministic evaluation on separate envs (the training envs are never reset for it); on
    Isaac Lab (one simulator per process) on the first `num_envs` training envs instead."""

    interval: int = setting(0, ge=0)
    """Evaluate every this many env steps summed over envs (0: only at the end of training)."""
    num_envs: int = setting(16, ge=1)
    """Number of evaluation environments."""
    max_steps: int | None = setting(None, ge=1)
    """Cap on steps per evaluation (None: the task's max episode length)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError on an invalid setting."""
        check_fields(self, "eval")


@dataclass
class PPOConfig:
    """rsl_rl PPO baseline settings (used when algo=ppo); rsl_rl's usual locomotion values."""

    num_steps_per_env: int = setting(24, ge=1)
    """Rollout length per env between PPO updates."""
    learning_rate: float = setting(1e-3, gt=0)
    """Adam learning rate (adaptive schedule on KL)."""
    num_learning_epochs: int = setting(5, ge=1)
    """Epochs over each rollout."""
    num_mini_batches: int = setting(4, ge=1)
    """Mini-batches per epoch."""
    entropy_coef: float = setting(0.01, ge=0)
    """Entropy bonus."""
    actor_hidden_dims: list[int] = setting(factory=lambda: [512, 256, 128], min_len=1, ge=1)
    """Actor MLP widths."""
    critic_hidden_dims: list[int] = setting(factory=lambda: [512, 256, 128], min_len=1, ge=1)
    """Critic MLP widths."""
    init_noise_std: float = setting(1.0, gt=0)
    """Initial action noise std."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError on an invalid setting."""
        check_fields(self, "ppo")


@dataclass
class TrainConfig:
    """Everything `fast-lora-td3 train` needs. Nested groups: algo, critic, actor, env, eval, ppo."""

    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Algorithm (FastTD3 defaults; `algo=fastsac` switches the recipe)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Critic family and sizes (`critic=simbav2_lora` etc.)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Actor network."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Simulator backend and task."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation schedule."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """rsl_rl PPO baseline settings (algo=ppo)."""
    experiment: str | None = setting(None, free="informational: the preset applied")
    """Name of the preset under configs/experiment/ that was applied (informational)."""
    total_steps: int = setting(100_000_000, ge=1)
    """Environment steps to train for, summed over all envs (iterations = total_steps / num_envs)."""
    max_wall_s: float = setting(0.0, ge=0)
    """Also stop after this many seconds of training in this process (0: no limit), then evaluate,
    checkpoint and export as at total_steps. A time budget for benchmarks and queue slots; a cosine
    schedule still follows total_steps."""
    seed: int = setting(1, ge=0, lt=2**32)
    """Global seed (torch, numpy, python, simulator); rank r uses seed + r."""
    device: str = setting(
        "auto", pattern=r"auto|cpu|cuda(:\d+)?", what="auto, cpu, cuda or cuda:<i>"
    )
    """Training device: `cpu`, `cuda`, `cuda:N`, or `auto` (cuda when available)."""
    cpu_defaults: bool = True
    """When `device` resolves to `cpu`, size the batch, network widths, updates per step (and mjlab's
    env count) for a CPU unless the command line or the preset sets them (fast_lora_td3/config/cpu_defaults.py)."""
    log_dir: str = setting("logs/fast_lora_td3", pattern=r".+", what="a non-empty directory path")
    """Root under which run directories `<task>/<date>_<time>[_<run_name>]/` are made."""
    run_name: str = setting("", pattern=r"[^/\\]*", what="a name without path separators")
    """Suffix of the run directory name."""
    run_dir: str | None = setting(None, free="a path: checked when the run directory is made")
    """Use exactly this run directory (set by resume or by scripts); None: make a new one."""
    resume: bool = False
    """Continue from the latest checkpoint of `run_dir` (or of the newest run of this task/run_name)."""
    checkpoint: str | None = setting(None, free="a path: checked when the checkpoint is read")
    """Checkpoint path or run directory for `play` / `export` (and for `train resume=true`)."""
    compile: str = setting(
        "auto",
        choices=FLAG_VALUES,
        ignore_case=True,
        what="compile=auto, compile=true or compile=false",
    )
    """torch.compile the update steps: `auto` (on CUDA: when it passes the start-up parity check
    against eager; on CPU: eager), `true` or `false` (a string so that Hydra takes all three)."""
    cuda_graph: str = setting(
        "auto",
        choices=FLAG_VALUES,
        ignore_case=True,
        what="cuda_graph=auto, cuda_graph=true or cuda_graph=false",
    )
    """Capture the update step in CUDA graphs: `auto` (on CUDA: graphed first when it passes the
    parity check, then compiled, then eager), `true` (CUDA only; a note on CPU) or `false`."""
    amp: str = setting("none", choices=AMP_MODES)
    """Autocast for the update: `none` or `bf16` (fp32 master weights)."""
    verify_compile: bool = False
    """Run a few updates eager and compiled from the same state at start; refuse to train on mismatch."""
    logger: str = setting("tensorboard", choices=("tensorboard", "wandb"))
    """`tensorboard` (always written) or `wandb` (TensorBoard plus W&B; offline mode works)."""
    log_interval: int = setting(1000, ge=1)
    """Write a metrics row every this many iterations (env steps per env)."""
    log_interval_s: float = setting(10.0, ge=0)
    """Also write a metrics row when this many seconds passed since the last one (0: off), and
    write one as soon as the first training episode ends, so slow runs show progress early."""
    checkpoint_interval: int = setting(5000, ge=0)
    """Checkpoint every this many iterations (0: only at the end and on preemption)."""
    keep_checkpoints: int = setting(3, ge=1)
    """Keep the last K checkpoints."""
    save_replay: bool = False
    """Include the replay buffer in checkpoints (large; needed for bit-identical resume)."""
    nan_check_interval: int = setting(100, ge=0)
    """Check losses and observations for NaN/Inf every this many iterations (0: never)."""
    nan_action: str = setting("stop", choices=("stop", "skip"))
    """On a non-finite value: `stop` (debug checkpoint, exit 1) or `skip` (warn and continue)."""
    progress: bool = True
    """Show the progress line."""
    export_at_end: bool = True
    """Export the policy (ONNX + TorchScript + policy.json) at the end of training."""
    dry_run: bool = False
    """Compose and validate the config, print a one-line summary, and exit 0 without building envs,
    networks, process groups or run directories (checks launch scripts and container commands)."""

    def __post_init__(self) -> None:
        self.check(nested=False)  # the groups checked themselves when they were built

    def check(self, nested: bool = True) -> None:
        """Raise ConfigError on the first invalid setting of this config (and, with `nested`, of
        its groups). Rules that relate two groups are in fast_lora_td3/config/validate.py."""
        if nested:
            for group in (self.algo, self.env, self.critic, self.actor, self.eval, self.ppo):
                group.check()
        check_fields(self, "")


def register_configs() -> None:
    """Register the schemas with Hydra (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="algo", name="algo_schema", node=AlgoConfig)
    cs.store(group="critic", name="critic_schema", node=CriticConfig)
    cs.store(group="actor", name="actor_schema", node=ActorConfig)
    cs.store(group="env", name="env_schema", node=EnvConfig)
