"""Source-level conformance of our Isaac Lab code against the real ``isaaclab`` wheels (no Isaac Sim).

    python scripts/isaaclab_conformance.py            # 2.3.2.post1 and 3.0.0; exit 1 on any miss
    python scripts/isaaclab_conformance.py --version 2.3

The wheels are plain Python on PyPI (2.3.2.post1: 3.1 MB, ships isaaclab, isaaclab_tasks,
isaaclab_assets, isaaclab_rl under ``isaaclab/source/``; 3.0.0: 12 MB, packages at the top level).
They are fetched once with ``pip download --no-deps`` into ``~/.cache/fast_lora_td3/isaaclab``
(``FAST_LORA_TD3_CACHE`` overrides the root) and read with ``ast`` only: nothing is imported.

What is checked: every name in ``fast_lora_td3.envs.isaaclab_names.ISAACLAB_NAMES`` (the adapter's
modules, classes, methods, attributes, config fields, ``extras`` keys, AppLauncher arguments, task
ids, the call order inside ``ManagerBasedRLEnv.step``) and ``fast_lora_td3.tasks.isaaclab_g1.
ISAACLAB_NAMES`` (the G1 config: manager term functions and their parameter names, config fields,
scene/sensor/command names, G1 body names), plus every ``mdp.<term>(params=...)`` found by parsing
``tasks/isaaclab_g1.py`` itself. The Dockerfile's base image tag is checked against the tag the
wheel's own docker files name.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = {
    "2.3": ("isaaclab==2.3.2.post1", "3.11"),
    "3.0": ("isaaclab==3.0.0", "3.12"),
}
"""version key → (pip requirement, the Python version its wheel is built for)."""


def cache_root() -> Path:
    """Where wheels and their unpacked sources live."""
    root = os.environ.get("FAST_LORA_TD3_CACHE") or Path.home() / ".cache" / "fast_lora_td3"
    return Path(root) / "isaaclab"


def fetch_source(version: str) -> Path:
    """Download (once) and unpack (once) the wheel of ``version``; returns the unpacked folder."""
    requirement, python = WHEELS[version]
    folder = cache_root() / version
    unpacked = folder / "src"
    if (unpacked / ".complete").exists():
        return unpacked
    folder.mkdir(parents=True, exist_ok=True)
    wheels = list(folder.glob("isaaclab-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", python, "-d", str(folder), requirement]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wheels = list(folder.glob("isaaclab-*.whl"))
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extractall(unpacked)
    (unpacked / ".complete").touch()
    return unpacked


@dataclass
class SourceTree:
    """Python packages of one unpacked wheel, resolved by AST."""

    roots: list[Path]
    _cache: dict[str, ast.Module | None] = field(default_factory=dict)

    @classmethod
    def from_wheel(cls, unpacked: Path) -> SourceTree:
        """2.3 nests each package under ``isaaclab/source/<pkg>/<pkg>``; 3.0 puts them at the top."""
        nested = sorted(p for p in (unpacked / "isaaclab" / "source").glob("*") if p.is_dir())
        return cls(roots=[*nested, unpacked])

    def module_files(self, module: str) -> list[Path]:
        """The files defining ``module`` (an ``__init__.pyi`` lazy-loader stub comes with it)."""
        rel = Path(*module.split("."))
        for root in self.roots:
            pkg = root / rel
            files = [f for f in (pkg / "__init__.py", pkg / "__init__.pyi") if f.exists()]
            if (root / rel.with_suffix(".py")).exists():
                files.append(root / rel.with_suffix(".py"))
            if files:
                return files
        return []

    def module(self, module: str) -> ast.Module | None:
        """The merged AST of a module (None if it does not exist)."""
        if module not in self._cache:
            files = self.module_files(module)
            body: list[ast.stmt] = []
            for f in files:
                body += ast.parse(f.read_text(encoding="utf-8")).body
            self._cache[module] = ast.Module(body=body, type_ignores=[]) if files else None
        return self._cache[module]

    def is_package(self, module: str) -> bool:
        """``module`` is a package (relative imports resolve against itself)."""
        return any(f.name.startswith("__init__") for f in self.module_files(module))

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")
        base = base if self.is_package(module) else base[:-1]
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """Where ``module.name`` is defined: (defining module, node); follows imports and ``*``."""
        tree = self.module(module)
        if tree is None or depth > 12:
            return None
        star: list[str] = []
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name == name:
                    return module, node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    if isinstance(node.value, (ast.Name, ast.Attribute)):  # an alias: follow it
                        return self._resolve_expr(module, node.value) or (module, node)
                    return module, node
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(module, node)
                for alias in node.names:
                    if alias.name == "*":
                        star.append(source)
                    elif (alias.asname or alias.name) == name:
                        found = self.resolve(source, alias.name, depth + 1)
                        if found is None and self.module(f"{source}.{alias.name}") is not None:
                            found = (
                                f"{source}.{alias.name}",
                                self.module(f"{source}.{alias.name}"),
                            )
                        return found
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == name:
                        return alias.name, self.module(alias.name)
        sub = f"{module}.{name}"
        if self.module(sub) is not None:
            return sub, self.module(sub)
        for source in star:
            found = self.resolve(source, name, depth + 1)
            if found is not None:
                return found
        return None

    def resolve_dotted(self, dotted: str) -> tuple[str, ast.AST] | None:
        """``pkg.mod:Name.attr`` → the node of ``attr`` (class members, nested classes)."""
        module, _, path = dotted.partition(":")
        if not path:
            tree = self.module(module)
            return (module, tree) if tree is not None else None
        head, *rest = path.split(".")
        found = self.resolve(module, head)
        for part in rest:
            if found is None or not isinstance(found[1], ast.ClassDef):
                return None
            found = self.class_member(found[0], found[1], part)
        return found

    def class_bases(self, module: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The class and its resolvable bases, depth first (an approximate MRO)."""
        out: list[tuple[str, ast.ClassDef]] = [(module, cls)]
        for base in cls.bases:
            found = self._resolve_expr(module, base)
            if found is not None and isinstance(found[1], ast.ClassDef):
                out += self.class_bases(*found)  # type: ignore[arg-type]
        return out

    def _resolve_expr(self, module: str, expr: ast.expr) -> tuple[str, ast.AST] | None:
        if isinstance(expr, ast.Name):
            return self.resolve(module, expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self._resolve_expr(module, expr.value)
            if owner is None:
                return None
            if isinstance(owner[1], ast.Module):
                return self.resolve(owner[0], expr.attr)
            if isinstance(owner[1], ast.ClassDef):
                return self.class_member(owner[0], owner[1], expr.attr)
        return None

    def class_member(self, module: str, cls: ast.ClassDef, name: str) -> tuple[str, ast.AST] | None:
        """A class attribute, method, property, nested class, or ``self.<name> = …`` of a method."""
        for mod, klass in self.class_bases(module, cls):
            for node in klass.body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
                    return mod, node
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                        return mod, node
            for node in ast.walk(klass):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == name
                    and isinstance(node.ctx, ast.Store)
                    and ast.unparse(node.value) == "self"
                ):
                    return mod, node
        return None

    def field_class(self, module: str, node: ast.AST) -> tuple[str, ast.ClassDef] | None:
        """The class of a config field (``x: T = T()`` or ``x = T(...)``)."""
        expr = None
        if isinstance(node, ast.AnnAssign):
            expr = node.annotation
            if isinstance(node.value, ast.Call) and not isinstance(expr, (ast.Name, ast.Attribute)):
                expr = node.value.func
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            expr = node.value.func
        elif isinstance(node, ast.ClassDef):
            return module, node
        found = self._resolve_expr(module, expr) if expr is not None else None
        if found is not None and isinstance(found[1], ast.ClassDef):
            return found  # type: ignore[return-value]
        return None

    def params(self, found: tuple[str, ast.AST]) -> list[str] | None:
        """Parameter names of a function, or of a class term's ``__init__`` + ``__call__``."""
        mod, node = found
        if isinstance(node, ast.FunctionDef):
            a = node.args
            return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        if isinstance(node, ast.ClassDef):  # a configclass takes its fields as arguments
            names = [
                n.target.id
                for _, klass in self.class_bases(mod, node)
                for n in klass.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            ]
            for method in ("__init__", "__call__"):
                m = self.class_member(mod, node, method)
                names += self.params(m) or [] if m else []
            return names
        return None


def string_constants(tree: ast.AST) -> set[str]:
    """Every string literal in a tree."""
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def call_order(func: ast.FunctionDef) -> list[str]:
    """Dotted names of the calls in a function body, in source order (``self.`` stripped)."""

    def dotted(e: ast.expr) -> str:
        if isinstance(e, ast.Attribute):
            return f"{dotted(e.value)}.{e.attr}"
        return e.id if isinstance(e, ast.Name) else "?"

    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return [dotted(c.func).removeprefix("self.") for c in calls]


def check(tree: SourceTree, kind: str, target: str, *args: str) -> str | None:
    """One name check; returns None when it holds, else what is missing."""
    found = tree.resolve_dotted(target)
    if kind == "exists":
        return None if found else f"{target} does not exist"
    if found is None:
        return f"{target} does not exist"
    mod, node = found
    if kind == "params":
        names = tree.params(found)
        missing = [a for a in args if names is None or a not in names]
        return f"{target} has no parameter(s) {missing}" if missing else None
    if kind == "field":  # dotted config-field path through nested config classes
        for part in args[0].split("."):
            klass = tree.field_class(mod, node)
            member = tree.class_member(*klass, part) if klass else None
            if member is None:
                return f"{target}.{args[0]}: no field {part!r}"
            mod, node = member
        return None
    if kind == "not_none":  # a base config must not disable the field in __post_init__
        klass = tree.field_class(mod, node)
        for m, c in tree.class_bases(*klass) if klass else []:
            for n in ast.walk(c):
                if (
                    isinstance(n, ast.Assign)
                    and isinstance(n.value, ast.Constant)
                    and n.value.value is None
                    and any(ast.unparse(t) == f"self.{args[0]}" for t in n.targets)
                ):
                    return f"{target}: {m}.{c.name}.__post_init__ sets {args[0]} = None"
        return None
    if kind == "strings":  # string literals present in the definition (ids, keys, names)
        missing = [a for a in args if a not in string_constants(node)]
        return f"{target} never mentions {missing}" if missing else None
    if kind == "regex_names":  # names matched by some regex literal (body/joint names)
        patterns = [s for s in string_constants(node) if s]
        missing = [a for a in args if not any(re.fullmatch(p, a) for p in _regexes(patterns))]
        return f"{target}: no name pattern matches {missing}" if missing else None
    if kind == "calls_in_order":
        order = call_order(node)  # type: ignore[arg-type]
        pos = 0
        for name in args:
            try:
                pos = order.index(name, pos) + 1
            except ValueError:
                return f"{target} does not call {name} after {args[: args.index(name)]}"
        return None
    if kind == "returns":
        rets = [
            ast.unparse(n.value) for n in ast.walk(node) if isinstance(n, ast.Return) and n.value
        ]
        return None if args[0] in rets else f"{target} returns {rets}, not {args[0]}"
    raise ValueError(f"unknown check kind {kind!r}")


def _regexes(patterns: list[str]) -> list[str]:
    out = []
    for p in patterns:
        try:
            re.compile(p)
        except re.error:
            continue
        out.append(p)
    return out


def g1_term_checks(path: Path) -> list[tuple[str, ...]]:
    """``func=mdp.X, params={...}`` pairs parsed from ``tasks/isaaclab_g1.py``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.asname:
                    aliases[a.asname] = a.name
    checks: list[tuple[str, ...]] = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        kw = {k.arg: k.value for k in n.keywords}
        func = kw.get("func")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module = aliases.get(func.value.id)
            if module is None:
                continue
            keys = []
            if isinstance(kw.get("params"), ast.Dict):
                keys = [k.value for k in kw["params"].keys if isinstance(k, ast.Constant)]
            checks.append(("params", f"{module}:{func.attr}", *keys))
    return checks


def import_checks(path: Path) -> list[tuple[str, ...]]:
    """Every ``isaaclab*`` import statement of one of our files, as ``exists`` checks."""
    checks: list[tuple[str, ...]] = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("isaaclab"):
            checks += [("exists", f"{n.module}:{a.name}") for a in n.names]
        elif isinstance(n, ast.Import):
            checks += [("exists", a.name) for a in n.names if a.name.startswith("isaaclab")]
    return checks


def run(version: str, unpacked: Path | None = None) -> list[str]:
    """All failed checks for ``version`` (empty: conformant)."""
    sys.path.insert(0, str(REPO))
    from fast_lora_td3.envs.isaaclab_names import ISAACLAB_NAMES as ENV_NAMES
    from fast_lora_td3.tasks.isaaclab_g1 import ISAACLAB_NAMES as G1_NAMES

    tree = SourceTree.from_wheel(unpacked or fetch_source(version))
    checks = list(ENV_NAMES.get(version, []))
    checks += import_checks(REPO / "fast_lora_td3" / "envs" / "isaaclab_env.py")
    if version in G1_NAMES:  # the FastLoRA task targets 2.3 only (refused on 3.0)
        g1 = REPO / "tasks" / "isaaclab_g1.py"
        checks += G1_NAMES[version] + g1_term_checks(g1) + import_checks(g1)
    failures = [f"[{version}] {m}" for m in _dockerfile_problems(version)]
    for kind, target, *args in checks:
        msg = check(tree, kind, target, *args)
        if msg:
            failures.append(f"[{version}] {kind}: {msg}")
    return failures


def _dockerfile_problems(version: str) -> list[str]:
    """The NGC base image must carry the Isaac Lab release the 2.3 checks ran against (the wheel
    ships no docker files; the tag itself was confirmed from public Dockerfiles, see README)."""
    if version != "2.3":
        return []
    text = (REPO / "docker" / "Dockerfile.isaaclab").read_text(encoding="utf-8")
    tag = re.search(r"^FROM nvcr\.io/nvidia/isaac-lab:(\S+)", text, re.M)
    release = WHEELS[version][0].split("==")[1].split(".post")[0]
    if tag is None or tag.group(1) != release:
        return [f"docker/Dockerfile.isaaclab: base image tag must be isaac-lab:{release}"]
    return []


def main(argv: list[str] | None = None) -> int:
    """Check the selected versions; print each missing name and exit 1 if any."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", choices=sorted(WHEELS), action="append")
    ns = parser.parse_args(argv)
    failures: list[str] = []
    for version in ns.version or sorted(WHEELS):
        found = run(version)
        print(f"{WHEELS[version][0]}: {'ok' if not found else f'{len(found)} missing'}")
        failures += found
    for f in failures:
        print(f"  {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
