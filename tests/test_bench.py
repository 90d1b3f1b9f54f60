"""`fast-lora-td3 bench` (stable JSON keys) and scripts/device_check.py on CPU at tiny sizes."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from learner_helpers import ACT, OBS, bandit_batch, make

from fast_lora_td3.bench import count_update_flops, run_bench
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.replay.buffer import ReplayBuffer

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "obs_dim=6",
    "action_dim=2",
    "num_atoms=11",
    "num_envs=4",
    "batch_size=16",
    "critic.hidden_dims=16,16",
    "actor.hidden_dims=8",
    "critic.width=8",
    "critic.num_blocks=1",
    "critic.rank=2",
    "buffer_size=12",
    "iters=2",
    "warmup=1",
]
REQUIRED = {"name", "device", "critic", "batch_size", "updates_per_s", "samples_per_s"}


def _lines(capsys: pytest.CaptureFixture) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]


@pytest.mark.parametrize("algo", ["fasttd3", "fastsac"])
def test_bench_update_prints_json_lines_with_required_keys(algo, capsys) -> None:
    assert run_bench(["update", f"algo={algo}", "critic=simbav2_lora", *TINY]) == 0
    lines = _lines(capsys)
    assert [r["critic"] for r in lines] == ["simbav2", "simbav2_lora"]  # dense twin first
    for rec in lines:
        assert rec.keys() >= REQUIRED and rec["name"] == "update" and rec["mode"] == "eager"
        assert rec["algo"] == algo and rec["batch_size"] == 16
        assert rec["updates_per_s"] > 0
        assert rec["samples_per_s"] == pytest.approx(16 * rec["updates_per_s"])
        assert rec["achieved_gflops"] == pytest.approx(
            rec["gflop_per_update"] * rec["updates_per_s"]
        )
    lora = lines[1]
    assert lora["widths"] == {"width": 8, "num_blocks": 1, "rank": 2}
    ratio = lora["ms_per_update"] / lines[0]["ms_per_update"]
    assert lora["lora_overhead"] == pytest.approx(ratio)


def test_bench_update_rounds_alternate_and_report_medians(capsys) -> None:
    run_bench(["update", "critic=simbav2_lora", "rounds=3", *TINY])
    dense, lora = _lines(capsys)
    for rec in (dense, lora):
        assert rec["rounds"] == 3 and len(rec["round_ms"]) == 3
        assert rec["ms_per_update"] == pytest.approx(sorted(rec["round_ms"])[1])
        assert rec["gemm_fraction_shape"] == pytest.approx(
            rec["achieved_gflops"] / rec["shape_gemm_gflops"]
        )
    assert rec["meter_shapes"]["update"] == [2, 16, 8, 32]  # members, batch, width, 4·width
    per_round = [a / b for a, b in zip(lora["round_ms"], dense["round_ms"], strict=True)]
    assert lora["lora_overhead_rounds"] == pytest.approx(per_round)
    assert lora["lora_overhead"] == pytest.approx(sorted(per_round)[1])


def test_bench_update_impls_alternate_fast_and_reference_in_one_process(capsys) -> None:
    run_bench(["update", "critic=simbav2_lora", "impls=fast,reference", "rounds=2", *TINY])
    lines = _lines(capsys)
    assert [(r["critic"], r["impl"]) for r in lines] == [
        ("simbav2", "fast"),
        ("simbav2", "reference"),
        ("simbav2_lora", "fast"),
        ("simbav2_lora", "reference"),
    ]
    fast, ref = lines[2], lines[3]
    per_round = [b / a for a, b in zip(fast["round_ms"], ref["round_ms"], strict=True)]
    assert fast["speedup_vs_reference_rounds"] == pytest.approx(per_round)
    assert "speedup_vs_reference" not in ref
    dense_ref = lines[1]  # LoRA overhead within the same implementation
    ratios = [a / b for a, b in zip(ref["round_ms"], dense_ref["round_ms"], strict=True)]
    assert ref["lora_overhead"] == pytest.approx(sum(ratios) / 2)  # the median of two rounds


def test_bench_update_graph_modes_are_skipped_on_cpu(capsys) -> None:
    run_bench(["update", "critic=mlp", "modes=eager,graphed", "compare_dense=false", *TINY])
    lines = _lines(capsys)
    assert lines[0]["mode"] == "eager" and lines[1] == {
        "name": "update",
        "critic": "mlp",
        "mode": "graphed",
        "skipped": "needs CUDA",
    }


def test_bench_replay_reports_bytes_against_reference(capsys) -> None:
    args = ["obs_dim=10", "critic_obs_dim=4", "action_dim=3", "num_envs=4", "buffer_size=64"]
    assert run_bench(["replay", *args, "batch_size=8", "iters=2", "n_step=3"]) == 0
    (rec,) = _lines(capsys)
    rb = ReplayBuffer(4, 64, 10, 3, critic_obs_dim=4, n_step=3, max_episode_length=1000)
    assert rec["bytes_per_transition"] == rb.bytes_per_transition
    # Reference: explicit fp32 obs + next_obs (actor and critic), fp32 action and reward, 2 int64.
    assert rec["reference_bytes_per_transition"] == 2 * (10 + 4) * 4 + 3 * 4 + 4 + 8 + 8
    assert rec["samples_per_s"] > 0 and rec["ratio_to_reference"] < 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["update", "bogus=1"], "bad argument 'bogus=1'"),
        (["update", "critic"], "bad argument 'critic'"),
        (["update", "batch_size=10", "num_envs=4"], r"batch_size=10 .*multiple of env\.num_envs=4"),
        (["update", "modes=eager,warp"], "modes="),
        (["update", "critic.hidden_dims=a,b"], r"critic\.hidden_dims.*'a'"),
        (["update", "critic=simbav2_lora", "critic.width=8"], r"critic\.rank=96"),
        (["update", "amp=fp16"], "amp='fp16'"),
        (["update", "algo=ppo"], "algo='ppo'"),
        (["update", "compare_dense=maybe"], "compare_dense"),
        (["replay", "obs_dtype=int8"], "obs_dtype"),
        (["fly"], "unknown benchmark"),
    ],
)
def test_bench_bad_input_is_one_line_config_error(args, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        run_bench(args)
    assert "\n" not in str(info.value)


def _gemm(batch: int, dims: list[int]) -> int:
    return sum(2 * batch * i * o for i, o in itertools.pairwise(dims))


def test_flop_count_matches_closed_form_and_skips_critic_weight_grads() -> None:
    """Critic update: actor fwd + E·(target fwd + online fwd + online bwd without the input grad of
    the first layer). Actor update: actor fwd/bwd (no input grad at layer 1) + E·critic fwd + E·
    input-grad-only critic bwd: no critic weight gradients (the actor step needs none)."""
    learner = make("fasttd3", "mlp")
    b, e = 64, 2
    critic = [OBS + ACT, 64, 64, 51]  # test_algos.small_critic / 51 atoms
    actor = [OBS, 32, 32, ACT]
    c_fwd, a_fwd = _gemm(b, critic), _gemm(b, actor)
    c_first, a_first = _gemm(b, critic[:2]), _gemm(b, actor[:2])
    before = {k: v.clone() for k, v in learner.critic.state_dict().items()}
    critic_flops, actor_flops = count_update_flops(learner, bandit_batch(b, 1.0), 2)
    assert critic_flops == a_fwd + e * (c_fwd + c_fwd + 2 * c_fwd - c_first)
    assert actor_flops == a_fwd + (2 * a_fwd - a_first) + e * (c_fwd + c_fwd)
    after = learner.critic.state_dict()  # counted on a copy: the learner did not step
    assert all(before[k].equal(after[k]) for k in before)


def _tail(proc: subprocess.CompletedProcess | subprocess.TimeoutExpired) -> str:
    """The last lines of a child's stdout and stderr (bytes or text), for a failure message."""
    text = [o.decode() if isinstance(o, bytes) else (o or "") for o in (proc.stdout, proc.stderr)]
    return "\n".join(line for t in text for line in t.strip().splitlines()[-8:])


def test_device_check_cpu_smoke_exercises_every_part() -> None:
    cmd = [sys.executable, str(ROOT / "scripts/device_check.py"), "--cpu-smoke"]
    cmd += ["--only", "auto_select,reward_scale_live,verify_spread,auto_fp32,td3_simbav2_lora"]
    cmd[-1] += ",td3_simbav2_dense"
    cmd += ["--budget-s", "3600"]  # every part runs, however slow the machine: the test is on paths
    try:  # a hang guard, not a timing (about 70 s on the 2-core machine alone)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"device_check --cpu-smoke ran over 1200 s; its last lines:\n{_tail(exc)}")
    assert done.returncode == 0, _tail(done)
    out = done.stdout
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert not [r for r in lines if "error" in r], lines
    parts = {(r["part"], r.get("mode")) for r in lines}
    assert ("env", None) in parts and ("done", None) in parts
    assert {("update", "eager"), ("update", "compiled"), ("parity", "compiled")} <= parts
    assert ("lora_ratio", "eager") in parts
    auto = next(r for r in lines if r["part"] == "auto_select")  # the default mode choice
    assert auto["mode"] == "compiled" and auto["verified"] and auto["updates_per_s"] > 0
    assert auto["line"].startswith("update step: compiled (") and "parity check" in auto["line"]
    parity = next(r for r in lines if r["part"] == "parity")
    assert parity["max_metric_rel_diff"] < 1e-3 and parity["max_update_rel_err"] < 1e-2
    live = [r for r in lines if r["part"] == "reward_scale_live"]  # the scale moves between steps
    assert [r["mode"] for r in live] == ["eager", "compiled"] and len(set(live[0]["scales"])) == 4
    assert live[1]["max_metric_rel_diff"] < 1e-3 and live[1]["max_update_rel_err"] < 1e-2
    spread = [r for r in lines if r["part"] == "verify_spread"]  # one row per fp32 config
    assert [r["config"] for r in spread] == ["sac_mlp", "td3_mlp", "td3_simbav2_lora"]
    assert all(len(r["update_rel_err"]) == 3 and max(r["update_rel_err"]) < 1e-2 for r in spread)
    chosen = {r["config"]: r for r in lines if r["part"] == "auto_fp32"}  # the smoke's chain
    assert set(chosen) == {"sac_mlp", "td3_mlp"}, chosen
    assert all(r["mode"] == "compiled" and "parity check" in r["line"] for r in chosen.values())
