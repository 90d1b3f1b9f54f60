"""Imports inside fast_lora_td3 go one way, down the package layers of docs/DESIGN.md (whose module
table lists every module), `import fast_lora_td3` stays light, and no test module imports another.

The graph has one node per module of the package and an edge for every `import` / `from … import`
of another package module written anywhere in a file: at module level, inside functions (lazy
imports) and under `if TYPE_CHECKING:`. Lazy imports count because a cycle hidden in a function
is still a cycle between layers (cli ↔ play was one); parent packages are not implicit edges,
since Python initialises a package before its submodules and that order cannot form a loop.
The public names of `fast_lora_td3/__init__.py` load through `importlib` on first access, not at
import time, so they are no edges.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "fast_lora_td3"
REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = {
    PACKAGE: "fast_lora_td3",
    f"{PACKAGE}.tasks": "tasks",
    f"{PACKAGE}.configs": "configs",
}
"""Package → source folder, as pyproject's `package-dir` maps them."""


def module_files() -> dict[str, Path]:
    """Dotted module name → file, for every .py of the package and of its mapped subpackages."""
    modules = {}
    for package, folder in SOURCE_DIRS.items():
        root = REPO / folder
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "__pycache__" in parts or (package == PACKAGE and parts[0] in ("tasks", "configs")):
                continue  # a worktree's fast_lora_td3/tasks, /configs symlinks: mapped above
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a (possibly relative) `from X import …` names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """Package modules that `module` imports anywhere in its source."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, path.name == "__init__.py")
            # `from pkg import sub` imports the submodule `pkg.sub` when one exists
            names = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in known else target
                for a in node.names
            ]
        else:
            continue
        for name in names:
            # `import a.b.c` binds the deepest module of the package that exists
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {m: imported_modules(m, p, known) for m, p in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (each holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has ~100 nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest closed path through a strongly connected component, from its smallest module."""
    start = min(comp)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth-first inside the component until an edge leads back to `start`
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(comp)} is not strongly connected")


def test_cycle_finder_reports_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [{"a", "b", "c"}]
    assert cycle_in(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_lazy_and_relative_imports_are_edges(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from .b import x\n    import p.c.d\n")
    known = {"p", "p.a", "p.b", "p.c"}
    assert imported_modules("p.a", src, known) == {"p.b", "p.c"}


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 50 and graph[f"{PACKAGE}.cli"], "the package's modules were not found"
    unexpected = [cycle_in(graph, c) for c in find_cycles(graph)]
    assert not unexpected, "import cycles:\n" + "\n".join(" -> ".join(c) for c in unexpected)


def test_importing_the_package_loads_no_simulator() -> None:
    """`import fast_lora_td3` (and its lazy names' table) must not pull a simulator or torch."""
    code = (
        "import sys, fast_lora_td3\n"
        "heavy = [m for m in ('mjlab', 'isaaclab', 'gymnasium', 'torch', 'hydra') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "", f"`import fast_lora_td3` imported {out.stdout.strip()}"


def test_every_public_name_resolves_to_its_defining_module() -> None:
    import importlib

    import fast_lora_td3

    lazy = fast_lora_td3._ENTRY_POINTS
    assert set(fast_lora_td3.__all__) == {"__version__", *lazy}
    for name, module in lazy.items():
        assert getattr(fast_lora_td3, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no_such_name"):
        fast_lora_td3.no_such_name  # noqa: B018


DESIGN = REPO / "docs" / "DESIGN.md"
TABLE_ROW = re.compile(r"^\|(.*)\|\s*$")
LISTED = re.compile(r"`([\w/]+(?:\.py|/))`")

NEVER_IMPORTS = {
    "nn/": {"algos/", "envs/", "replay/", "config/", "runs/", "training/", "deploy/", "bench/"},
    "config/": {"runs/", "training/", "deploy/", "bench/", "train.py", "cli.py"},
    "envs/": {"training/", "deploy/", "bench/", "config/", "runs/", "train.py", "cli.py"},
    "replay/": {"training/", "deploy/", "bench/", "config/", "runs/", "algos/"},
    "training/": {"deploy/", "bench/", "train.py", "cli.py"},
    "deploy/": {"bench/", "train.py", "cli.py"},
}
"""The rules of issue 19, written here as well as in DESIGN.md, so loosening the table fails."""


def _section(text: str, heading: str) -> str:
    return ("\n" + text).split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]


def _rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        if (m := TABLE_ROW.match(line)) and not set(line) <= set("|- "):
            rows.append([c.strip() for c in m.group(1).split("|")])
    return rows


def design_packages(text: str) -> dict[str, tuple[int, set[str]]]:
    """Package (`nn/`, `cli.py`) → (layer, the packages it may import), from DESIGN.md's
    "## Packages" table (`| layer | packages | owns | may import |`; "each other" lets the packages
    of one row import one another)."""
    out: dict[str, tuple[int, set[str]]] = {}
    for cells in _rows(_section(text, "Packages")):
        if not cells[0].isdigit():
            continue
        names = LISTED.findall(cells[1])
        allowed = set(LISTED.findall(cells[3]))
        for name in names:
            mates = set(names) - {name} if "each other" in cells[3] else set()
            out[name] = (int(cells[0]), allowed | mates)
    return out


def design_modules(text: str) -> set[str]:
    """Every path listed in the first cell of a row of DESIGN.md's "## Modules" tables."""
    found = set()
    for cells in _rows(_section(text, "Modules")):
        found.update(LISTED.findall(cells[0]))
    return found


def doc_path(module: str, path: Path) -> str:
    """`fast_lora_td3.nn.lora` → `nn/lora.py`; a package → its `__init__.py`; `tasks.x` → `tasks/`."""
    parts = module.split(".")[1:]
    if parts and parts[0] in ("tasks", "configs"):
        return f"{parts[0]}/"
    return "/".join([*parts, "__init__.py"] if path.name == "__init__.py" else parts) + (
        "" if path.name == "__init__.py" else ".py"
    )


def package_of(doc: str) -> str:
    """`nn/lora.py` → `nn/`; a top-level module is its own package (`cli.py`)."""
    return doc.split("/", 1)[0] + "/" if "/" in doc else doc


def package_violations(
    edges: dict[str, set[str]], packages: dict[str, tuple[int, set[str]]]
) -> list[str]:
    """`<module> imports <module>` for every import between packages that the table does not allow,
    plus every table row that allows an import of a higher layer."""
    bad = [
        f"{package} may import {other} (layer {packages[other][0]} > {packages[package][0]})"
        for package, (layer, allowed) in packages.items()
        for other in sorted(allowed)
        if other in packages and packages[other][0] > layer
    ]
    for src, targets in edges.items():
        for dst in sorted(targets):
            a, b = package_of(src), package_of(dst)
            if a != b and b not in packages.get(a, (0, set()))[1]:
                bad.append(f"{src} ({a}) imports {dst} ({b})")
    return bad


def module_edges() -> dict[str, set[str]]:
    files = module_files()
    docs = {m: doc_path(m, p) for m, p in files.items()}
    edges: dict[str, set[str]] = {}
    for m, targets in import_graph().items():
        edges.setdefault(docs[m], set()).update(docs[t] for t in targets)
    return edges


def test_package_rules_report_a_planted_upward_import() -> None:
    text = (
        "## Packages\n| layer | package | owns | may import |\n| --- | --- | --- | --- |\n"
        "| 0 | `errors.py` | e | nothing |\n"
        "| 1 | `nn/` | n | `errors.py` |\n"
        "| 3 | `envs/`, `tasks/` | t | each other, `errors.py` |\n"
        "| 5 | `training/` | l | `nn/`, `envs/` |\n"
        "## Modules\n| module | owns |\n| --- | --- |\n| `nn/lora.py` | x |\n## Next\n"
    )
    packages = design_packages(text)
    assert packages["tasks/"] == (3, {"envs/", "errors.py"})
    assert design_modules(text) == {"nn/lora.py"}
    edges = {"nn/lora.py": {"errors.py"}, "tasks/": {"envs/base.py"}, "training/t.py": {"nn/a.py"}}
    assert package_violations(edges, packages) == []
    edges["nn/lora.py"].add("training/trainer.py")
    assert package_violations(edges, packages) == [
        "nn/lora.py (nn/) imports training/trainer.py (training/)"
    ]
    packages["nn/"] = (1, {"errors.py", "training/"})
    assert "nn/ may import training/ (layer 5 > 1)" in package_violations({}, packages)


def test_design_md_lists_every_module_and_package() -> None:
    """docs/DESIGN.md is the map: every module of the package has a row in its module table, every
    path it names exists, and every package has a row in its package table."""
    text = DESIGN.read_text()
    listed = design_modules(text)
    docs = set(module_edges())
    assert not sorted(docs - listed), f"modules missing from DESIGN.md: {sorted(docs - listed)}"
    assert not sorted(listed - docs), f"DESIGN.md names modules that do not exist: {listed - docs}"
    packages = design_packages(text)
    unlisted = sorted({package_of(d) for d in docs} - set(packages))
    assert not unlisted, f"packages missing from DESIGN.md's package table: {unlisted}"


def test_imports_between_packages_follow_design_md() -> None:
    """Every import from one package into another is one that DESIGN.md's package table allows,
    the table only allows imports of its own or a lower layer, and the fixed rules hold."""
    packages = design_packages(DESIGN.read_text())
    edges = module_edges()
    bad = package_violations(edges, packages)
    assert not bad, "imports against docs/DESIGN.md's package table:\n" + "\n".join(bad)
    for package, never in NEVER_IMPORTS.items():
        assert not packages[package][1] & never, f"DESIGN.md lets {package} import {never}"
        wrong = [
            f"{src} imports {dst}"
            for src, targets in edges.items()
            if package_of(src) == package
            for dst in targets
            if package_of(dst) in never
        ]
        assert not wrong, "\n".join(wrong)


def imports_between_test_modules(tests_dir: Path) -> list[str]:
    """`<file> imports <module>` for every import of a `test_*` module by a `test_*.py` file."""
    test_modules = {p.stem for p in tests_dir.glob("test_*.py")}
    found = []
    for path in sorted(tests_dir.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from .test_x import`, `from . import test_x`
                names = [node.module] if node.module else [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in test_modules]
    return found


def test_finder_reports_a_test_importing_another(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("def f():\n    from test_b import x\n")
    (tmp_path / "test_b.py").write_text("from . import test_a\nimport helpers\n")
    found = imports_between_test_modules(tmp_path)
    assert found == ["test_a.py imports test_b", "test_b.py imports test_a"]


def test_tests_share_helpers_not_test_modules() -> None:
    """A test module imports no other test module (that ties the files together and runs the
    imported module's code twice): shared helpers live in conftest.py or a helper module."""
    assert len(list((REPO / "tests").glob("test_*.py"))) > 20, "the test modules were not found"
    found = imports_between_test_modules(REPO / "tests")
    assert not found, "\n".join(found)
