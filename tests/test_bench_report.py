"""`bench learn report`: tables, plots and a page's generated blocks from a results.json alone.

tests/data/bench_learn_smoke_results.json is the smoke suite's results.json (its run_dir paths
made relative): the report must redraw everything from it without any run directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fast_lora_td3.bench import stats as bench_stats
from fast_lora_td3.bench.plots import CURVE_POINTS, PLOTS, shrink
from fast_lora_td3.bench.report import BLOCKS, dumps, headline, markdown, page_blocks
from fast_lora_td3.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "data" / "bench_learn_smoke_results.json"
PAGE = """# Results

Text before.

<!-- BEGIN GENERATED: smoke headline -->
stale headline
<!-- END GENERATED -->

Between.

<!-- BEGIN GENERATED: smoke lora-vs-dense -->
<!-- END GENERATED -->

<!-- BEGIN GENERATED: other headline -->
another suite's table, left alone
<!-- END GENERATED -->

Text after.
"""


def _stat(mean: float | None, lo: float = 0.0, hi: float = 0.0, n: int = 3) -> dict:
    return {"mean": mean, "ci95": [lo, hi] if n > 1 else [mean, mean], "n": n}


def test_headline_rows_read_as_the_hand_formatted_cpu_page() -> None:
    # Two rows of the cpu suite's first run's hand-made headline (archived), from numbers that
    # round to them.
    summary = {
        "seeds": 3,
        "final_eval_return": _stat(2201.3, 1533.4, 2830.6),
        "final_train_return": _stat(1823.8, 1288.1, 2159.4),
        "steps_to_threshold": _stat(32000.0, 32000.0, 32000.0),
        "seconds_to_threshold": _stat(204.2, 176.3, 252.1),
        "reached_threshold": 3,
        "wall_time_s": _stat(283.4, 253.0, 341.2),
    }
    g1 = {
        "seeds": 1,
        "final_eval_return": _stat(37.39, n=1),
        "final_train_return": _stat(19.06, n=1),
        "steps_to_threshold": _stat(8864.0, n=1),
        "seconds_to_threshold": _stat(98.0, n=1),
        "reached_threshold": 1,
        "wall_time_s": _stat(2886.3, n=1),
    }
    results = {
        "tasks": {
            "halfcheetah_cpu": {
                "spec": {"total_steps": 40_000, "threshold": 1000.0},
                "methods": {"mlp": {"summary": summary}},
            },
            "g1_flat_cpu": {
                "spec": {"total_steps": 256_000, "threshold": 10.0},
                "methods": {"simbav2_lora": {"summary": g1}},
            },
        }
    }
    rows = headline(results).splitlines()
    page = (REPO / "docs" / "results" / "cpu_201f0ed" / "README.md").read_text().splitlines()
    assert rows[0] == page[page.index("## Headline") + 2]  # the same columns
    assert rows[2] == (
        "| halfcheetah_cpu (40,000; threshold 1000) | mlp | 3 | 2,201 [1,533, 2,831] | "
        "1,824 [1,288, 2,159] | 32,000 [32,000, 32,000] / 204 [176, 252] (3/3) | 283 [253, 341] |"
    )
    assert rows[3] == (
        "| g1_flat_cpu (256,000; threshold 10) | simbav2_lora | 1 | 37.4 | 19.1 | 8,864 / 98 (1/1) "
        "| 2,886 |"
    )
    assert rows[2] in page and rows[3] in page


def test_wall_marks_and_health_rows_by_hand() -> None:
    def run(seed: int, mass: float | None, alpha: float | None = None) -> dict:
        health = {"end_mass_max": mass, "saturated_rows": None if mass is None else mass / 2}
        return {"seed": seed, "env_steps": 1000.0 * seed, **health, "alpha": alpha}

    def summary(seeds: int, **extra: dict) -> dict:
        marks = {"60": _stat(10.0, 5.0, 15.0, seeds), "600": _stat(1234.0, 1000.0, 1500.0, seeds)}
        return {"seeds": seeds, "wall_returns": marks, "final_eval_return": _stat(2000.0, n=1)}

    sac = summary(2)
    sac.update(
        saturated_actions=_stat(0.05, 0.0, 0.1, 2),
        alpha=_stat(0.02, 0.01, 0.03, 2),
        entropy=_stat(-5.0, -6.0, -4.0, 2),
        entropy_target=_stat(-6.0, -6.0, -6.0, 2),
    )
    results = {
        "tasks": {
            "Hopper-v5": {
                "spec": {"wall_marks": [60.0, 600.0]},
                "methods": {
                    "fastsac": {"runs": [run(1, 0.02, 0.01), run(2, 0.3, 0.03)], "summary": sac},
                    "sb3_td3": {"runs": [run(1, None)], "summary": summary(1)},
                },
            },
            "halfcheetah_cpu": {"spec": {"wall_marks": []}, "methods": {}},
        }
    }
    rows = BLOCKS["wall-marks"](results).splitlines()
    assert rows[0] == (
        "| task | method | seeds | return @ 60 s | return @ 600 s | final eval return "
        "| env steps in the budget |"
    )
    assert rows[2] == (
        "| Hopper-v5 | fastsac | 2 | 10 [5, 15] | 1,234 [1,000, 1,500] | 2,000 "
        "| 1,500 [1,000, 2,000] |"
    )
    assert rows[3].startswith("| Hopper-v5 | sb3_td3 | 1 | 10 | 1,234 |") and len(rows) == 4
    rows = BLOCKS["health"](results).splitlines()
    assert len(rows) == 3  # the peer has no value support: no row
    assert rows[2] == (
        "| Hopper-v5 | fastsac | 2 | 0.30 | 0.15 | 0.05 [0, 0.1] | 0.02 [0.01, 0.03] "
        "| -5 [-6, -4] / -6 [-6, -6] |"
    )
    assert BLOCKS["wall-marks"]({"tasks": {"t": {"spec": {}, "methods": {}}}}).startswith("(no")


def test_shrink_averages_consecutive_points_and_rounds() -> None:
    pts = np.array([[s, s / 10, s * 2.0] for s in range(1, 11)], dtype=np.float64)
    assert shrink(pts, 20) == [[s, round(s / 10, 2), s * 2.0] for s in range(1, 11)]
    # 10 points into 4 runs of 3, 3, 2, 2 points: each row is its run's mean on every column.
    assert shrink(pts, 4) == [[2, 0.2, 4.0], [5, 0.5, 10.0], [8, 0.75, 15.0], [10, 0.95, 19.0]]
    assert shrink(np.array([[100.0, 1.23456, 1234567.0]])) == [[100, 1.23, 1235000.0]]


def test_results_json_of_fifty_runs_stays_small_and_round_trips() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(1.0, 5001.0)
    long = np.stack([steps * 51.2, steps * 0.577, rng.normal(0.0, 1000.0, 5000)], axis=1)
    run = {"seed": 1, "ci": [1.5, 2.5], "curves": {key: shrink(long) for key, *_ in PLOTS.values()}}
    assert all(len(c) == CURVE_POINTS for c in run["curves"].values())
    results = {"suite": "x", "tasks": {"t": {"methods": {"m": {"runs": [run] * 50}}}}}
    text = dumps(results)
    assert json.loads(text) == results
    assert len(text) < 700_000  # ~0.5 MB; the indented dump would be ~3 MB


def _report_dir(tmp_path: Path) -> Path:
    path = tmp_path / "docs" / "results" / "smoke" / "results.json"
    path.parent.mkdir(parents=True)
    shutil.copy(FIXTURE, path)
    return path


def test_report_redraws_tables_plots_and_page_blocks_from_results_json_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_run_dirs(path: Path) -> list:
        raise AssertionError(f"the report read a run directory: {path}")

    monkeypatch.setattr(bench_stats, "read_rows", no_run_dirs)
    path = _report_dir(tmp_path)
    results = json.loads(path.read_text())
    page = tmp_path / "RESULTS.md"
    page.write_text(PAGE)
    assert main(["bench", "learn", "report", str(path), f"page={page}"]) == 0
    assert (path.parent / "results.md").read_text() == markdown(results)
    for png in PLOTS:  # two critic families: the critic-only figures are drawn too
        assert (path.parent / png).stat().st_size > 1000, png
    text = page.read_text()
    blocks = page_blocks(text)
    assert blocks[("smoke", "headline")] == BLOCKS["headline"](results)
    assert blocks[("smoke", "lora-vs-dense")] == BLOCKS["lora-vs-dense"](results)
    assert blocks[("other", "headline")] == "another suite's table, left alone\n"
    assert "| pendulum_cpu (4,800; threshold -1000) | mlp | 2 | -159 [-178, -140] |" in text
    assert "| pendulum_cpu | mlp_lora-mlp | 2 / 2 |" in text
    assert "stale headline" not in text
    outside = PAGE.split("<!-- BEGIN")[0], "\nBetween.\n", "\nText after.\n"
    assert all(part in text for part in outside)
    assert main(["bench", "learn", "report", str(path), f"page={page}"]) == 0
    assert page.read_text() == text  # a second run changes nothing


def test_report_mistakes_are_one_line_errors_that_leave_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _report_dir(tmp_path)
    page = tmp_path / "RESULTS.md"
    page.write_text(PAGE.replace("smoke lora-vs-dense", "smoke plots"))
    old = json.loads(path.read_text())
    for task in old["tasks"].values():
        for data in task["methods"].values():
            for run in data["runs"]:
                del run["curves"]
    stale = tmp_path / "old.json"
    stale.write_text(json.dumps(old))
    no_markers = tmp_path / "plain.md"
    no_markers.write_text("# nothing generated\n")
    unterminated = tmp_path / "open.md"
    unterminated.write_text(PAGE.replace("stale headline\n<!-- END GENERATED -->\n", ""))
    cases = [
        ([], "give a results.json path"),
        ([str(tmp_path / "nope.json")], "no file"),
        ([str(FIXTURE.parent)], "no file"),
        ([str(path), "pages=x.md"], "bad argument 'pages=x.md'"),
        ([str(path), f"page={tmp_path / 'nope.md'}"], "no file"),
        ([str(path), f"page={page}"], "unknown block 'plots'"),
        ([str(path), f"page={no_markers}"], "BEGIN GENERATED: smoke BLOCK"),
        ([str(stale)], "no run curves"),
        ([str(page)], "not a bench learn results.json"),
        ([str(path), f"page={unterminated}"], "no `<!-- END GENERATED -->` line"),
    ]
    for args, message in cases:
        assert main(["bench", "learn", "report", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (args, err)
    assert page.read_text() == PAGE.replace("smoke lora-vs-dense", "smoke plots")
    assert not (path.parent / "results.md").exists()


def page_mismatches(page: Path, results_dir: Path) -> list[str]:
    """What in `page` and the results.md files differs from what `bench learn report` writes
    from each results_dir/SUITE/results.json (empty: all generated and current)."""
    blocks = page_blocks(page.read_text())
    committed = {p.parent.name: p for p in sorted(results_dir.glob("*/results.json"))}
    wrong = [f"{s} {b}: no {s}/results.json" for s, b in blocks if s not in committed]
    for suite, path in committed.items():
        results = json.loads(path.read_text())
        md = path.parent / "results.md"
        if results["suite"] != suite:
            wrong.append(f"{path} holds suite {results['suite']!r}")
        if not md.is_file() or md.read_text() != markdown(results):
            wrong.append(f"{suite}/results.md is missing or stale")
        quoted = {block: text for (s, block), text in blocks.items() if s == suite}
        if "headline" not in quoted:
            wrong.append(f"{page.name} quotes no {suite} headline")
        wrong += [f"{suite} {b} is stale" for b, t in quoted.items() if t != BLOCKS[b](results)]
    return wrong


def test_page_check_flags_stale_or_orphan_blocks(tmp_path: Path) -> None:
    path = _report_dir(tmp_path)
    page = tmp_path / "RESULTS.md"
    page.write_text(PAGE[: PAGE.index("<!-- BEGIN GENERATED: other")])
    assert page_mismatches(page, path.parents[1]) == [
        "smoke/results.md is missing or stale",
        "smoke headline is stale",
        "smoke lora-vs-dense is stale",
    ]
    assert main(["bench", "learn", "report", str(path), f"page={page}"]) == 0
    assert page_mismatches(page, path.parents[1]) == []
    page.write_text(page.read_text().replace("| mlp | 2 | -159 ", "| mlp | 2 | -158 "))
    assert page_mismatches(page, path.parents[1]) == ["smoke headline is stale"]
    page.write_text(page.read_text() + PAGE[PAGE.index("<!-- BEGIN GENERATED: other") :])
    assert "other headline: no other/results.json" in page_mismatches(page, path.parents[1])


def test_results_page_quotes_the_committed_results_as_generated() -> None:
    # Every generated block of the page, both suites, against the committed results.json files.
    assert page_mismatches(REPO / "docs" / "RESULTS.md", REPO / "docs" / "results") == [], (
        "run `fast-lora-td3 bench learn report docs/results/*/results.json page=docs/RESULTS.md`"
    )


def test_one_report_command_redraws_every_suite_of_a_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    smoke = _report_dir(tmp_path)
    other = tmp_path / "docs" / "results" / "other" / "results.json"
    other.parent.mkdir()
    other.write_text(json.dumps({**json.loads(smoke.read_text()), "suite": "other"}))
    page = tmp_path / "RESULTS.md"
    page.write_text(PAGE)
    args = ["bench", "learn", "report", str(smoke), str(other), f"page={page}"]
    assert main(args) == 0
    assert page_mismatches(page, smoke.parents[1]) == []
    assert "another suite's table, left alone" not in page.read_text()
    # One suite twice is a mistake caught before anything is written.
    page.write_text(PAGE)
    (smoke.parent / "results.md").unlink()
    capsys.readouterr()
    assert main(["bench", "learn", "report", str(smoke), str(smoke), f"page={page}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "give one per suite" in err and len(err.splitlines()) == 1
    assert page.read_text() == PAGE and not (smoke.parent / "results.md").exists()
