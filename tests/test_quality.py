"""The code stays as STYLE.md asks: formatted by ruff, ruff-clean (blind excepts and unused
suppressions included), strict mypy over everything (contracts, services, tests, bench: the
paths are in pyproject.toml), services that import only `contracts`, the shared helpers and
themselves, no giant modules, and nothing shipped that only the tests use."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# they start the services: any may be imported
WIRING = {"services/cli.py", "services/up.py", "services/supervisor.py", "services/config_reference.py"}
# a process that serves several roles composes those services (and imports them)
COMPOSITES = {"worker": ("encoder", "dispatcher", "parser")}
MAX_LINES = 400
CODE = ["contracts", "services", "tests", "bench"]
WORD = re.compile(r"\w+")
# shipped though only tests call them, each for a reason: the simulator is a test double whose
# hooks are its API; the nkey codec keeps both directions; the docs generator's check
FOR_TESTS = {
    "services/simengine/": "the simulated engine's hooks",
    "services/common/wire_auth.py:encode_seed": "the nkey codec's other direction",
    "services/common/wire_auth.py:decode_public_key": "the nkey codec's other direction",
    "services/config_reference.py:generated_part": "what the docs check compares",
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff() -> None:
    result = run("ruff", "check", *CODE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = run("ruff", "format", "--check", *CODE)
    assert result.returncode == 0, "run `ruff format`:\n" + result.stdout + result.stderr


def test_mypy_strict_everywhere() -> None:
    result = run("mypy")  # strict, over the files pyproject.toml names
    assert result.returncode == 0, result.stdout + result.stderr


def imported_names(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in a module, at any depth: ``import a.b`` gives
    ``a.b``, ``from a import b`` gives ``a.b``; relative imports are resolved in the package;
    ``importlib.import_module("a.b")`` gives ``a.b``, and a computed name counts as importing
    another service (only the wiring may)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, module if alias.name == "*" else f"{module}.{alias.name}"
        elif isinstance(node, ast.Call) and _dynamic_import(node.func):
            # importlib.import_module / __import__: the module named, or "?" when it is computed
            first = node.args[0] if node.args else None
            named = isinstance(first, ast.Constant) and isinstance(first.value, str)
            yield node.lineno, first.value if named else "services.?dynamic"  # type: ignore[union-attr]


def _dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def allowed_first_party(rel: str) -> tuple[str, ...] | None:
    """The `contracts`/`services` packages a module may import from (None: any)."""
    parts = rel.split("/")
    if parts[0] == "contracts":
        return ("contracts",)
    if rel in WIRING:
        return None
    if len(parts) > 2 and parts[1] != "common":  # services/<name>/...: its own service
        composed = tuple(f"services.{name}" for name in COMPOSITES.get(parts[1], ()))
        return ("contracts", "services.common", f"services.{parts[1]}", *composed)
    return ("contracts", "services.common")  # services/common/ and services/__init__.py


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_import_boundaries() -> None:
    """contracts/ imports no service; a service imports `contracts`, `services.common` and
    itself, never another service (a composite imports the services it runs together); only the
    wiring (cli.py, up.py, supervisor.py) imports them all."""
    offences = []
    for path in sorted([*(ROOT / "contracts").rglob("*.py"), *(ROOT / "services").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        allowed = allowed_first_party(rel)
        if allowed is None:
            continue
        for line, name in imported_names(path):
            first_party = within(name, "contracts") or within(name, "services")
            if first_party and not any(within(name, prefix) for prefix in allowed):
                offences.append(f"{rel}:{line} imports {name}")
    assert not offences, "imports across service boundaries:\n" + "\n".join(offences)


def test_module_size() -> None:
    """Modules stay under MAX_LINES lines (STYLE.md: 100-400, split before 800)."""
    too_long = []
    for top in ("contracts", "services", "tests", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines >= MAX_LINES:
                too_long.append(f"{path.relative_to(ROOT).as_posix()}: {lines} lines")
    assert not too_long, f"modules of {MAX_LINES} lines or more:\n" + "\n".join(too_long)


def test_nothing_shipped_only_for_tests() -> None:
    """A function or class defined in contracts/ or services/ is used there (by name: a route,
    a validator or a protocol method registered by decorator or by its name counts), not only
    by the tests; test helpers live under tests/."""
    sources = {p: p.read_text() for top in ("contracts", "services") for p in sorted((ROOT / top).rglob("*.py"))}
    defined: dict[str, list[str]] = {}
    for path, text in sources.items():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.setdefault(node.name, []).append(rel)
    shipped = Counter(WORD.findall("\n".join(sources.values())))
    tested = set(
        WORD.findall("\n".join(p.read_text() for top in ("tests", "bench") for p in (ROOT / top).rglob("*.py")))
    )
    offences = []
    for name, where in sorted(defined.items()):
        if name.startswith("__") or shipped[name] > len(where) or name not in tested:
            continue  # used where it ships (or by nobody: a registered handler)
        for rel in where:
            if not any(rel.startswith(k) or f"{rel}:{name}" == k for k in FOR_TESTS):
                offences.append(f"{rel}: {name}")
    assert not offences, "defined in services, used only by tests (move it under tests/):\n" + "\n".join(offences)


def test_every_imported_package_is_declared() -> None:
    """What contracts/ and services/ import outside the standard library comes from a
    distribution pyproject.toml names: a plain `pip install .` has it, not only the test extra's
    dependencies' dependencies."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.split(r"[<>=!~\[ ;]", d)[0].lower().replace("_", "-") for d in dependencies}
    distributions = packages_distributions()
    undeclared = set()
    for top in ("contracts", "services"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for package in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - {*CODE}:
                    found = {d.lower().replace("_", "-") for d in distributions.get(package, [package])}
                    if not found & declared:
                        undeclared.add(f"{path.relative_to(ROOT).as_posix()}: {package} ({', '.join(sorted(found))})")
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(sorted(undeclared))
