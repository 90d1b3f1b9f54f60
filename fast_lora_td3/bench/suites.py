"""The suites of `fast-lora-td3 bench learn`: which tasks, methods, seeds and budgets each runs."""

from __future__ import annotations

from dataclasses import dataclass

CRITICS = ("simbav2_lora", "simbav2", "mlp_lora", "mlp")
PEERS = ("sb3_td3", "sb3_sac", "ppo")
LORA_PAIRS = (("simbav2_lora", "simbav2"), ("mlp_lora", "mlp"))
GO1_THRESHOLD = 100.0
"""go1_flat_cpu return threshold: the untrained policy (initial actor with exploration noise,
`algo.learning_starts` above the budget) earned 0.058 per step, about 60 over a full 1000-step
episode; 100 asks for clearly more than standing up (docs/RESULTS.md)."""
G1_THRESHOLD = 10.0
"""g1_flat_cpu return threshold: the untrained policy earned 1.8 per episode (falls after ~76
steps), measured as for Go1 (docs/RESULTS.md)."""

HALFCHEETAH_CPU_BUDGET = (40_000, (10_000, 20_000, 40_000), 1000.0)
"""halfcheetah_cpu's env-step budget, checkpoints and return threshold (the cpu and cpu_large suites)."""

UNTUNED_WALL_S = 600.0
"""Wall-clock seconds per run of the `untuned` suite (one core each)."""
UNTUNED_WALL_MARKS = (60.0, 300.0, 600.0)
UNTUNED_CHECKPOINTS = (20_000, 50_000, 100_000)
UNTUNED_STEP_CAP = 5_000_000
"""Env-step cap of `untuned` runs: above what 600 s reach, so the wall clock ends them."""


@dataclass(frozen=True)
class TaskSpec:
    """One panel of the suite: a preset at a fixed env-step budget."""

    preset: str
    """configs/experiment/<preset>.yaml."""
    total_steps: int
    """Env-step budget of every method on this task."""
    checkpoints: tuple[int, ...]
    """Env steps at which the return is reported."""
    threshold: float
    """Return for time-to-threshold."""
    peers: tuple[str, ...] = ()
    """Peer methods run on this task (`sb3_td3`, `sb3_sac` for gymnasium ids, `ppo` for mjlab)."""
    gym_id: str = ""
    """gymnasium id for the SB3 peers."""
    overrides: tuple[str, ...] = ()
    """Extra overrides of our runs (and PPO's)."""
    peer_learning_starts: int | None = None
    """SB3 learning_starts for budgets too small for the zoo's 10,000 (smoke only)."""
    critics: tuple[str, ...] | None = None
    """Critic families run on this task; None: the suite's."""
    seeds: tuple[int, ...] | None = None
    """Seeds of this task; None: the suite's (a `seeds=` argument overrides both)."""
    name: str = ""
    """The task's name in results; empty: the preset's name."""
    wall_s: float = 0.0
    """Wall-clock budget of every run, in seconds on one core (ours: `max_wall_s`, SB3 peers the
    same); `total_steps` is then only a cap. 0: the env-step budget alone."""
    wall_marks: tuple[float, ...] = ()
    """Wall-clock seconds at which the return is reported."""

    @property
    def key(self) -> str:
        """The task's name in run directories and results."""
        return self.name or self.preset


@dataclass(frozen=True)
class Suite:
    """A named set of tasks × critic families × seeds."""

    name: str
    tasks: tuple[TaskSpec, ...]
    critics: tuple[str, ...]
    seeds: tuple[int, ...]
    workers: int = 1
    note: str = ""


SUITES = {
    # Minutes on 2 cores (CI runs it as tests/test_bench_learn.py): machinery, not evidence.
    "smoke": Suite(
        name="smoke",
        tasks=(
            TaskSpec(
                preset="pendulum_cpu",
                total_steps=4800,
                checkpoints=(3200, 4800),  # 16 envs x 200-step episodes: the first ends at 3200
                threshold=-1000.0,
                peers=("sb3_td3",),
                gym_id="Pendulum-v1",
                # mlp_lora adapts the first layer too: rank < obs + action dims (3 + 1).
                overrides=(
                    "eval.num_envs=2",
                    "checkpoint_interval=0",
                    "critic.rank=2",
                    "critic.alpha=2",
                ),
                peer_learning_starts=4400,
            ),
        ),
        critics=("mlp", "mlp_lora"),
        seeds=(1, 2),
        workers=2,
        note="tiny budgets: checks the machinery end to end, not learning",
    ),
    # 51 runs, ~5.5 h of process time (~3 h with workers=2 on 2 cores; docs/RESULTS.md). LoRA vs dense
    # (all four families, 3 seeds) on HalfCheetah and Go1; Hopper runs the preset's mlp and
    # simbav2_lora against the peers, G1 simbav2_lora; FastSAC (`algo=fastsac` on the preset) runs
    # on HalfCheetah and G1. The claims come first, the long G1 runs (30-60 min each) last.
    "cpu": Suite(
        name="cpu",
        tasks=(
            TaskSpec(
                "halfcheetah_cpu",
                *HALFCHEETAH_CPU_BUDGET,
                ("sb3_td3", "sb3_sac"),
                "HalfCheetah-v5",
                critics=(*CRITICS, "fastsac"),  # FastSAC with the preset's (FastTD3) settings
            ),
            TaskSpec("go1_flat_cpu", 32_000, (8_000, 16_000, 32_000), GO1_THRESHOLD, ("ppo",)),
            TaskSpec(
                "hopper_cpu",
                40_000,
                (10_000, 20_000, 40_000),
                500.0,
                ("sb3_td3", "sb3_sac"),
                "Hopper-v5",
                critics=("mlp", "simbav2_lora"),  # the preset's critic and the headline one
            ),
            TaskSpec(
                "g1_flat_cpu",
                256_000,  # ~120 env steps/s on an idle 2-core CPU: a 35-45 min run
                (64_000, 128_000, 256_000),
                G1_THRESHOLD,
                ("ppo",),
                critics=("simbav2_lora", "fastsac"),
                seeds=(1,),
            ),
        ),
        critics=CRITICS,
        seeds=(1, 2, 3),
        workers=2,
        note="LoRA vs dense at the same width (the presets fix every family's size)",
    ),
    # LoRA vs dense at a size closer to the paper's critic (width 512 x 2 blocks, rank 96) on the
    # halfcheetah_cpu preset's budget. One update costs ~0.55 s on one core (4x the cpu suite's
    # width): a run took 75-83 min, so one seed per family (2.6 h of process time, workers=2).
    "cpu_large": Suite(
        name="cpu_large",
        tasks=(
            TaskSpec(
                "halfcheetah_cpu",
                *HALFCHEETAH_CPU_BUDGET,
                overrides=(
                    "critic.width=512",
                    "critic.num_blocks=2",
                    "critic.rank=96",
                    "critic.alpha=96",
                ),
                name="halfcheetah_cpu_512x2",
            ),
        ),
        critics=("simbav2_lora", "simbav2"),
        seeds=(1,),
        workers=2,
        note="LoRA vs dense SimbaV2 critics at width 512 x 2 blocks, rank 96 (one seed each)",
    ),
    # A new user's runs. Only the backend, task, env count, budget and seed are set (no preset, no
    # tuned key); every run gets WALL_S seconds on its own core. 22 runs per seed, ~2 h per seed
    # with workers=2; run it in pieces (`only=`, `seeds=`): finished runs are skipped.
    "untuned": Suite(
        name="untuned",
        tasks=(
            *(
                TaskSpec(
                    "",
                    UNTUNED_STEP_CAP,
                    UNTUNED_CHECKPOINTS,
                    threshold,
                    peers,
                    gym_id,
                    overrides=("env.backend=gymnasium", f"env.task={gym_id}", "env.num_envs=16"),
                    name=gym_id,
                    wall_s=UNTUNED_WALL_S,
                    wall_marks=UNTUNED_WALL_MARKS,
                )
                for gym_id, threshold, peers in (
                    ("Hopper-v5", 1000.0, ("sb3_td3",)),
                    ("HalfCheetah-v5", 1500.0, ("sb3_td3", "sb3_sac")),
                    ("Ant-v5", 1000.0, ("sb3_td3",)),
                    ("Humanoid-v5", 1000.0, ("sb3_td3", "sb3_sac")),
                )
            ),
            TaskSpec(
                "",
                UNTUNED_STEP_CAP,
                UNTUNED_CHECKPOINTS,
                25.0,  # ~3x a random policy's 8.7 (tests/test_e2e_cartpole.py)
                ("ppo",),
                overrides=("env.task=Mjlab-Cartpole-Swingup", "env.num_envs=256"),
                name="Mjlab-Cartpole-Swingup",
                wall_s=UNTUNED_WALL_S,
                wall_marks=UNTUNED_WALL_MARKS,
            ),
        ),
        critics=("default", "simbav2_lora", "fastsac"),
        seeds=(1, 2, 3),
        workers=2,
        note="a new user's runs: no preset, no tuned key, equal wall-clock per run on one core",
    ),
}
