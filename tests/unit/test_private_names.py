"""Nothing outside a module reads its ``_private`` names (ps/ and launcher/).

A private name is one that starts with one underscore. A module may use the private names
it defines itself (its functions, classes, globals and the ``self._x`` attributes its classes
set); reading one that only another of our modules defines is a violation, whatever the
object it is read from. Private names that none of our modules defines belong to other
libraries (MXNet's ``_LIB``, a Trainer's ``_kvstore``): those are not ours to police.
A private *module* may be imported only from inside its own top-level package.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ps", "launcher")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path))
            for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))}


def _defined(tree: ast.Module) -> set[str]:
    """Private names a module defines: defs, classes, assigned names and attributes, slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)        # __slots__ entries, setattr/getattr of its own names
    return {n for n in names if _private(n)}


def _top(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


def _module_exists(parts: list[str]) -> bool:
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _absolute(path: Path, node: ast.ImportFrom) -> list[str]:
    if not node.level:
        return (node.module or "").split(".")
    pkg = list(path.relative_to(ROOT).parts[:-1])
    base = pkg[: len(pkg) - node.level + 1]
    return base + (node.module.split(".") if node.module else [])


def violations() -> list[str]:
    sources = _sources()
    defined = {path: _defined(tree) for path, tree in sources.items()}
    ours = set().union(*defined.values())
    bad = []
    for path, tree in sources.items():
        where = path.relative_to(ROOT)
        own = defined[path]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr in ours \
                    and node.attr not in own:
                bad.append(f"{where}:{node.lineno} reads .{node.attr}, private to another module")
            elif isinstance(node, ast.ImportFrom):
                mod = _absolute(path, node)
                if mod and mod[0] in PACKAGES:
                    outside = mod[0] != _top(path)
                    if outside and any(_private(p) for p in mod):
                        bad.append(f"{where}:{node.lineno} imports {'.'.join(mod)}, private to {mod[0]}")
                    for alias in node.names:
                        if _private(alias.name) and not _module_exists(mod + [alias.name]):
                            bad.append(f"{where}:{node.lineno} imports {alias.name} from {'.'.join(mod)}")
                        elif _private(alias.name) and outside:
                            bad.append(f"{where}:{node.lineno} imports module {alias.name}, private to {mod[0]}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] in PACKAGES and parts[0] != _top(path) and any(_private(p) for p in parts):
                        bad.append(f"{where}:{node.lineno} imports {alias.name}, private to {parts[0]}")
    return bad


def test_no_module_reads_another_modules_private_names():
    bad = violations()
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_private_read(tmp_path, monkeypatch):
    """The check itself can fail: a module reading another's ``_private`` attribute is reported."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "ps" / "a.py").write_text("class A:\n    def __init__(self):\n        self._secret = 1\n")
    (tmp_path / "ps" / "b.py").write_text("from .a import A\n\ndef peek(a):\n    return a._secret\n")
    (tmp_path / "launcher" / "c.py").write_text("from ps._hidden import x\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    found = violations()
    assert any("b.py:4 reads ._secret" in v for v in found), found
    assert any("c.py:1 imports ps._hidden" in v for v in found), found
