"""The authorizer applied to the Kafka APIs (automq_ref/kafka/handlers/authorize.py and the
handlers' checks): one node in process whose ``authorizer.class.name``, ``super.users`` and
``allow.everyone.if.no.acl.found`` come from its properties; an admin (a super user) creates
ACLs with CreateAcls and alice (``User:alice``, a connection's principal as a login sets it) is
refused, then served, API by API, with Kafka's error codes. The settings' refusals, and that
without an authorizer the checks never look at what they are given."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnTopic
from kio.schema.alter_client_quotas.v1.request import EntityData as QuotaEntity
from kio.schema.alter_client_quotas.v1.request import EntryData as QuotaEntry
from kio.schema.alter_client_quotas.v1.request import OpData
from kio.schema.alter_partition_reassignments.v0.request import (
    ReassignablePartition,
    ReassignableTopic,
)
from kio.schema.alter_user_scram_credentials.v0.request import ScramCredentialDeletion
from kio.schema.create_partitions.v3.request import CreatePartitionsTopic
from kio.schema.create_topics.v7.request import CreatableTopic
from kio.schema.delete_topics.v6.request import DeleteTopicState
from kio.schema.describe_configs.v4.request import DescribeConfigsResource
from kio.schema.describe_topic_partitions.v0.request import TopicRequest
from kio.schema.elect_leaders.v2.request import TopicPartitions
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.join_group.v9.request import JoinGroupRequestProtocol
from kio.schema.list_offsets.v8.request import ListOffsetsPartition, ListOffsetsTopic
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.schema.offset_commit.v9.request import (
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v9.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import GroupId, ProducerId, TopicName
from kio.schema.write_txn_markers.v1.request import WritableTxnMarker, WritableTxnMarkerTopic
from kio.static.primitive import Records, f64, i8, i16, i32, i64

from automq_ref.config import ConfigError, load_config
from automq_ref.errors import KafkaErrorCode as E
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.handlers import authorize
from automq_ref.node import Node, start_node
from automq_ref.state_machines.acl import STANDARD_AUTHORIZER, AclOperation, ResourceType, bit_field
from tests.unit.test_acls import (
    ALLOW,
    CLUSTER,
    DENY,
    GROUP,
    PREFIXED,
    READ,
    TOPIC,
    WRITE,
    create,
    creation,
    peer,
)
from tests.unit.test_broker_node import call, create_topic

ADMIN = peer("User:admin")
ALICE = peer("User:alice")
TOPIC_TYPE = ResourceType.TOPIC
CREATE_OP, DELETE_OP, ALTER_OP, DESCRIBE_OP = 5, 6, 7, 8
TRANSACTIONAL_ID = 5
# API keys
METADATA, CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 3, 19, 20, 37
FIND_COORDINATOR, JOIN_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 10, 11, 15, 16, 42
OFFSET_COMMIT, OFFSET_FETCH, INIT_PRODUCER_ID, LIST_OFFSETS = 8, 9, 22, 2
DESCRIBE_CONFIGS, DESCRIBE_LOG_DIRS, DESCRIBE_SCRAM, DESCRIBE_CLUSTER = 32, 35, 50, 60
DESCRIBE_QUOTAS, LIST_REASSIGNMENTS = 48, 46


def properties(tmp_path: Path, *extra: str) -> list[str]:
    return [
        f"log.dirs={tmp_path}",
        "s3.wal.capacity=16777216",
        "listeners=PLAINTEXT://127.0.0.1:0",
        *extra,
    ]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    config = load_config(
        overrides=properties(
            tmp_path,
            f"authorizer.class.name={STANDARD_AUTHORIZER}",
            "super.users=User:admin;User:broker",
        ),
        environment={},
    )
    running = await start_node(config)
    try:
        yield running
    finally:
        await running.shutdown()


async def allow(node: Node, *creations: Any) -> None:
    assert await create(node, *creations, who=ADMIN) == [(0, None)] * len(creations)


def cluster_acl(operation: int) -> Any:
    return creation("kafka-cluster", CLUSTER, principal="User:alice", operation=operation)


def topic_acl(name: str, operation: int, permission: int = ALLOW, **more: Any) -> Any:
    return creation(name, TOPIC, operation=operation, permission=permission, **more)


async def metadata(node: Node, who: Any, *names: str, auto: bool = False) -> dict[str, Any]:
    topics = (
        None
        if not names
        else tuple(MetadataRequestTopic(topic_id=None, name=TopicName(n)) for n in names)
    )
    response = await call(
        node.front_end.admit,
        who,
        METADATA,
        12,
        topics=topics,
        allow_auto_topic_creation=auto,
        include_topic_authorized_operations=True,
    )
    return {t.name: t for t in response.topics}


def offset_at(offset: int) -> OffsetCommitRequestPartition:
    return OffsetCommitRequestPartition(
        partition_index=i32(0),
        committed_offset=i64(offset),
        committed_leader_epoch=i32(-1),
        committed_metadata=None,
    )


async def commit_offsets(node: Node, who: Any, *names: str) -> dict[str, int]:
    """OffsetCommit (v9, no member) of offset 5 of partition 0 of each topic to group g."""
    topics = tuple(
        OffsetCommitRequestTopic(name=TopicName(name), partitions=(offset_at(5),)) for name in names
    )
    response = await call(
        node.front_end.admit,
        who,
        OFFSET_COMMIT,
        9,
        group_id=GroupId("g"),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        group_instance_id=None,
        topics=topics,
    )
    return {t.name: int(t.partitions[0].error_code) for t in response.topics}


# ------------------------------------------------------------------------------ settings


def test_the_three_properties_make_the_settings(tmp_path: Path) -> None:
    config = load_config(
        overrides=properties(
            tmp_path,
            f"authorizer.class.name={STANDARD_AUTHORIZER}",
            "super.users=User:admin; User:CN=broker,O=example",
            "allow.everyone.if.no.acl.found=true",
        ),
        environment={},
    )
    settings = config.authorizer
    assert settings.enabled and settings.allow_if_no_acl
    assert settings.super_users == {"User:admin", "User:CN=broker,O=example"}
    assert not load_config(overrides=properties(tmp_path), environment={}).authorizer.enabled


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("authorizer.class.name=kafka.security.authorizer.AclAuthorizer", "authorizer.class.name="),
        ("super.users=admin", "super.users="),
    ],
)
def test_refused_settings_name_the_property(tmp_path: Path, setting: str, named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=properties(tmp_path, setting), environment={})
    assert str(refused.value).startswith(named)


async def test_a_node_without_an_authorizer_has_none(tmp_path: Path) -> None:
    running = await start_node(load_config(overrides=properties(tmp_path), environment={}))
    try:
        assert running.front_end.context.acls is None
        # The checks cost one attribute test: what they are given is never looked at.
        context = running.front_end.context

        def untouched() -> Iterator[str]:
            raise AssertionError("read without an authorizer")
            yield ""  # pragma: no cover

        request: Any = None
        assert (
            authorize.denied(context, request, AclOperation.READ, TOPIC_TYPE, untouched()) == set()
        )
        assert authorize.allowed(context, request, AclOperation.WRITE, TOPIC_TYPE, "t")
    finally:
        await running.shutdown()


# ------------------------------------------------------------------------------ topics


async def test_metadata_hides_what_alice_may_not_describe(node: Node) -> None:
    admit = node.front_end.admit
    await create_topic(admit, ADMIN, "visible", 1)
    await create_topic(admit, ADMIN, "secret", 1)
    await allow(node, topic_acl("visible", READ, principal="User:alice"))
    # The admin sees both; alice only the one she may read (READ implies DESCRIBE).
    assert {"visible", "secret"} <= set(await metadata(node, ADMIN))
    listed = await metadata(node, ALICE)
    assert "visible" in listed and "secret" not in listed
    assert listed["visible"].topic_authorized_operations == bit_field(
        [AclOperation.READ, AclOperation.DESCRIBE]
    )
    named = await metadata(node, ALICE, "secret", "visible")
    assert named["secret"].error_code == E.TOPIC_AUTHORIZATION_FAILED
    assert named["secret"].partitions == ()
    assert named["visible"].error_code == 0


async def test_auto_creation_needs_create(node: Node) -> None:
    # DESCRIBE but not CREATE on a missing topic: refused, not created.
    await allow(node, topic_acl("auto-", DESCRIBE_OP, pattern=PREFIXED, principal="User:alice"))
    refused = await metadata(node, ALICE, "auto-one", auto=True)
    assert refused["auto-one"].error_code == E.TOPIC_AUTHORIZATION_FAILED
    assert "auto-one" not in node.topics.topics
    await allow(node, topic_acl("auto-", CREATE_OP, pattern=PREFIXED, principal="User:alice"))
    created = await metadata(node, ALICE, "auto-one", auto=True)
    assert created["auto-one"].error_code == 0 and "auto-one" in node.topics.topics


async def test_create_delete_and_grow_topics(node: Node) -> None:
    admit = node.front_end.admit

    async def create_one(name: str) -> Any:
        topic = CreatableTopic(
            name=TopicName(name),
            num_partitions=i32(1),
            replication_factor=i16(1),
            assignments=(),
            configs=(),
        )
        response = await call(
            admit,
            ALICE,
            CREATE_TOPICS,
            7,
            topics=(topic,),
            timeout=datetime.timedelta(seconds=10),
            validate_only=False,
        )
        return response.topics[0]

    denied = await create_one("made")
    assert (denied.error_code, denied.error_message) == (
        E.TOPIC_AUTHORIZATION_FAILED,
        "Authorization failed.",
    )
    await allow(node, cluster_acl(CREATE_OP))
    made = await create_one("made")
    # Created, but its configs are not alice's to see without DESCRIBE_CONFIGS.
    assert made.error_code == 0 and made.configs == ()
    assert made.topic_config_error_code == E.TOPIC_AUTHORIZATION_FAILED

    grown = await call(
        admit,
        ALICE,
        CREATE_PARTITIONS,
        3,
        topics=(CreatePartitionsTopic(name=TopicName("made"), count=i32(2), assignments=None),),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    assert grown.results[0].error_code == E.TOPIC_AUTHORIZATION_FAILED

    async def delete() -> int:
        deleted = await call(
            admit,
            ALICE,
            DELETE_TOPICS,
            6,
            topics=(DeleteTopicState(name=TopicName("made"), topic_id=None),),
            timeout=datetime.timedelta(seconds=10),
        )
        return int(deleted.responses[0].error_code)

    assert await delete() == E.TOPIC_AUTHORIZATION_FAILED
    assert "made" in node.topics.topics
    await allow(node, topic_acl("made", DELETE_OP, principal="User:alice"))
    assert await delete() == 0


async def test_list_offsets_and_configs_need_describe(node: Node) -> None:
    admit = node.front_end.admit
    await create_topic(admit, ADMIN, "offsets", 1)
    asked = ListOffsetsTopic(
        name=TopicName("offsets"),
        partitions=(
            ListOffsetsPartition(
                partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(-1)
            ),
        ),
    )
    listed = await call(
        admit, ALICE, LIST_OFFSETS, 8, replica_id=i32(-1), isolation_level=i8(0), topics=(asked,)
    )
    assert listed.topics[0].partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED

    async def configs(kind: int, name: str) -> Any:
        resource = DescribeConfigsResource(
            resource_type=i8(kind), resource_name=name, configuration_keys=None
        )
        response = await call(
            admit,
            ALICE,
            DESCRIBE_CONFIGS,
            4,
            resources=(resource,),
            include_synonyms=False,
            include_documentation=False,
        )
        return response.results[0].error_code

    assert await configs(2, "offsets") == E.TOPIC_AUTHORIZATION_FAILED
    assert await configs(4, "0") == E.CLUSTER_AUTHORIZATION_FAILED
    await allow(node, topic_acl("offsets", READ, principal="User:alice"))
    listed = await call(
        admit, ALICE, LIST_OFFSETS, 8, replica_id=i32(-1), isolation_level=i8(0), topics=(asked,)
    )
    assert listed.topics[0].partitions[0].error_code == 0


# ------------------------------------------------------------------------------ groups


async def test_groups_need_their_operations(node: Node) -> None:
    admit = node.front_end.admit
    await create_topic(admit, ADMIN, "consumed", 1)

    async def join(who: Any) -> Any:
        return await call(
            admit,
            who,
            JOIN_GROUP,
            9,
            group_id=GroupId("g"),
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10),
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
            reason=None,
        )

    assert (await join(ALICE)).error_code == E.GROUP_AUTHORIZATION_FAILED
    found = await call(admit, ALICE, FIND_COORDINATOR, 4, key_type=i8(0), coordinator_keys=("g",))
    assert found.coordinators[0].error_code == E.GROUP_AUTHORIZATION_FAILED
    described = await call(
        admit, ALICE, DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=True
    )
    assert described.groups[0].error_code == E.GROUP_AUTHORIZATION_FAILED
    dropped = await call(admit, ALICE, DELETE_GROUPS, 2, groups_names=("g",))
    assert dropped.results[0].error_code == E.GROUP_AUTHORIZATION_FAILED

    async def commit() -> int:
        return (await commit_offsets(node, ALICE, "consumed"))["consumed"]

    assert await commit() == E.GROUP_AUTHORIZATION_FAILED
    await allow(node, creation("g", GROUP, principal="User:alice", operation=READ))
    assert (await join(ALICE)).error_code != E.GROUP_AUTHORIZATION_FAILED
    # READ on the group, none on the topic: the topic's partitions are refused.
    assert await commit() == E.TOPIC_AUTHORIZATION_FAILED
    await allow(node, topic_acl("consumed", READ, principal="User:alice"))
    assert await commit() == 0
    found = await call(admit, ALICE, FIND_COORDINATOR, 4, key_type=i8(0), coordinator_keys=("g",))
    assert found.coordinators[0].error_code == 0
    described = await call(
        admit, ALICE, DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=True
    )
    (group,) = described.groups
    assert group.error_code == 0
    assert group.authorized_operations == bit_field([AclOperation.READ, AclOperation.DESCRIBE])


async def test_offset_fetch_and_list_groups_filter(node: Node) -> None:
    admit = node.front_end.admit
    await create_topic(admit, ADMIN, "read", 1)
    await create_topic(admit, ADMIN, "hidden", 1)
    await allow(
        node,
        creation("g", GROUP, principal="User:alice", operation=READ),
        topic_acl("read", READ, principal="User:alice"),
    )
    assert await commit_offsets(node, ADMIN, "read", "hidden") == {"read": 0, "hidden": 0}

    async def fetch(names: tuple[str, ...] | None) -> dict[str, int]:
        wanted = (
            None
            if names is None
            else tuple(
                OffsetFetchRequestTopics(name=TopicName(n), partition_indexes=(i32(0),))
                for n in names
            )
        )
        group = OffsetFetchRequestGroup(
            group_id=GroupId("g"), member_id=None, member_epoch=i32(-1), topics=wanted
        )
        response = await call(admit, ALICE, OFFSET_FETCH, 9, groups=(group,), require_stable=False)
        (answered,) = response.groups
        assert answered.error_code == 0
        return {t.name: int(t.partitions[0].error_code) for t in answered.topics}

    assert await fetch(None) == {"read": 0}  # every topic: the hidden one left out
    assert await fetch(("read", "hidden")) == {"read": 0, "hidden": E.TOPIC_AUTHORIZATION_FAILED}
    await allow(node, creation("other", GROUP, principal="User:bob", operation=READ))
    listed = await call(admit, ALICE, LIST_GROUPS, 5, states_filter=(), types_filter=())
    assert {g.group_id for g in listed.groups} == {"g"}
    everything = await call(admit, ADMIN, LIST_GROUPS, 5, states_filter=(), types_filter=())
    assert "g" in {g.group_id for g in everything.groups}


# ------------------------------------------------------------------ producers, the cluster


async def test_init_producer_id(node: Node) -> None:
    admit = node.front_end.admit

    async def init(transactional_id: str | None) -> int:
        response = await call(
            admit,
            ALICE,
            INIT_PRODUCER_ID,
            5,
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=i64(-1),
            producer_epoch=-1,
        )
        return int(response.error_code)

    assert await init(None) == E.CLUSTER_AUTHORIZATION_FAILED
    assert await init("tx") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # WRITE on some topic lets an idempotent producer in (KIP-679); a DENY of it does not.
    await allow(node, topic_acl("orders-", WRITE, pattern=PREFIXED, principal="User:alice"))
    assert await init(None) == 0
    await allow(node, creation("tx", TRANSACTIONAL_ID, principal="User:alice", operation=WRITE))
    assert await init("tx") != E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


async def test_cluster_operations(node: Node) -> None:
    admit = node.front_end.admit

    async def codes() -> dict[str, int]:
        scram = await call(admit, ALICE, DESCRIBE_SCRAM, 0, users=None)
        log_dirs = await call(admit, ALICE, DESCRIBE_LOG_DIRS, 4, topics=None)
        quotas = await call(admit, ALICE, DESCRIBE_QUOTAS, 1, components=(), strict=False)
        cluster = await call(
            admit,
            ALICE,
            DESCRIBE_CLUSTER,
            1,
            include_cluster_authorized_operations=True,
            endpoint_type=i8(1),
        )
        return {
            "scram": int(scram.error_code),
            "log dirs": int(log_dirs.error_code),
            "quotas": int(quotas.error_code),
            "cluster": int(cluster.error_code),
            "operations": int(cluster.cluster_authorized_operations),
        }

    denied = int(E.CLUSTER_AUTHORIZATION_FAILED)
    assert await codes() == {
        "scram": denied,
        "log dirs": denied,
        "quotas": denied,
        "cluster": 0,  # DescribeCluster answers everyone, as Kafka's
        "operations": 0,  # without DESCRIBE on the cluster
    }
    await allow(
        node,
        cluster_acl(DESCRIBE_OP),
        cluster_acl(10),
    )
    allowed = await codes()
    assert allowed["operations"] == bit_field(
        [AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS]
    )
    assert {k: v for k, v in allowed.items() if k != "operations"} == dict.fromkeys(
        ("scram", "log dirs", "quotas", "cluster"), 0
    )


async def test_a_deny_wins_and_super_users_pass(node: Node) -> None:
    await create_topic(node.front_end.admit, ADMIN, "denied", 1)
    await allow(
        node,
        topic_acl("*", READ, principal="User:*"),
        topic_acl("denied", DESCRIBE_OP, DENY, principal="User:alice"),
    )
    assert "denied" not in await metadata(node, ALICE)
    assert "denied" in await metadata(node, peer("User:bob"))
    assert "denied" in await metadata(node, peer("User:broker"))  # a super user


# ------------------------------------------------------------------------ produce, fetch


async def produce_to(node: Node, who: Any, topic: str, transactional_id: str | None = None) -> int:
    """One Produce (v9, acks=all) of a record to partition 0: its error code."""
    produced = await call(
        node.front_end.admit,
        who,
        0,  # Produce
        9,
        transactional_id=transactional_id,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(
                    PartitionProduceData(
                        index=i32(0), records=Records(build_record_batch([(None, b"v")]))
                    ),
                ),
            ),
        ),
    )
    return int(produced.responses[0].partition_responses[0].error_code)


async def fetch_from(node: Node, who: Any, topic: str, replica_id: int = -1) -> int:
    """One Fetch (v12) of partition 0 from offset 0: its error code."""
    fetched = await call(
        node.front_end.admit,
        who,
        1,  # Fetch
        12,
        replica_id=i32(replica_id),
        max_wait=datetime.timedelta(0),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    FetchPartition(
                        partition=i32(0),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(0),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(1 << 20),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    return int(fetched.responses[0].partitions[0].error_code)


async def test_produce_needs_write_and_fetch_read(node: Node) -> None:
    await create_topic(node.front_end.admit, ADMIN, "data", 1)
    assert await produce_to(node, ALICE, "data") == E.TOPIC_AUTHORIZATION_FAILED
    assert await produce_to(node, ALICE, "data", "tx") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert await fetch_from(node, ALICE, "data") == E.TOPIC_AUTHORIZATION_FAILED
    assert node.topics.partitions[("data", 0)].high_watermark == 0  # nothing appended
    await allow(node, topic_acl("data", WRITE, principal="User:alice"))
    assert await produce_to(node, ALICE, "data") == 0
    assert await fetch_from(node, ALICE, "data") == E.TOPIC_AUTHORIZATION_FAILED
    await allow(node, topic_acl("data", READ, principal="User:alice"))
    assert await fetch_from(node, ALICE, "data") == 0
    # A follower's Fetch (a replica id) needs CLUSTER_ACTION, whatever its topic ACLs.
    assert await fetch_from(node, ALICE, "data", replica_id=1) == E.TOPIC_AUTHORIZATION_FAILED
    assert await fetch_from(node, peer("User:broker"), "data", replica_id=1) == 0


async def test_transactions_need_their_ids(node: Node) -> None:
    admit = node.front_end.admit
    await create_topic(admit, ADMIN, "txn-data", 1)
    producer = {"transactional_id": "tx", "producer_id": i64(1), "producer_epoch": i16(0)}

    async def end() -> int:
        ended = await call(admit, ALICE, 26, 4, committed=True, **producer)  # EndTxn
        return int(ended.error_code)

    assert await end() == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    offsets = await call(admit, ALICE, 25, 4, group_id=GroupId("g"), **producer)  # AddOffsetsToTxn
    assert offsets.error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    added = await call(
        admit,
        ALICE,
        24,  # AddPartitionsToTxn
        3,
        v3_and_below_transactional_id="tx",
        v3_and_below_producer_id=i64(1),
        v3_and_below_producer_epoch=i16(0),
        v3_and_below_topics=(
            AddPartitionsToTxnTopic(name=TopicName("txn-data"), partitions=(i32(0),)),
        ),
    )
    (topic,) = added.results_by_topic_v3_and_below
    assert topic.results_by_partition[0].partition_error_code == (
        E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    # Markers are a broker's to write: ALTER or CLUSTER_ACTION on the cluster.
    marker = WritableTxnMarker(
        producer_id=ProducerId(1),
        producer_epoch=i16(0),
        transaction_result=True,
        topics=(WritableTxnMarkerTopic(name=TopicName("txn-data"), partition_indexes=(i32(0),)),),
        coordinator_epoch=i32(0),
    )
    written = await call(admit, ALICE, 27, 1, markers=(marker,))  # WriteTxnMarkers
    (result,) = written.markers[0].topics[0].partitions
    assert result.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    await allow(node, creation("tx", TRANSACTIONAL_ID, principal="User:alice", operation=WRITE))
    assert await end() != E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


async def test_cluster_changes_need_alter(node: Node) -> None:
    admit = node.front_end.admit
    await create_topic(admit, ADMIN, "moved", 1)
    ten_s = datetime.timedelta(seconds=10)
    listed = await call(
        admit, ALICE, 46, 0, timeout=ten_s, topics=None
    )  # ListPartitionReassignments
    moved = await call(
        admit,
        ALICE,
        45,  # AlterPartitionReassignments
        0,
        timeout=ten_s,
        topics=(
            ReassignableTopic(
                name=TopicName("moved"),
                partitions=(ReassignablePartition(partition_index=i32(0), replicas=None),),
            ),
        ),
    )
    elected = await call(
        admit,
        ALICE,
        43,  # ElectLeaders
        2,
        election_type=i8(0),
        topic_partitions=(TopicPartitions(topic=TopicName("moved"), partitions=(i32(0),)),),
        timeout=ten_s,
    )
    scram = await call(
        admit,
        ALICE,
        51,  # AlterUserScramCredentials
        0,
        deletions=(ScramCredentialDeletion(name="bob", mechanism=i8(1)),),
        upsertions=(),
    )
    quotas = await call(
        admit,
        ALICE,
        49,  # AlterClientQuotas
        1,
        entries=(
            QuotaEntry(
                entity=(QuotaEntity(entity_type="user", entity_name="bob"),),
                ops=(OpData(key="producer_byte_rate", value=f64(1024.0), remove=False),),
            ),
        ),
        validate_only=False,
    )
    denied = E.CLUSTER_AUTHORIZATION_FAILED
    assert listed.error_code == moved.error_code == elected.error_code == denied
    assert elected.replica_election_results[0].partition_result[0].error_code == denied
    assert [(r.user, r.error_code) for r in scram.results] == [("bob", denied)]
    assert [e.error_code for e in quotas.entries] == [denied]
    await allow(node, cluster_acl(ALTER_OP))
    # ALTER on the cluster, and the DESCRIBE it implies: listing is allowed too.
    listed = await call(admit, ALICE, LIST_REASSIGNMENTS, 0, timeout=ten_s, topics=None)
    assert listed.error_code == 0
    scram = await call(
        admit,
        ALICE,
        51,
        0,
        deletions=(ScramCredentialDeletion(name="bob", mechanism=i8(1)),),
        upsertions=(),
    )
    assert [(r.user, r.error_code) for r in scram.results] == [("bob", E.RESOURCE_NOT_FOUND)]


async def test_consumer_protocol_and_topic_partitions(node: Node) -> None:
    admit = node.front_end.admit
    await create_topic(admit, ADMIN, "kip848", 1)
    await create_topic(admit, ADMIN, "unseen", 1)

    async def heartbeat(*topics: str) -> tuple[int, str | None]:
        response = await call(
            admit,
            ALICE,
            68,  # ConsumerGroupHeartbeat
            0,
            group_id=GroupId("cg"),
            member_id="",
            member_epoch=i32(0),
            instance_id=None,
            rack_id=None,
            rebalance_timeout=datetime.timedelta(seconds=30),
            subscribed_topic_names=tuple(TopicName(t) for t in topics),
            server_assignor=None,
            topic_partitions=(),
        )
        return int(response.error_code), response.error_message

    assert (await heartbeat("kip848"))[0] == E.GROUP_AUTHORIZATION_FAILED
    await allow(
        node,
        creation("cg", GROUP, principal="User:alice", operation=READ),
        topic_acl("kip848", READ, principal="User:alice"),
    )
    assert await heartbeat("kip848", "unseen") == (
        E.TOPIC_AUTHORIZATION_FAILED,
        "Unauthorized topics: unseen",
    )
    assert (await heartbeat("kip848"))[0] == 0
    described = await call(
        admit, ALICE, 69, 0, group_ids=("cg", "other"), include_authorized_operations=True
    )  # ConsumerGroupDescribe
    errors = {g.group_id: (int(g.error_code), g.authorized_operations) for g in described.groups}
    assert errors["other"][0] == E.GROUP_AUTHORIZATION_FAILED
    assert errors["cg"] == (0, bit_field([AclOperation.READ, AclOperation.DESCRIBE]))
    partitions = await call(
        admit,
        ALICE,
        75,  # DescribeTopicPartitions
        0,
        topics=(TopicRequest(name=TopicName("kip848")), TopicRequest(name=TopicName("unseen"))),
        response_partition_limit=i32(100),
        cursor=None,
    )
    assert {t.name: int(t.error_code) for t in partitions.topics} == {
        "kip848": 0,
        "unseen": E.TOPIC_AUTHORIZATION_FAILED,
    }
    everything = await call(
        admit, ALICE, 75, 0, topics=(), response_partition_limit=i32(100), cursor=None
    )
    assert [t.name for t in everything.topics] == ["kip848"]
