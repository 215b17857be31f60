"""``automq-ref verify`` keeps Spark's JVM noise out of its stderr unless ``--verbose``.

The command runs as a user runs it (a subprocess, stderr a pipe) on a small produced topic, once
plain and once with ``--verbose``. Plain, stderr holds only the command's own progress lines:
none of the JVM's ``WARNING:`` lines, log4j's banner and WARN lines, the shell's log-level
banner or Spark's stage bars. Verbose, Spark's own start-up lines are back. Two JVM starts (about
10 s each here) are the cost; the module's broker is shared.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.spark.produce import ProduceSettings, produce

ROOT = Path(__file__).resolve().parents[2]
# What Spark prints when left to itself (the start-up banners are printed by Spark's code
# whenever its default log4j profile is in use, so a verbose run always has them).
NOISE = (
    re.compile(r"^WARNING: "),  # the JVM's own (incubator modules, ...)
    re.compile(r"Using Spark's default log4j profile"),
    re.compile(r"Setting default log level"),
    re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO) "),  # log4j
    re.compile(r"\[Stage \d+:"),  # console progress bars
)
BANNERS = ("Using Spark's default log4j profile", 'Setting default log level to "WARN"')


@pytest.fixture(scope="module")
def manifest(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("quiet") / "manifest.json"
    result = produce(
        ProduceSettings(bootstrap=broker.bootstrap, topic="quiet", partitions=2, records=200)
    )
    assert result.failed == 0
    result.manifest.write(path)
    return path


def verify(broker: BrokerProcess, manifest: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "automq_ref.cli",
            "verify",
            "--manifest",
            str(manifest),
            "--bootstrap",
            broker.bootstrap,
            "--master",
            "local[2]",
            "--report",
            str(manifest.parent / f"report{'-'.join(flags)}"),
            *flags,
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def noise(stderr: str) -> list[str]:
    return [
        line
        for line in stderr.replace("\r", "\n").splitlines()
        if any(pattern.search(line) for pattern in NOISE)
    ]


def test_verify_without_verbose_prints_only_its_progress(
    broker: BrokerProcess, manifest: Path
) -> None:
    result = verify(broker, manifest)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["ok"]
    assert noise(result.stderr) == []
    lines = result.stderr.splitlines()
    assert lines[0] == "automq-ref verify: 0 s: starting Spark, step 1/5"
    assert all(line.startswith("automq-ref verify: ") for line in lines), result.stderr
    assert any(": reading the topic, step 2/5" in line for line in lines), result.stderr
    final = r"automq-ref verify: (\d+ s|\d+m\d\ds): verdict, step 5/5"
    assert re.fullmatch(final, lines[-1]), lines[-1]


def test_verify_with_verbose_lets_spark_speak(broker: BrokerProcess, manifest: Path) -> None:
    result = verify(broker, manifest, "--verbose")
    assert result.returncode == 0, result.stderr
    for banner in BANNERS:
        assert banner in result.stderr
    assert noise(result.stderr)
