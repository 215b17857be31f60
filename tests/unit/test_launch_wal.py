"""``automq-ref cluster --wal``: what the launcher gives each broker as its WAL (the object WAL in
the bucket by default; with ``device`` a WAL device process of its own) and how it runs and finds
a device, without starting processes (tests/e2e/test_make_cluster.py runs the launcher;
tests/e2e/test_crash_failover_device.py runs brokers on device processes)."""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path

from automq_ref.config import load_config
from automq_ref.io.metadata.failover_contexts import survivors_can_take_over
from automq_ref.launch import (
    SERVING,
    ClusterSettings,
    LocalCluster,
    run,
    wal_device_address,
    wal_device_command,
)


def cluster(wal: str, *overrides: str) -> LocalCluster:
    settings = ClusterSettings(data_dir=Path("/tmp/c"), wal=wal, overrides=overrides)
    made = LocalCluster(settings, threading.Event(), lambda line: None)
    made.s3_endpoint = "http://127.0.0.1:5000"
    return made


def wal_of(made: LocalCluster, node_id: int) -> str:
    return load_config(overrides=made.broker_overrides(node_id)).s3_wal_path


def test_each_broker_gets_its_own_device_or_the_shared_bucket() -> None:
    on_objects = cluster("object")
    assert {wal_of(on_objects, n) for n in (1, 2, 3)} == {
        "0@s3://automq-ref?region=us-east-1&endpoint=http://127.0.0.1:5000&pathStyle=true"
    }
    on_devices = cluster("device")
    on_devices.device_addresses = {1: "127.0.0.1:4001", 2: "127.0.0.1:4002", 3: "127.0.0.1:4003"}
    assert [wal_of(on_devices, n) for n in (1, 2, 3)] == [
        f"0@device://127.0.0.1:400{n}" for n in (1, 2, 3)
    ]
    assert all(survivors_can_take_over(wal_of(on_devices, n)) for n in (1, 2, 3))
    # Before the devices listen (the settings' check), a stand-in of the same form.
    assert load_config(overrides=cluster("device").broker_overrides(2)).wal_device
    # The user's overrides still win.
    mine = cluster("device", "s3.wal.path=0@dir:///shared")
    assert wal_of(mine, 1) == "0@dir:///shared"


def test_a_device_process_command_and_its_address() -> None:
    command = wal_device_command(Path("/d/wal"), 1 << 26)
    assert command[:3] == [sys.executable, "-m", "automq_ref.io.storage.wal_device"]
    assert command[3:] == ["--path", "/d/wal", "--size", str(1 << 26), "--listen", "127.0.0.1:0"]
    assert wal_device_address("") is None
    assert wal_device_address("booting\nwal-device listening 127.0.0.1:4711\n") == "127.0.0.1:4711"


def test_an_unknown_wal_kind_is_refused_before_anything_starts(tmp_path: Path) -> None:
    settings = ClusterSettings(data_dir=tmp_path / "c", base_port=1, wal="tape")
    assert run(settings, io.StringIO()) == 2
    assert not (tmp_path / "c").exists()


def test_the_brokers_run_with_the_zone_router_on_their_bucket() -> None:
    made = cluster("object")
    for node_id in (1, 2, 3):
        config = load_config(overrides=made.broker_overrides(node_id))
        assert config.broker_rack == f"az{node_id}"
        (channel,) = config.zone_router_channels
        assert channel.wal.store_uri == config.object_wal.store_uri  # type: ignore[union-attr]
    # The user's overrides still win: an empty list turns the router off.
    off = load_config(
        overrides=cluster("object", "automq.zonerouter.channels=").broker_overrides(1)
    )
    assert not off.zone_router_enabled


def test_ports_from_a_base_or_as_the_brokers_bound_them(tmp_path: Path) -> None:
    assert ClusterSettings(data_dir=tmp_path, base_port=9092).ports == [9092, 9093, 9094]
    free = ClusterSettings(data_dir=tmp_path, base_port=0)
    assert free.ports == [0, 0, 0]  # each broker binds a free port: listeners=...:0
    free.bound.update({1: 41000, 3: 35001})
    assert free.ports == [41000, 0, 35001]
    match = SERVING.search("automq-ref: serving Kafka on 127.0.0.1:41000 (node 1)")
    assert match is not None and match.group(1) == "41000"
