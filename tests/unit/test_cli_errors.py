"""Every command that cannot do its work says so in one line and exits 2 (issue 15).

Each test runs ``python -m automq_ref.cli`` as a user would and checks the one line on stderr,
``automq-ref <command>: <what went wrong>; <what to do>``, and the exit code. Nothing here needs
a broker: the failures are refused before one would be reached.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from automq_ref.checker.nemesis import NEMESES
from automq_ref.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "automq_ref.cli", *arguments],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on (the OS just handed it out and it was closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_serve_on_a_taken_port_names_it_and_the_setting_before_writing_anything(
    tmp_path: Path, taken_port: int
) -> None:
    data = tmp_path / "data"
    result = run_cli(
        "serve",
        "--override",
        f"listeners=PLAINTEXT://127.0.0.1:{taken_port}",
        "--override",
        f"log.dirs={data}",
        cwd=tmp_path,
    )
    line = one_line(result)
    assert result.returncode == 2
    assert line.startswith(f"automq-ref serve: cannot listen on 127.0.0.1:{taken_port}: ")
    assert "already in use" in line
    assert f"--override listeners=PLAINTEXT://127.0.0.1:{taken_port + 1}" in line
    assert not (data / "wal").exists()
    assert not data.exists() or not any(data.iterdir())
    assert result.stdout == ""


def test_an_unknown_setting_is_refused_with_the_nearest_known_name(tmp_path: Path) -> None:
    result = run_cli("serve", "--override", "listener=PLAINTEXT://127.0.0.1:0", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref serve: unknown setting 'listener'; did you mean 'listeners'?"
    )


def test_an_unknown_setting_far_from_any_points_to_the_list(tmp_path: Path) -> None:
    result = run_cli("serve", "--override", "zzz=1", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref serve: unknown setting 'zzz'; docs/broker.md lists the settings"
    )


def test_a_bad_value_is_one_line_naming_the_property_without_pydantic_boilerplate(
    tmp_path: Path,
) -> None:
    result = run_cli("serve", "--override", "s3.wal.capacity=abc", cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("automq-ref serve: s3.wal.capacity='abc': input should be a valid")
    assert "pydantic" not in line and "validation error" not in line
    assert "further information" not in line
    assert not (tmp_path / "data").exists()


def test_each_config_problem_is_its_own_line() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=["node.id=-1", "listeners=PLAINTEXT://a", "log.dir=x"])
    assert caught.value.problems == (
        "unknown setting 'log.dir'; did you mean 'log.dirs'?",
        "node.id='-1': input should be greater than or equal to 0",
        "listeners='PLAINTEXT://a': a listener is NAME://host:port, e.g. "
        "PLAINTEXT://127.0.0.1:9092",
    )


def test_a_problem_across_settings_names_both(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "--override",
        "group.min.session.timeout.ms=9",
        "--override",
        "group.max.session.timeout.ms=1",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref serve: group.min.session.timeout.ms must not exceed "
        "group.max.session.timeout.ms"
    )


def test_an_unreadable_config_file_is_one_line(tmp_path: Path) -> None:
    result = run_cli("serve", "--config", "missing.properties", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result).startswith(
        "automq-ref serve: cannot read --config missing.properties: "
    )


def test_certificates_are_written_once(tmp_path: Path) -> None:
    written = run_cli("certificates", "certs", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert sorted(p.name for p in (tmp_path / "certs").iterdir()) == [
        "broker.pem",
        "ca.pem",
        "client.pem",
    ]
    again = run_cli("certificates", "certs", cwd=tmp_path)
    assert again.returncode == 2
    assert one_line(again) == (
        "automq-ref certificates: certs already holds ca.pem, broker.pem, client.pem; "
        "remove them or name another directory"
    )


def test_an_unknown_nemesis_lists_the_known_ones(tmp_path: Path) -> None:
    result = run_cli("check", "--nemesis", "explode", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref check: unknown nemesis 'explode'; --nemesis takes a comma-separated list "
        "of kill, pause, wal-loss, s3, net, etcd-pause, pause-past-session, graceful-restart, "
        "s3-faults, zone-partition"
    )
    assert not (tmp_path / "out").exists()


def test_a_misspelt_nemesis_gets_the_nearest_match(tmp_path: Path) -> None:
    result = run_cli("check", "--nemesis", "kill,wal_loss", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result).endswith("; did you mean 'wal-loss'?")


def test_an_unknown_broken_mode_gets_the_nearest_match(tmp_path: Path) -> None:
    result = run_cli("check", "--broken", "ack-before-fsynk", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result).startswith(
        "automq-ref check: unknown --broken mode 'ack-before-fsynk';"
    )
    assert one_line(result).endswith("; did you mean 'ack-before-fsync'?")


def test_check_help_lists_every_nemesis(tmp_path: Path) -> None:
    result = run_cli("check", "--help", cwd=tmp_path)
    assert result.returncode == 0
    help_text = " ".join(result.stdout.split())
    assert f"any of: {', '.join(NEMESES)}" in help_text
    assert set(NEMESES) == {
        "kill",
        "pause",
        "wal-loss",
        "s3",
        "net",
        "etcd-pause",
        "pause-past-session",
        "graceful-restart",
        "s3-faults",
        "zone-partition",
    }


def test_etcd_pause_needs_a_cluster(tmp_path: Path) -> None:
    result = run_cli("check", "--nemesis", "kill,etcd-pause", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref check: the etcd-pause nemesis needs a cluster (one broker runs without etcd); "
        "add --brokers 3, or leave it out of --nemesis"
    )
    assert not (tmp_path / "out").exists()


def test_pause_past_session_needs_a_cluster(tmp_path: Path) -> None:
    result = run_cli("check", "--nemesis", "pause-past-session", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result).startswith(
        "automq-ref check: the pause-past-session nemesis needs a cluster"
    )
    assert not (tmp_path / "out").exists()


def test_no_runs_and_no_fault_interval_are_refused(tmp_path: Path) -> None:
    result = run_cli("check", "--runs", "0", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == "automq-ref check: --runs must be at least 1, not 0"
    result = run_cli("check", "--fault-interval", "0", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == "automq-ref check: --fault-interval must be positive, not 0.0"
    assert not (tmp_path / "out").exists()


def test_wal_loss_needs_the_file_wal(tmp_path: Path) -> None:
    result = run_cli("check", "--wal", "s3", "--nemesis", "wal-loss", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref check: the wal-loss nemesis undoes what a WAL file wrote; with --wal s3 "
        "leave it out of --nemesis"
    )
    assert not (tmp_path / "out").exists()


def test_a_cluster_of_no_brokers_is_refused(tmp_path: Path) -> None:
    result = run_cli("check", "--brokers", "0", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref check: --brokers must be at least 1, not 0; 1 checks one broker, 3 a cluster"
    )
    assert not (tmp_path / "out").exists()


def test_a_cluster_check_without_etcd_says_what_to_install(tmp_path: Path) -> None:
    """PATH without etcd (the interpreter is run by its full path)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "automq_ref.cli", "check", "--brokers", "3", "--out", "out"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref check: etcd is not on PATH; a cluster check (--brokers above 1) runs "
        "Debian's etcd: apt-get install -y etcd-server"
    )
    assert not (tmp_path / "out").exists()


def test_produce_against_no_broker_names_the_address(tmp_path: Path, closed_port: int) -> None:
    result = run_cli(
        "produce",
        "--bootstrap",
        f"127.0.0.1:{closed_port}",
        "--topic",
        "t",
        "--records",
        "10",
        "--manifest",
        "m.json",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert one_line(result).startswith(
        f"automq-ref produce: no broker answers at 127.0.0.1:{closed_port} (connection refused);"
    )
    assert not (tmp_path / "m.json").exists()


def test_produce_with_a_malformed_bootstrap_says_the_form(tmp_path: Path) -> None:
    result = run_cli(
        "produce", "--bootstrap", "localhost", "--topic", "t", "--records", "1",
        "--manifest", "m.json", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref produce: --bootstrap 'localhost' is not HOST:PORT; "
        "pass e.g. --bootstrap 127.0.0.1:9092"
    )


def test_verify_against_no_broker_names_the_address(tmp_path: Path, closed_port: int) -> None:
    (tmp_path / "m.json").write_text(json.dumps({}))
    result = run_cli(
        "verify", "--manifest", "m.json", "--bootstrap", f"127.0.0.1:{closed_port}", cwd=tmp_path
    )
    assert result.returncode == 2
    assert one_line(result).startswith(
        f"automq-ref verify: no broker answers at 127.0.0.1:{closed_port} (connection refused);"
    )


def test_verify_without_a_manifest_says_where_one_comes_from(tmp_path: Path) -> None:
    result = run_cli(
        "verify", "--manifest", "none.json", "--bootstrap", "127.0.0.1:1", cwd=tmp_path
    )
    assert result.returncode == 2
    assert one_line(result) == (
        "automq-ref verify: no manifest at none.json; pass the file "
        "`automq-ref produce --manifest` wrote"
    )


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (
            ["--source", "automq-objects"],
            "--path (a broker's log.dirs) or --metadata-etcd-endpoints (a cluster's etcd) is "
            "needed with --source automq-objects",
        ),
        (
            ["--source", "automq-objects", "--path", "data", "--metadata-etcd-endpoints", "a:1"],
            "--path and --metadata-etcd-endpoints name two metadata logs; give --path for a "
            "broker's log.dirs or --metadata-etcd-endpoints for a cluster's, not both",
        ),
        (
            ["--source", "automq-objects", "--metadata-etcd-endpoints", "a:1"],
            "--object-store is needed with --metadata-etcd-endpoints; pass the brokers' "
            "s3.data.buckets",
        ),
        (
            ["--source", "automq-objects", "--path", "data", "--cluster-id", "c"],
            "--cluster-id needs --metadata-etcd-endpoints (a cluster's metadata log)",
        ),
        (
            ["--bootstrap", "127.0.0.1:1", "--metadata-etcd-endpoints", "a:1"],
            "--metadata-etcd-endpoints and --cluster-id apply only to --source automq-objects; "
            "the automq source finds everything through --bootstrap",
        ),
        (
            ["--source", "automq-objects", "--metadata-etcd-endpoints", "localhost",
             "--object-store", "file:///o"],
            "--metadata-etcd-endpoints: 'localhost': expected host:port (or http://host:port); "
            "pass the brokers' metadata.etcd.endpoints",
        ),
        (
            ["--source", "automq-objects", "--metadata-etcd-endpoints", "a:1", "--cluster-id",
             "a/b", "--object-store", "file:///o"],
            "--cluster-id: 'a/b': must be non-empty, without '/'; pass the brokers' cluster.id",
        ),
    ],
)  # fmt: skip
def test_verify_names_a_bad_choice_of_metadata_log(
    tmp_path: Path, arguments: list[str], line: str
) -> None:
    (tmp_path / "m.json").write_text(json.dumps({}))
    result = run_cli("verify", "--manifest", "m.json", *arguments, cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == f"automq-ref verify: {line}"


def test_verify_against_no_etcd_names_the_address_before_spark_starts(
    tmp_path: Path, closed_port: int
) -> None:
    (tmp_path / "m.json").write_text(json.dumps({}))
    result = run_cli(
        "verify", "--manifest", "m.json", "--source", "automq-objects",
        "--metadata-etcd-endpoints", f"http://127.0.0.1:{closed_port}", "--cluster-id", "c",
        "--object-store", "file:///o", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert one_line(result) == (
        f"automq-ref verify: no etcd answers at 127.0.0.1:{closed_port} (connection refused); "
        "start it or pass the brokers' metadata.etcd.endpoints"
    )


def test_an_unreachable_etcd_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    result = run_cli(
        "serve",
        "--override",
        f"metadata.etcd.endpoints=127.0.0.1:{dead}",
        "--override",
        "listeners=PLAINTEXT://127.0.0.1:0",
        "--override",
        "controller.request.timeout.ms=1000",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith(f"automq-ref serve: cannot reach etcd at 127.0.0.1:{dead}: "), line
    assert line.endswith("start etcd there or correct metadata.etcd.endpoints")


def test_the_checkers_broker_refuses_an_unknown_log_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from automq_ref.checker import serve

    with pytest.raises(SystemExit) as exit_info:
        serve.main(["--log-level", "loud"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'loud'" in capsys.readouterr().err
