"""Imports inside fast_lora_td3 go one way, down the layers of docs/DESIGN.md's module table (which
lists every module), `import fast_lora_td3` stays light, and no test module imports another.

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
MODULE_ROW = re.compile(r"^\| (\d+) \| ([^|]*) \|")
LISTED_PATH = re.compile(r"`([\w/]+(?:\.py|/))`")


def design_layers(text: str) -> dict[str, int]:
    """Path (relative to fast_lora_td3/, a folder ending in `/`) → layer, from DESIGN.md's table of
    modules (rows `| <layer> | <module cell> | …`; the module cell names paths in backticks)."""
    section = text.split("## Modules", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        if match := MODULE_ROW.match(line):
            for path in LISTED_PATH.findall(match.group(2)):
                layers[path] = int(match.group(1))
    return layers


def doc_path(module: str, path: Path) -> str:
    """`fast_lora_td3.nn.lora` → `nn/lora.py`; a package → its `__init__.py`."""
    parts = module.split(".")[1:]
    return "/".join([*parts, "__init__.py"] if path.name == "__init__.py" else parts) + (
        "" if path.name == "__init__.py" else ".py"
    )


def layer_of(doc: str, layers: dict[str, int]) -> int | None:
    """The module's own row, else the row of the deepest listed folder holding it."""
    if doc in layers:
        return layers[doc]
    folders = [f for f in layers if f.endswith("/") and doc.startswith(f)]
    return layers[max(folders, key=len)] if folders else None


def test_design_table_parser_reads_rows_and_folders() -> None:
    text = (
        "## Modules\n| layer | module | owns | may import |\n| --- | --- | --- | --- |\n"
        "| 0 | `errors.py`, `nn/config.py` | x | `a.py` |\n"
        "| 3 | `tasks/` (`fast_lora_td3.tasks`) | y | — |\n"
        "## Next\n| 9 | `other.py` | z | — |\n"
    )
    layers = design_layers(text)
    assert layers == {"errors.py": 0, "nn/config.py": 0, "tasks/": 3}
    assert layer_of("tasks/g1_rewards.py", layers) == 3 and layer_of("cli.py", layers) is None


def test_design_md_lists_every_module_and_its_imports_go_down_the_layers() -> None:
    """docs/DESIGN.md's module table is the map: every module of the package has a row, every
    path it names exists, and no module imports a module of a higher layer."""
    layers = design_layers(DESIGN.read_text())
    files = module_files()
    docs = {m: doc_path(m, p) for m, p in files.items()}
    missing = sorted(d for d in docs.values() if layer_of(d, layers) is None)
    assert not missing, f"modules missing from docs/DESIGN.md's module table: {missing}"
    stale = [
        p
        for p in layers
        if p not in docs.values() and not any(d.startswith(p) for d in docs.values())
    ]
    assert not stale, f"docs/DESIGN.md's module table names modules that do not exist: {stale}"
    upward = [
        f"{docs[m]} (layer {layer_of(docs[m], layers)}) imports {docs[t]} "
        f"(layer {layer_of(docs[t], layers)})"
        for m, targets in import_graph().items()
        for t in sorted(targets)
        if layer_of(docs[t], layers) > layer_of(docs[m], layers)
    ]
    assert not upward, "imports against docs/DESIGN.md's layers:\n" + "\n".join(upward)


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
