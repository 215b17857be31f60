"""The authorizer (automq_ref/state_machines/acl.py) against a deliberately simple model of Kafka's
documented rules, on generated ACL sets, principals, hosts and resources; the binding filters
against a model of DescribeAcls' matching; an explicit example of each rule; and a state machine
over the KV-backed table (automq_ref/kafka/acls.py) in which DeleteAcls with a filter removes
exactly what DescribeAcls with that filter answered, and nothing else.

The model enumerates every binding and checks each rule as the docs state it (tables of what an
operation grants or denies, a prefix taken by slicing), sharing no code with the index the
authorizer decides on."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from automq_ref.io.metadata.view import ImageView
from automq_ref.kafka.acls import ClusterAcls, acls_in, binding_key
from automq_ref.state_machines import acl
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.acl import (
    AclBinding,
    AclFilter,
    Acls,
    AuthorizerSettings,
)
from automq_ref.state_machines.acl import AclOperation as Op
from automq_ref.state_machines.acl import AclPermissionType as Perm
from automq_ref.state_machines.acl import PatternType as Pat
from automq_ref.state_machines.acl import ResourceType as Res

# ------------------------------------------------------------------------------- the model

CONCRETE_OPS = [op for op in Op if op.value >= Op.READ]
# What an ALLOW binding of an operation grants (Kafka's docs: ALL is everything; READ, WRITE,
# DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS).
GRANTS: dict[Op, set[Op]] = {op: {op} for op in CONCRETE_OPS}
GRANTS[Op.ALL] = set(CONCRETE_OPS) | {Op.ALL}
for implying in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
    GRANTS[implying].add(Op.DESCRIBE)
GRANTS[Op.ALTER_CONFIGS].add(Op.DESCRIBE_CONFIGS)
# What a DENY binding denies: nothing is implied by a DENY.
DENIES: dict[Op, set[Op]] = {op: {op} for op in CONCRETE_OPS}
DENIES[Op.ALL] = set(CONCRETE_OPS) | {Op.ALL}


def on_resource(b: AclBinding, resource_type: Res, name: str) -> bool:
    if b.resource_type != resource_type:
        return False
    if b.pattern_type == Pat.LITERAL:
        return b.name == name or b.name == "*"
    return b.pattern_type == Pat.PREFIXED and name[: len(b.name)] == b.name


def entry_for(b: AclBinding, principal: str, host: str) -> bool:
    return (b.principal == principal or b.principal == "User:*") and (
        b.host == "*" or b.host == host
    )


def model_allows(
    bindings: set[AclBinding],
    cfg: AuthorizerSettings,
    principal: str,
    host: str,
    operation: Op,
    resource_type: Res,
    name: str,
) -> bool:
    if not cfg.enabled:
        return True
    if principal in cfg.super_users:
        return True
    applying = [b for b in bindings if on_resource(b, resource_type, name)]
    mine = [b for b in applying if entry_for(b, principal, host)]
    if any(b.permission == Perm.DENY and operation in DENIES[b.operation] for b in mine):
        return False
    if any(b.permission == Perm.ALLOW and operation in GRANTS[b.operation] for b in mine):
        return True
    if not applying:
        return cfg.allow_if_no_acl
    return False


def model_filter(f: AclFilter, b: AclBinding) -> bool:
    if f.name is None:
        name_ok = True
    elif f.pattern_type == Pat.MATCH:
        name_ok = (b.pattern_type == Pat.LITERAL and b.name in (f.name, "*")) or (
            b.pattern_type == Pat.PREFIXED and f.name[: len(b.name)] == b.name
        )
    else:
        name_ok = f.name == b.name
    return all(
        (
            f.resource_type in (Res.ANY, b.resource_type),
            f.pattern_type in (Pat.ANY, Pat.MATCH, b.pattern_type),
            name_ok,
            f.principal in (None, b.principal),
            f.host in (None, b.host),
            f.operation in (Op.ANY, b.operation),
            f.permission in (Perm.ANY, b.permission),
        )
    )


def model_by_type(
    bindings: set[AclBinding],
    cfg: AuthorizerSettings,
    principal: str,
    host: str,
    operation: Op,
    resource_type: Res,
) -> bool:
    """KIP-679 as Kafka documents authorizeByResourceType: allowed as for one resource
    (``hardcode``); else some ALLOW of the operation (or ALL) that no DENY dominates, a DENY of
    the literal wildcard dominating everything."""
    if model_allows(bindings, cfg, principal, host, operation, resource_type, "hardcode"):
        return True
    mine = [
        b
        for b in bindings
        if b.resource_type == resource_type
        and entry_for(b, principal, host)
        and b.operation in (operation, Op.ALL)
    ]
    denies = [b for b in mine if b.permission == Perm.DENY]
    allows = [b for b in mine if b.permission == Perm.ALLOW]
    if any(d.pattern_type == Pat.LITERAL and d.name == "*" for d in denies):
        return False
    if any(a.pattern_type == Pat.LITERAL and a.name == "*" for a in allows):
        return True

    def dominated(a: AclBinding) -> bool:
        for d in denies:
            if d.pattern_type == Pat.LITERAL and a.pattern_type == Pat.LITERAL and d.name == a.name:
                return True
            if d.pattern_type == Pat.PREFIXED and a.name[: len(d.name)] == d.name:
                return True
        return False

    return any(not dominated(a) for a in allows)


# ------------------------------------------------------------------------------ strategies

NAMES = ["a", "ab", "abc", "b", "ba", "*", "hard", "hardcode"]
PRINCIPALS = ["User:alice", "User:bob", "User:*", "Group:alice"]
CLIENTS = ["User:alice", "User:bob", "User:carol"]
HOSTS = ["10.0.0.1", "10.0.0.2"]
TYPES = [Res.TOPIC, Res.GROUP, Res.CLUSTER, Res.TRANSACTIONAL_ID, Res.DELEGATION_TOKEN, Res.USER]

bindings_st = st.builds(
    AclBinding,
    resource_type=st.sampled_from(TYPES[:3]),
    name=st.sampled_from(NAMES),
    pattern_type=st.sampled_from([Pat.LITERAL, Pat.PREFIXED]),
    principal=st.sampled_from(PRINCIPALS),
    host=st.sampled_from(["*", *HOSTS]),
    operation=st.sampled_from([Op.ALL, *CONCRETE_OPS]),
    permission=st.sampled_from([Perm.ALLOW, Perm.DENY]),
)
acl_sets = st.sets(bindings_st, max_size=12)
settings_st = st.builds(
    AuthorizerSettings,
    enabled=st.booleans() | st.just(True),
    super_users=st.frozensets(st.sampled_from(CLIENTS), max_size=1),
    allow_if_no_acl=st.booleans(),
)
requests_st = st.tuples(
    st.sampled_from(CLIENTS),
    st.sampled_from(HOSTS),
    st.sampled_from(CONCRETE_OPS),
    st.sampled_from(TYPES[:3]),
    st.sampled_from([*NAMES, "abcd", "c", "*x"]),
)
filters_st = st.builds(
    AclFilter,
    resource_type=st.sampled_from([Res.ANY, Res.UNKNOWN, *TYPES[:3]]),
    name=st.none() | st.sampled_from([*NAMES, "abcd"]),
    pattern_type=st.sampled_from(list(Pat)),
    principal=st.none() | st.sampled_from(PRINCIPALS),
    host=st.none() | st.sampled_from(["*", *HOSTS]),
    operation=st.sampled_from([Op.ANY, Op.UNKNOWN, Op.ALL, Op.READ, Op.DESCRIBE, Op.WRITE]),
    permission=st.sampled_from(list(Perm)),
)


# ------------------------------------------------------------------------------ properties


@given(acl_sets, settings_st, st.lists(requests_st, min_size=1, max_size=8))
def test_authorize_is_the_models(
    bindings: set[AclBinding], cfg: AuthorizerSettings, requests: list[Any]
) -> None:
    table = Acls(bindings)
    for principal, host, operation, resource_type, name in requests:
        expected = model_allows(bindings, cfg, principal, host, operation, resource_type, name)
        decision = acl.decide(table, cfg, principal, host, operation, resource_type, name)
        assert decision.allowed == expected, (principal, host, operation, resource_type, name)
        assert acl.authorize(table, cfg, principal, host, operation, resource_type, name) is (
            expected
        )
        if decision.binding is not None:
            assert decision.binding in bindings


@given(acl_sets, settings_st, requests_st)
def test_authorized_operations_are_the_allowed_supported_ones(
    bindings: set[AclBinding], cfg: AuthorizerSettings, request: Any
) -> None:
    principal, host, _, resource_type, name = request
    field = acl.authorized_operations(Acls(bindings), cfg, principal, host, resource_type, name)
    expected = 0
    for op in acl.SUPPORTED_OPERATIONS[resource_type]:
        if model_allows(bindings, cfg, principal, host, op, resource_type, name):
            expected |= 1 << int(op)
    assert field == expected


@given(acl_sets, settings_st, requests_st)
def test_authorize_by_resource_type_is_kip_679s(
    bindings: set[AclBinding], cfg: AuthorizerSettings, request: Any
) -> None:
    principal, host, operation, resource_type, _ = request
    table = Acls(bindings)
    allowed = acl.authorize_by_resource_type(table, cfg, principal, host, operation, resource_type)
    assert allowed == model_by_type(bindings, cfg, principal, host, operation, resource_type)
    if allowed:
        # Sound: some resource of the type is allowed (a literal name allowed, or a name under
        # an allowed prefix that no other binding names).
        candidates = ["hardcode", *(b.name for b in bindings), *(b.name + "\x00" for b in bindings)]
        assert any(
            model_allows(bindings, cfg, principal, host, operation, resource_type, name)
            for name in candidates
        )


@given(acl_sets, filters_st)
def test_filters_match_as_describe_acls_documents(
    bindings: set[AclBinding], acl_filter: AclFilter
) -> None:
    expected = sorted(b for b in bindings if model_filter(acl_filter, b))
    assert Acls(bindings).matching(acl_filter) == expected
    for b in bindings:
        assert acl.filter_matches(acl_filter, b) == model_filter(acl_filter, b)
        # A binding's own exact filter matches it, and MATCH on its name for a literal one.
        exact = AclFilter(
            b.resource_type, b.name, b.pattern_type, b.principal, b.host, b.operation, b.permission
        )
        assert acl.filter_matches(exact, b)


# --------------------------------------------------------------------------- explicit rules

ON = AuthorizerSettings(enabled=True)
ALICE, HOST = "User:alice", "10.0.0.1"


def binding(
    name: str = "orders",
    permission: Perm = Perm.ALLOW,
    operation: Op = Op.READ,
    pattern: Pat = Pat.LITERAL,
    principal: str = ALICE,
    host: str = "*",
    resource_type: Res = Res.TOPIC,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def allows(
    bindings: list[AclBinding],
    operation: Op = Op.READ,
    name: str = "orders",
    cfg: AuthorizerSettings = ON,
    principal: str = ALICE,
    host: str = HOST,
    resource_type: Res = Res.TOPIC,
) -> bool:
    return acl.authorize(Acls(bindings), cfg, principal, host, operation, resource_type, name)


def test_deny_beats_allow() -> None:
    allow = binding()
    assert allows([allow])
    assert not allows([allow, binding(permission=Perm.DENY)])
    # A DENY of every user on every topic beats a literal ALLOW of this one.
    assert not allows([allow, binding("*", Perm.DENY, Op.ALL, principal="User:*")])
    # A DENY of READ does not deny DESCRIBE (implication is for ALLOW only).
    assert allows([allow, binding(permission=Perm.DENY)], Op.DESCRIBE)


def test_prefixed_patterns_match_names_that_start_with_them() -> None:
    prefixed = binding("ord", pattern=Pat.PREFIXED)
    assert allows([prefixed], name="orders")
    assert allows([prefixed], name="ord")
    assert not allows([prefixed], name="or")
    assert not allows([prefixed], name="payments")
    # A literal binding is not a prefix.
    assert not allows([binding("ord")], name="orders")
    # A prefixed "*" matches names that start with "*", not every name.
    assert not allows([binding("*", pattern=Pat.PREFIXED)], name="orders")
    assert allows([binding("*", pattern=Pat.PREFIXED)], name="*orders")


def test_wildcards() -> None:
    everyone = binding(principal="User:*")
    assert allows([everyone], principal="User:bob")
    assert allows([binding("*")], name="anything")
    # Only User:* is the wildcard principal; another type's name "*" is a name.
    assert not allows([binding(principal="Group:*")], principal="User:bob")
    # Hosts: "*" or the exact address.
    assert allows([binding(host=HOST)])
    assert not allows([binding(host="10.9.9.9")])


def test_implied_operations() -> None:
    for implying in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert allows([binding(operation=implying)], Op.DESCRIBE)
    assert allows([binding(operation=Op.ALTER_CONFIGS)], Op.DESCRIBE_CONFIGS)
    assert not allows([binding(operation=Op.DESCRIBE_CONFIGS)], Op.ALTER_CONFIGS)
    assert not allows([binding(operation=Op.READ)], Op.WRITE)
    assert not allows([binding(operation=Op.DESCRIBE)], Op.READ)
    all_ops = binding(operation=Op.ALL)
    assert all(allows([all_ops], op) for op in CONCRETE_OPS)


def test_idempotent_write_is_implied_by_write_on_some_topic() -> None:
    def may(bindings: list[AclBinding], transactional_id: str | None = None) -> bool:
        return acl.may_init_producer_id(Acls(bindings), ON, ALICE, HOST, transactional_id)

    assert not may([])
    assert may([binding("kafka-cluster", operation=Op.IDEMPOTENT_WRITE, resource_type=Res.CLUSTER)])
    assert may([binding("any-topic", operation=Op.WRITE)])
    assert may([binding("logs-", operation=Op.WRITE, pattern=Pat.PREFIXED)])
    # WRITE on a topic, denied again by a prefixed DENY of a prefix of it: not allowed.
    assert not may(
        [
            binding("logs-1", operation=Op.WRITE),
            binding("logs", Perm.DENY, Op.WRITE, Pat.PREFIXED),
        ]
    )
    assert not may([binding("any-topic", operation=Op.READ)])
    # A transactional producer needs WRITE on its transactional id.
    tid = binding("tx-1", operation=Op.WRITE, resource_type=Res.TRANSACTIONAL_ID)
    assert may([tid], "tx-1")
    assert not may([tid], "tx-2")
    assert not may([binding("any-topic", operation=Op.WRITE)], "tx-1")


def test_super_users_are_allowed_everything() -> None:
    cfg = AuthorizerSettings(enabled=True, super_users=frozenset({ALICE}))
    deny_all = binding("*", Perm.DENY, Op.ALL, principal="User:*")
    assert allows([deny_all], Op.ALTER, cfg=cfg)
    assert not allows([deny_all], Op.ALTER, cfg=cfg, principal="User:bob")
    parsed = AuthorizerSettings.of_properties(
        acl.STANDARD_AUTHORIZER, " User:alice ; User:CN=x,O=y ;", True
    )
    assert parsed == AuthorizerSettings(True, frozenset({ALICE, "User:CN=x,O=y"}), True)
    with pytest.raises(ValueError, match="principalType:principalName"):
        AuthorizerSettings.of_properties(acl.STANDARD_AUTHORIZER, "alice")
    with pytest.raises(ValueError, match="only"):
        AuthorizerSettings.of_properties("kafka.security.authorizer.AclAuthorizer")
    assert AuthorizerSettings.of_properties("") == acl.DISABLED


def test_allow_everyone_if_no_acl_found() -> None:
    open_ = AuthorizerSettings(enabled=True, allow_if_no_acl=True)
    assert not allows([])
    assert allows([], cfg=open_)
    # Any binding on the resource, even another principal's, takes the default away.
    bobs = binding(principal="User:bob")
    assert not allows([bobs], cfg=open_)
    # A binding on another resource does not.
    assert allows([binding("payments")], cfg=open_)
    # No authorizer: everything allowed.
    assert allows([binding(permission=Perm.DENY)], cfg=acl.DISABLED)


def test_authorized_operations_bit_fields() -> None:
    field = acl.authorized_operations(
        Acls([binding(operation=Op.WRITE)]), ON, ALICE, HOST, Res.TOPIC, "orders"
    )
    assert field == (1 << Op.WRITE) | (1 << Op.DESCRIBE)
    everything = acl.authorized_operations(Acls(), acl.DISABLED, ALICE, HOST, Res.GROUP, "g")
    assert everything == acl.bit_field(acl.SUPPORTED_OPERATIONS[Res.GROUP])


def test_creation_refusals_are_kafkas() -> None:
    def refused(**changes: Any) -> str | None:
        return acl.creation_error(dataclasses.replace(binding(), **changes))

    assert refused() is None
    assert refused(resource_type=Res.CLUSTER) == (
        "The only valid name for the CLUSTER resource is kafka-cluster"
    )
    assert refused(resource_type=Res.CLUSTER, name="kafka-cluster") is None
    assert refused(name="") == "Invalid empty resource name"
    assert refused(resource_type=Res.UNKNOWN) == "Invalid resourceType UNKNOWN"
    assert refused(pattern_type=Pat.UNKNOWN) == "Invalid patternType UNKNOWN"
    assert refused(operation=Op.UNKNOWN) == "Invalid operation UNKNOWN"
    assert refused(permission=Perm.UNKNOWN) == "Invalid permissionType UNKNOWN"
    message = refused(principal="alice")
    assert message is not None and "`alice`" in message and "no colon" in message
    assert refused(principal="User:") is None  # Kafka parses it: type User, empty name
    assert acl.filter_error(AclFilter(resource_type=Res.UNKNOWN)) == "Unknown patternFilter."
    assert acl.filter_error(AclFilter(permission=Perm.UNKNOWN)) == "Unknown entryFilter."
    assert acl.filter_error(AclFilter()) is None


# ------------------------------------------------- DeleteAcls removes what DescribeAcls shows


class KvController:
    """The controller's KV decisions the table relies on (put-if-absent, compare-and-delete),
    each published at once to the view, as a broker's image follows them."""

    def __init__(self) -> None:
        self.view = ImageView(sm.EMPTY_IMAGE)

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        kv = dict(self.view.image.kv)
        if isinstance(event, sm.PutKV):
            assert not event.overwrite
            if event.key in kv:
                return sm.Response(sm.StreamErrorCode.KEY_EXIST, value=kv[event.key])
            kv[event.key] = event.value
        else:
            assert isinstance(event, sm.DeleteKV)
            if kv.get(event.key) != event.expected:
                return sm.Response(sm.StreamErrorCode.VALUE_NOT_MATCHED, value=kv.get(event.key))
            del kv[event.key]
        self.view.publish(dataclasses.replace(self.view.image, kv=kv))
        return sm.Response()


@settings(max_examples=25, stateful_step_count=12)
class DeleteRemovesWhatDescribeShows(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.controller = KvController()
        self.acls = ClusterAcls(self.controller.view, ON)
        self.model: set[AclBinding] = set()

    @rule(bindings=st.lists(bindings_st, max_size=4))
    def create(self, bindings: list[AclBinding]) -> None:
        results = asyncio.run(self.acls.create(self.controller, bindings))
        assert [code for code, _ in results] == [0] * len(bindings)
        self.model |= set(bindings)

    @rule(filters=st.lists(filters_st, min_size=1, max_size=3))
    def delete(self, filters: list[AclFilter]) -> None:
        valid = [f for f in filters if acl.filter_error(f) is None]
        described = [self.acls.table().matching(f) for f in valid]
        deleted = asyncio.run(self.acls.delete(self.controller, valid))
        assert [[d.binding for d in found] for found in deleted] == described
        assert all(d.error == 0 for found in deleted for d in found)
        gone = {b for found in described for b in found}
        self.model -= gone
        for f in valid:
            assert self.acls.table().matching(f) == []

    @invariant()
    def the_table_is_the_model(self) -> None:
        assert self.acls.table().bindings == self.model
        assert acls_in(self.controller.view.image.kv).bindings == self.model
        assert set(self.controller.view.image.kv) == {binding_key(b) for b in self.model}


TestDeleteRemovesWhatDescribeShows = DeleteRemovesWhatDescribeShows.TestCase
