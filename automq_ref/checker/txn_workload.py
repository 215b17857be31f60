"""The transactional workload (``automq-ref check --workload txn``): Kafka transactions from
real clients against a broker process, or a cluster, while faults are injected.

Each transactional process (confluent-kafka, ``transactional.id`` ``<topic>-txn-<slot>``) runs
one transaction at a time: a planned list of micro-operations, sends of unique values to chosen
partitions and polls of its own ``read_committed`` consumer (assigned every partition from
offset 0, its position kept from one transaction to the next), then a commit, or an abort for
about one transaction in :data:`ABORT_FRACTION`. Each transaction is one ``txn`` operation of
the history (:mod:`automq_ref.checker.history`). At invoke: ``{"mops": [["send", p, v] |
["poll"], ...], "partitions": [...]}`` (the consumer's assignment). At completion: the same
list with what happened, ``["send", p, v, offset]`` (the offset of the delivery report, None
without one) and ``["poll", [[p, offset, v], ...]]``. The completion is ``ok`` when the commit
returned, ``fail`` when an abort returned (the client's own, or the one an abortable error
asked for: nothing of it may become visible), ``info`` on anything else (a commit that timed
out, a fenced or fatal producer): the transaction may or may not have committed. An ``info``
ends the process as an application's crash would: the next process of the slot (``slot +
10,000 x generation``) starts a new producer with the same ``transactional.id``, whose
``init_transactions`` fences the old one and completes or aborts what it left open, and a new
consumer from offset 0. A commit that times out is tried again (about every second time,
seeded) before the process gives up on it.

Beside them, plain consumers poll every partition (``read_committed``, the workload's
:func:`~automq_ref.checker.workload.consume`). After the faults, a final read takes every
partition from its start to its end as a ``read_committed`` consumer sees it, once no
transaction is open (the last stable offset has caught up with the high watermark), and
records it as final polls. :mod:`automq_ref.checker.transactional` checks the history.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from automq_ref.checker.nemesis import Environment
from automq_ref.checker.workload import (
    CLIENT_LOG,
    FINAL_READ_GRACE_S,
    FINAL_READ_TIMEOUT_S,
    CheckTally,
    History,
    WorkloadResult,
    WorkloadSettings,
    client_config,
    create_topic,
    run_clients,
    watermarks,
)

log = logging.getLogger(__name__)

ABORT_FRACTION = 0.2  # of transactions the client aborts itself
POLL_FRACTION = 0.3  # of micro-operations that are polls
MICRO_OPS = (2, 5)  # micro-operations per transaction, at least and at most
TRANSACTION_TIMEOUT_MS = 10_000
CALL_TIMEOUT_S = 3.0  # init, commit and abort calls
COMMIT_ATTEMPTS = 3
POLL_RECORDS = 50
POLL_TIMEOUT_S = 0.05


def run_txn_workload(
    env: Environment, settings: WorkloadSettings, tally: CheckTally | None = None
) -> WorkloadResult:
    tally = tally if tally is not None else CheckTally(settings.duration_s)
    tally.acknowledged = [0] * settings.producers
    tally.counted = "transactions committed"
    topic = create_topic(env, settings, "checked-txn")
    history = History()
    stop = threading.Event()
    committed = tally.acknowledged
    faults = run_clients(
        env,
        settings,
        tally,
        (topic, history, stop),
        lambda slot: _transact(env, topic, settings, slot, history, stop, committed),
        "transactions",
    )
    tally.stage = "final read"
    unreadable = final_committed_read(env.bootstrap, topic, settings, history)
    return WorkloadResult(history.ops, faults, topic, unreadable)


def _transact(
    env: Environment,
    topic: str,
    settings: WorkloadSettings,
    slot: int,
    history: History,
    stop: threading.Event,
    committed: list[int],
) -> None:
    """One transactional slot: processes one after another until ``stop``."""
    rng = random.Random(f"{settings.seed}-{slot}")
    generation = 0
    while not stop.is_set():
        process = slot + 10_000 * generation
        try:
            _transact_until_restart(
                env, topic, settings, (slot, process), rng, history, stop, committed
            )
        except Exception:  # a client that cannot be made: try again, as a new process
            log.exception("transactional process %d", process)
            time.sleep(0.5)
        generation += 1


def _transact_until_restart(
    env: Environment,
    topic: str,
    settings: WorkloadSettings,
    who: tuple[int, int],
    rng: random.Random,
    history: History,
    stop: threading.Event,
    committed: list[int],
) -> None:
    """One process of slot ``who[0]`` (``who[1]`` its number) until an ``info`` transaction;
    each commit is counted in ``committed[slot]``."""
    slot, process = who
    client = client_config(env, slot)
    producer = Producer(
        {
            **client,
            "logger": CLIENT_LOG,
            "transactional.id": f"{topic}-txn-{slot}",
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "message.timeout.ms": 8000,
            "request.timeout.ms": 5000,
            "socket.timeout.ms": 5000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
    )
    while not _initialised(producer):
        if stop.is_set():
            return
        time.sleep(0.2)
    consumer = Consumer(
        {
            **client,
            "logger": CLIENT_LOG,
            "group.id": f"checker-txn-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "socket.timeout.ms": 5000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
    )
    assigned = list(range(settings.partitions))
    consumer.assign([TopicPartition(topic, p, 0) for p in assigned])
    count = 0
    try:
        while not stop.is_set():
            mops: list[list[Any]] = []
            for _ in range(rng.randint(*MICRO_OPS)):
                if rng.random() < POLL_FRACTION:
                    mops.append(["poll"])
                else:
                    mops.append(["send", rng.randrange(settings.partitions), f"{process}-{count}"])
                    count += 1
            history.add(process, "invoke", "txn", {"mops": mops, "partitions": assigned})
            outcome, done, error = _transaction(producer, consumer, topic, mops, rng)
            value: dict[str, object] = {"mops": done}
            if error:
                value["error"] = error
            history.add(process, outcome, "txn", value)
            if outcome == "ok":
                committed[slot] += 1
            if outcome == "info":
                log.info("transactional process %d ends: %s", process, error)
                return
    finally:
        consumer.close()


def _initialised(producer: Producer) -> bool:
    """``init_transactions`` done; False to try again (a retriable error: the coordinator
    away or still completing the previous instance's transaction)."""
    try:
        producer.init_transactions(CALL_TIMEOUT_S)
        return True
    except KafkaException as error:
        if _error(error).fatal():
            raise
        return False


def _transaction(
    producer: Producer,
    consumer: Consumer,
    topic: str,
    mops: list[list[Any]],
    rng: random.Random,
) -> tuple[str, list[list[Any]], str]:
    """Run one planned transaction: (outcome, the micro-operations done, the error if any)."""
    offsets: dict[str, int | None] = {}

    def delivered(error: KafkaError | None, message: Message) -> None:
        value = (message.value() or b"").decode()
        offsets[value] = message.offset() if error is None else None

    done: list[list[Any]] = []
    abort = rng.random() < ABORT_FRACTION
    outcome, why = "ok", ""
    try:
        producer.begin_transaction()
        for mop in mops:
            if mop[0] == "send":
                _, partition, value = mop
                producer.produce(topic, value.encode(), partition=partition, on_delivery=delivered)
                done.append(["send", partition, value, None])
            else:
                records = [
                    [message.partition(), message.offset(), (message.value() or b"").decode()]
                    for message in consumer.consume(POLL_RECORDS, POLL_TIMEOUT_S)
                    if message.error() is None
                ]
                done.append(["poll", records])
        if abort:
            producer.abort_transaction(CALL_TIMEOUT_S)
            outcome = "fail"
        else:
            _commit(producer, rng)
    except KafkaException as failure:
        outcome, why = _after_failure(producer, failure)
    for mop in done:
        if mop[0] == "send":
            mop[3] = offsets.get(mop[2])
    return outcome, done, why


def _commit(producer: Producer, rng: random.Random) -> None:
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            producer.commit_transaction(CALL_TIMEOUT_S)
            return
        except KafkaException as failure:
            error = _error(failure)
            if not error.retriable() or attempt == COMMIT_ATTEMPTS or rng.random() < 0.5:
                raise


def _after_failure(producer: Producer, failure: KafkaException) -> tuple[str, str]:
    """The outcome of a transaction whose call failed: ``fail`` if an abort the error asked for
    went through, else ``info``."""
    error = _error(failure)
    if not error.txn_requires_abort():
        return "info", str(error)
    try:
        producer.abort_transaction(CALL_TIMEOUT_S)
    except KafkaException as again:
        return "info", f"{error}; then the abort: {_error(again)}"
    return "fail", str(error)


def _error(failure: KafkaException) -> KafkaError:
    error = failure.args[0] if failure.args else None
    if isinstance(error, KafkaError):
        return error
    return KafkaError(KafkaError._FAIL, str(failure))


def final_committed_read(
    bootstrap: str, topic: str, settings: WorkloadSettings, history: History
) -> list[int]:
    """Every partition from its start to its end as a ``read_committed`` consumer reads it,
    once its last stable offset has caught up with its high watermark (every transaction
    ended), recorded as one final poll per partition; the partitions whose offsets could not
    be had are returned. A partition whose transactions did not all end in time is read up
    to its last stable offset, and its final poll carries no ``log_end``."""
    committed = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "logger": CLIENT_LOG,
            "group.id": f"final-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    uncommitted = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "logger": CLIENT_LOG,
            "group.id": f"final-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_uncommitted",
        }
    )
    process = 1000
    unreadable: list[int] = []
    deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
    try:
        for partition in range(settings.partitions):
            history.add(process, "invoke", "poll", {"partitions": [partition], "final": True})
            try:
                low, stable, high = _settled(committed, uncommitted, topic, partition, deadline)
            except KafkaException as error:
                log.warning("final read of partition %d: %s", partition, error)
                history.add(process, "info", "poll", {"error": str(error), "final": True})
                process += 1
                unreadable.append(partition)
                continue
            records, reached = read_to_end(committed, topic, partition, low, stable)
            result: dict[str, object] = {
                "records": [[partition, offset, value] for offset, value in records],
                "final": True,
                "log_start": {str(partition): low},
            }
            if reached and stable == high:
                result["log_end"] = {str(partition): high}
            history.add(process, "ok", "poll", result)
    finally:
        committed.close()
        uncommitted.close()
    return unreadable


def _settled(
    committed: Consumer, uncommitted: Consumer, topic: str, partition: int, deadline: float
) -> tuple[int, int, int]:
    """(log start, last stable offset, high watermark), waiting (until ``deadline``) for the
    last stable offset to reach the high watermark."""
    while True:
        wait_s = max(deadline - time.monotonic(), FINAL_READ_GRACE_S)
        low, stable = watermarks(committed, topic, partition, wait_s)
        _, high = watermarks(uncommitted, topic, partition, wait_s)
        if stable >= high or time.monotonic() > deadline:
            return low, stable, high
        time.sleep(0.2)


def read_to_end(
    consumer: Consumer, topic: str, partition: int, low: int, end: int, timeout_s: float = 60
) -> tuple[list[tuple[int, str]], bool]:
    """(offset, value) of every record the consumer returns from ``low`` until it reports the
    partition's end at ``end`` or beyond (control records and aborted ones take offsets but
    are never returned, so the end is known by the end-of-partition event, not by offsets),
    and whether it got there within ``timeout_s``."""
    consumer.assign([TopicPartition(topic, partition, low)])
    records: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in consumer.consume(num_messages=1000, timeout=0.5):
            error = message.error()
            if error is None:
                offset = message.offset()
                assert offset is not None
                records.append((offset, (message.value() or b"").decode()))
            elif error.code() == KafkaError._PARTITION_EOF and (message.offset() or 0) >= end:
                return records, True
    return records, False
