"""What the broker logs, read from the log as a person (and grep) would: ``key=value`` fields that
split back; a reason told once per client and then kept to DEBUG; a TLS client on the plaintext
listener named as such once per host (a real ClientHello from Python's ssl module), an HTTP client
likewise; new connections logged in bursts, not one line each; and, from a node in process, one
line per topic created or deleted, per group generation, an upload summary, and a summary of
the reads from objects."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import re
import socket
import ssl
import struct
from pathlib import Path
from typing import cast

import pytest
from kio.schema.join_group.v3.request import JoinGroupRequestProtocol

from automq_ref.config import load_config
from automq_ref.io.clock import SystemClock
from automq_ref.io.logfmt import fields
from automq_ref.io.storage import storage_log
from automq_ref.io.storage.block_cache import BlockCacheStats
from automq_ref.io.storage.object_store import CountingReads, LocalDirectoryObjectStore
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.io.storage.storage_totals import UploadTotals
from automq_ref.kafka import server as kafka_server
from automq_ref.kafka.notices import Notices
from automq_ref.kafka.server import KafkaServer, Peer, Reply
from automq_ref.node import start_node
from tests.unit.test_broker_node import call

FIELD = re.compile(r'(?:^|\s)([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|\S*)')


def parse_fields(line: str) -> dict[str, str]:
    """The ``key=value`` fields of a log line (a quoted value is a JSON string)."""
    return {
        key: json.loads(value) if value.startswith('"') else value
        for key, value in FIELD.findall(line)
    }


def lines(caplog: pytest.LogCaptureFixture, start: str, level: int = logging.INFO) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == level and record.getMessage().startswith(start)
    ]


def test_fields_split_back() -> None:
    line = fields(
        topic="orders",
        partitions=3,
        configs={"retention.ms": "1000", "cleanup.policy": "delete"},
        reason='not "here" at all',
        empty="",
        seconds=0.25,
    )
    assert line.startswith("topic=orders partitions=3 ")
    assert parse_fields(line) == {
        "topic": "orders",
        "partitions": "3",
        "configs": "cleanup.policy=delete,retention.ms=1000",
        "reason": 'not "here" at all',
        "empty": "",
        "seconds": "0.25",
    }


def test_notices_tell_once_per_key_then_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    notices = Notices(logging.getLogger("test.notices"), capacity=2)
    for _ in range(3):
        notices.tell(("tls", "10.0.0.1"), "TLS handshake", client="10.0.0.1:1")
    notices.tell(("tls", "10.0.0.2"), "TLS handshake", client="10.0.0.2:1")
    warnings = lines(caplog, "TLS handshake", logging.WARNING)
    assert warnings == ["TLS handshake client=10.0.0.1:1", "TLS handshake client=10.0.0.2:1"]
    assert len(lines(caplog, "TLS handshake", logging.DEBUG)) == 2
    # Past its capacity the oldest key is forgotten, and would be told again.
    notices.tell(("tls", "10.0.0.3"), "TLS handshake", client="10.0.0.3:1")
    assert notices.first(("tls", "10.0.0.1"))


class Echo:
    def __init__(self) -> None:
        self.frames = 0

    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        self.frames += 1
        return [bytes(frame[:8])]


def tls_handshake(port: int) -> str:
    """A real TLS client's attempt on ``port``: its ClientHello is sent, the broker closes."""
    context = ssl.create_default_context()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost"):
                return "handshake completed"
        except (ssl.SSLError, OSError) as error:
            return type(error).__name__


def http_get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        return raw.recv(100)


async def test_tls_and_http_clients_are_named_once_per_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="automq_ref.kafka.server")
    handler = Echo()
    server = KafkaServer(handler)
    host, port = await server.start("127.0.0.1", 0)
    try:
        for _ in range(3):
            outcome = await asyncio.to_thread(tls_handshake, port)
            assert outcome != "handshake completed"
            assert await asyncio.to_thread(http_get, port) == b""  # closed, nothing answered
        # The listener still serves Kafka afterwards.
        reader, writer = await asyncio.open_connection(host, port)
        payload = struct.pack(">hhi", 18, 0, 9)
        writer.write(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        assert await reader.readexactly(size) == payload
        writer.close()
    finally:
        await server.close()
    tls = lines(caplog, "TLS handshake on a plaintext listener", logging.WARNING)
    assert len(tls) == 1, tls
    assert "security.protocol=PLAINTEXT" in tls[0]
    assert parse_fields(tls[0])["client"].startswith("127.0.0.1:")
    assert len(lines(caplog, "TLS handshake on a plaintext listener", logging.DEBUG)) == 2
    http = lines(caplog, "HTTP request on the Kafka listener", logging.WARNING)
    assert len(http) == 1, http
    assert handler.frames == 1  # neither reached the handler
    assert not lines(caplog, "closing a connection", logging.WARNING)


async def test_an_oversized_frame_is_told_once_per_host(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="automq_ref.kafka.server")
    server = KafkaServer(Echo(), max_request_bytes=1024)
    _, port = await server.start("127.0.0.1", 0)
    try:
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(struct.pack(">i", 4096) + b"\x00" * 8)
            assert await reader.read() == b""
            writer.close()
    finally:
        await server.close()
    told = lines(caplog, "closing a connection: a frame's size", logging.WARNING)
    assert len(told) == 1, told
    assert parse_fields(told[0])["size"] == "4096"
    assert parse_fields(told[0])["limit"] == "1024"


async def test_connections_are_logged_in_bursts(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_server, "CONNECTION_LOG_WINDOW_S", 0.3)
    caplog.set_level(logging.INFO, logger="automq_ref.kafka.server")
    server = KafkaServer(Echo())
    _, port = await server.start("127.0.0.1", 0)
    try:
        writers = []
        for _ in range(5):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writers.append(writer)
        await asyncio.sleep(0.5)  # the window ends: one line for the four after the first
        await asyncio.sleep(0.5)  # a quiet window: no line
        for writer in writers:
            writer.close()
    finally:
        await server.close()
    connected = lines(caplog, "client connected")
    assert len(connected) == 1, connected
    assert parse_fields(connected[0])["open"] == "1"
    bursts = lines(caplog, "client connections")
    assert len(bursts) == 1, bursts
    burst = parse_fields(bursts[0])
    assert (burst["client"], burst["new"], burst["open"]) == ("127.0.0.1", "4", "5")
    assert float(burst["seconds"]) == pytest.approx(0.3)


async def test_node_logs_topics_groups_and_uploads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage_log, "UPLOAD_LOG_INTERVAL_S", 0.2)
    caplog.set_level(logging.INFO)
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        await node.topics.create_topic("logged", 2, {"retention.ms": "60000"})
        await asyncio.sleep(0.5)  # an upload summary (creating a topic uploads its skeleton)
        joined = await call(
            node.front_end.admit,
            Peer(1, "10.0.0.9:5000"),
            11,  # JoinGroup v3
            3,
            group_id="readers",
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10),
            member_id="",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
        assert joined.generation_id == 1
        await node.topics.delete_topic("logged")
    finally:
        await node.shutdown()
    assert len(lines(caplog, "WAL recovered")) == 1
    assert parse_fields(lines(caplog, "WAL recovered")[0])["records"] == "0"
    assert len(lines(caplog, "node started")) == 1
    # The test's topic, then the groups' internal one, created by the first group request.
    created = lines(caplog, "topic created")
    assert [parse_fields(line)["topic"] for line in created] == ["logged", "__consumer_offsets"]
    assert parse_fields(created[1])["configs"] == "cleanup.policy=compact"
    assert {key: parse_fields(created[0])[key] for key in ("topic", "partitions", "configs")} == {
        "topic": "logged",
        "partitions": "2",
        "configs": "retention.ms=60000",
    }
    deleted = lines(caplog, "topic deleted")
    assert len(deleted) == 1
    assert parse_fields(deleted[0])["topic"] == "logged"
    rebalanced = lines(caplog, "group rebalanced")
    assert len(rebalanced) == 1, rebalanced
    group = parse_fields(rebalanced[0])
    assert (group["group"], group["generation"], group["members"]) == ("readers", "1", "1")
    assert group["leader"] == joined.member_id
    uploads = lines(caplog, "uploaded seconds=")
    assert uploads, caplog.text
    upload = parse_fields(uploads[0])
    assert int(upload["blocks"]) >= 1 and int(upload["objects"]) >= 1
    assert int(upload["bytes"]) > 0 and int(upload["streams"]) >= 1


class _ReadingStorage:
    """What the node's log task asks of the storage: reads from objects and the cache's size."""

    def __init__(self, tmp_path: Path) -> None:
        self.reads = CountingReads(LocalDirectoryObjectStore(tmp_path))
        self.block_cache_bytes = 0

    def take_upload_totals(self) -> UploadTotals:
        return UploadTotals()

    def block_cache_stats(self) -> BlockCacheStats:
        return BlockCacheStats(self.block_cache_bytes, self.block_cache_bytes, 0, 0, 0, 0, 0, 0, 0)


async def test_reads_from_objects_are_summed_with_the_cache_peak(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage_log, "READ_LOG_INTERVAL_S", 0.2)
    caplog.set_level(logging.INFO)
    storage = _ReadingStorage(tmp_path)
    await storage.reads.put("object", b"x" * 100)
    task = asyncio.create_task(
        storage_log.log_storage_forever(cast(S3Storage, storage), SystemClock())
    )
    try:
        storage.block_cache_bytes = 4096
        await storage.reads.get_range("object", 0, 10)
        await storage.reads.get_range("object", 10, 40)
        for _ in range(200):  # the line (the hang guard is generous: the machine is shared)
            if lines(caplog, "read objects"):
                break
            await asyncio.sleep(0.05)
        storage.block_cache_bytes = 1024  # after the line: not in it
        await asyncio.sleep(0.5)  # quiet intervals: no more lines
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    read = lines(caplog, "read objects")
    assert len(read) == 1, read
    found = parse_fields(read[0])
    assert (found["gets"], found["bytes"], found["cache_peak_bytes"]) == ("2", "40", "4096")
    assert (storage.reads.gets, storage.reads.get_bytes) == (0, 0)  # taken
