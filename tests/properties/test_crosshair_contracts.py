"""CrossHair checks the PEP 316 contracts on the machines' small pure helpers.

The ``post:`` lines in the docstrings of the machines (``automq_ref/state_machines/``) state
what a helper promises (a bump moves route and fenced up by one, a catch-up never moves the
channel trim back, a fetch never reads past the applied end, replaying a record twice is
replaying it once, ...).
``crosshair check --analysis_kind=PEP316`` executes each function on symbolic inputs and looks
for an input that breaks a postcondition. One ``crosshair`` run covers every module (one start
up); the tests then read its report line by line:

- no contract has a counterexample or an error;
- a seeded off-by-one copy of ``route_epoch.bumped`` gets a counterexample, so the check can fail.

Both runs are bounded by CrossHair's iteration count (``--max_uninteresting_iterations``), not by
CPU seconds, so their verdict does not depend on how busy the machine is. Whether a contract is
also "Confirmed over all paths" (every path explored: proved for all inputs) does depend on the
budget, so that check (``CONFIRMED``: the contracts over scalars and small frozen records) runs
only in the soak tier (``AUTOMQ_SOAK=1``) with a generous per-condition budget; the counts are in
docs/trace_validation.md.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from automq_ref.state_machines import route_epoch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("crosshair") is None,
    reason="crosshair-tool is not installed (pip install crosshair-tool)",
)

ROOT = Path(__file__).resolve().parents[2]
MACHINES = ROOT / "automq_ref" / "state_machines"
MODULES = (
    "route_epoch",
    "route_epoch_projections",
    "confirm_wal",
    "failover",
    "stream_metadata",
    "placement",
    "log_cache",
    "group",
)
# Iterations without progress before CrossHair moves on: a count, so the same on any machine
# (about 5 s for every module on 2 idle cores).
ITERATIONS = 20
# The soak tier's budget for confirming contracts over all paths: CPU seconds per condition.
CONFIRM_SECONDS_PER_CONDITION = 10.0
CONFIRMED_MESSAGE = "Confirmed over all paths."
REPORT = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<level>\w+): (?P<message>.*)$")

# (module, the postcondition's text): contracts CrossHair proves over all paths.
CONFIRMED = (
    ("route_epoch", "implies(node.up, __return__)"),
    ("route_epoch", "implies(rule is CountRule.ALL, __return__)"),
    ("route_epoch", "__return__.route == old.route + 1 and __return__.fenced == old.fenced + 1"),
    ("route_epoch", "implies(committed_monotone, __return__.committed >= old.committed)"),
    ("route_epoch", "implies(minimum is None, __return__.committed == old.committed)"),
    ("route_epoch", "__return__.view == controller and __return__.up == node.up"),
    (
        "route_epoch",
        "__return__.trimmed >= node.trimmed and __return__.trimmed >= controller.committed",
    ),
    ("route_epoch", "__return__.trimmed in (node.trimmed, controller.committed)"),
    ("confirm_wal", "__return__.resolved == isinstance(record, DataRecord)"),
    ("confirm_wal", "_same_origin(__return__, __return__)"),
    ("confirm_wal", "__return__ == _same_origin(replayed, cached)"),
    (
        "confirm_wal",
        "__return__ is None or (__return__.resolved and _same_origin(entry, __return__))",
    ),
    ("confirm_wal", "__return__ is None or 0 <= partition_offset < state.proxy.exposed_end"),
    ("failover", "implies(__return__ is None, not node.leads and not node.pending)"),
    ("failover", "__return__ >= stream.epoch"),
    (
        "failover",
        "implies(params.open_bumps_epoch or stream.epoch == NO_EPOCH, __return__ > stream.epoch)",
    ),
    ("stream_metadata", "len(__return__) <= 1"),
    (
        "stream_metadata",
        "all(offset_range.start_offset <= s < e == offset_range.end_offset for s, e in __return__)",
    ),
    ("log_cache", "not __return__ or __return__[0].base_offset <= start_offset"),
    ("group", "implies(now_ms < member.session_deadline_ms, not __return__)"),
)
POST = re.compile(r"^\s*(?:\"\"\")?post: (?P<condition>.*?)(?:\"\"\")?$")


def crosshair(
    *targets: str, budget: str = f"--max_uninteresting_iterations={ITERATIONS}"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "crosshair",
            "check",
            "--analysis_kind=PEP316",
            budget,
            "--report_all",
            *targets,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def module_files(module: str) -> list[tuple[str, Path]]:
    """(dotted name, file) of a machine's module, or of every module of the machine's package."""
    package = MACHINES / module
    if not package.is_dir():
        return [(f"automq_ref.state_machines.{module}", MACHINES / f"{module}.py")]
    return [
        (f"automq_ref.state_machines.{module}" + ("" if p.stem == "__init__" else f".{p.stem}"), p)
        for p in sorted(package.glob("*.py"))
    ]


def report_key(path: str | Path, line: int) -> tuple[str, int]:
    """A file and line as the contracts and the report both name them (relative to MACHINES)."""
    return str((ROOT / path).resolve().relative_to(MACHINES)), line


def contracts() -> dict[tuple[str, int], tuple[str, str]]:
    """(file, line) -> (module, condition) for every ``post:`` line of the machines."""
    found: dict[tuple[str, int], tuple[str, str]] = {}
    for module in MODULES:
        for _, path in module_files(module):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if match := POST.match(line):
                    found[report_key(path, number)] = (module, match["condition"])
    return found


@cache
def report(budget: str | None = None) -> tuple[int, dict[tuple[str, int], tuple[str, str]], str]:
    """One CrossHair run over every module: (exit code, (file, line) -> (level, message))."""
    targets = [name for module in MODULES for name, _ in module_files(module)]
    run = crosshair(*targets) if budget is None else crosshair(*targets, budget=budget)
    results: dict[tuple[str, int], tuple[str, str]] = {}
    for line in run.stdout.splitlines():
        if match := REPORT.match(line):
            results[report_key(match["path"], int(match["line"]))] = (
                match["level"],
                match["message"],
            )
    return run.returncode, results, run.stdout + run.stderr


def test_no_contract_has_a_counterexample() -> None:
    returncode, results, output = report()
    failures = {key: value for key, value in results.items() if value[0] != "info"}
    assert not failures, output
    assert returncode == 0, output


def test_every_contract_is_checked() -> None:
    _, results, output = report()
    expected = contracts()
    assert len(expected) >= 20, "the machines lost their contracts"
    missing = {contract for key, contract in expected.items() if key not in results}
    assert not missing, f"CrossHair did not report on {missing}:\n{output}"


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("AUTOMQ_SOAK"), reason="soak tier: AUTOMQ_SOAK=1")
@pytest.mark.parametrize(("module", "condition"), CONFIRMED, ids=[c for _, c in CONFIRMED])
def test_contract_confirmed_over_all_paths(module: str, condition: str) -> None:
    _, results, output = report(f"--per_condition_timeout={CONFIRM_SECONDS_PER_CONDITION}")
    keys = [key for key, contract in contracts().items() if contract == (module, condition)]
    assert len(keys) == 1, f"no single contract {condition!r} in {module}.py"
    assert results.get(keys[0]) == ("info", CONFIRMED_MESSAGE), output


def test_seeded_off_by_one_gets_a_counterexample(tmp_path: Path) -> None:
    """A copy of ``bumped`` whose monotone branch keeps one epoch too little breaks its own
    contract (the committed epoch moves back when the minimum is one below it)."""
    source = inspect.getsource(route_epoch.bumped)
    correct = "committed = max(old.committed, minimum)"
    assert source.count(correct) == 1
    buggy = source.replace(correct, "committed = max(old.committed - 1, minimum)")
    module = tmp_path / "seeded_bumped.py"
    module.write_text(
        "from __future__ import annotations\n\n"
        "from automq_ref.state_machines.route_epoch import EpochRecord\n\n\n" + buggy
    )
    run = crosshair(str(module))
    assert run.returncode == 1, run.stdout + run.stderr
    reports = [m for line in run.stdout.splitlines() if (m := REPORT.match(line))]
    failing = [m for m in reports if m["level"] == "error"]
    assert len(failing) == 1, run.stdout
    assert "false when calling bumped" in failing[0]["message"], run.stdout
    broken = module.read_text().splitlines()[int(failing[0]["line"]) - 1]
    assert "implies(committed_monotone, __return__.committed >= old.committed)" in broken
