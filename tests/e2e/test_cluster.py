"""Three brokers on one etcd and one object store, driven by real clients (confluent-kafka,
kafka-python, kcat): partitions spread over the brokers, moved by hand while a producer runs,
the active controller killed, etcd stopped, a broker paused until it is fenced. Whatever
happens, every acknowledged record is read back at the offset it was acknowledged at, and each
producer's records come back in the order it sent them, per partition.

One cluster serves the whole module (three ``automq-ref serve`` processes cost seconds to start
on a small machine): etcd from ``tests/etcd_fixture.py``, a local directory as the shared object
store, brokers 1-3 in racks az1-az3 on ports the OS hands out. Every test starts from a whole
cluster (a broker a failed test left dead is started again, a paused one resumed) and leaves
the processes it disturbed running; the module stops everything and removes its data at the
end, however the tests went (a failed module keeps the brokers' logs and says where).

Sessions are short here (``broker.session.timeout.ms`` 3 s, heartbeats every 0.5 s) so that a
paused broker is fenced quickly; the controller's lease is 2 s. Timings (a controller takeover,
the longest gap between acknowledgements on a moved partition) are printed; the tests assert
only bounds far above them, the machine being shared.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from automq_ref.checker.cluster import BrokerProcess
from tests.e2e.test_cluster_failover import controller_node
from tests.etcd_fixture import EtcdServer, unique_cluster_id
from tests.waiting import PATIENCE_S, wait_until

NODES = (1, 2, 3)
TTL_MS = 2000
SESSION_MS = 3000
HEARTBEAT_MS = 500
PARTITIONS = 12
# A generous bound on a takeover (the target is TTL + 1 s, printed): far above any healthy run
# on a busy machine, it fails only on a takeover that does not happen.
TAKEOVER_BOUND_S = 30.0
ETCD_DOWN_S = 5.0
METADATA = 3  # Kafka's API key; version 1 names racks and the controller
METADATA_VERSION = 1


# ------------------------------------------------------------------------------- the cluster


class Cluster:
    """Three brokers on one etcd member and one object store: a directory under ``root``, or
    ``store`` (the brokers' ``s3.data.buckets``, e.g. an S3 bucket); ``overrides`` go to every
    broker."""

    def __init__(
        self, root: Path, etcd: EtcdServer, store: str | None = None, overrides: Sequence[str] = ()
    ) -> None:
        self.root = root
        self.etcd = etcd
        self.etcd_paused = False
        self.cluster_id = unique_cluster_id("cluster")
        self.store = (root / "objects").as_uri() if store is None else store
        common = (
            f"metadata.etcd.endpoints={etcd.endpoint}",
            f"cluster.id={self.cluster_id}",
            f"s3.data.buckets={self.store}",
            f"controller.lease.ttl.ms={TTL_MS}",
            f"broker.session.timeout.ms={SESSION_MS}",
            f"broker.heartbeat.interval.ms={HEARTBEAT_MS}",
            *overrides,
        )
        self.brokers = {
            node: BrokerProcess(
                root / f"broker-{node}", *common, f"node.id={node}", f"broker.rack=az{node}"
            )
            for node in NODES
        }
        self.paused: set[int] = set()

    def bootstrap(self, nodes: Iterable[int] = NODES) -> str:
        return ",".join(self.brokers[node].bootstrap for node in nodes)

    def controller(self) -> int | None:
        """The node id in etcd's election key (None while no broker holds it)."""
        return controller_node(self.etcd.endpoint, self.cluster_id)

    def pause(self, node: int) -> None:
        self.brokers[node].pause()
        self.paused.add(node)

    def resume(self, node: int) -> None:
        self.brokers[node].resume()
        self.paused.discard(node)

    def heal(self) -> None:
        """Every process running again: etcd resumed (or started), paused brokers resumed,
        dead ones started on their data."""
        if self.etcd_paused:
            self.etcd.resume()
            self.etcd_paused = False
        if self.etcd.process is None or self.etcd.process.poll() is not None:
            self.etcd.start()
        for node in sorted(self.paused):
            self.resume(node)
        for broker in self.brokers.values():
            if not broker.alive():
                broker.start()

    def stop(self) -> None:
        """Every broker stopped gracefully (killed if it does not stop), the active controller
        last, so the others' last requests still find one."""
        for node in sorted(self.paused):
            with contextlib.suppress(Exception):
                self.resume(node)
        controller = None
        with contextlib.suppress(Exception):
            controller = self.controller()
        last = [controller] if controller in NODES else []
        for node in [*(n for n in NODES if n not in last), *last]:
            broker = self.brokers[node]
            if broker.alive():
                try:
                    broker.stop()
                except Exception:  # a broker that does not stop in time is killed
                    broker.kill()


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    failed_before = request.session.testsfailed
    with running_cluster(lambda: request.session.testsfailed > failed_before) as made:
        yield made


@contextlib.contextmanager
def running_cluster(
    failed: Callable[[], bool], store: str | None = None, overrides: Sequence[str] = ()
) -> Iterator[Cluster]:
    """A started :class:`Cluster` in a temporary directory, whole (three live brokers agreeing
    on one controller), stopped and removed at the end (its logs kept, and named, when
    ``failed()`` says the tests using it failed). Shared with the Spark tests, which run it on
    S3."""
    root = Path(tempfile.mkdtemp(prefix="automq-ref-cluster-"))
    (root / "etcd").mkdir()
    etcd = EtcdServer(root / "etcd")
    made: Cluster | None = None
    try:
        etcd.start()
        made = Cluster(root, etcd, store, overrides)
        for broker in made.brokers.values():
            broker.start()
        wait_until(lambda: _whole(made), "three live brokers agreeing on one controller")
        yield made
    finally:
        if made is not None:
            made.stop()
        etcd.stop()
        dropped = [] if made is None else _unawaited(made)
        if failed() or dropped:
            # The data goes (WALs are preallocated), the logs stay.
            for path in [*root.glob("broker-*"), root / "objects", root / "etcd" / "data"]:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
            print(f"\ncluster tests failed: the brokers' logs are kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    assert not dropped, f"brokers dropped coroutines unawaited: {dropped}"


def _unawaited(cluster: Cluster) -> list[str]:
    return [line for b in cluster.brokers.values() for line in b.unawaited_coroutines()]


@pytest.fixture(autouse=True)
def whole(cluster: Cluster) -> Iterator[Cluster]:
    """Each test starts on a whole cluster: three live brokers that every broker's Metadata
    lists, and an active controller."""
    cluster.heal()
    wait_until(lambda: _whole(cluster), "three live brokers agreeing on one controller")
    yield cluster
    cluster.heal()


def _whole(cluster: Cluster) -> bool:
    try:
        answers = [metadata(cluster.brokers[node]) for node in NODES]
    except OSError:
        return False
    return all(set(answer.racks) == set(NODES) for answer in answers) and (
        cluster.controller() in NODES
    )


# ---------------------------------------------------------------- Metadata from one broker


@dataclass(frozen=True, slots=True)
class Metadata:
    """One broker's Metadata answer: live brokers (with racks), the controller it names, and
    each topic's partitions with their leader (-1: none) and error code."""

    racks: dict[int, str | None]
    controller: int
    leaders: dict[str, dict[int, int]]
    errors: dict[str, dict[int, int]]


class _Chunks(list[bytes]):
    def write(self, chunk: bytes) -> int:
        self.append(bytes(chunk))
        return len(chunk)


def metadata(broker: BrokerProcess) -> Metadata:
    """Ask exactly this broker (a client library would ask whichever broker it likes)."""
    request_cls: Any = load_request_schema(METADATA, METADATA_VERSION)
    response_cls: Any = load_response_schema(METADATA, METADATA_VERSION)
    out = _Chunks()
    header_cls: Any = request_cls.__header_schema__
    write_header: Any = entity_writer(header_cls)
    write_body: Any = entity_writer(request_cls)
    write_header(
        out,
        header_cls(
            request_api_key=METADATA,
            request_api_version=METADATA_VERSION,
            correlation_id=1,
            client_id="cluster-test",
        ),
    )
    write_body(out, request_cls(topics=None))
    payload = b"".join(out)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _receive(sock, 4))[0]
        data = _receive(sock, size)
    _, offset = entity_reader(response_cls.__header_schema__)(data, 0)
    answer, _ = entity_reader(response_cls)(data, offset)
    return Metadata(
        racks={int(b.node_id): b.rack for b in answer.brokers},
        controller=int(answer.controller_id),
        leaders={
            str(t.name): {int(p.partition_index): int(p.leader_id) for p in t.partitions}
            for t in answer.topics
        },
        errors={
            str(t.name): {int(p.partition_index): int(p.error_code) for p in t.partitions}
            for t in answer.topics
        },
    )


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def leaders(cluster: Cluster, topic: str, nodes: Iterable[int] = NODES) -> dict[int, int] | None:
    """The topic's leaders, when every broker in ``nodes`` answers the same ones and each
    partition has a live leader; else None."""
    answers = []
    for node in nodes:
        try:
            answer = metadata(cluster.brokers[node])
        except OSError:
            return None
        found = answer.leaders.get(topic)
        if not found or any(leader not in answer.racks for leader in found.values()):
            return None
        answers.append(found)
    first = answers[0]
    return first if all(answer == first for answer in answers) else None


def agreed_leaders(cluster: Cluster, topic: str, nodes: Iterable[int] = NODES) -> dict[int, int]:
    nodes = tuple(nodes)
    found: dict[int, int] = {}

    def agreed() -> bool:
        nonlocal found
        found = leaders(cluster, topic, nodes) or {}
        return bool(found)

    try:
        wait_until(agreed, f"brokers {nodes} agreeing on the leaders of {topic}")
    except AssertionError as error:
        raise AssertionError(f"{error}: {describe(cluster, topic)}") from None
    return found


def describe(cluster: Cluster, topic: str) -> str:
    """What each broker answers about ``topic`` (for a failure's message)."""
    answers = []
    for node in NODES:
        try:
            answer = metadata(cluster.brokers[node])
        except OSError as error:
            answers.append(f"broker {node}: {error!r}")
            continue
        answers.append(
            f"broker {node}: brokers {sorted(answer.racks)}, leaders "
            f"{answer.leaders.get(topic)}, errors {answer.errors.get(topic)}"
        )
    return "; ".join(answers)


# ------------------------------------------------------------------------------ clients


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(
    bootstrap: str, name: str, partitions: int, assignment: list[list[int]] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = (
        NewTopic(name, partitions)
        if assignment is None
        else NewTopic(name, len(assignment), replica_assignment=assignment)
    )
    for future in admin.create_topics([topic], request_timeout=PATIENCE_S).values():
        future.result(PATIENCE_S)


def create_topic_through_election(bootstrap: str) -> list[str]:
    """Create a new topic of 2 partitions through ``bootstrap``; the creations the controller
    gave no decision (REQUEST_TIMED_OUT: a controller election with them in flight) are tried
    again under a new name until one is created, within the tests' patience. Returns their
    errors."""
    deadline = time.monotonic() + PATIENCE_S
    undecided: list[str] = []
    while True:
        try:
            create_topic(bootstrap, unique("after-etcd"), 2)
            return undecided
        except KafkaException as error:
            code = error.args[0].code()
            if code != KafkaError.REQUEST_TIMED_OUT or time.monotonic() > deadline:
                raise
            undecided.append(str(error))


UNKNOWN_OFFSET = -1


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    offset: int  # UNKNOWN_OFFSET when the client was not told it
    value: bytes
    at: float  # time.monotonic() when the client saw the acknowledgement


@dataclass
class RunningProducer:
    """confluent-kafka, idempotent, acks=all, in a thread of its own: one record per partition
    every ``interval_s`` until stopped, values ``<name>-<partition>-<sequence>`` (the sequence
    counts per partition, so the order it sent them in is in the value)."""

    bootstrap: str
    topic: str
    partitions: tuple[int, ...]
    name: str = "ck"
    interval_s: float = 0.02
    # What a failure's message says about the cluster.
    diagnose: Callable[[], str] = lambda: ""
    # Where librdkafka's debug log of its idempotence, messages and brokers goes, if anywhere.
    client_log: Path | None = None
    acks: list[Ack] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _abandon: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> RunningProducer:
        self._thread = threading.Thread(target=self._run, name=f"producer-{self.name}")
        self._thread.start()
        return self

    def __exit__(self, kind: object, *exc_info: object) -> None:
        if kind is None:
            self.stop()
        else:  # the test failed already: stop without waiting for deliveries
            self._abandon.set()
            self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(PATIENCE_S + 10)
            assert not self._thread.is_alive(), "the producer did not stop"
            self._thread = None

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        now = time.monotonic()
        value = message.value() or b""
        with self._lock:
            if error is None:
                # None: librdkafka answers a DUPLICATE_SEQUENCE_NUMBER (the broker had the batch
                # already: a retry after a kill) as delivered, at an offset it does not know.
                offset = message.offset()
                known = UNKNOWN_OFFSET if offset is None else offset
                self.acks.append(Ack(message.partition() or 0, known, value, now))
            else:
                self.failures.append(f"{value!r}: {error}")

    def _run(self) -> None:
        settings: dict[str, object] = {
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            # A record whose partition has no broker for a while (its broker killed, until
            # it restarts) waits rather than fail.
            "message.timeout.ms": int(PATIENCE_S * 1000),
        }
        if self.client_log is not None:
            client = logging.getLogger(f"librdkafka.{self.name}.{id(self)}")
            client.propagate = False
            client.addHandler(logging.FileHandler(self.client_log))
            client.setLevel(logging.DEBUG)
            settings |= {"debug": "eos,msg,broker,topic,protocol", "logger": client}
        producer = Producer(settings)
        sequence = 0
        tick = time.monotonic()
        while not self._stop.is_set():
            for partition in self.partitions:
                value = f"{self.name}-{partition}-{sequence:08d}".encode()
                producer.produce(
                    self.topic, value=value, partition=partition, on_delivery=self._delivered
                )
            sequence += 1
            # Acknowledgements are taken as they come (their times are measured), and records
            # are sent at the pace asked whatever the acknowledgements do.
            tick = max(tick + self.interval_s, time.monotonic() - self.interval_s)
            while (left := tick - time.monotonic()) > 0:
                producer.poll(left)
        remaining = producer.flush(1 if self._abandon.is_set() else PATIENCE_S)
        if remaining:
            self.failures.append(f"{remaining} records not delivered at the end")

    def acked(self, partition: int | None = None, after: float = 0.0) -> int:
        with self._lock:
            return sum(
                1
                for ack in self.acks
                if (partition is None or ack.partition == partition) and ack.at > after
            )

    def wait_acked(self, partitions: Iterable[int], after: float, what: str) -> None:
        """Until each partition has an acknowledgement seen after ``after``."""
        partitions = tuple(partitions)
        try:
            wait_until(
                lambda: all(self.acked(p, after) for p in partitions),
                f"acknowledgements on partitions {partitions} {what}",
            )
        except AssertionError as error:
            silent = [p for p in partitions if not self.acked(p, after)]
            with self._lock:
                failures = self.failures[-3:]
            raise AssertionError(
                f"{error}: none on {silent}; last failures {failures}; {self.diagnose()}"
            ) from None

    def longest_gap(self, partition: int, start: float, end: float) -> float:
        """The longest time between two acknowledgements on ``partition`` around
        [start, end]: pairs of consecutive acks whose span meets that window."""
        with self._lock:
            times = sorted(a.at for a in self.acks if a.partition == partition)
        gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
        return max(gaps, default=0.0)


Log = dict[int, list[tuple[int, bytes]]]


def read_all(bootstrap: str, topic: str, partitions: int) -> Log:
    """Every record of every partition, read with kafka-python (assigned, no group) from the
    beginning to the end offsets asked for first: partition -> [(offset, value)]."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # kafka-python 3.0's offset lookup retries a NOT_LEADER_OR_FOLLOWER partition at the
        # leader it cached, without asking for metadata: a consumer that met a broker's view
        # from just before a partition moved kept asking the old leader until its 30 s timeout
        # (once in CI, right after a fenced broker came back). Metadata this young ends that.
        metadata_max_age_ms=1000,
    )
    try:
        assigned = [TopicPartition(topic, index) for index in range(partitions)]
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        ends = {tp.partition: end for tp, end in consumer.end_offsets(assigned).items()}
        log: Log = {index: [] for index in range(partitions)}

        def read_to_the_end() -> bool:
            for tp, records in consumer.poll(timeout_ms=500).items():
                log[tp.partition] += [(r.offset, r.value) for r in records]
            return all(
                ends[index] == 0 or (log[index] and log[index][-1][0] >= ends[index] - 1)
                for index in range(partitions)
            )

        wait_until(read_to_the_end, f"{topic} read to its end offsets {ends}", interval_s=0)
    finally:
        consumer.close()
    return log


def check(log: Log, acks: Iterable[Ack], producers: Iterable[str]) -> None:
    """Nothing acknowledged lost, nothing reordered: offsets strictly increase in each
    partition, each acknowledged record is at its offset, and each producer's sequence
    strictly increases in each partition (no record twice, none overtaking another)."""
    at = {index: dict(records) for index, records in log.items()}
    for index, records in log.items():
        offsets = [offset for offset, _ in records]
        assert offsets == sorted(set(offsets)), f"partition {index}: offsets not increasing"
    values = {index: set(records.values()) for index, records in at.items()}
    lost = [
        ack
        for ack in acks
        if (
            ack.value not in values.get(ack.partition, set())
            if ack.offset == UNKNOWN_OFFSET
            else at.get(ack.partition, {}).get(ack.offset) != ack.value
        )
    ]
    assert not lost, f"{len(lost)} acknowledged records lost or changed, first {lost[:5]}"
    for name in producers:
        for index, records in log.items():
            sequences = [
                _sequence(value) for _, value in records if value.startswith(f"{name}-".encode())
            ]
            assert sequences == sorted(set(sequences)), (
                f"partition {index}: {name}'s records out of order or repeated: "
                f"{_first_disorder(sequences)}"
            )


def _sequence(value: bytes) -> int:
    return int(value.rsplit(b"-", 1)[1])


def _first_disorder(sequences: list[int]) -> str:
    for before, after in itertools.pairwise(sequences):
        if after <= before:
            return f"{before} then {after}"
    return "none"


def kcat_produce(bootstrap: str, topic: str, count: int) -> list[bytes]:
    """kcat, idempotent, acks=all, each record keyed by its sequence (so the keys' hashes
    spread them over the partitions): the values it delivered, ``kcat-<sequence>``."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is not installed (make kcat installs Debian's package)")
    values = [f"kcat-{sequence:08d}".encode() for sequence in range(count)]
    done = subprocess.run(
        [
            kcat,
            "-b",
            bootstrap,
            "-P",
            "-t",
            topic,
            "-X",
            "enable.idempotence=true",
            "-X",
            "acks=all",
            "-K",
            ":",
        ],
        input=b"".join(b"%d:%s\n" % (sequence, value) for sequence, value in enumerate(values)),
        capture_output=True,
        timeout=PATIENCE_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return values


def partitions_of(log: Log) -> dict[bytes, int]:
    return {value: index for index, records in log.items() for _, value in records}


# -------------------------------------------------------------------------------- the tests


def test_partitions_spread_over_three_brokers(cluster: Cluster) -> None:
    topic = unique("spread")
    create_topic(cluster.brokers[1].bootstrap, topic, PARTITIONS)
    found = agreed_leaders(cluster, topic)
    assert sorted(found) == list(range(PARTITIONS))
    counts = {node: sorted(found.values()).count(node) for node in NODES}
    print(f"leaders of {PARTITIONS} partitions per broker: {counts}")
    assert set(found.values()) == set(NODES), found
    # Every broker names the others with their racks.
    for node in NODES:
        assert metadata(cluster.brokers[node]).racks == {n: f"az{n}" for n in NODES}

    with RunningProducer(
        cluster.bootstrap(),
        topic,
        tuple(range(PARTITIONS)),
        diagnose=lambda: describe(cluster, topic),
    ) as producer:
        producer.wait_acked(range(PARTITIONS), 0.0, "on every partition")
        sent_by_kcat = kcat_produce(cluster.bootstrap(), topic, 500)
    assert not producer.failures, producer.failures[:5]

    log = read_all(cluster.bootstrap(), topic, PARTITIONS)
    check(log, producer.acks, ["ck", "kcat"])
    where = partitions_of(log)
    missing = [value for value in sent_by_kcat if value not in where]
    assert not missing, f"kcat's records lost: {missing[:5]}"
    # kcat spread its records: more than one broker's partitions hold them.
    assert len({found[where[value]] for value in sent_by_kcat}) > 1


def test_reassignments_while_producing(cluster: Cluster) -> None:
    topic = unique("moves")
    partitions = 6
    create_topic(cluster.bootstrap(), topic, partitions)
    placed = agreed_leaders(cluster, topic)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap())
    gaps: list[str] = []
    try:
        with RunningProducer(
            cluster.bootstrap(),
            topic,
            tuple(range(partitions)),
            diagnose=lambda: describe(cluster, topic),
        ) as producer:
            producer.wait_acked(range(partitions), 0.0, "before the moves")
            # Four rounds: one partition, two at once, one more, and the first moved back.
            rounds = [[0], [1, 2], [3], [0]]
            for moving in rounds:
                targets = {index: placed[index] % len(NODES) + 1 for index in moving}
                asked = time.monotonic()
                answer = admin.alter_partition_reassignments(
                    {TopicPartition(topic, index): [target] for index, target in targets.items()}
                )
                assert answer == {TopicPartition(topic, index): None for index in moving}
                wait_until(
                    functools.partial(_moved, cluster, admin, topic, targets),
                    f"partitions {targets} moved (image, Metadata, no reassignment listed)",
                )
                settled = time.monotonic()
                producer.wait_acked(moving, settled, "after the move")
                for index, target in targets.items():
                    gap = producer.longest_gap(index, asked, settled)
                    gaps.append(
                        f"{topic}-{index} {placed[index]} -> {target}: longest gap between "
                        f"acknowledgements {gap:.3f} s (move settled {settled - asked:.3f} s "
                        "after the request)"
                    )
                    placed[index] = target
        assert admin.list_partition_reassignments() == {}
    finally:
        admin.close()
    print("\n" + "\n".join(gaps))
    assert not producer.failures, producer.failures[:5]
    assert agreed_leaders(cluster, topic) == placed
    check(read_all(cluster.bootstrap(), topic, partitions), producer.acks, ["ck"])


def _moved(cluster: Cluster, admin: KafkaAdminClient, topic: str, targets: dict[int, int]) -> bool:
    found = leaders(cluster, topic)
    if found is None or any(found[index] != target for index, target in targets.items()):
        return False
    listed = admin.list_partition_reassignments()
    return not any(TopicPartition(topic, index) in listed for index in targets)


def test_the_active_controller_killed(cluster: Cluster) -> None:
    topic = unique("takeover")
    create_topic(cluster.bootstrap(), topic, PARTITIONS)
    before = agreed_leaders(cluster, topic)
    victim = cluster.controller()
    assert victim is not None and victim in NODES
    survivors = tuple(node for node in NODES if node != victim)
    theirs = sorted(index for index, leader in before.items() if leader != victim)
    victims = sorted(index for index, leader in before.items() if leader == victim)

    with RunningProducer(
        cluster.bootstrap(),
        topic,
        tuple(range(PARTITIONS)),
        diagnose=lambda: describe(cluster, topic),
    ) as producer:
        producer.wait_acked(range(PARTITIONS), 0.0, "before the kill")
        # The WAL of the broker killed holds records: recovered at its restart.
        cluster.brokers[victim].kill()
        killed = time.monotonic()
        elected: dict[str, float] = {}
        watcher = threading.Thread(
            target=_watch_election, args=(cluster, set(survivors), killed, elected)
        )
        watcher.start()
        # A topic created through a survivor, on a survivor (the killed broker is live in the
        # image until its session lapses): the time until the new controller decides.
        create_topic(
            cluster.brokers[survivors[0]].bootstrap,
            unique("after-kill"),
            1,
            assignment=[[survivors[1]]],
        )
        created_s = time.monotonic() - killed
        watcher.join(PATIENCE_S)
        print(
            f"\ncontroller {victim} killed: broker {elected.get('node')} holds the election after "
            f"{elected.get('seconds', float('nan')):.2f} s, a CreateTopics through broker "
            f"{survivors[0]} succeeded after {created_s:.2f} s "
            f"(target: lease TTL + 1 s = {TTL_MS / 1000 + 1:.1f} s)"
        )
        assert created_s <= TAKEOVER_BOUND_S
        assert elected.get("node") in survivors

        # Partitions of the live brokers go on taking records.
        producer.wait_acked(theirs, time.monotonic(), "of the live brokers after the kill")
        # The killed broker's session lapses: the survivors alone are listed, and topics are
        # placed on them.
        wait_until(
            lambda: all(
                set(metadata(cluster.brokers[node]).racks) == set(survivors) for node in survivors
            ),
            f"broker {victim} fenced (not listed by the survivors)",
        )
        placed = unique("placed")
        create_topic(cluster.bootstrap(survivors), placed, 4)
        assert set(agreed_leaders(cluster, placed, survivors).values()) <= set(survivors)

        # Restarted on its WAL, the broker serves again, its partitions are open again and
        # take records.
        restarted = time.monotonic()
        cluster.brokers[victim].start()
        after = agreed_leaders(cluster, topic)
        producer.wait_acked(range(PARTITIONS), time.monotonic(), "after the restart")
        # A broker that joins takes its share of the partitions (of whichever topics).
        assert _leads_some(cluster, victim), describe(cluster, topic)
        print(
            f"broker {victim} restarted: its partitions {victims} take records again "
            f"{time.monotonic() - restarted:.2f} s after the restart; leaders {after}"
        )
    assert not producer.failures, producer.failures[:5]
    recovered = _last_line(cluster.brokers[victim], "WAL recovered")
    print(recovered)
    assert "records=0 " not in recovered, recovered
    check(read_all(cluster.bootstrap(), topic, PARTITIONS), producer.acks, ["ck"])


def _leads_some(cluster: Cluster, node: int) -> bool:
    """Whether every broker names ``node`` the leader of some partition (of any topic)."""
    return all(
        any(node in found.values() for found in metadata(broker).leaders.values())
        for broker in cluster.brokers.values()
    )


def _watch_election(
    cluster: Cluster, among: set[int], since: float, found: dict[str, float]
) -> None:
    def elected() -> bool:
        node = cluster.controller()
        if node in among:
            found["node"], found["seconds"] = node, time.monotonic() - since
            return True
        return False

    with contextlib.suppress(AssertionError):
        wait_until(elected, f"one of {among} elected")


def _last_line(broker: BrokerProcess, text: str) -> str:
    lines = [line for line in broker.log_path.read_text().splitlines() if text in line]
    assert lines, f"no {text!r} in {broker.log_path}"
    return lines[-1]


@dataclass
class RunningConsumer:
    """kafka-python, assigned every partition (no group), reading from the beginning in a
    thread of its own until stopped: what it read, partition -> [(offset, value)]."""

    bootstrap: str
    topic: str
    partitions: int
    log: Log = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> RunningConsumer:
        self.log = {index: [] for index in range(self.partitions)}
        self._thread = threading.Thread(target=self._run, name="consumer")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(PATIENCE_S)
            assert not self._thread.is_alive(), "the consumer did not stop"
            self._thread = None

    def _run(self) -> None:
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        try:
            assigned = [TopicPartition(self.topic, index) for index in range(self.partitions)]
            consumer.assign(assigned)
            consumer.seek_to_beginning(*assigned)
            while not self._stop.is_set():
                for tp, records in consumer.poll(timeout_ms=200).items():
                    with self._lock:
                        self.log[tp.partition] += [(r.offset, r.value) for r in records]
        finally:
            consumer.close()

    def read_past(self, acks: Iterable[Ack]) -> bool:
        """Whether this consumer has read up to each of ``acks``."""
        with self._lock:
            return all(
                self.log[ack.partition] and self.log[ack.partition][-1][0] >= ack.offset
                for ack in acks
            )


def _last_acks(producer: RunningProducer, after: float) -> list[Ack]:
    """Per partition, the last acknowledgement seen after ``after``."""
    with producer._lock:
        last: dict[int, Ack] = {}
        for ack in producer.acks:
            if ack.at > after:
                last[ack.partition] = ack
    return list(last.values())


def _stop_etcd(cluster: Cluster, how: str) -> None:
    if how == "paused":
        cluster.etcd.pause()
        cluster.etcd_paused = True
    else:
        process = cluster.etcd.process
        assert process is not None
        process.terminate()
        process.wait(PATIENCE_S)
        cluster.etcd.process = None


def _start_etcd(cluster: Cluster, how: str) -> None:
    if how == "paused":
        cluster.etcd.resume()
        cluster.etcd_paused = False
    else:
        cluster.etcd.start()  # its ports and data directory, as before


@pytest.mark.parametrize("how", ["paused", "restarted"])
def test_etcd_stopped_while_clients_run(cluster: Cluster, how: str) -> None:
    topic = unique(f"etcd-{how}")
    partitions = 6
    create_topic(cluster.bootstrap(), topic, partitions)
    agreed_leaders(cluster, topic)
    with (
        RunningProducer(
            cluster.bootstrap(),
            topic,
            tuple(range(partitions)),
            diagnose=lambda: describe(cluster, topic),
        ) as producer,
        RunningConsumer(cluster.bootstrap(), topic, partitions) as consumer,
    ):
        producer.wait_acked(range(partitions), 0.0, "before etcd stops")
        wait_until(lambda: consumer.read_past(_last_acks(producer, 0.0)), "the consumer reading")
        _stop_etcd(cluster, how)
        stopped = time.monotonic()
        # The outage itself lasts a fixed time; nothing is judged on it.
        time.sleep(ETCD_DOWN_S)
        acked_while_down = producer.acked(after=stopped)
        _start_etcd(cluster, how)
        back = time.monotonic()
        # Metadata changes resume: a topic is created, through each broker in turn. The
        # outage may have cost the controller its lease, so a creation in flight across the
        # election that follows gets no decision: answered REQUEST_TIMED_OUT (never a closed
        # connection), and a creation of another topic succeeds once there is a controller.
        undecided = []
        for node in NODES:
            undecided += create_topic_through_election(cluster.brokers[node].bootstrap)
        created_s = time.monotonic() - back
        # Every partition takes records again, and the consumer reads them.
        producer.wait_acked(range(partitions), time.monotonic(), "after etcd is back")
        latest = _last_acks(producer, back)
        wait_until(lambda: consumer.read_past(latest), "the consumer reading past etcd's outage")
    print(
        f"\netcd {how} for {ETCD_DOWN_S:.0f} s: {acked_while_down} records acknowledged while "
        f"it was down; three topics created {created_s:.2f} s after it was back"
        f" ({len(undecided)} creations undecided across an election first)"
    )
    assert not producer.failures, producer.failures[:5]
    # What the running consumer read: no gap below where it got to, in order.
    reached = {index: records[-1][0] for index, records in consumer.log.items() if records}
    read_acks = [ack for ack in producer.acks if 0 <= ack.offset <= reached.get(ack.partition, -1)]
    check(consumer.log, read_acks, ["ck"])
    check(read_all(cluster.bootstrap(), topic, partitions), producer.acks, ["ck"])


def test_a_paused_broker_is_fenced_and_starts_again(cluster: Cluster) -> None:
    topic = unique("fenced")
    create_topic(cluster.bootstrap(), topic, PARTITIONS)
    before = agreed_leaders(cluster, topic)
    controller = cluster.controller()
    # Not the controller: this is about the broker's session, not the election.
    victim = next(node for node in NODES if node != controller)
    survivors = tuple(node for node in NODES if node != victim)
    theirs = sorted(index for index, leader in before.items() if leader != victim)
    fenced_before = _count(cluster.brokers[victim], "broker fenced")

    with RunningProducer(
        cluster.bootstrap(),
        topic,
        tuple(range(PARTITIONS)),
        diagnose=lambda: describe(cluster, topic),
    ) as producer:
        producer.wait_acked(range(PARTITIONS), 0.0, "before the pause")
        cluster.pause(victim)
        paused = time.monotonic()
        wait_until(
            lambda: all(
                set(metadata(cluster.brokers[node]).racks) == set(survivors) for node in survivors
            ),
            f"broker {victim} fenced (not listed by the others)",
        )
        fenced_s = time.monotonic() - paused
        producer.wait_acked(theirs, time.monotonic(), "of the other brokers while it is paused")
        cluster.resume(victim)
        resumed = time.monotonic()
        wait_until(
            lambda: _count(cluster.brokers[victim], "broker fenced") > fenced_before,
            f"broker {victim} logging that it was fenced",
        )
        after = agreed_leaders(cluster, topic)
        producer.wait_acked(range(PARTITIONS), time.monotonic(), "after it started again")
        back_s = time.monotonic() - resumed
    print(
        f"\nbroker {victim} paused: fenced after {fenced_s:.2f} s (session "
        f"{SESSION_MS / 1000:.0f} s); resumed, every partition takes records again after "
        f"{back_s:.2f} s; leaders {after}"
    )
    assert not producer.failures, producer.failures[:5]
    # It started again by itself: a new registration (a higher node epoch), its WAL recovered,
    # and its share of the partitions led again.
    log = cluster.brokers[victim].log_path.read_text().splitlines()
    fenced_at = max(i for i, line in enumerate(log) if "broker fenced" in line)
    print(log[fenced_at])
    epochs = [_field(line, "node_epoch") for line in log if "node started" in line]
    assert len(epochs) >= 2 and epochs[-1] > epochs[-2], epochs
    assert any("node started" in line for line in log[fenced_at:])
    assert any("WAL recovered" in line for line in log[fenced_at:])
    # Its share comes back at its first heartbeat after the restart, which may follow the
    # producer's last acknowledgement (the other brokers led every partition meanwhile).
    wait_until(
        lambda: any(
            "partition led" in line
            for line in cluster.brokers[victim].log_path.read_text().splitlines()[fenced_at:]
        ),
        f"broker {victim} leading partitions again",
    )
    wait_until(lambda: _leads_some(cluster, victim), f"broker {victim} leading a partition")
    check(read_all(cluster.bootstrap(), topic, PARTITIONS), producer.acks, ["ck"])


def _count(broker: BrokerProcess, text: str) -> int:
    if not broker.log_path.exists():
        return 0
    return broker.log_path.read_text().count(text)


def _field(line: str, name: str) -> int:
    return int(line.split(f"{name}=", 1)[1].split()[0])
