"""The node in process: what its seams inject reaches the parts (the clock's time is the node
epoch proposed at registration, and the granted one opens the WAL; the hook runs before anything
is opened), and the connection's peer reaches the handlers (JoinGroup records the member's real
host, which DescribeGroups reports)."""

from __future__ import annotations

import datetime
import inspect
from pathlib import Path
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.create_topics.v5.request import CreatableTopic
from kio.schema.join_group.v3.request import JoinGroupRequestProtocol
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from automq_ref.config import BrokerConfig, load_config
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.kafka.server import Peer
from automq_ref.node import Seams, open_wal, start_node


def node_config(tmp_path: Path) -> BrokerConfig:
    return load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
            "listeners=PLAINTEXT://127.0.0.1:0",  # a free port: 9092 is make run's
        ],
        environment={},
    )


class Chunks(list[bytes]):
    def write(self, chunk: bytes) -> int:
        self.append(bytes(chunk))
        return len(chunk)


def request_frame(api_key: int, version: int, correlation_id: int, **body: Any) -> bytes:
    cls: Any = load_request_schema(api_key, version)
    header_cls: Any = cls.__header_schema__
    out = Chunks()
    header = header_cls(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id="node-test",
    )
    write_header: Any = entity_writer(header_cls)
    write_body: Any = entity_writer(cls)
    write_header(out, header)
    write_body(out, cls(**body))
    return b"".join(out)


async def call(admit: Any, peer: Peer, api_key: int, version: int, **body: Any) -> Any:
    reply = await admit(request_frame(api_key, version, 1, **body), peer)
    if inspect.isawaitable(reply):
        reply = await reply
    data = b"".join(bytes(chunk) for chunk in reply)
    cls = load_response_schema(api_key, version)
    header, offset = entity_reader(cls.__header_schema__)(data, 0)
    assert header.correlation_id == 1
    response, _ = entity_reader(cls)(data, offset)
    return response


async def create_topic(admit: Any, peer: Peer, name: str, partitions: int) -> None:
    """CreateTopics (v5) of one topic, which must succeed."""
    created = await call(
        admit,
        peer,
        19,  # CreateTopics
        5,
        topics=(
            CreatableTopic(
                name=TopicName(name),
                num_partitions=i32(partitions),
                replication_factor=i16(1),
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    assert int(created.topics[0].error_code) == 0


async def test_join_group_records_the_connections_host(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    try:
        peer = Peer(7, "10.1.2.3:45678")
        joined = await call(
            node.front_end.admit,
            peer,
            11,  # JoinGroup
            3,
            group_id="hosts",
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10),
            member_id="",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
        assert int(joined.error_code) == 0
        described = await call(
            node.front_end.admit,
            Peer(8, "127.0.0.1:1"),
            15,  # DescribeGroups
            3,
            groups=("hosts",),
            include_authorized_operations=False,
        )
        (group,) = described.groups
        (member,) = group.members
        assert member.member_id == joined.member_id
        assert member.client_id == "node-test"
        assert member.client_host == "/10.1.2.3"
    finally:
        await node.shutdown()


async def test_seams_reach_the_parts(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    seen: list[Any] = []

    class FixedClock:
        def now_ms(self) -> int:
            return 1_234_567

        def monotonic_s(self) -> float:
            return 42.0

    def before_open(given: BrokerConfig) -> None:
        seen.append(("before_open", given is config, (tmp_path / "metadata").exists()))

    async def opener(given: BrokerConfig, node_epoch: int) -> WriteAheadLog:
        seen.append(("open_wal", given is config, node_epoch))
        return await open_wal(given, node_epoch)

    node = await start_node(config, Seams(FixedClock(), opener, before_open))
    try:
        assert node.clock.now_ms() == 1_234_567
        assert node.context.clock is node.clock
        assert node.storage._clock is node.clock and node.groups._clock is node.clock
        assert node.topics.producer_expiry.clock is node.clock  # the partitions' time
        assert node.storage.node_epoch == node.view.image.nodes[config.node_id].node_epoch
    finally:
        await node.shutdown()
    assert seen == [("before_open", True, False), ("open_wal", True, 1_234_567)]

    # A restart on the same clock (or one that went back) is granted a newer epoch than the
    # stored one: the WAL and every request of the new incarnation carry the grant.
    seen.clear()
    node = await start_node(config, Seams(FixedClock(), opener, before_open))
    try:
        assert node.storage.node_epoch == 1_234_568
        assert node.view.image.nodes[config.node_id].node_epoch == 1_234_568
    finally:
        await node.shutdown()
    assert seen == [("before_open", True, True), ("open_wal", True, 1_234_568)]
