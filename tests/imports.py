"""What the layering tests share: the modules a source file imports, read with ``ast``.

Used by ``tests/unit/test_architecture.py`` (rooms and arrows), ``test_state_machine_purity.py``
and ``test_checker_isolation.py``; all three must see every import form, at any depth of a file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import automq_ref

PACKAGE = Path(automq_ref.__file__).parent
ROOT = PACKAGE.parent


def package_of(path: Path) -> str:
    """The package a module file belongs to (``automq_ref.io.storage`` for wal_block.py)."""
    return ".".join(path.relative_to(ROOT).parts[:-1])


def imported_modules(path: Path, package: str | None = None) -> set[str]:
    """Every module an import statement anywhere in ``path`` names, absolute or relative (relative
    ones resolved against ``package``, by default the file's own); for ``from a import b`` both
    ``a`` and ``a.b`` (``b`` may be a module)."""
    if package is None:
        package = package_of(path) if path.is_relative_to(ROOT) else ""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def matches(module: str, names: set[str] | tuple[str, ...]) -> bool:
    """``module`` is one of ``names`` or inside one of them."""
    return any(module == name or module.startswith(name + ".") for name in names)
