"""Resolver dry runs for the install routes (pip's resolver, nothing installed; a few minutes).

    python scripts/isaaclab_resolve.py            # PyPI only
    python scripts/isaaclab_resolve.py --nvidia   # also the full `.[isaaclab]` route via pypi.nvidia.com

Checks, each with ``pip install --dry-run --ignore-installed --report``:

1. ``-e .[dev]`` with the CPU constraints (the README's first command) installs mjlab.
2. ``-e .`` + ``isaaclab[all]==2.3.2.post1`` (the Isaac Lab route minus Isaac Sim) resolves from PyPI
   alone, with rsl-rl-lib 3.0.1 and without mjlab. ``isaacsim`` itself cannot be checked from PyPI:
   PyPI's ``isaacsim`` is a stub whose build fetches the real wheel from NVIDIA's index.
3. ``mjlab>=1.6`` + ``isaaclab[all]==2.3.2.post1`` is impossible (rsl-rl-lib 5.4.2 vs 3.0.1):
   the reason the simulators are separate extras.
4. (``--nvidia``) ``-e .[isaaclab]`` with ``--extra-index-url https://pypi.nvidia.com``.

Exit status 1 if any expectation fails. Needs Python 3.11 (Isaac Lab 2.3's wheel is cp311).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ISAACLAB = "isaaclab[all]==2.3.2.post1"
NVIDIA_INDEX = "https://pypi.nvidia.com"


def dry_run(*requirements: str, extra: tuple[str, ...] = ()) -> dict[str, str] | str:
    """{name: version} pip would install, or pip's error text when resolution fails."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q"]
        cmd += ["--report", str(report), *extra, *requirements]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            lines = [x for x in out.stderr.splitlines() if not x.startswith("WARNING: Location")]
            return "\n".join(lines[-15:])
        installs = json.loads(report.read_text())["install"]
        return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}


def main(argv: list[str] | None = None) -> int:
    """Run the dry runs and print one line per expectation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvidia", action="store_true", help=f"also resolve via {NVIDIA_INDEX}")
    ns = parser.parse_args(argv)
    results: list[tuple[str, bool, str]] = []

    dev = dry_run("-e", ".[dev]", extra=("-c", "constraints/cpu-x86_64.txt"))
    ok = isinstance(dev, dict) and "mjlab" in dev
    results.append(
        ("README's `-e .[dev]` installs mjlab", ok, str(dev.get("mjlab") if ok else dev))
    )

    route = dry_run("-e", ".", ISAACLAB)
    ok = isinstance(route, dict) and route.get("rsl-rl-lib") == "3.0.1" and "mjlab" not in route
    detail = f"{len(route)} packages, rsl-rl-lib {route.get('rsl-rl-lib')}" if ok else str(route)
    results.append(("`-e .` + isaaclab[all]==2.3.2.post1 resolves from PyPI", ok, detail))

    clash = dry_run("mjlab>=1.6", ISAACLAB)
    ok = isinstance(clash, str)
    results.append(("mjlab + isaaclab[all] cannot resolve", ok, "conflict" if ok else "resolved?!"))

    if ns.nvidia:
        full = dry_run("-e", ".[isaaclab]", extra=("--extra-index-url", NVIDIA_INDEX))
        ok = isinstance(full, dict) and "isaacsim" in full and "mjlab" not in full
        results.append(
            ("`-e .[isaaclab]` via NVIDIA's index", ok, str(full.get("isaacsim") if ok else full))
        )

    for what, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
