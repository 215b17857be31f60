"""The group coordinator's shell in process: on a clock the test moves, a request sees every
timer due at its time already fired, without waiting for the ticker (a static member that
stopped heartbeating is gone for the DeleteGroups sent one session timeout later); the session
timeout bounds are broker settings."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from kio.schema.join_group.v5.request import JoinGroupRequestProtocol
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.sync_group.v3.request import SyncGroupRequestAssignment
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from automq_ref.config import ConfigError, load_config
from automq_ref.io.clock import SystemClock
from automq_ref.kafka.server import Peer
from automq_ref.node import Seams, start_node
from tests.unit.test_broker_node import call, create_topic, node_config

PEER = Peer(1, "127.0.0.1:1")
SESSION_MS = 6000


class ManualClock:
    """Wall time the test moves; monotonic time runs (long polls and sleeps still end)."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def now_ms(self) -> int:
        return self.now

    def monotonic_s(self) -> float:
        return SystemClock().monotonic_s()


async def test_a_request_after_a_session_deadline_sees_the_member_gone(tmp_path: Path) -> None:
    clock = ManualClock()
    node = await start_node(node_config(tmp_path), Seams(clock))
    admit: Any = node.front_end.admit
    try:
        joined = await call(
            admit,
            PEER,
            11,  # JoinGroup
            5,
            group_id="static",
            session_timeout=datetime.timedelta(milliseconds=SESSION_MS),
            rebalance_timeout=datetime.timedelta(seconds=30),
            member_id="",
            group_instance_id="instance-0",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
        assert int(joined.error_code) == 0
        synced = await call(
            admit,
            PEER,
            14,  # SyncGroup
            3,
            group_id="static",
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            group_instance_id="instance-0",
            assignments=(SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b""),),
        )
        assert int(synced.error_code) == 0
        # A consumer commits before it closes: the offsets keep the group once it is Empty.
        await create_topic(admit, PEER, "read", 1)
        committed = await call(
            admit,
            PEER,
            8,  # OffsetCommit
            8,
            group_id="static",
            generation_id_or_member_epoch=joined.generation_id,
            member_id=joined.member_id,
            group_instance_id="instance-0",
            topics=(
                OffsetCommitRequestTopic(
                    name=TopicName("read"),
                    partitions=(
                        OffsetCommitRequestPartition(
                            partition_index=i32(0),
                            committed_offset=i64(0),
                            committed_leader_epoch=i32(-1),
                            committed_metadata=None,
                        ),
                    ),
                ),
            ),
        )
        assert int(committed.topics[0].partitions[0].error_code) == 0

        async def state() -> tuple[str, int]:
            described = await call(
                admit, PEER, 15, 5, groups=("static",), include_authorized_operations=False
            )
            (group,) = described.groups
            return group.group_state, len(group.members)

        clock.now += SESSION_MS - 1
        assert await state() == ("Stable", 1)
        # The static member sends nothing more (no LeaveGroup): its session ends.
        clock.now += 1
        assert await state() == ("Empty", 0)
        deleted = await call(admit, PEER, 42, 2, groups_names=("static",))
        assert [int(result.error_code) for result in deleted.results] == [0]
    finally:
        await node.shutdown()


async def test_session_timeout_bounds_are_broker_settings(tmp_path: Path) -> None:
    """``group.min.session.timeout.ms`` / ``group.max.session.timeout.ms`` (Kafka's names and
    defaults, 6 s and 30 min) bound JoinGroup's session timeout: outside them the answer is
    INVALID_SESSION_TIMEOUT. Test suites lower the minimum to run clients with short sessions."""

    async def join(admit: Any, session_ms: int) -> int:
        joined = await call(
            admit,
            PEER,
            11,  # JoinGroup
            5,
            group_id="bounds",
            session_timeout=datetime.timedelta(milliseconds=session_ms),
            rebalance_timeout=datetime.timedelta(seconds=30),
            member_id="",
            group_instance_id="instance-0",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
        return int(joined.error_code)

    node = await start_node(node_config(tmp_path))
    try:
        assert await join(node.front_end.admit, 5000) == 26  # INVALID_SESSION_TIMEOUT
        assert await join(node.front_end.admit, 1_800_001) == 26
    finally:
        await node.shutdown()
    config = node_config(tmp_path).model_copy(
        update={"group_min_session_timeout_ms": 1000, "group_max_session_timeout_ms": 10_000}
    )
    node = await start_node(config)
    try:
        assert await join(node.front_end.admit, 5000) == 0
        assert await join(node.front_end.admit, 10_001) == 26
    finally:
        await node.shutdown()
    with pytest.raises(ConfigError, match=r"group\.min\.session\.timeout\.ms"):
        load_config(
            overrides=["group.min.session.timeout.ms=2000", "group.max.session.timeout.ms=1000"],
            environment={},
        )
