"""Fault injection stays in the checker: no module under automq_ref/ outside checker/ imports
``automq_ref.checker.faults`` or ``automq_ref.checker.broken`` (nor ``automq_ref.checker.serve``,
which installs them); a broker gets the test-only modes only through the seams it offers."""

from __future__ import annotations

from pathlib import Path

from tests.imports import PACKAGE, imported_modules, matches, package_of

FAULT_MODULES = (
    "automq_ref.checker.faults",
    "automq_ref.checker.broken",
    "automq_ref.checker.serve",
)


def is_fault_code(module: str) -> bool:
    return matches(module, FAULT_MODULES)


def production_modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "checker" not in path.relative_to(PACKAGE).parts
    ]


def test_no_production_module_imports_fault_injection() -> None:
    files = production_modules()
    assert any(path.name == "wal_block.py" for path in files), "the check would be vacuous"
    offenders = {
        f"{path.relative_to(PACKAGE)}: {module}"
        for path in files
        for module in imported_modules(path, package_of(path))
        if is_fault_code(module)
    }
    assert not offenders, offenders


def test_the_check_catches_every_import_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    package = "automq_ref.io.storage"
    forms = [
        "import automq_ref.checker.faults",
        "from automq_ref.checker.broken import seams_for",
        "from automq_ref.checker import faults",
        "from ...checker import broken",
        "def late():\n    from automq_ref.checker.faults import lose_unsynced_tail",
    ]
    for form in forms:
        sample.write_text(form + "\n")
        assert any(is_fault_code(module) for module in imported_modules(sample, package)), form
    sample.write_text("from automq_ref.checker import history\nimport automq_ref.io\n")
    assert not any(is_fault_code(module) for module in imported_modules(sample, package))
