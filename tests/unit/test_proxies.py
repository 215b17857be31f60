"""The checker's fault-injecting proxies, and what the broker does behind them.

TcpProxy against a small echo server: transparent forwarding, delay, black hole and heal, reset;
then a real broker process reached by confluent-kafka clients only through the proxy (the broker
advertises the proxy's address). S3FaultProxy in front of moto: the project's S3ObjectStore
through it (put, get, ranged get, list, delete), then 503s, ambiguous successes and latency.
Last, a broker process whose objects go through the S3 proxy while a producer runs through
503, ambiguous and slow windows: every acknowledged record is read back after healing and again
after a graceful restart (which reads from the objects), and the broker never dies.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.checker.cluster import BrokerProcess, free_port
from automq_ref.checker.proxies import S3FaultProxy, TcpProxy
from automq_ref.checker.workload import read_partition
from automq_ref.io.storage.object_store import ObjectStoreUnavailable, S3ObjectStore
from tests.conftest import MotoS3
from tests.waiting import wait_until

# ---------------------------------------------------------------------------------------------
# Helpers


class EchoServer:
    """Echoes every byte back, on a thread; closes its side when the client closes."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                try:
                    conn.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def tcp_proxy(echo: EchoServer) -> Iterator[TcpProxy]:
    proxy = TcpProxy("127.0.0.1", echo.port)
    proxy.start()
    yield proxy
    proxy.stop()


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def round_trip(sock: socket.socket, payload: bytes) -> float:
    started = time.monotonic()
    sock.sendall(payload)
    assert receive_exactly(sock, len(payload)) == payload
    return time.monotonic() - started


def fresh_bucket() -> str:
    return f"proxied-{uuid.uuid4().hex[:20]}"


# ---------------------------------------------------------------------------------------------
# TcpProxy


def test_tcp_proxy_forwards_both_ways_transparently(tcp_proxy: TcpProxy) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
    with connect(tcp_proxy.port) as sock:
        sock.sendall(payload)
        assert receive_exactly(sock, len(payload)) == payload
        round_trip(sock, b"x")  # a small write is passed on by itself, not held for more
    # The proxy counts a chunk once it is written, so the echo can reach us before its count.
    total = len(payload) + 1
    wait_until(
        lambda: min(tcp_proxy.stats["bytes_up"], tcp_proxy.stats["bytes_down"]) >= total,
        "the count",
    )
    stats = tcp_proxy.stats
    assert stats["connections"] == 1
    assert stats["bytes_up"] == stats["bytes_down"] == len(payload) + 1
    assert stats["dropped_bytes"] == stats["resets"] == 0


def test_tcp_proxy_eof_is_passed_on(tcp_proxy: TcpProxy) -> None:
    with connect(tcp_proxy.port) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)  # the echo server sees EOF and closes its side
        assert receive_exactly(sock, 10) == b"last words"
        assert sock.recv(1) == b""


def test_tcp_proxy_delay_adds_latency_and_keeps_order(tcp_proxy: TcpProxy) -> None:
    with connect(tcp_proxy.port) as sock:
        round_trip(sock, b"warm")
        tcp_proxy.set_delay(0.15)
        for index in range(20):  # many small writes, each its own chunk, in order
            sock.sendall(f"{index:03d}".encode())
        assert receive_exactly(sock, 60) == b"".join(f"{i:03d}".encode() for i in range(20))
        assert round_trip(sock, b"ping") >= 0.29  # up and down, each delayed
        # The heal lifts any delay: with a minute's delay left in place the round trip would
        # outlast the socket's 5 s timeout, however slow the machine.
        tcp_proxy.set_delay(60)
        tcp_proxy.heal()
        round_trip(sock, b"fast")


def test_tcp_proxy_drop_black_holes_then_heal_serves_new_connections(
    tcp_proxy: TcpProxy,
) -> None:
    with connect(tcp_proxy.port) as before:
        round_trip(before, b"hello")
        before.settimeout(0.5)  # a black hole answers nothing, however long one waits
        tcp_proxy.set_drop(True)
        before.sendall(b"into the void")
        with pytest.raises(TimeoutError):
            before.recv(1)
        with connect(tcp_proxy.port, timeout=0.5) as during:  # accepted, and black-holed too
            during.sendall(b"anyone?")
            with pytest.raises(TimeoutError):
                during.recv(1)
        dropped = len(b"into the void") + len(b"anyone?")
        wait_until(lambda: tcp_proxy.stats["dropped_bytes"] >= dropped, f"{dropped} bytes dropped")
        tcp_proxy.heal()
        with connect(tcp_proxy.port) as after:
            round_trip(after, b"back again")


def test_tcp_proxy_stall_holds_bytes_and_delivers_them_in_order_after_heal(
    tcp_proxy: TcpProxy,
) -> None:
    with connect(tcp_proxy.port) as sock:
        round_trip(sock, b"hello")
        sock.settimeout(0.5)  # stalled bytes never arrive before the heal
        tcp_proxy.set_stall(True)
        sock.sendall(b"held ")
        sock.sendall(b"back")
        with pytest.raises(TimeoutError):
            sock.recv(1)
        tcp_proxy.heal()
        sock.settimeout(5)
        assert receive_exactly(sock, 9) == b"held back"  # nothing lost, order kept
        assert tcp_proxy.stats["dropped_bytes"] == 0


def kafka_header(client_id: str | None, body: bytes = b"") -> bytes:
    """A request frame as a Kafka client writes it: size, API key, version, correlation id,
    the client id (int16 length, -1 for null), then ``body``."""
    encoded = b"" if client_id is None else client_id.encode()
    length = -1 if client_id is None else len(encoded)
    frame = struct.pack(">hhih", 3, 7, 1, length) + encoded + body
    return struct.pack(">i", len(frame)) + frame


def test_tcp_proxy_cut_holds_only_the_connections_whose_client_id_it_names(
    tcp_proxy: TcpProxy,
) -> None:
    cut_one = kafka_header("automq_az=az2", b"first")
    with (
        connect(tcp_proxy.port) as cut,
        connect(tcp_proxy.port) as kept,
        connect(tcp_proxy.port) as unnamed,
    ):
        # The header may come in pieces: the client id is read once it is whole.
        cut.sendall(cut_one[:9])
        time.sleep(0.05)
        cut.sendall(cut_one[9:])
        assert receive_exactly(cut, len(cut_one)) == cut_one
        round_trip(kept, kafka_header("automq_az=az1"))
        round_trip(unnamed, kafka_header(None))
        tcp_proxy.set_cut(lambda client_id: client_id == "automq_az=az2")
        cut.settimeout(0.5)
        cut.sendall(b"held ")
        cut.sendall(b"back")
        with pytest.raises(TimeoutError):
            cut.recv(1)
        round_trip(kept, b"still flowing")  # other connections are not cut
        round_trip(unnamed, b"nor this one")
        with connect(tcp_proxy.port, timeout=0.5) as new:  # a new one is cut too
            new.sendall(kafka_header("automq_az=az2"))
            with pytest.raises(TimeoutError):
                new.recv(1)
            tcp_proxy.set_cut(None)
            cut.settimeout(5)
            assert receive_exactly(cut, 9) == b"held back"  # in order, nothing lost
            new.settimeout(5)
            assert receive_exactly(new, len(kafka_header("automq_az=az2"))) == kafka_header(
                "automq_az=az2"
            )
        assert tcp_proxy.held_client_ids() == {"automq_az=az2"}
        assert tcp_proxy.held_client_ids() == set()  # asked again: nothing new
        tcp_proxy.set_cut(lambda _: True)
        tcp_proxy.heal()  # the heal ends a cut too
        round_trip(cut, b"healed")
        assert tcp_proxy.stats["dropped_bytes"] == 0


def test_tcp_proxy_reset_all_aborts_clients(tcp_proxy: TcpProxy) -> None:
    clients = [connect(tcp_proxy.port, timeout=2) for _ in range(3)]
    try:
        for sock in clients:
            round_trip(sock, b"up")
        assert tcp_proxy.reset_all() == 3
        for sock in clients:
            with pytest.raises((ConnectionResetError, EOFError, BrokenPipeError)):
                # An RST: recv raises ECONNRESET (or sees the end), a send fails.
                sock.sendall(b"after")
                receive_exactly(sock, 5)
        assert tcp_proxy.stats["resets"] == 3
        with connect(tcp_proxy.port) as fresh:
            round_trip(fresh, b"still serving")
    finally:
        for sock in clients:
            sock.close()


def test_tcp_proxy_is_controlled_from_another_thread(tcp_proxy: TcpProxy) -> None:
    """The nemesis thread: toggles while traffic flows, then heals; nothing hangs."""
    stop = threading.Event()

    def nemesis() -> None:
        while not stop.is_set():
            tcp_proxy.set_delay(0.01)
            tcp_proxy.set_delay(0.0)

    thread = threading.Thread(target=nemesis)
    thread.start()
    try:
        with connect(tcp_proxy.port) as sock:
            for index in range(50):
                round_trip(sock, f"message {index}".encode())
    finally:
        stop.set()
        thread.join()


def test_kafka_clients_produce_and_consume_through_the_tcp_proxy(tmp_path: Path) -> None:
    broker_port = free_port()
    proxy = TcpProxy("127.0.0.1", broker_port)
    proxy.start()
    broker = BrokerProcess(
        tmp_path / "data", f"advertised.listeners=PLAINTEXT://127.0.0.1:{proxy.port}"
    )
    broker.port = broker_port
    broker.start()
    try:
        bootstrap = f"127.0.0.1:{proxy.port}"
        topic = "through-the-proxy"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for index in range(100):
            producer.produce(topic, f"v{index}".encode(), partition=index % 2)
        assert producer.flush(30) == 0
        values = consume(bootstrap, topic, 2, expected=100)
        assert sorted(values) == sorted(f"v{index}" for index in range(100))
        stats = proxy.stats
        assert stats["connections"] >= 1 and stats["bytes_up"] > 0 and stats["bytes_down"] > 0
    finally:
        if broker.alive():
            broker.stop()
        proxy.stop()


def consume(
    bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 30
) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < expected and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.5):
                if message.error() is None:
                    values.append((message.value() or b"").decode())
    finally:
        consumer.close()
    return values


# ---------------------------------------------------------------------------------------------
# S3FaultProxy with the project's S3ObjectStore


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[S3FaultProxy]:
    proxy = S3FaultProxy(moto_s3.endpoint_url, seed=7)
    proxy.start()
    yield proxy
    proxy.stop()


def proxied_store(
    moto_s3: MotoS3, proxy: S3FaultProxy, bucket: str, **options: object
) -> S3ObjectStore:
    settings: dict[str, object] = {
        "endpoint_url": proxy.url,
        "region": moto_s3.region,
        "access_key_id": moto_s3.access_key_id,
        "secret_access_key": moto_s3.secret_access_key,
        "path_style": True,
        "max_attempts": 3,
        "backoff_base_ms": 5,
        "backoff_max_ms": 20,
        "backoff_jitter_ms": 5,
    }
    settings.update(options)
    return S3ObjectStore(bucket, **settings)  # type: ignore[arg-type]


async def test_s3_proxy_is_transparent_when_healed(moto_s3: MotoS3, s3_proxy: S3FaultProxy) -> None:
    async with proxied_store(moto_s3, s3_proxy, fresh_bucket()) as store:
        await store.create_bucket_if_missing()
        big = bytes(range(256)) * 8192  # 2 MiB: large enough for botocore's Expect header
        info = await store.put("a/big", [big[:1000], big[1000:]])
        assert info.size_bytes == len(big)
        assert await store.get("a/big") == big
        assert await store.get_range("a/big", 1000, 5096) == big[1000:5096]  # 206
        assert await store.get_range("a/big", 7, 7) == b""  # a HEAD
        assert (await store.head("a/big")).size_bytes == len(big)
        await store.put_if_absent("a/odd key+%/é", b"unicode and reserved characters")
        assert await store.get("a/odd key+%/é") == b"unicode and reserved characters"
        keys = [f"list/{index:02d}" for index in range(12)]
        await asyncio.gather(*(store.put(key, key.encode()) for key in keys))
        assert [item.key for item in await store.list("list/")] == keys
        await store.delete("a/big")
        await store.delete_many(keys)  # a POST with a body
        assert [item.key for item in await store.list()] == ["a/odd key+%/é"]
    stats = s3_proxy.stats
    assert stats["requests"] >= 20
    assert stats["errors_injected"] == stats["ambiguous_injected"] == stats["delayed"] == 0


async def test_s3_proxy_errors_are_503_slowdown_and_retried_as_configured(
    moto_s3: MotoS3, s3_proxy: S3FaultProxy
) -> None:
    async with proxied_store(moto_s3, s3_proxy, fresh_bucket()) as store:
        await store.create_bucket_if_missing()
        s3_proxy.set_faults(error_rate=1.0)
        with pytest.raises(ObjectStoreUnavailable) as raised:
            await store.put("never", b"stored")
        assert raised.value.attempts == 3
        assert "SlowDown" in str(raised.value)
        assert s3_proxy.stats["errors_injected"] == 3
        s3_proxy.heal()
        assert [item.key for item in await store.list()] == []  # never forwarded
        await store.put("now", b"stored")
        assert await store.get("now") == b"stored"


async def test_s3_proxy_ambiguous_put_raises_yet_lands(
    moto_s3: MotoS3, s3_proxy: S3FaultProxy
) -> None:
    async with proxied_store(moto_s3, s3_proxy, fresh_bucket()) as store:
        await store.create_bucket_if_missing()
        s3_proxy.set_faults(ambiguous_rate=1.0)
        for key in ("first", "second"):  # a 500 first, a cut connection next, alternately
            with pytest.raises(ObjectStoreUnavailable) as raised:
                await store.put(key, key.encode() * 10)
            assert "InternalError" in str(raised.value) or "closed" in str(raised.value)
        assert s3_proxy.stats["ambiguous_injected"] == 6
        s3_proxy.heal()
        assert await store.get("first") == b"first" * 10
        assert await store.get("second") == b"second" * 10
        # A conditional put whose first attempt landed: the retry's 412 is resolved as ours.
        s3_proxy.set_faults(ambiguous_rate=1.0)
        with pytest.raises(ObjectStoreUnavailable):
            await store.put_if_absent("fence", b"mine")
        s3_proxy.heal()
        assert await store.get("fence") == b"mine"


async def test_s3_proxy_latency_shows(moto_s3: MotoS3, s3_proxy: S3FaultProxy) -> None:
    async with proxied_store(moto_s3, s3_proxy, fresh_bucket()) as store:
        await store.create_bucket_if_missing()
        await store.put("k", b"v")
        s3_proxy.set_faults(latency_s=0.25)
        started = time.monotonic()
        assert await store.get("k") == b"v"
        assert time.monotonic() - started >= 0.25
        assert s3_proxy.stats["delayed"] == 1
        s3_proxy.heal()
        await store.get("k")
        assert s3_proxy.stats["delayed"] == 1  # the healed proxy delays nothing more


async def test_s3_proxy_faults_limited_to_puts_leave_reads_alone(
    moto_s3: MotoS3, s3_proxy: S3FaultProxy
) -> None:
    """The s3-faults nemesis fails or slows PUTs alone: reads and lists pass untouched."""
    async with proxied_store(moto_s3, s3_proxy, fresh_bucket()) as store:
        await store.create_bucket_if_missing()
        await store.put("old", b"readable")
        s3_proxy.set_faults(error_rate=1.0, methods=("put",))
        with pytest.raises(ObjectStoreUnavailable):
            await store.put("new", b"refused")
        assert await store.get("old") == b"readable"
        assert [item.key for item in await store.list()] == ["old"]
        assert s3_proxy.stats["errors_injected"] == 3  # the three PUT attempts, nothing else
        s3_proxy.set_faults(latency_s=0.25, methods=("PUT",))
        started = time.monotonic()
        assert await store.get("old") == b"readable"
        assert time.monotonic() - started < 0.25
        await store.put("slow", b"landed")
        assert time.monotonic() - started >= 0.25
        assert s3_proxy.stats["delayed"] == 1
        s3_proxy.heal()
        assert await store.get("slow") == b"landed"


# ---------------------------------------------------------------------------------------------
# A broker whose objects go through the S3 proxy


class AckedProducer:
    """Produces unique values on a thread; remembers each acknowledged (partition, offset)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.acked: dict[tuple[int, int], str] = {}
        self.failed: list[str] = []
        self._topic = topic
        self._partitions = partitions
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 60000,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        value = (message.value() or b"").decode()
        if error is not None:
            self.failed.append(f"{value}: {error}")
            return
        offset = message.offset()
        partition = message.partition()
        assert offset is not None and partition is not None
        self.acked[(partition, offset)] = value

    def _run(self) -> None:
        count = 0
        while not self._stop.is_set():
            value = f"value-{count}-" + "x" * 200
            self._producer.produce(
                self._topic,
                value.encode(),
                partition=count % self._partitions,
                on_delivery=self._delivered,
            )
            self._producer.poll(0)
            count += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        assert self._producer.flush(60) == 0


def read_all(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"final-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    found: dict[tuple[int, int], str] = {}
    try:
        for partition in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 30)
            read, _ = read_partition(consumer, topic, partition, low, high)
            found.update(((partition, offset), value) for offset, value in read)
    finally:
        consumer.close()
    return found


def requests_since(proxy: S3FaultProxy, before: int) -> bool:
    return proxy.stats["requests"] > before


def test_broker_keeps_every_acked_record_through_s3_faults(
    tmp_path: Path, moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = fresh_bucket()

    async def create_bucket() -> None:
        async with S3ObjectStore(
            bucket,
            endpoint_url=moto_s3.endpoint_url,
            access_key_id=moto_s3.access_key_id,
            secret_access_key=moto_s3.secret_access_key,
        ) as store:
            await store.create_bucket_if_missing()

    asyncio.run(create_bucket())
    proxy = S3FaultProxy(moto_s3.endpoint_url, seed=11)
    proxy.start()
    # The broker process finds its credentials the way botocore does: the environment.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_s3.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3.secret_access_key)
    broker = BrokerProcess(
        tmp_path / "data",
        f"s3.data.buckets=s3://{bucket}?region=us-east-1&endpoint={proxy.url}&pathStyle=true",
        "s3.wal.upload.threshold=32768",
        "s3.wal.upload.interval.ms=200",
        "s3.wal.cache.size=1048576",  # small: the cache lets go of committed blocks early
    )
    partitions = 2
    topic = "s3-faults"
    try:
        began = time.monotonic()
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(30)
        del admin
        print(f"broker started, topic created in {time.monotonic() - began:.1f} s")
        producer = AckedProducer(broker.bootstrap, topic, partitions)
        producer.start()
        windows: list[dict[str, Any]] = [
            {"error_rate": 1.0},
            {"ambiguous_rate": 1.0},
            {"latency_s": 0.3},
            {"error_rate": 0.3, "ambiguous_rate": 0.3, "latency_s": 0.05},
        ]
        for faults in windows:
            time.sleep(0.5)
            proxy.set_faults(**faults)
            before = proxy.stats["requests"]  # every request counted from here meets the faults
            time.sleep(1.5)
            # The window lasts until an S3 request has met it: the broker may spend all of the
            # 1.5 s waiting out an upload retry's backoff, the longer the busier the machine.
            wait_until(functools.partial(requests_since, proxy, before), f"S3 under {faults}")
            proxy.heal()
            assert broker.alive(), f"the broker died under {faults}"
        time.sleep(0.5)
        producer.stop()
        acked = producer.acked
        del producer  # no client left retrying against the broker stopped below
        stopped_producing = time.monotonic()
        stats = proxy.stats
        assert stats["errors_injected"] > 0 and stats["ambiguous_injected"] > 0
        assert stats["delayed"] > 0
        assert acked, "nothing was acknowledged"
        assert broker.alive()
        after_heal = read_all(broker.bootstrap, topic, partitions)
        assert_contains(after_heal, acked)
        read_back = time.monotonic()
        assert broker.stop() == 0, "the graceful stop failed"
        requests_before_restart = proxy.stats["requests"]
        stopped = time.monotonic()
        broker.start()  # recovers nothing: everything is in objects, read back through S3
        after_restart = read_all(broker.bootstrap, topic, partitions)
        print(
            f"acked {len(acked)}; read back in {read_back - stopped_producing:.1f} s, "
            f"stopped in {stopped - read_back:.1f} s, restarted and read in "
            f"{time.monotonic() - stopped:.1f} s; proxy {proxy.stats}"
        )
        assert_contains(after_restart, acked)
        assert proxy.stats["requests"] > requests_before_restart
    finally:
        if broker.alive():
            broker.stop()
        proxy.stop()


def assert_contains(found: dict[tuple[int, int], str], acked: dict[tuple[int, int], str]) -> None:
    lost = {key: value for key, value in acked.items() if found.get(key) != value}
    assert not lost, (
        f"{len(lost)} of {len(acked)} acknowledged records lost or changed, e.g. "
        f"{sorted(lost.items())[:3]}"
    )
