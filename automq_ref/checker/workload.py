"""The Kafka queue workload: real clients against a broker process, or a cluster of them, while
faults are injected.

Producers (confluent-kafka, idempotent, acks=all) send unique values round-robin over the
partitions; consumers ``assign`` every partition from offset 0 and poll. No consumer joins a
group or commits an offset, so in a cluster nothing depends on where groups are coordinated:
clients follow each partition's leader from Metadata and NOT_LEADER_OR_FOLLOWER answers.
Every operation is recorded (``automq_ref.checker.history``): a send is invoked when handed to
the client and completes ``ok`` with its offset on a delivery report, ``info`` on any delivery
error (a timeout or a broker that died may or may not have stored it: never ``fail``). The
nemesis loop (this thread) injects faults on a seeded schedule and heals each one
(``automq_ref.checker.nemesis`` lists them). After the faults, producers flush, and a final
phase reads every partition from its start to its end with a fresh consumer. A
:class:`CheckTally` given to :func:`run_workload` counts acknowledged sends and injected faults
as they happen, for the command's progress line.
"""

from __future__ import annotations

import collections
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.checker.history import Op, Recorder
from automq_ref.checker.nemesis import NEMESES, Environment
from automq_ref.progress import Status

log = logging.getLogger(__name__)
# librdkafka's own log lines (connection refused while the broker is down, ...) go here instead
# of stderr; the history records every outcome the clients saw. Lower the level to see them.
CLIENT_LOG = logging.getLogger("automq_ref.checker.librdkafka")
CLIENT_LOG.setLevel(logging.CRITICAL)
# How long the final read waits for the partitions' offsets (they may be moving between
# brokers): one deadline for all, counted from the start of the final read, so that a cluster
# whose partitions never come back costs a minute, not a minute per partition; a partition asked
# after the deadline still gets FINAL_READ_GRACE_S.
FINAL_READ_TIMEOUT_S = 60.0
FINAL_READ_GRACE_S = 5.0
# How long the workload waits for a client thread to end once the faults are over. Producers
# flush for at most 30 s; a consumer only closes. librdkafka's consumer close was once seen
# waiting for good (a soak run sat in "producers flushing" with every broker idle and the
# consumer's thread in close()): the thread is then left behind, logged, and the run goes on to
# its final read; everything the client saw is in the history already.
CLIENT_STOP_TIMEOUT_S = 90.0


@dataclass
class WorkloadSettings:
    partitions: int = 3
    producers: int = 2
    consumers: int = 2
    duration_s: float = 30.0
    nemeses: tuple[str, ...] = ("kill", "pause")
    fault_interval_s: float = 6.0  # a fault starts about this often
    fault_length_s: float = 1.5  # how long a pause lasts / a killed broker stays down
    # At least this many faults: the workload goes on past ``duration_s`` until they were
    # injected (a short run that must meet several kinds of fault, whatever the machine's speed).
    min_faults: int = 0
    seed: int = 0
    send_interval_s: float = 0.002  # per producer
    # "queue": this module's sends and polls; "txn": transactions (checker/txn_workload.py)
    workload: str = "queue"


@dataclass
class FaultWindow:
    kind: str
    start_ns: int
    end_ns: int
    detail: str = ""
    target: str = ""  # what the fault hit in a cluster ("broker 2", "etcd"); "" with one broker


@dataclass
class WorkloadResult:
    ops: list[Op]
    faults: list[FaultWindow] = field(default_factory=list)
    topic: str = ""
    # partitions whose offsets the final read could not get (after every fault healed)
    unreadable: list[int] = field(default_factory=list)


@dataclass
class CheckTally:
    """What a running check has done so far, read by its progress line from another thread.

    Each producer thread counts its acknowledged sends in its own slot of ``acknowledged`` (one
    writer per slot: the delivery path takes no lock, as :class:`History` explains); the
    nemesis loop alone writes ``faults`` and ``fault_now``; the reader only sums and copies."""

    duration_s: float
    stage: str = "starting the broker"
    acknowledged: list[int] = field(default_factory=list)
    faults: int = 0
    fault_now: str = ""  # the fault in force, while one is
    workload_started: float | None = None  # time.monotonic() when the clients started
    counted: str = "sends acknowledged"  # what ``acknowledged`` counts

    def status(self, _elapsed_s: float) -> Status:
        faults = f"{self.faults} fault{'' if self.faults == 1 else 's'} injected"
        if self.fault_now:
            faults += f" ({self.fault_now} now)"
        fraction = None
        if self.workload_started is not None:
            fraction = (time.monotonic() - self.workload_started) / max(self.duration_s, 1e-9)
        return Status(
            self.stage,
            f"{sum(list(self.acknowledged)):,} {self.counted}, {faults}",
            fraction,
        )


class History:
    """Entries appended from client threads and librdkafka callbacks without a lock: a callback
    must not block on (or die holding) a lock, so each entry takes a number from a shared
    counter (atomic under the GIL) and goes into a deque; ``ops`` orders them by that number."""

    def __init__(self) -> None:
        self._numbers = itertools.count()
        self._entries: collections.deque[tuple[int, int, int, str, str, dict[str, object]]] = (
            collections.deque()
        )

    def add(self, process: int, type_: str, f: str, value: dict[str, object]) -> None:
        self._entries.append((next(self._numbers), time.monotonic_ns(), process, type_, f, value))

    @property
    def ops(self) -> list[Op]:
        recorder = Recorder()
        for _, time_ns, process, type_, f, value in sorted(self._entries, key=lambda e: e[0]):
            recorder.add(process, type_, f, time_ns, value)  # type: ignore[arg-type]
        return recorder.ops


def run_workload(
    env: Environment, settings: WorkloadSettings, tally: CheckTally | None = None
) -> WorkloadResult:
    tally = tally if tally is not None else CheckTally(settings.duration_s)
    tally.acknowledged = [0] * settings.producers
    topic = create_topic(env, settings, "checked")
    bootstrap = env.bootstrap
    history = History()
    stop = threading.Event()
    acknowledged = tally.acknowledged
    faults = run_clients(
        env,
        settings,
        tally,
        (topic, history, stop),
        lambda p: _produce(client_config(env, p), topic, settings, p, history, stop, acknowledged),
        "producer",
    )
    tally.stage = "final read"
    unreadable = final_read(bootstrap, topic, settings, history)
    return WorkloadResult(history.ops, faults, topic, unreadable)


def create_topic(env: Environment, settings: WorkloadSettings, prefix: str) -> str:
    """A new topic ``<prefix>-<8 hex digits>`` of ``settings.partitions`` partitions."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin_config: dict[str, Any] = {"bootstrap.servers": env.bootstrap, "logger": CLIENT_LOG}
    admin = AdminClient(admin_config)
    admin.create_topics([NewTopic(topic, num_partitions=settings.partitions)])[topic].result()
    return topic


def run_clients(
    env: Environment,
    settings: WorkloadSettings,
    tally: CheckTally,
    run: tuple[str, History, threading.Event],
    writer: Callable[[int], None],
    writer_name: str,
) -> list[FaultWindow]:
    """The workload's middle: ``settings.producers`` threads running ``writer(slot)`` and
    ``settings.consumers`` plain consumers of ``run``'s (topic, history, stop) while the
    nemesis loop runs here; then ``stop`` is set and the threads joined (a client that hangs is
    left behind, logged). The faults injected are returned."""
    topic, history, stop = run
    faults: list[FaultWindow] = []
    threads = [
        threading.Thread(target=writer, args=(slot,), name=f"{writer_name}-{slot}", daemon=True)
        for slot in range(settings.producers)
    ]
    threads += [
        threading.Thread(
            target=consume,
            args=(client_config(env, c), topic, settings, 100 + c, history, stop),
            name=f"consumer-{100 + c}",
            daemon=True,
        )
        for c in range(settings.consumers)
    ]
    tally.stage, tally.workload_started = "workload", time.monotonic()
    for thread in threads:
        thread.start()
    try:
        nemesis_loop(env, settings, faults, tally)
    finally:
        stop.set()
        tally.stage = "producers flushing"
        deadline_s = time.monotonic() + CLIENT_STOP_TIMEOUT_S
        for thread in threads:
            thread.join(max(0.0, deadline_s - time.monotonic()))
            if thread.is_alive():
                log.warning(
                    "%s did not stop within %.0f s of the faults' end (its client hangs): "
                    "left behind",
                    thread.name,
                    CLIENT_STOP_TIMEOUT_S,
                )
    return faults


def client_config(env: Environment, number: int) -> dict[str, str]:
    """Where client ``number`` connects and who it says it is: every broker; or, when the
    clients declare zones (the zone router on), its zone's broker and ``automq_az=<zone>``."""
    if not env.zoned:
        return {"bootstrap.servers": env.bootstrap}
    zone = env.client_zone(number)
    return {"bootstrap.servers": env.zone_bootstrap(zone), "client.id": f"automq_az={zone}"}


def nemesis_loop(
    env: Environment, settings: WorkloadSettings, faults: list[FaultWindow], tally: CheckTally
) -> None:
    rng = random.Random(settings.seed)
    deadline = time.monotonic() + settings.duration_s
    while True:
        wait = rng.uniform(0.5, 1.5) * settings.fault_interval_s
        enough = len(faults) >= settings.min_faults
        if (
            enough and time.monotonic() + wait + settings.fault_length_s + 2 > deadline
        ) or not settings.nemeses:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
        time.sleep(wait)
        nemesis = NEMESES[rng.choice(settings.nemeses)]
        start = time.monotonic_ns()
        fault = nemesis.inject(env, rng)
        tally.faults += 1
        tally.fault_now = f"{nemesis.name} {fault.target}".strip()
        log.info("nemesis %s %s: %s", nemesis.name, fault.target, fault.detail)
        try:
            time.sleep(settings.fault_length_s if fault.length_s is None else fault.length_s)
        finally:
            fault.heal()
            tally.fault_now = ""
        detail = fault.detail if fault.outcome is None else f"{fault.detail}; {fault.outcome()}"
        faults.append(FaultWindow(nemesis.name, start, time.monotonic_ns(), detail, fault.target))


def _produce(
    client: dict[str, str],
    topic: str,
    settings: WorkloadSettings,
    process: int,
    history: History,
    stop: threading.Event,
    acknowledged: list[int],
) -> None:
    """One producer thread. A fatal producer error (a broker that lost acknowledged data breaks
    the idempotence sequence) ends that client: its open send stays unknown, and a new client
    under a new process number (``process + 10,000 x generation``) carries on, so writes after
    the fault still happen and land on the offsets the lost records had. Every generation
    counts its acknowledged sends in ``acknowledged[process]``."""
    generation = 0
    while not stop.is_set():
        _produce_until_fatal(
            client,
            topic,
            settings,
            process + 10_000 * generation,
            history,
            stop,
            (acknowledged, process),
        )
        generation += 1


def _produce_until_fatal(
    client: dict[str, str],
    topic: str,
    settings: WorkloadSettings,
    process: int,
    history: History,
    stop: threading.Event,
    tally: tuple[list[int], int],
) -> None:
    """One producer client until a fatal error; ``tally`` is (counts, slot): the slot of this
    thread where each acknowledged send is counted."""
    counts, slot = tally
    producer = Producer(
        {
            **client,
            "logger": CLIENT_LOG,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "message.timeout.ms": 30000,
            "request.timeout.ms": 10000,
            "socket.timeout.ms": 10000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
    )
    count = 0
    fatal: list[BaseException] = []

    def record(error: KafkaError | None, message: Message) -> None:
        value = (message.value() or b"").decode()
        sent = {"partition": message.partition(), "value": value}
        if error is None:
            history.add(process, "ok", "send", {**sent, "offset": message.offset()})
            counts[slot] += 1
        else:  # a timeout or a lost connection: it may have been stored
            history.add(process, "info", "send", {**sent, "error": str(error)})

    def delivered(error: KafkaError | None, message: Message) -> None:
        try:
            try:
                record(error, message)
            except SystemError as pending:
                # A fatal client error is left pending as an exception while the client reports
                # the sends it fails: the first call here fails with it as the cause, which
                # clears it. Keep it, for the log line, and record the send.
                fatal.append(pending.__cause__ or pending)
                record(error, message)
        except Exception:  # an exception must not escape into librdkafka's callback
            log.exception("recording a delivery report")

    # One operation at a time per process, as the history format requires: a process waits
    # for each send's outcome before the next (several processes give concurrency).
    while not stop.is_set():
        partition = count % settings.partitions
        value = f"{process}-{count}"
        history.add(process, "invoke", "send", {"partition": partition, "value": value})
        try:
            producer.produce(topic, value.encode(), partition=partition, on_delivery=delivered)
            while producer.flush(0.5) > 0:
                if stop.is_set() and producer.flush(30) > 0:
                    break
        except Exception as error:  # KafkaException, or a SystemError out of a callback
            log.warning("producer %d ends: %s", process, _why_fatal(fatal[0] if fatal else error))
            return
        count += 1
        time.sleep(settings.send_interval_s)
    producer.flush(30)


def _why_fatal(error: BaseException) -> str:
    """A fatal producer error, and for OUT_OF_ORDER_SEQUENCE_NUMBER what it means here."""
    code = error.args[0].code() if error.args and isinstance(error.args[0], KafkaError) else None
    if code != KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER:
        return str(error)
    # A producer sends its next record only once the one before was acknowledged: the leader
    # then lacks a batch it acknowledged.
    return (
        f"{error}: the leader lacks this producer's last acknowledged batch on the partition "
        "(an acknowledged write, or the producer state recording it, was lost there; the "
        "queue checker reports lost writes)"
    )


def consume(
    client: dict[str, str],
    topic: str,
    settings: WorkloadSettings,
    process: int,
    history: History,
    stop: threading.Event,
) -> None:
    consumer = Consumer(
        {
            **client,
            "logger": CLIENT_LOG,
            "group.id": f"checker-{uuid.uuid4().hex[:6]}",
            "socket.timeout.ms": 10000,
            "enable.auto.commit": False,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
    )
    partitions = list(range(settings.partitions))
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    try:
        while not stop.is_set():
            history.add(process, "invoke", "poll", {"partitions": partitions})
            records = []
            for message in consumer.consume(num_messages=200, timeout=0.2):
                if message.error() is not None:
                    continue
                value = (message.value() or b"").decode()
                records.append([message.partition(), message.offset(), value])
            history.add(process, "ok", "poll", {"records": records})
    finally:
        consumer.close()


def final_read(
    bootstrap: str, topic: str, settings: WorkloadSettings, history: History
) -> list[int]:
    """Every partition from its start to its end, recorded as one final poll per partition;
    the partitions it could not read (their offsets not given within
    :data:`FINAL_READ_TIMEOUT_S` of the final read's start: a partition that never came back)
    are returned."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "logger": CLIENT_LOG,
            "group.id": f"final-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    process = 1000
    unreadable: list[int] = []
    deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
    try:
        for partition in range(settings.partitions):
            history.add(process, "invoke", "poll", {"partitions": [partition], "final": True})
            try:
                wait_s = max(deadline - time.monotonic(), FINAL_READ_GRACE_S)
                low, high = watermarks(consumer, topic, partition, wait_s)
            except KafkaException as error:  # the partition never came back: nothing observed
                log.warning("final read of partition %d: %s", partition, error)
                history.add(process, "info", "poll", {"error": str(error), "final": True})
                process += 1  # an info operation ends its process
                unreadable.append(partition)
                continue
            read, position = read_partition(consumer, topic, partition, low, high)
            records = [[partition, offset, value] for offset, value in read]
            result: dict[str, object] = {
                "records": records,
                "final": True,
                "log_start": {str(partition): low},
            }
            if position >= high:  # it got to the end: anything acked past it was lost
                result["log_end"] = {str(partition): high}
            history.add(process, "ok", "poll", result)
    finally:
        consumer.close()
    return unreadable


def watermarks(
    consumer: Consumer, topic: str, partition: int, timeout_s: float = FINAL_READ_TIMEOUT_S
) -> tuple[int, int]:
    """The partition's (log start, high watermark), asked again after an error (in a cluster
    a partition may be moving: NOT_LEADER_OR_FOLLOWER; every fault has healed, so any error is
    taken for a passing one) until ``timeout_s``; the last error is raised then."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            return int(low), int(high)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_partition(
    consumer: Consumer, topic: str, partition: int, low: int, high: int, timeout_s: float = 60
) -> tuple[list[tuple[int, str]], int]:
    """(offset, value) of every record from ``low`` up to ``high`` (exclusive), in the order
    read, and the position reached (``>= high`` when the read got to the end in time)."""
    consumer.assign([TopicPartition(topic, partition, low)])
    records: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout_s
    position = low
    while position < high and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=1000, timeout=0.5):
            if message.error() is not None:
                continue
            offset = message.offset()
            assert offset is not None
            records.append((offset, (message.value() or b"").decode()))
            position = offset + 1
    return records, position
