"""`fast-lora-td3 bench learn`: the smoke suite end to end (CI runs it) and the cpu suite's plan.

The smoke suite runs 6 short processes (2 at a time): our FastTD3 with the mlp and mlp_lora critics
and the Stable-Baselines3 TD3 peer on Pendulum-v1, 2 seeds each; about 1–3 minutes on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fast_lora_td3.bench.learn import plan_runs, run_bench_learn
from fast_lora_td3.bench.plots import CURVE_POINTS, PLOTS
from fast_lora_td3.bench.suites import SUITES
from fast_lora_td3.cli import main
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.config.validate import validate


def test_smoke_suite_runs_peers_and_writes_results_table_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    assert run_bench_learn(["smoke", f"out={out}"]) == 0
    results = json.loads((out / "results.json").read_text())
    methods = results["tasks"]["pendulum_cpu"]["methods"]
    assert set(methods) == {"mlp", "mlp_lora", "sb3_td3"}
    for name, data in methods.items():
        runs = data["runs"]
        assert [r["seed"] for r in runs] == [1, 2] and all(r["rc"] == 0 for r in runs), name
        finals = [r["final_eval_return"] for r in runs]
        assert all(f is not None and np.isfinite(f) for f in finals), name
        assert data["summary"]["final_eval_return"]["mean"] == pytest.approx(np.mean(finals))
        assert all(r["checkpoint_returns"]["4800"] is not None for r in runs), name
        for r in runs:  # the plots' curves travel in results.json, shrunk
            assert r["curves"]["episode_return"] and r["curves"]["episode_length"], name
            assert all(0 < len(c) <= CURVE_POINTS for c in r["curves"].values()), name
    assert results["command"] == f"fast-lora-td3 bench learn smoke out={out}"
    assert "commit" in results
    lora, dense = methods["mlp_lora"]["runs"], methods["mlp"]["runs"]
    assert all("critic/weight_change_rel" in r["curves"] for r in lora + dense)
    assert all(r["adapter_delta_norm"] > 0 and r["weight_change_norm"] > 0 for r in lora)
    assert all(r["adapter_delta_norm"] is None and r["weight_change_norm"] > 0 for r in dense)
    assert all(r["final_critic_loss"] is not None for r in lora + dense)
    assert "mlp_lora-mlp" in results["tasks"]["pendulum_cpu"]["lora_vs_dense"]
    table = (out / "results.md").read_text()
    assert "| sb3_td3 | 2 |" in table and "| mlp_lora | 2 |" in table
    for png in PLOTS:  # smoke has two critic families: the critic-only figures are drawn too
        assert (out / png).stat().st_size > 1000, png
    comparison = results["tasks"]["pendulum_cpu"]["lora_vs_dense"]["mlp_lora-mlp"]
    assert {"final_eval_return_diff_ci95", "auc_return_diff_ci95"} <= set(comparison)
    assert "mlp_lora-mlp: AUC difference 95 % CI" in table
    # A second invocation finds every run done and only re-aggregates.
    stamps = {p: p.stat().st_mtime for p in out.glob("runs/*/*/*/metrics.jsonl")}
    assert len(stamps) == 6
    assert run_bench_learn(["smoke", f"out={out}"]) == 0
    assert stamps == {p: p.stat().st_mtime for p in stamps}
    # Each run records the commit that executed it; ours carry the health numbers, peers none.
    assert all("commit" in r for m in methods.values() for r in m["runs"])
    for r in lora + dense:
        assert 0 <= r["end_mass_max"] <= 1 and 0 <= r["saturated_rows"] <= 1
        assert 0 <= r["saturated_actions"] <= 1 and r["alpha"] is None
    assert all(r["end_mass_max"] is None for r in methods["sb3_td3"]["runs"])
    assert "## Health: saturation and entropy (`health`)" in table
    _merge_carries_earlier_runs_instead_of_rerunning(out, tmp_path)


def _merge_carries_earlier_runs_instead_of_rerunning(out: Path, tmp_path: Path) -> None:
    """merge=RESULTS_JSON: a later session's suite keeps an earlier session's runs (here seed 1
    only, from a file) and adds the runs it finds or makes itself (seed 2, already done in out)."""
    earlier = json.loads((out / "results.json").read_text())
    for method in earlier["tasks"]["pendulum_cpu"]["methods"].values():
        method["runs"] = [dict(r, run_dir="elsewhere") for r in method["runs"] if r["seed"] == 1]
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    stamps = {p: p.stat().st_mtime for p in out.glob("runs/*/*/*/metrics.jsonl")}
    assert run_bench_learn(["smoke", f"out={out}", f"merge={tmp_path / 'earlier.json'}"]) == 0
    assert stamps == {p: p.stat().st_mtime for p in stamps}  # nothing rerun
    merged = json.loads((out / "results.json").read_text())
    for name, method in merged["tasks"]["pendulum_cpu"]["methods"].items():
        assert [(r["seed"], r["run_dir"] == "elsewhere") for r in method["runs"]] == [
            (1, True),
            (2, False),
        ], name
        assert method["summary"]["seeds"] == 2
    assert merged["seeds"] == [1, 2]
    # methods=mlp: the mlp runs found in out replace the file's; the other methods keep the file's.
    merge = f"merge={tmp_path / 'earlier.json'}"
    assert run_bench_learn(["smoke", f"out={out}", merge, "methods=mlp"]) == 0
    assert stamps == {p: p.stat().st_mtime for p in stamps}
    methods = json.loads((out / "results.json").read_text())["tasks"]["pendulum_cpu"]["methods"]
    elsewhere = {
        m: [(r["seed"], r["run_dir"] == "elsewhere") for r in v["runs"]] for m, v in methods.items()
    }
    assert elsewhere == {
        "mlp": [(1, False), (2, False)],
        "mlp_lora": [(1, True)],
        "sb3_td3": [(1, True)],
    }
    # methods=mlp seeds=2: only mlp's seed 2 is this invocation's; its seed 1 stays the file's
    # (so does every task that only= leaves out).
    assert run_bench_learn(["smoke", f"out={out}", merge, "methods=mlp", "seeds=2"]) == 0
    methods = json.loads((out / "results.json").read_text())["tasks"]["pendulum_cpu"]["methods"]
    assert [(r["seed"], r["run_dir"] == "elsewhere") for r in methods["mlp"]["runs"]] == [
        (1, True),
        (2, False),
    ]
    wrong = dict(earlier, suite="cpu")
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    assert main(["bench", "learn", "smoke", f"out={out}", f"merge={tmp_path / 'wrong.json'}"]) == 2


def test_cpu_suite_plan_covers_lora_vs_dense_and_peers_and_configs_compose(tmp_path: Path) -> None:
    runs = plan_runs(SUITES["cpu"], tmp_path)
    seeds: dict[tuple[str, str], list[int]] = {}
    for r in runs:
        seeds.setdefault((r.task, r.method), []).append(r.seed)
    # The LoRA-vs-dense claim: every family, >= 3 seeds, on HalfCheetah and Go1.
    for task in ("halfcheetah_cpu", "go1_flat_cpu"):
        for critic in ("simbav2_lora", "simbav2", "mlp_lora", "mlp"):
            assert len(seeds[(task, critic)]) >= 3, (task, critic)
    for task, peer in [("halfcheetah_cpu", "sb3_td3"), ("hopper_cpu", "sb3_sac")]:
        assert len(seeds[(task, peer)]) >= 2 and (task, "simbav2_lora") in seeds
    assert {
        ("go1_flat_cpu", "ppo"),
        ("g1_flat_cpu", "ppo"),
        ("g1_flat_cpu", "simbav2_lora"),
        ("g1_flat_cpu", "fastsac"),
        ("halfcheetah_cpu", "fastsac"),
    } <= set(seeds)
    for r in runs:
        if r.method.startswith("sb3_"):
            continue
        overrides = r.command[r.command.index("train") + 1 :]
        cfg = compose_config(overrides)
        validate(cfg)
        assert cfg.total_steps == next(
            t.total_steps for t in SUITES["cpu"].tasks if t.preset == r.task
        )
        if r.method in ("simbav2_lora", "simbav2"):
            assert (cfg.critic.family, cfg.critic.width) == (r.method, 128)  # same width


def test_cpu_large_suite_compares_simbav2_lora_and_dense_at_the_paper_like_size(
    tmp_path: Path,
) -> None:
    runs = plan_runs(SUITES["cpu_large"], tmp_path)
    assert {r.method for r in runs} == {"simbav2_lora", "simbav2"}
    for r in runs:
        cfg = compose_config(r.command[r.command.index("train") + 1 :])
        validate(cfg)
        critic = cfg.critic
        assert (critic.family, critic.width, critic.num_blocks) == (r.method, 512, 2)
        assert (critic.rank, critic.alpha) == (96, 96)
        # Everything else is the halfcheetah_cpu preset's (the cpu suite's budget and recipe).
        assert (cfg.total_steps, cfg.algo.batch_size, cfg.env.num_envs) == (40_000, 256, 8)


def test_bad_suite_or_option_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "learn", "nosuch"]) == 2
    assert "unknown suite 'nosuch'" in capsys.readouterr().err
    assert main(["bench", "learn", "smoke", "workers=two"]) == 2
    assert main(["bench", "learn", "smoke", "only=atari"]) == 2
    assert main(["bench", "learn", "smoke", "methods=ppo"]) == 2
    assert "methods=ppo not in the smoke suite: use some of mlp,mlp_lora,sb3_td3" in (
        capsys.readouterr().err
    )


UNTUNED_KEYS = {"env.backend", "env.task", "env.num_envs", "total_steps", "seed", "critic"}
"""What a new user sets: the task and its size, the budget, a seed (and the critic, for the
headline critic's column). The rest of an untuned command only routes files and output."""
PLUMBING = {"device", "run_dir", "progress", "export_at_end", "max_wall_s", "algo"}


def test_untuned_suite_runs_ours_with_task_keys_only_and_gives_every_run_the_same_time() -> None:
    runs = plan_runs(SUITES["untuned"], Path("/tmp/untuned"))
    tasks = {r.task for r in runs}
    assert {
        "Hopper-v5",
        "HalfCheetah-v5",
        "Ant-v5",
        "Humanoid-v5",
        "Mjlab-Cartpole-Swingup",
    } <= tasks
    for run in runs:
        if run.method.startswith("sb3_"):
            assert "max_wall_s=600" in run.command, run.command
            continue
        keys = {w.partition("=")[0] for w in run.command[run.command.index("train") + 1 :]}
        assert not any(k.startswith("experiment") for k in keys), run.command
        assert keys <= UNTUNED_KEYS | PLUMBING, keys - UNTUNED_KEYS - PLUMBING
        assert "max_wall_s=600" in run.command
        cfg = compose_config(run.command[run.command.index("train") + 1 :])
        assert cfg.algo.auto_value_range, run.command  # no preset fixed the support
    peers = {(r.task, r.method) for r in runs if r.method.startswith("sb3_")}
    gym = {"Hopper-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"}
    assert {(t, "sb3_td3") for t in gym} <= peers
    assert {("HalfCheetah-v5", "sb3_sac"), ("Humanoid-v5", "sb3_sac")} <= peers
    # Both trainers on every task: FastSAC beside SB3 SAC and our FastTD3.
    ours = {(r.task, r.method) for r in runs}
    assert {(t, m) for t in tasks for m in ("default", "simbav2_lora", "fastsac")} <= ours
    fastsac = next(r for r in runs if r.method == "fastsac")
    assert compose_config(fastsac.command[fastsac.command.index("train") + 1 :]).algo.name == (
        "fastsac"
    )


def test_each_run_is_pinned_to_its_workers_core(tmp_path: Path) -> None:
    import sys

    from fast_lora_td3.bench.learn import RunSpec, execute

    cmd = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    core = sorted(__import__("os").sched_getaffinity(0))[-1]
    record = execute(RunSpec("t", "m", 1, tmp_path / "run", cmd), core=core)
    assert record["rc"] == 0 and record["core"] == core
    assert (tmp_path / "run" / "output.log").read_text().strip() == f"[{core}]"


def test_a_run_records_the_commit_it_started_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A commit made while a long run goes on must not be credited with that run: the run's
    # command moves the (fake) HEAD, and the record keeps the one it started from.
    import sys

    from fast_lora_td3.bench import learn

    head = tmp_path / "HEAD"
    head.write_text("started-at")
    monkeypatch.setattr(learn, "_commit", head.read_text)
    cmd = [sys.executable, "-c", f"open({str(head)!r}, 'w').write('ended-at')"]
    record = learn.execute(learn.RunSpec("t", "m", 1, tmp_path / "run", cmd))
    assert head.read_text() == "ended-at"
    assert record["rc"] == 0 and record["commit"] == "started-at"
    assert json.loads((tmp_path / "run" / learn.DONE_FILE).read_text())["commit"] == "started-at"


def test_timed_mjlab_tasks_warm_the_simulator_once_before_their_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warp compiles its kernels on a machine's first mjlab run (~40 s on a CPU): a short untimed
    run per mjlab task takes that cost before any timed run; gymnasium tasks and peers need none."""
    from fast_lora_td3.bench import learn

    calls: list[list[str]] = []
    monkeypatch.setattr(learn.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    suite = SUITES["untuned"]
    runs = plan_runs(suite, tmp_path)
    learn.warm_simulators(suite, runs, tmp_path)
    assert len(calls) == 1  # the cartpole, once for all its methods and seeds
    (cmd,) = calls
    train = next(r for r in runs if r.task == "Mjlab-Cartpole-Swingup")
    assert cmd[: cmd.index("train") + 1] == train.command[: train.command.index("train") + 1]
    assert "env.task=Mjlab-Cartpole-Swingup" in cmd and "max_wall_s=600" not in cmd
    assert {*learn.WARMUP_OVERRIDES, f"run_dir={tmp_path / 'warmup' / train.task}"} <= set(cmd)
    assert (tmp_path / "warmup" / f"{train.task}.log").exists()
    calls.clear()  # tasks whose runs are all done (or gymnasium only) warm nothing
    learn.warm_simulators(suite, [r for r in runs if r.task == "Hopper-v5"], tmp_path)
    assert calls == []
    learn.warm_simulators(SUITES["cpu"], plan_runs(SUITES["cpu"], tmp_path), tmp_path)
    assert calls == []  # env-step budgets (no wall clock) are not timed
