"""Slurm scripts and Docker files: syntax, the CLI lines they run parse with the real CLI
(`dry_run=true`), every copied path exists, and the requeue wrapper forwards the preemption signal
and requeues so that the next run resumes."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from fast_lora_td3.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "scripts" / "slurm"
SBATCH = sorted(SLURM.glob("*.sbatch"))
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.isaaclab"]
DUMMY = ["env.backend=dummy", "env.task=PointMassAsym-v0", "env.num_envs=4", "device=cpu"]

SHIMS = {
    # Records its arguments; `show hostnames` answers like a one-node allocation.
    "scontrol": 'echo "scontrol $*" >> "$SHIM_LOG"\n[ "$1" = show ] && echo localhost\nexit 0\n',
    # Runs the command after srun's own options (one task, as on one node).
    "srun": 'echo "srun $*" >> "$SHIM_LOG"\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n',
    # `apptainer exec [opts] IMAGE CMD...`: checks the form, then runs CMD on the host.
    "apptainer": 'echo "apptainer $*" >> "$SHIM_LOG"\n[ "$1" = exec ] || exit 64\nshift\n'
    'while [ "${1#-}" != "$1" ]; do case "$1" in --bind|-B|--pwd) shift;; esac; shift; done\n'
    'case "$1" in *.sif) shift;; *) exit 65;; esac\nexec "$@"\n',
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A submit directory (scripts/ linked in, logs/ written here) and PATH with Slurm shims."""
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in SHIMS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SHIM_LOG=str(tmp_path / "shim.log"),
        SLURM_SUBMIT_DIR=str(tmp_path),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="test",
        SLURM_JOB_NODELIST="localhost",
        SLURM_NNODES="1",
        SLURM_GPUS_ON_NODE="2",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
    )
    for key in ("WORLD_SIZE", "RANK", "SLURM_STEP_NUM_TASKS", "SLURM_ARRAY_TASK_ID"):
        env.pop(key, None)
    return tmp_path, env


def test_every_script_parses_with_bash_n() -> None:
    scripts = [*SBATCH, *SLURM.glob("*.sh")]
    assert {p.name for p in scripts} >= {
        "train.sbatch",
        "sweep.sbatch",
        "multinode.sbatch",
        "train_apptainer.sbatch",
        "requeue.sh",
    }
    for script in scripts:
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, f"{script.name}: {res.stderr}"


@pytest.mark.parametrize("script", SBATCH, ids=lambda p: p.name)
def test_sbatch_headers_request_signal_requeue_and_per_job_logs(script: Path) -> None:
    header = [ln for ln in script.read_text().splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --signal=B:USR1@120" in header
    assert "#SBATCH --requeue" in header
    (output,) = [ln for ln in header if ln.startswith("#SBATCH --output=")]
    assert "%j" in output or "%A_%a" in output
    assert "exec bash scripts/slurm/requeue.sh" in script.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "extra_env", "runs"),
    [
        ("train.sbatch", {}, 1),
        ("train_apptainer.sbatch", {"SIF": "image.sif"}, 1),
        ("sweep.sbatch", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "77"}, 1),
        ("sweep.sbatch", {"SLURM_ARRAY_TASK_ID": "11", "SLURM_ARRAY_JOB_ID": "77"}, 1),
        ("multinode.sbatch", {}, 2),
    ],
)
def test_sbatch_cli_lines_parse_with_the_real_cli(
    sandbox: tuple[Path, dict[str, str]], script: str, extra_env: dict[str, str], runs: int
) -> None:
    """Run the script itself (Slurm commands shimmed) with `dry_run=true` appended."""
    cwd, env = sandbox
    res = subprocess.run(
        ["bash", str(SLURM / script), *DUMMY, "dry_run=true"],
        cwd=cwd,
        env={**env, **extra_env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("dry run: config valid")]
    assert len(lines) == runs, res.stdout
    log = (cwd / "shim.log").read_text() if (cwd / "shim.log").exists() else ""
    assert "requeue" not in log  # a clean exit is not requeued
    if script == "sweep.sbatch":
        task = int(extra_env["SLURM_ARRAY_TASK_ID"])
        seed, rank = [(s, r) for s in (1, 2, 3) for r in (16, 32, 64, 96)][task]
        assert f"run_dir=logs/fast_lora_td3/sweep/77/seed{seed}_rank{rank}" in lines[0]
    elif script == "multinode.sbatch":
        assert all("world_size=2" in ln for ln in lines) and "srun --kill-on-bad-exit=1" in log
    else:
        assert "run_dir=logs/fast_lora_td3/slurm/test-4242" in lines[0]
    if script == "train_apptainer.sbatch":
        assert "apptainer exec --nv" in log and "image.sif fast-lora-td3 train" in log


def test_bad_overrides_and_array_ids_fail(sandbox: tuple[Path, dict[str, str]]) -> None:
    cwd, env = sandbox
    bad = subprocess.run(
        ["bash", str(SLURM / "train.sbatch"), *DUMMY, "critic=simbav2_lora", "critic.rank=0"],
        cwd=cwd, env={**env, "RUN_DIR": str(cwd / "r")}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "critic.rank" in bad.stderr
    out_of_range = subprocess.run(
        ["bash", str(SLURM / "sweep.sbatch"), "dry_run=true"],
        cwd=cwd, env={**env, "SLURM_ARRAY_TASK_ID": "12"}, capture_output=True, text=True,
    )  # fmt: skip
    assert out_of_range.returncode == 2 and "out of range" in out_of_range.stderr


@pytest.mark.slow
def test_usr1_checkpoints_requeues_and_the_rerun_resumes(
    sandbox: tuple[Path, dict[str, str]],
) -> None:
    """train.sbatch end to end: USR1 to the batch shell → trainer checkpoints, exits 75 →
    `scontrol requeue <job>`; the requeued job (same id) resumes from the checkpoint."""
    cwd, env = sandbox
    args = [*DUMMY, "algo.batch_size=32", "algo.buffer_size=32", "algo.learning_starts=2",
            "critic.hidden_dims=[16,16]", "actor.hidden_dims=[16,16]", "algo.num_atoms=11",
            "total_steps=400000", "log_interval=5", "checkpoint_interval=1000000",
            "export_at_end=false", "eval.max_steps=5"]  # fmt: skip
    proc = subprocess.Popen(
        ["bash", str(SLURM / "train.sbatch"), *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run = cwd / "logs" / "fast_lora_td3" / "slurm" / "test-4242"
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert "scontrol requeue 4242" in (cwd / "shim.log").read_text()
    assert "received SIGUSR1" in err and "preempted" in err
    assert list((run / "checkpoints").glob("ckpt_*.pt"))
    rerun = subprocess.run(
        ["bash", str(SLURM / "train.sbatch"), *args, "total_steps=400"],
        cwd=cwd, env={**env, "SHIM_LOG": str(cwd / "shim2.log")},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # A shorter total_steps (a resumable setting) lets the resumed run finish at once.
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed {Path('logs/fast_lora_td3/slurm/test-4242')}" in rerun.stdout


def _cli_lines_from_dockerfile(path: Path) -> list[list[str]]:
    """argv (after the program) of each CLI call in RUN lines, and ENTRYPOINT + CMD."""
    text = path.read_text().replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        if not line.startswith("RUN "):
            continue
        for part in line[4:].split("&&"):
            words = shlex.split(part)
            for i, w in enumerate(words):
                if w == "fast-lora-td3" or w == "fast_lora_td3.cli":
                    calls.append(words[i + 1 :])
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))
    calls.append(cmd)
    return calls


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_paths_exist_and_cli_lines_parse(
    dockerfile: Path, capsys: pytest.CaptureFixture
) -> None:
    text = dockerfile.read_text()
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()}
    copies = re.findall(r"^COPY (.+) (\S+)$", text, re.M)
    assert copies
    for sources, _dest in copies:
        for src in sources.split():
            assert (ROOT / src).exists(), f"{dockerfile.name}: COPY {src} does not exist"
            assert src not in ignored, f"{src} is excluded by .dockerignore"
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
    assert entry[-1] in ("fast-lora-td3", "fast_lora_td3.cli")
    if dockerfile.name == "Dockerfile.isaaclab":
        assert re.search(r"^FROM nvcr\.io/nvidia/isaac-lab:2\.3\.2$", text, re.M)
        assert "/isaac-sim/python.sh -m pip install" in text and "OMNI_KIT_ACCEPT_EULA=YES" in text
        assert entry[0] == "/isaac-sim/python.sh"
    else:
        assert re.search(r"^FROM pytorch/pytorch:\S+cuda", text, re.M)
    for argv in _cli_lines_from_dockerfile(dockerfile):
        if "--help" in argv:  # the image's default command lists the train keys
            assert cli_main(argv) == 0, argv
            assert "total_steps=" in capsys.readouterr().out
        else:
            assert "dry_run=true" in argv
            assert cli_main(argv) == 0, argv
            assert "dry run: config valid" in capsys.readouterr().out


def test_compose_reserves_a_gpu_mounts_logs_and_runs_valid_commands(
    capsys: pytest.CaptureFixture,
) -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert compose["services"]
    for name, service in compose["services"].items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        assert any(v.endswith(":/workspace/logs") for v in service["volumes"]), name
        assert (
            ROOT / "docker" / service["build"]["context"] / service["build"]["dockerfile"]
        ).is_file()
        assert cli_main([*service["command"], "dry_run=true"]) == 0, name
    assert capsys.readouterr().out.count("dry run: config valid") == len(compose["services"])


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed")
def test_hadolint_is_clean() -> None:
    res = subprocess.run(["hadolint", *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
