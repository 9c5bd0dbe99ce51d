"""The client stands alone: `gateway.client` and `gateway.conformance` import nothing of the gateway but
`gateway.protocol`, and know one era type, `gateway.protocol.era.Era`.

Their import statements are read from the source (every one, those inside functions too), so a server
import cannot hide behind a lazy import; a fresh interpreter that imports every module of both packages
then shows what they pull in, `gateway.protocol`'s own imports included.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("gateway/client", "gateway/conformance")
ALLOWED = ("gateway.protocol", "gateway.client", "gateway.conformance")
"""The gateway modules the client may import (and their submodules)."""
PACKAGE_ROOT_NAMES = {"__version__"}
"""What `from gateway import ...` may take: the package's version, never a module of it."""
ERA_STRINGS = {"legacy", "modern", "2025-11-25", "2026-07-28"}


def sources() -> list[Path]:
    files = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    assert len(files) >= 10, files
    return files


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, a module of `package`; `from X import a` yields `X.a`
    (a may be a module)."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def is_allowed(name: str) -> bool:
    if name != "gateway" and not name.startswith("gateway."):
        return True  # the standard library or a third-party package
    if name.startswith("gateway.") and name.count(".") == 1:
        return name.removeprefix("gateway.") in PACKAGE_ROOT_NAMES or name in ALLOWED
    return any(name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED)


@pytest.mark.parametrize("path", sources(), ids=lambda path: str(path.relative_to(ROOT)))
def test_client_and_conformance_import_no_server_module(path: Path) -> None:
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = imported(path.read_text(encoding="utf-8"), package)
    offending = [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in found if not is_allowed(name)]
    assert not offending, "a server module imported by the client:\n" + "\n".join(offending)


def test_the_import_check_catches_server_imports() -> None:
    """The check itself: top-level, function-level and relative server imports are all caught."""
    assert not is_allowed("gateway.app") and not is_allowed("gateway.events.capture") and not is_allowed("gateway")
    assert not is_allowed("gateway.sessions") and not is_allowed("gateway.config")
    assert is_allowed("gateway.protocol.era.Era") and is_allowed("gateway.__version__") and is_allowed("aiohttp")
    source = "def f():\n    from gateway.app import build_app\n    from ..events import capture\n"
    names = [name for _, name in imported(source, "gateway.client")]
    assert names == ["gateway.app.build_app", "gateway.events.capture"]
    assert not any(is_allowed(name) for name in names)


def test_importing_the_client_loads_no_server_module() -> None:
    """Every module of both packages imported in a fresh interpreter: only `gateway`, `gateway.protocol`
    and the client's own modules are loaded, and no pydantic (the server's config)."""
    modules = [module_name(path) for path in sources()]
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True).stdout)
    server = [name for name in loaded if name.startswith("gateway.") and not is_allowed(name)]
    assert not server, server
    assert "pydantic" not in loaded


# -- one era type ----------------------------------------------------------------------------------


def era_strings_in(node: ast.AST) -> list[str]:
    """The era names or versions spelled out as strings directly in `node` (a tuple's elements too)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [item.value for item in items if isinstance(item, ast.Constant) and item.value in ERA_STRINGS]


def era_spellings(source: str, label: str) -> list[str]:
    """Each place `source` (the file `label`) models an era itself: a comparison or a table keyed by an
    era's string, a `Literal` of era strings, an `Era` not protocol's, or a type of its own named so."""
    found = []
    for node in ast.walk(ast.parse(source)):
        problem = era_spelling(node)
        if problem is not None:
            found.append(f"{label}:{getattr(node, 'lineno', '?')}: {problem}")
    return found


def era_spelling(node: ast.AST) -> str | None:
    if isinstance(node, ast.Compare) and any(era_strings_in(side) for side in [node.left, *node.comparators]):
        return "compares with an era string"
    if isinstance(node, ast.Dict) and any(key is not None and era_strings_in(key) for key in node.keys):
        return "a table keyed by era strings"
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal") and era_strings_in(node.slice):
        return "a Literal of era strings"
    imports_era = isinstance(node, ast.ImportFrom) and any(alias.name == "Era" for alias in node.names)
    if imports_era and getattr(node, "module", None) != "gateway.protocol.era":
        return f"Era imported from {getattr(node, 'module', None)}, not gateway.protocol.era"
    names = [node.name] if isinstance(node, ast.ClassDef) else []
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names += [target.id for target in targets if isinstance(target, ast.Name)]
    own = [name for name in names if name in ("Era", "EraName")]
    return f"its own era type {own[0]}" if own else None


def test_one_era_type_and_no_era_strings_compared() -> None:
    found: list[str] = []
    for path in sources():
        found += era_spellings(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_era_check_catches_what_it_looks_for() -> None:
    source = (
        "from typing import Literal\n"
        "from gateway.conformance.registry import Era\n"
        'EraName = Literal["legacy", "modern"]\n'
        'TABLE = {"legacy": {}, "modern": {}}\n'
        'def f(era: str) -> bool:\n    return era == "modern" or era in ("legacy",)\n'
    )
    found = era_spellings(source, "probe.py")
    assert len(found) == 6, found
