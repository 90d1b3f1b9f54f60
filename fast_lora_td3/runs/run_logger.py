"""Run directories, metrics.jsonl, TensorBoard / W&B mirroring and the console progress line.

Console: on a terminal a rich live bar shows progress, env-steps/s, updates/s, return, critic loss
and ETA, refreshed by `update_progress`. When stdout is not a TTY (CI, Slurm, `| tee`), a live bar
would print escape codes or nothing useful, so each `log()` call prints the same fields as one plain
line instead.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.runs.atomic_io import atomic_write_bytes

LOGGERS = ("tensorboard", "wandb", "none")
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
RUN_SUBDIRS = ("checkpoints", "exported", "videos")
_RATE_WINDOW_S = 30.0  # rates are averaged over this much recent wall time
_RATE_MIN_SPAN_S = 0.5  # shorter spans give wild rates (two calls microseconds apart)
_SAMPLE_EVERY_S = 0.25  # update_progress may run every iteration: sample and redraw at most 4/s
_now = time.monotonic  # one indirection so tests can drive the clock


def _timestamp() -> str:
    return _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def ensure_dir(key: str, path: str | os.PathLike[str], value: object = None) -> Path:
    """Create directory `path` (and its parents) or raise one ConfigError line naming the setting
    `key` (its value `value`, default `path`): a regular file in the way, no permission, a
    read-only or virtual file system."""
    path = Path(path)
    shown = path if value is None else value
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except FileExistsError:
        raise ConfigError(
            f"{key}={str(shown)!r} cannot be used: {path} is a file, not a directory"
        ) from None
    except NotADirectoryError:
        raise ConfigError(
            f"{key}={str(shown)!r} cannot be used: a parent of {path} is a regular file"
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"{key}={str(shown)!r} cannot be used: {path} cannot be created or written ({reason})"
        ) from None
    return path


def remove_failed_run_dir(run_dir: Path, log_root: str | os.PathLike[str]) -> None:
    """Remove a run directory this start made (a failed start leaves none behind), then each
    parent up to and including `log_root` that is left empty."""
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    root = Path(log_root).resolve()
    parent = run_dir.resolve().parent
    while parent == root or root in parent.parents:
        try:
            parent.rmdir()  # only empty directories: anything else stays
        except OSError:
            return
        parent = parent.parent


def make_run_dir(log_root: str | os.PathLike[str], task: str, run_name: str = "") -> Path:
    """Create `<log_root>/<task>/<YYYY-MM-DD_HH-MM-SS>[_<run_name>]/` with checkpoints/, exported/,
    videos/; a `_1`, `_2`, … suffix avoids collisions with an existing directory."""
    if not task:
        raise ConfigError("task must be a non-empty task id to name the run directory")
    if (run_name and any(c in run_name for c in "/\\")) or run_name in (".", ".."):
        raise ConfigError(f"run_name must not contain path separators, got {run_name!r}")
    stamp = _timestamp()
    base = f"{stamp}_{run_name}" if run_name else stamp
    # e.g. gym ids "ALE/Pong-v5"
    parent = Path(log_root) / task.replace("/", "_").replace("\\", "_")
    ensure_dir("log_dir", parent, log_root)
    for i in range(10_000):
        run_dir = parent / (base if i == 0 else f"{base}_{i}")
        try:
            run_dir.mkdir()  # atomic: two processes cannot both create the same directory
        except FileExistsError:
            continue
        for sub in RUN_SUBDIRS:
            (run_dir / sub).mkdir()
        return run_dir
    raise ConfigError(f"could not create a unique run directory under {parent}")


def _plain(obj: Any) -> Any:
    """Config → YAML-safe plain containers (OmegaConf, dataclasses, Paths, tuples)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, DictConfig | ListConfig):
            obj = OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with hydra
        pass
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)


def _to_float(key: str, value: Any) -> float | None:
    """A metric as float; NaN/Inf become None (JSON null) so metrics.jsonl stays strict JSON."""
    try:
        x = float(value)  # 1-element tensors and numpy scalars convert; anything else is a bug
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"metric {key!r} is not a scalar: {type(value).__name__}") from exc
    return x if math.isfinite(x) else None


def _stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def _fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}"


def _repair_metrics(path: Path, resume_step: int | None) -> float:
    """Drop a partial last line (killed mid-write) and, on resume, rows past the checkpoint step.

    Returns the last kept row's wall_time_s so a resumed run's wall clock continues from there.
    """
    if not path.exists():
        return 0.0
    lines = path.read_bytes().split(b"\n")
    complete, partial = lines[:-1], lines[-1]  # the last element is b"" when the file ends in \n
    kept, last_wall = [], 0.0
    for line in complete:
        try:
            row = json.loads(line)
        except ValueError:
            kept.append(line)  # keep what we cannot read rather than silently destroy it
            continue
        if resume_step is not None and row.get("env_steps", 0) > resume_step:
            continue
        kept.append(line)
        last_wall = float(row.get("wall_time_s") or last_wall)
    if partial or len(kept) != len(complete):
        atomic_write_bytes(path, b"".join(line + b"\n" for line in kept))
    return last_wall


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ConfigError(
            "logger=wandb needs the wandb package: pip install wandb (or pip install "
            "'fast_lora_td3[wandb]'), or use logger=tensorboard"
        ) from exc
    return wandb


class RunLogger:
    """Writes metrics.jsonl, config.yaml, TensorBoard events (and W&B) for one run; rank 0 only.

    `logger`: `tensorboard` (events in the run dir), `wandb` (TensorBoard plus W&B; set
    WANDB_MODE=offline to run without network) or `none` (metrics.jsonl and console only). On ranks
    other than 0 every method is a no-op and nothing is created. `resume_step`: the env step of the
    checkpoint a resumed run restarts from; rows and TensorBoard events logged after it (by the
    interrupted run) are dropped so curves do not double back.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        logger: str = "tensorboard",
        config: Any,
        rank: int = 0,
        total_steps: int,
        progress: bool = True,
        wandb_project: str = "fast_lora_td3",
        resume_step: int | None = None,
    ) -> None:
        if logger not in LOGGERS:
            raise ConfigError(f"logger must be one of {', '.join(LOGGERS)}, got {logger!r}")
        self.enabled = rank == 0
        self.run_dir = Path(run_dir)
        self.total_steps = int(total_steps)
        self.progress = bool(progress)
        self._closed = False
        if not self.enabled:
            return
        wandb = _import_wandb() if logger == "wandb" else None  # fail before writing anything
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._config = _plain(config)
        self._write_config()
        self._t0 = _now()
        self._wall_offset = _repair_metrics(self.run_dir / METRICS_FILE, resume_step)
        self._metrics = (self.run_dir / METRICS_FILE).open("a", encoding="utf-8")
        self._tb: Any = None
        self._wandb: Any = None
        self._live: Any = None
        self._last_steps = 0
        self._shown: dict[str, float | None] = {}
        self._samples: collections.deque[tuple[float, int, float | None]] = collections.deque()
        try:
            if logger in ("tensorboard", "wandb"):
                from torch.utils.tensorboard import SummaryWriter  # slow import: only when used

                purge = None if resume_step is None else int(resume_step) + 1
                self._tb = SummaryWriter(log_dir=str(self.run_dir), purge_step=purge, flush_secs=30)
            if wandb is not None:
                self._wandb = self._start_wandb(wandb, wandb_project)
            if self.progress and _stdout_is_tty():
                self._live = self._start_live()
        except BaseException:
            self.close()  # do not leak open files or writer threads when W&B fails to start
            raise

    # -- set-up ------------------------------------------------------------------------------
    def _write_config(self) -> None:
        text = yaml.safe_dump(self._config, sort_keys=False)
        path = self.run_dir / CONFIG_FILE
        if path.exists():
            if path.read_text() == text:
                return
            # A resume with changed settings keeps the original and records the new one beside it.
            k = 1
            while (self.run_dir / f"config_resume_{k}.yaml").exists():
                k += 1
            path = self.run_dir / f"config_resume_{k}.yaml"
        path.write_text(text)

    def _start_wandb(self, wandb: Any, project: str) -> Any:
        id_file = self.run_dir / "wandb_run_id"  # a resumed run continues the same W&B run
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        try:
            run = wandb.init(
                project=project,
                name=self.run_dir.name,
                id=run_id,
                resume="allow",
                dir=os.environ.get("WANDB_DIR") or str(self.run_dir),
                config=self._config,
            )
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"logger=wandb could not start W&B ({msg}): run `wandb login`, set "
                "WANDB_MODE=offline, or use logger=tensorboard"
            ) from exc
        # x axis = env steps even across resumes (W&B's own step must increase monotonically).
        run.define_metric("env_steps")
        run.define_metric("*", step_metric="env_steps")
        return run

    def _start_live(self) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn
        from rich.table import Column

        live = Progress(
            BarColumn(bar_width=20),
            # Wrap rather than cut the fields on a narrow terminal.
            TextColumn("{task.fields[stats]}", table_column=Column(no_wrap=False, overflow="fold")),
            console=Console(),  # a fresh console: picks up the current stdout and width
            refresh_per_second=2,
        )
        live.start()
        self._task = live.add_task("train", total=max(self.total_steps, 1), stats="")
        return live

    # -- logging ------------------------------------------------------------------------------
    def log(self, metrics: Mapping[str, Any], env_steps: int) -> None:
        """Append one row to metrics.jsonl (flushed) and mirror the scalars to TensorBoard / W&B.

        The row holds `env_steps`, `wall_time_s` (cumulative over resumes) and every metric as a
        float (None for NaN/Inf). A metric named `wall_time_s` overrides the logger's own clock.
        """
        if not self.enabled or self._closed:
            return
        env_steps = int(env_steps)
        row: dict[str, Any] = {
            "env_steps": env_steps,
            "wall_time_s": self._wall_offset + _now() - self._t0,
        }
        for key, value in metrics.items():
            if key != "env_steps":
                row[key] = _to_float(key, value)
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()  # a crash loses at most the line being written
        scalars = {k: v for k, v in row.items() if k != "env_steps" and v is not None}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, global_step=env_steps)
        if self._wandb is not None:
            self._wandb.log({**scalars, "env_steps": env_steps})
        self._shown.update(row)
        self._sample(env_steps, None, force=True)
        self._last_steps = env_steps
        if self._live is not None:
            self._live.update(self._task, completed=env_steps, stats=self.status_line(env_steps))
        elif self.progress:
            print(self.status_line(env_steps), flush=True)

    def _sample(self, env_steps: int, updates: float | None, force: bool = False) -> bool:
        """Record a rate sample unless the last one is too recent; True if recorded."""
        now = _now()
        if not force and self._samples and now - self._samples[-1][0] < _SAMPLE_EVERY_S:
            return False
        self._samples.append((now, env_steps, updates))
        while len(self._samples) > 2 and now - self._samples[0][0] > _RATE_WINDOW_S:
            self._samples.popleft()
        return True

    def _rates(self) -> tuple[float | None, float | None]:
        """(env-steps/s, updates/s) over the recent window; updates/s from logged values if absent."""
        pts = list(self._samples)
        steps_rate = upd_rate = None
        if len(pts) >= 2 and pts[-1][0] - pts[0][0] >= _RATE_MIN_SPAN_S:
            steps_rate = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        upd = [(t, u) for t, _, u in pts if u is not None]
        if len(upd) >= 2 and upd[-1][0] - upd[0][0] >= _RATE_MIN_SPAN_S:
            upd_rate = (upd[-1][1] - upd[0][1]) / (upd[-1][0] - upd[0][0])
        if steps_rate is None:
            steps_rate = self._shown.get("env_steps_per_s")
        if upd_rate is None:
            upd_rate = self._shown.get("updates_per_s")
        return steps_rate, upd_rate

    def status_line(self, env_steps: int) -> str:
        """The progress fields as one line (the plain-mode output and the live bar's text)."""
        steps_rate, upd_rate = self._rates()
        pct = 100.0 * env_steps / max(self.total_steps, 1)
        parts = [f"{env_steps:,}/{self.total_steps:,} ({pct:.1f}%)"]
        parts.append(f"{steps_rate:,.0f} env-steps/s" if steps_rate else "- env-steps/s")
        parts.append(f"{upd_rate:,.1f} upd/s" if upd_rate is not None else "- upd/s")
        for key, label in (
            ("episode_return", "return"),
            ("eval_return", "eval"),
            ("critic_loss", "critic loss"),
        ):
            value = self._shown.get(key)
            if value is not None:
                parts.append(f"{label} {value:.4g}")
        remaining = max(self.total_steps - env_steps, 0)
        eta = _fmt_duration(remaining / steps_rate) if steps_rate else "-"
        parts.append(f"ETA {eta}")
        return " | ".join(parts)

    def update_progress(self, env_steps: int, **fields: float | int | None) -> None:
        """Advance the progress line to `env_steps`.

        `fields` (Python numbers, to avoid a device sync per call) override the shown values;
        `updates` is the cumulative critic-update count, from which updates/s is derived.
        Known keys shown: episode_return, eval_return, critic_loss. On a non-TTY this only
        records values; the line is printed by the next `log()`.
        """
        if not self.enabled or self._closed or not self.progress:
            return
        self._last_steps = int(env_steps)
        updates = fields.pop("updates", None)
        for key, value in fields.items():
            self._shown[key] = None if value is None else _to_float(key, value)
        recorded = self._sample(int(env_steps), None if updates is None else float(updates))
        if recorded and self._live is not None:
            self._live.update(self._task, completed=env_steps, stats=self.status_line(env_steps))

    def close(self) -> None:
        """Flush and close every sink (idempotent)."""
        if not self.enabled or self._closed:
            return
        self._closed = True
        if self._live is not None:
            last = self._last_steps  # the final state, even if the last update was throttled
            self._live.update(self._task, completed=last, stats=self.status_line(last))
            self._live.stop()
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
