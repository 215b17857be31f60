"""Metadata keeps listing a broker fenced by its session for a moment: while a crash failover is
about to close its streams (``awaiting_failover``), and for two seconds after this broker first
saw it fenced (``RecentlyFenced``), so that the answer naming its partitions' new leaders still
lists it (librdkafka otherwise parks the partitions on its internal broker until its next leader
query: ``bench.failover_bench --breakdown``). A broker in controlled shutdown is listed by its
own rule (``tests/unit/test_controlled_shutdown.py``), not by these.
"""

from __future__ import annotations

from automq_ref.io.metadata.failover_contexts import FailoverSettings, awaiting_failover
from automq_ref.kafka.fenced_brokers import FENCED_LINGER_S, RecentlyFenced
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    BrokerHeartbeat,
    CloseStream,
    ControlledShutdown,
    CreateStream,
    CreateTopic,
    ExpireSessions,
    OpenStream,
    RegisterNode,
)
from tests.properties.test_placement import SESSION_MS, listeners, run, topic_value

S3_WAL = "0@s3://wal?region=r&endpoint=http://127.0.0.1:1"
GRACE_MS = 1_000


def two_brokers(wal_of_one: str) -> tuple[sm.StreamMetadataImage, int]:
    """Brokers 1 and 2 (epochs 0), a one-partition topic on 1 with a stream open there, then
    broker 1's session lapsed (fenced, its partition moved to 2). The image and the stream."""
    image = run(
        sm.EMPTY_IMAGE,
        RegisterNode(1, 0, "a", listeners(1), wal_config=wal_of_one),
        RegisterNode(2, 0, "b", listeners(2), wal_config=S3_WAL),
        BrokerHeartbeat(1, 0, 1_000),
        BrokerHeartbeat(2, 0, 1_000),
        CreateTopic("t0", topic_value("t0", 1), (1,)),
    )
    placed = sm.placed_topic(image, "t0")
    assert placed is not None
    created = sm.step(image, CreateStream(1, 0, placed.topic_id, 0), sm.StreamMetadataParams())
    stream_id = sm.response_of(created).stream_id
    assert stream_id is not None
    image = run(
        created.state,
        OpenStream(1, 0, stream_id, 0),
        BrokerHeartbeat(2, 0, 1_000 + SESSION_MS),
        ExpireSessions(1_000 + SESSION_MS + 1),
    )
    assert image.brokers[1].fenced and not image.brokers[1].in_controlled_shutdown
    assert sm.broker_partitions(image, 1) == []
    return image, stream_id


def test_a_fenced_broker_awaits_failover_while_its_streams_are_open() -> None:
    image, stream_id = two_brokers(S3_WAL)
    settings = FailoverSettings(GRACE_MS)
    now_ms = 10 * SESSION_MS
    assert awaiting_failover(image, now_ms, settings) == {1}
    # Not while it is young enough to recover its own WAL (the grace) ...
    assert awaiting_failover(image, 0, settings) == frozenset()
    # ... nor once the failover closed its streams (at its bumped epoch).
    closed = run(image, CloseStream(1, image.nodes[1].node_epoch, stream_id, 0))
    assert awaiting_failover(closed, now_ms, settings) == frozenset()


def test_a_fenced_broker_on_a_wal_no_survivor_reaches_awaits_nothing() -> None:
    image, _ = two_brokers("0@file:///var/wal")
    assert awaiting_failover(image, 10 * SESSION_MS, FailoverSettings(GRACE_MS)) == frozenset()


def test_a_fenced_broker_lingers_for_a_while_after_it_was_first_seen_fenced() -> None:
    image, _ = two_brokers("0@file:///var/wal")
    fenced = RecentlyFenced()
    assert fenced.lingering(image, 100.0) == {1}
    assert fenced.lingering(image, 100.0 + FENCED_LINGER_S - 0.01) == {1}
    assert fenced.lingering(image, 100.0 + FENCED_LINGER_S) == frozenset()
    # Registered again (a new incarnation, fenced until its first heartbeat): seen anew.
    again = run(image, RegisterNode(1, 5, "a", listeners(1)))
    assert fenced.lingering(again, 200.0) == {1}
    assert fenced.lingering(again, 200.0 + FENCED_LINGER_S) == frozenset()


def test_a_broker_in_controlled_shutdown_does_not_linger() -> None:
    image = run(
        sm.EMPTY_IMAGE,
        RegisterNode(1, 0, "a", listeners(1)),
        BrokerHeartbeat(1, 0, 1_000),
        ControlledShutdown(1, 0),
    )
    assert RecentlyFenced().lingering(image, 0.0) == frozenset()
