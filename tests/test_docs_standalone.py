"""Comments, docstrings and docs stand on their own: no pointer into design documents kept outside
the repository (a reader of the code or of the wheel cannot open them)."""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("fast_lora_td3", "tasks", "configs", "tests", "scripts", "docker", "docs", "README.md")
# "SPEC" as a word in capitals (so `spec` variables and `BackendSpec` pass), "SPEC.md" and
# "spec §x" in any case.
OUTSIDE_REFERENCE = re.compile(r"\bSPEC\b|(?i:spec\.md|spec\s*§)")


def tracked_files() -> list[Path]:
    """The tracked files under CHECKED (git), or every file there when this is not a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", *CHECKED], cwd=ROOT, capture_output=True, check=True
        ).stdout
        return [ROOT / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = [ROOT / top for top in CHECKED if (ROOT / top).is_file()]
        for top in CHECKED:
            for parent, dirs, names in os.walk(ROOT / top):
                dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
                files.extend(Path(parent) / name for name in names)
        return files


def outside_references(files: list[Path], root: Path) -> list[str]:
    """`path:line: text` (path relative to `root`) for each line that cites such a document."""
    hits = []
    for path in files:
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE_REFERENCE.search(line):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return hits


def test_detector_flags_spec_references_and_spares_spec_identifiers(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Projection (SPEC §2.1)."""\n'
        "# see SPEC.md\n"
        "# as the spec § 4 says\n"
        "spec = BackendSpec(name)  # a spec, not a document\n"
        "ENV_SPEC = 1  # an identifier\n"
    )
    hits = outside_references([sample], tmp_path)
    assert [hit.split(":")[1] for hit in hits] == ["1", "2", "3"]


def test_no_references_to_design_documents_outside_the_repository() -> None:
    files = tracked_files()
    assert any(f.name == "lora.py" for f in files), "the file listing found no package sources"
    hits = outside_references(files, ROOT)
    assert not hits, "replace each reference with the one-line reason:\n" + "\n".join(hits)


LOCAL_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def link_targets(doc: Path) -> list[str]:
    """Relative Markdown link/image targets in `doc` (URLs and mail addresses are skipped)."""
    text = doc.read_text(encoding="utf-8")
    return [t for t in LOCAL_LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


def broken_links(doc: Path) -> list[str]:
    """The link targets of `doc` that do not exist."""
    return [t for t in link_targets(doc) if not (doc.parent / t).exists()]


def test_link_checker_flags_a_missing_target(tmp_path: Path) -> None:
    (tmp_path / "there.png").write_bytes(b"")
    doc = tmp_path / "doc.md"
    doc.write_text("![a](there.png) [b](missing.md#part) [c](https://example.org/x.md)\n")
    assert broken_links(doc) == ["missing.md"]


def test_readme_and_docs_link_only_to_files_that_exist() -> None:
    docs = [d for d in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if d.is_file()]
    broken = {str(d.relative_to(ROOT)): broken_links(d) for d in docs}
    assert not any(broken.values()), f"links to missing files: {broken}"
    # On disk is not enough: a target that git ignores (e.g. a *.png) is missing from every clone.
    tracked = {p.resolve() for p in tracked_files()}
    untracked = [
        f"{d.relative_to(ROOT)} -> {t}"
        for d in docs
        for t in link_targets(d)
        if (d.parent / t).is_file() and (d.parent / t).resolve() not in tracked
    ]
    assert not untracked, f"links to files git does not track: {untracked}"
