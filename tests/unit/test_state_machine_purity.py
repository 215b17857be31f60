"""state_machines/ stays pure: no I/O, clock, randomness, logging or asyncio, nor the shell."""

from __future__ import annotations

from pathlib import Path

import automq_ref.state_machines as machines
from tests.imports import imported_modules, matches

FORBIDDEN = {
    "asyncio",
    "os",
    "time",
    "random",
    "logging",
    "socket",
    "threading",
    "subprocess",
    "datetime",
    "pathlib",
    "io",
    "secrets",
    "uuid",
    "shutil",
    "tempfile",
    "select",
    "selectors",
    "signal",
    "concurrent",
    "multiprocessing",
    "automq_ref.io",
}


def is_forbidden(module: str) -> bool:
    return matches(module, FORBIDDEN)


def test_machines_import_nothing_impure() -> None:
    files = sorted(Path(machines.__file__).parent.rglob("*.py"))
    assert len(files) > 1, "no machine modules found: the check would be vacuous"
    offenders = {
        f"{path.relative_to(Path(machines.__file__).parent)}: {module}"
        for path in files
        for module in imported_modules(path)
        if is_forbidden(module)
    }
    assert not offenders, offenders


def test_the_check_catches_an_impure_import(tmp_path: Path) -> None:
    sample = tmp_path / "impure.py"
    sample.write_text(
        "import os.path\nfrom automq_ref.io.storage.wal_block import BlockWal\nimport enum\n"
    )
    found = {module for module in imported_modules(sample) if is_forbidden(module)}
    assert {"os.path", "automq_ref.io.storage.wal_block"} <= found
    assert not any(module.startswith("enum") for module in found)
