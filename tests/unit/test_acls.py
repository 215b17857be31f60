"""The ACL admin APIs (automq_ref/kafka/handlers/acls.py) through the dispatcher of a node in
process: SECURITY_DISABLED without an authorizer; with one, CreateAcls, DescribeAcls and
DeleteAcls over the controller KV (refusals as Kafka's, duplicates, filters, a restart keeps the
bindings), the cluster operations the APIs need; and kafka-python's and confluent-kafka's admin
clients creating, describing and deleting ACLs on the node's listener (a free port).

The authorizer's settings are built here directly (``Context.acls``); the broker's properties
for them (``authorizer.class.name``, ``super.users``, ``allow.everyone.if.no.acl.found``) and
the other APIs' checks are tests/unit/test_acl_enforcement.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.create_acls.v3.request import AclCreation
from kio.schema.delete_acls.v3.request import DeleteAclsFilter
from kio.static.primitive import i8

from automq_ref.config import BrokerConfig, load_config
from automq_ref.errors import KafkaErrorCode as E
from automq_ref.kafka.acls import ClusterAcls
from automq_ref.kafka.server import CloseConnection, Peer
from automq_ref.node import Node, start_node
from automq_ref.state_machines.acl import AuthorizerSettings
from automq_ref.vocabulary.naming import ACL_KEY_PREFIX
from tests.unit.test_broker_node import call, request_frame

DESCRIBE, CREATE, DELETE = 29, 30, 31
TOPIC, GROUP, CLUSTER = 2, 3, 4
ANY, MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
ALL, READ, WRITE, ALTER, DESCRIBE_OP = 2, 3, 4, 7, 8
DENY, ALLOW = 2, 3
# The tests' own connection (no login: User:ANONYMOUS) is a super user.
OPEN = AuthorizerSettings(enabled=True, super_users=frozenset({"User:ANONYMOUS"}))


def config(tmp_path: Path) -> BrokerConfig:
    return load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "listeners=PLAINTEXT://127.0.0.1:0",
        ],
        environment={},
    )


async def started(tmp_path: Path, settings: AuthorizerSettings | None) -> Node:
    node = await start_node(config(tmp_path))
    if settings is not None:
        node.front_end.context.acls = ClusterAcls(node.view, settings)
    return node


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    running = await started(tmp_path, OPEN)
    try:
        yield running
    finally:
        await running.shutdown()


def peer(principal: str | None = None, address: str = "10.0.0.1:5000") -> Peer:
    connection = Peer(1, address)
    connection.session.principal = principal
    return connection


ANONYMOUS = peer()


def creation(
    name: str = "orders",
    resource_type: int = TOPIC,
    pattern: int = LITERAL,
    principal: str = "User:alice",
    host: str = "*",
    operation: int = READ,
    permission: int = ALLOW,
) -> AclCreation:
    return AclCreation(
        resource_type=i8(resource_type),
        resource_name=name,
        resource_pattern_type=i8(pattern),
        principal=principal,
        host=host,
        operation=i8(operation),
        permission_type=i8(permission),
    )


def filter_of(
    resource_type: int = ANY,
    name: str | None = None,
    pattern: int = ANY,
    principal: str | None = None,
    host: str | None = None,
    operation: int = ANY,
    permission: int = ANY,
) -> dict[str, Any]:
    return {
        "resource_type_filter": i8(resource_type),
        "resource_name_filter": name,
        "pattern_type_filter": i8(pattern),
        "principal_filter": principal,
        "host_filter": host,
        "operation": i8(operation),
        "permission_type": i8(permission),
    }


async def create(node: Node, *creations: AclCreation, who: Peer = ANONYMOUS) -> list[Any]:
    response = await call(node.front_end.admit, who, CREATE, 3, creations=creations)
    return [(int(r.error_code), r.error_message) for r in response.results]


async def describe(node: Node, who: Peer = ANONYMOUS, **wanted: Any) -> Any:
    return await call(node.front_end.admit, who, DESCRIBE, 3, **filter_of(**wanted))


def described(response: Any) -> list[tuple[Any, ...]]:
    assert int(response.error_code) == 0, response.error_message
    return [
        (
            int(r.resource_type),
            r.resource_name,
            int(r.pattern_type),
            a.principal,
            a.host,
            int(a.operation),
            int(a.permission_type),
        )
        for r in response.resources
        for a in r.acls
    ]


async def delete(node: Node, *filters: dict[str, Any], who: Peer = ANONYMOUS) -> Any:
    items = tuple(DeleteAclsFilter(**f) for f in filters)
    return await call(node.front_end.admit, who, DELETE, 3, filters=items)


async def test_without_an_authorizer_the_apis_answer_security_disabled(tmp_path: Path) -> None:
    node = await started(tmp_path, None)
    try:
        response = await describe(node)
        assert int(response.error_code) == E.SECURITY_DISABLED
        assert response.error_message == "No Authorizer is configured on the broker"
        assert (
            await create(node, creation(), creation("b"))
            == [(E.SECURITY_DISABLED, "No Authorizer is configured.")] * 2
        )
        deleted = await delete(node, filter_of())
        assert [(int(r.error_code), r.error_message) for r in deleted.filter_results] == [
            (E.SECURITY_DISABLED, "No Authorizer is configured.")
        ]
        assert not any(key.startswith(ACL_KEY_PREFIX) for key in node.view.image.kv)
    finally:
        await node.shutdown()


async def test_create_describe_delete(node: Node) -> None:
    assert (
        await create(
            node,
            creation(),
            creation("ord", pattern=PREFIXED, principal="User:*", operation=WRITE, permission=DENY),
            creation("app", resource_type=GROUP, host="10.0.0.9"),
            creation("kafka-cluster", resource_type=CLUSTER, operation=ALTER),
            creation("*", principal="User:bob", operation=ALL),
        )
        == [(0, None)] * 5
    )
    # Creating one that exists succeeds, and writes nothing more.
    keys = {key for key in node.view.image.kv if key.startswith(ACL_KEY_PREFIX)}
    assert await create(node, creation()) == [(0, None)]
    assert {key for key in node.view.image.kv if key.startswith(ACL_KEY_PREFIX)} == keys
    assert len(keys) == 5
    everything = described(await describe(node))
    assert everything == sorted(everything) and len(everything) == 5
    # MATCH on a name: the literal, the wildcard and the prefixes that apply to it.
    matched = described(await describe(node, resource_type=TOPIC, name="orders", pattern=MATCH))
    assert [(name, pattern) for _, name, pattern, *_ in matched] == [
        ("*", LITERAL),
        ("ord", PREFIXED),
        ("orders", LITERAL),
    ]
    # A literal filter on the name: only that pattern.
    literal = described(await describe(node, name="orders", pattern=LITERAL))
    assert literal == [(TOPIC, "orders", LITERAL, "User:alice", "*", READ, ALLOW)]
    assert described(await describe(node, principal="User:nobody")) == []
    # DeleteAcls: what the filter matches, listed; the rest stays.
    deleted = await delete(node, filter_of(resource_type=TOPIC), filter_of(operation=ALTER))
    first, second = deleted.filter_results
    assert int(first.error_code) == 0 and int(second.error_code) == 0
    assert sorted(m.resource_name for m in first.matching_acls) == ["*", "ord", "orders"]
    assert [m.resource_name for m in second.matching_acls] == ["kafka-cluster"]
    assert [name for _, name, *_ in described(await describe(node))] == ["app"]
    # Deleting again matches nothing.
    again = await delete(node, filter_of(resource_type=TOPIC))
    assert list(again.filter_results[0].matching_acls) == []


async def test_refusals_are_kafkas(node: Node) -> None:
    results = await create(
        node,
        creation(principal="alice"),
        creation("other", resource_type=CLUSTER),
        creation(""),
        creation(resource_type=99),
        creation(pattern=77),
        creation(operation=99),
        creation(permission=42),
        creation("*", pattern=PREFIXED),  # accepted: a prefix like any other, as in Kafka
    )
    assert [code for code, _ in results] == [E.INVALID_REQUEST] * 7 + [0]
    messages = [message for _, message in results]
    assert messages[0] == (
        "Could not parse principal from `alice` (no colon is present separating the principal "
        "type from the principal name)"
    )
    assert messages[1:7] == [
        "The only valid name for the CLUSTER resource is kafka-cluster",
        "Invalid empty resource name",
        "Invalid resourceType UNKNOWN",
        "Invalid patternType UNKNOWN",
        "Invalid operation UNKNOWN",
        "Invalid permissionType UNKNOWN",
    ]
    assert len(described(await describe(node))) == 1
    # ANY or MATCH where a binding needs a concrete value: Kafka's binding classes throw, and
    # the whole request is answered UNKNOWN_SERVER_ERROR, nothing created.
    for bad in (
        creation(resource_type=ANY),
        creation(pattern=MATCH),
        creation(operation=ANY),
        creation(permission=ANY),
    ):
        assert await create(node, creation("fine"), bad) == [(E.UNKNOWN_SERVER_ERROR, None)] * 2
    assert len(described(await describe(node))) == 1
    # Filters of a code Kafka does not know: DeleteAcls refuses them, DescribeAcls matches none.
    deleted = await delete(node, filter_of(resource_type=99), filter_of(operation=99))
    assert [(int(r.error_code), r.error_message) for r in deleted.filter_results] == [
        (E.INVALID_REQUEST, "Unknown patternFilter."),
        (E.INVALID_REQUEST, "Unknown entryFilter."),
    ]
    assert described(await describe(node, resource_type=99)) == []
    # A type of code 0 does not parse in Kafka: the connection is closed.
    frames = [
        request_frame(CREATE, 3, 1, creations=(creation(operation=0),)),
        request_frame(DESCRIBE, 3, 1, **filter_of(resource_type=0)),
        request_frame(DELETE, 3, 1, filters=(DeleteAclsFilter(**filter_of(permission=0)),)),
    ]
    for frame in frames:
        with pytest.raises(CloseConnection):
            await node.front_end.admit(frame, ANONYMOUS)


async def test_the_apis_need_cluster_describe_or_alter(tmp_path: Path) -> None:
    closed = AuthorizerSettings(enabled=True, super_users=frozenset({"User:admin"}))
    node = await started(tmp_path, closed)
    admin, bob, carol = peer("User:admin"), peer("User:bob"), peer("User:carol")
    try:
        refused = await describe(node, who=bob)
        assert int(refused.error_code) == E.CLUSTER_AUTHORIZATION_FAILED
        assert "User:bob" in refused.error_message and "DESCRIBE" in refused.error_message
        assert await create(
            node, creation("kafka-cluster", CLUSTER, principal="User:bob"), who=admin
        ) == [(0, None)]
        # bob may now describe (READ implies DESCRIBE), not create (ALTER) nor delete.
        assert len(described(await describe(node, who=bob))) == 1
        assert [code for code, _ in await create(node, creation(), who=bob)] == [
            E.CLUSTER_AUTHORIZATION_FAILED
        ]
        deleted = await delete(node, filter_of(), who=bob)
        assert int(deleted.filter_results[0].error_code) == E.CLUSTER_AUTHORIZATION_FAILED
        # carol: an ACL exists on the cluster, none for her, and no default allow.
        assert int((await describe(node, who=carol)).error_code) == E.CLUSTER_AUTHORIZATION_FAILED
        acls = node.front_end.context.acls
        assert acls is not None
        assert acls.authorize(bob, *_cluster(DESCRIBE_OP)) and not acls.authorize(
            bob, *_cluster(ALTER)
        )
    finally:
        await node.shutdown()


def _cluster(operation: int) -> tuple[Any, Any, str]:
    from automq_ref.state_machines import acl

    return acl.AclOperation(operation), acl.ResourceType.CLUSTER, acl.CLUSTER_NAME


async def test_without_cluster_acls_the_default_decides(tmp_path: Path) -> None:
    node = await started(tmp_path, AuthorizerSettings(enabled=True, allow_if_no_acl=True))
    bob = peer("User:bob")
    try:
        assert await create(node, creation(), who=bob) == [(0, None)]
        assert len(described(await describe(node, who=bob))) == 1
        # A binding on the cluster for someone else: the default no longer applies to bob.
        admin = creation("kafka-cluster", CLUSTER, principal="User:admin", operation=ALL)
        assert await create(node, admin, who=bob) == [(0, None)]
        assert int((await describe(node, who=bob)).error_code) == E.CLUSTER_AUTHORIZATION_FAILED
        assert len(described(await describe(node, who=peer("User:admin")))) == 2
    finally:
        await node.shutdown()


async def test_bindings_survive_a_restart(tmp_path: Path) -> None:
    node = await started(tmp_path, OPEN)
    try:
        assert await create(node, creation(), creation("x", GROUP)) == [(0, None)] * 2
        before = described(await describe(node))
    finally:
        await node.shutdown()
    node = await started(tmp_path, OPEN)
    try:
        assert described(await describe(node)) == before
    finally:
        await node.shutdown()


# ------------------------------------------------------------------------- real clients


def kafka_python_round_trip(bootstrap: str) -> None:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.errors import NoError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="acl-kafka-python")
    try:
        pattern = ResourcePattern(ResourceType.TOPIC, "kp-orders", ACLResourcePatternType.PREFIXED)
        wanted = ACL("User:alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW, pattern)
        created = admin.create_acls([wanted])
        assert created["failed"] == [] and len(created["succeeded"]) == 1
        any_topic = ResourcePatternFilter(ResourceType.TOPIC, None, ACLResourcePatternType.ANY)
        acl_filter = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY, any_topic)
        found, error = admin.describe_acls(acl_filter)
        assert error is NoError and [a.principal for a in found] == ["User:alice"]
        assert found[0].resource_pattern.resource_name == "kp-orders"
        ((_, deleted, error),) = admin.delete_acls([acl_filter])
        assert error is NoError and len(deleted) == 1
        found, _ = admin.describe_acls(acl_filter)
        assert found == []
    finally:
        admin.close()


def confluent_round_trip(bootstrap: str) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "acl-confluent"})
    binding = AclBinding(
        ResourceType.GROUP,
        "ck-group",
        ResourcePatternType.LITERAL,
        "User:bob",
        "10.1.1.1",
        AclOperation.DESCRIBE,
        AclPermissionType.DENY,
    )
    for future in admin.create_acls([binding]).values():
        assert future.result(30) is None
    anything: Any = None  # the stubs type these str; None (any) is what the client documents
    groups = AclBindingFilter(
        ResourceType.GROUP,
        anything,
        ResourcePatternType.MATCH,
        anything,
        anything,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert admin.describe_acls(groups).result(30) == [binding]
    (deleted,) = admin.delete_acls([groups]).values()
    assert deleted.result(30) == [binding]
    assert admin.describe_acls(groups).result(30) == []
    # A principal that is not Type:name: refused with Kafka's message.
    bad = AclBinding(
        ResourceType.TOPIC,
        "t",
        ResourcePatternType.LITERAL,
        "bob",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    (refused,) = admin.create_acls([bad]).values()
    with pytest.raises(Exception, match="no colon"):
        refused.result(30)


async def test_admin_clients_manage_acls(node: Node) -> None:
    host, port = await node.listen()
    bootstrap = f"{host}:{port}"
    await asyncio.to_thread(kafka_python_round_trip, bootstrap)
    await asyncio.to_thread(confluent_round_trip, bootstrap)
