"""Client quotas (state_machines/quota.py, formats/client_quota.py, kafka/quotas.py): Kafka's
precedence of entities, the sampled rate and the throttle time; the KV record round trip;
AlterClientQuotas and DescribeClientQuotas as Kafka answers them; a confluent-kafka producer over
its quota told to back off (throttle_time_ms) while another client id is not; the connection
muted for a self-throttling client, the response held back for an older one."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.alter_client_quotas.v1.request import EntityData, EntryData, OpData
from kio.schema.describe_client_quotas.v1.request import ComponentData
from kio.static.primitive import f64, i8

from automq_ref.formats.client_quota import decode_quotas, encode_quotas, parse_quota_key, quota_key
from automq_ref.kafka.quotas import ClientQuotas, quota_table
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from automq_ref.state_machines import quota as q
from tests.unit.test_broker_node import call, node_config

DESCRIBE, ALTER = 48, 49
TIMEOUT_S = 30

# ------------------------------------------------------------------------------- pure parts


def test_the_first_quota_set_in_kafkas_order_applies() -> None:
    alice = q.QuotaEntity(user="alice")
    table: dict[q.QuotaEntity, dict[str, float]] = {
        q.QuotaEntity(client_id_default=True): {"producer_byte_rate": 8},
        q.QuotaEntity(client_id="app"): {"producer_byte_rate": 7},
        q.QuotaEntity(user_default=True): {"producer_byte_rate": 6},
        q.QuotaEntity(user_default=True, client_id_default=True): {"producer_byte_rate": 5},
        q.QuotaEntity(user_default=True, client_id="app"): {"producer_byte_rate": 4},
        alice: {"producer_byte_rate": 3},
        q.QuotaEntity(user="alice", client_id_default=True): {"producer_byte_rate": 2},
        q.QuotaEntity(user="alice", client_id="app"): {"producer_byte_rate": 1},
    }
    order = q.precedence("alice", "app")
    assert [table[e]["producer_byte_rate"] for e in order] == [1, 2, 3, 4, 5, 6, 7, 8]
    # Taking the winners away one by one walks down the order.
    for expected, entity in enumerate(order, start=1):
        found = q.quota_for(table, "alice", "app", "producer_byte_rate")
        assert found == (entity, expected)
        del table[entity]
    assert q.quota_for(table, "alice", "app", "producer_byte_rate") is None
    # Another key is not this one's.
    assert (
        q.quota_for({alice: {"consumer_byte_rate": 1}}, "alice", "x", "producer_byte_rate") is None
    )


def test_rate_and_throttle_as_kafka_computes_them() -> None:
    samples = q.record(q.Samples(), 0, 21_000)
    # One window so far: the rate is taken over (11 - 1) windows of 1 s, 2,100 B/s.
    assert q.rate(samples, 0) == 2100
    # (2100 - 1000) / 1000 * 10 s = 11 s: exactly the bound of 11 windows.
    assert q.throttle_ms(samples, 0, 1000) == 11_000
    assert q.throttle_ms(samples, 0, 1500) == round(600 / 1500 * 10_000)
    assert q.throttle_ms(samples, 0, 2100) == 0
    assert q.throttle_ms(samples, 0, 100) == 11_000  # bounded
    # 12 s on, the window is gone: nothing is counted.
    assert q.rate(samples, 12_000) == 0 and q.throttle_ms(samples, 12_000, 1) == 0
    # Within one window, amounts add up; a window later, a new one starts.
    more = q.record(q.record(samples, 500, 1000), 1500, 2000)
    assert more.windows == ((0, 22_000), (1500, 2000))


@given(
    st.lists(st.tuples(st.integers(0, 30_000), st.integers(0, 10**6)), max_size=30),
    st.integers(1, 10**6),
    st.integers(1, 10**6),
)
def test_more_bytes_never_throttle_less(
    events: list[tuple[int, int]], extra: int, quota: int
) -> None:
    samples, now = q.Samples(), 0
    for delay, amount in events:
        now += delay
        samples = q.record(samples, now, amount)
    more = q.record(samples, now, extra)
    assert q.throttle_ms(samples, now, quota) <= q.throttle_ms(more, now, quota) <= 11_000
    assert len(more.windows) <= q.QUOTA_WINDOW_NUM


NAMES = st.one_of(st.none(), st.text(max_size=12))


@given(st.one_of(NAMES, st.just("<default>")), NAMES, st.booleans(), st.booleans())
def test_the_kv_record_names_its_entity(
    user: str | None, client: str | None, with_user: bool, with_client: bool
) -> None:
    parts = {
        **({q.USER: user} if with_user else {}),
        **({q.CLIENT_ID: client} if with_client else {}),
    }
    if not parts:
        return
    entity = q.QuotaEntity.of(parts)
    key = quota_key(entity.parts())
    assert parse_quota_key(key) == entity.parts()
    kv = {key: encode_quotas({"producer_byte_rate": 5.0}), "topics/x": b"{}"}
    assert quota_table(kv) == {entity: {"producer_byte_rate": 5.0}}
    assert decode_quotas(encode_quotas({"a": 1.5})) == {"a": 1.5}


# ---------------------------------------------------------------------------- the APIs


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    started = await start_node(node_config(tmp_path))
    await started.listen()
    try:
        yield started
    finally:
        await started.shutdown()


PEER = Peer(1, "127.0.0.1:5000")


def entity(**parts: str | None) -> tuple[EntityData, ...]:
    return tuple(
        EntityData(entity_type=k.replace("_", "-"), entity_name=v) for k, v in parts.items()
    )


async def alter(
    node: Node, *entries: EntryData, validate_only: bool = False
) -> list[tuple[int, str | None]]:
    response = await call(
        node.front_end.admit, PEER, ALTER, 1, entries=entries, validate_only=validate_only
    )
    return [(int(e.error_code.value), e.error_message) for e in response.entries]


async def describe(node: Node, *components: ComponentData, strict: bool = False) -> Any:
    return await call(node.front_end.admit, PEER, DESCRIBE, 1, components=components, strict=strict)


def op(key: str, value: float = 0.0, remove: bool = False) -> OpData:
    return OpData(key=key, value=f64(float(value)), remove=remove)


def listed(response: Any) -> list[tuple[tuple[tuple[str, str | None], ...], dict[str, float]]]:
    assert int(response.error_code.value) == 0, response.error_message
    return [
        (
            tuple((e.entity_type, e.entity_name) for e in entry.entity),
            {v.key: v.value for v in entry.values},
        )
        for entry in response.entries
    ]


async def test_alter_and_describe_client_quotas(node: Node) -> None:
    assert (
        await alter(
            node,
            EntryData(entity=entity(user="alice"), ops=(op("producer_byte_rate", 1024),)),
            EntryData(
                entity=entity(user=None, client_id=None), ops=(op("consumer_byte_rate", 2048),)
            ),
            EntryData(entity=entity(client_id="app"), ops=(op("producer_byte_rate", 10),)),
        )
        == [(0, None)] * 3
    )
    everything = listed(await describe(node))
    assert (((("user", "alice"),), {"producer_byte_rate": 1024.0})) in everything
    assert ((("user", None), ("client-id", None)), {"consumer_byte_rate": 2048.0}) in everything
    assert len(everything) == 3
    exact = ComponentData(entity_type="user", match_type=i8(0), match="alice")
    assert listed(await describe(node, exact)) == [
        ((("user", "alice"),), {"producer_byte_rate": 1024.0})
    ]
    default_user = ComponentData(entity_type="user", match_type=i8(1), match=None)
    assert [e for e, _ in listed(await describe(node, default_user))] == [
        (("user", None), ("client-id", None))
    ]
    # Strict: exactly the types filtered on; not strict: those and more.
    any_user = ComponentData(entity_type="user", match_type=i8(2), match=None)
    assert len(listed(await describe(node, any_user))) == 2
    assert len(listed(await describe(node, any_user, strict=True))) == 1
    # A validate-only change changes nothing; removing the last quota removes the entity.
    assert await alter(
        node,
        EntryData(entity=entity(user="alice"), ops=(op("producer_byte_rate", 1),)),
        validate_only=True,
    ) == [(0, None)]
    assert listed(await describe(node, exact))[0][1] == {"producer_byte_rate": 1024.0}
    assert await alter(
        node, EntryData(entity=entity(user="alice"), ops=(op("producer_byte_rate", remove=True),))
    ) == [(0, None)]
    assert listed(await describe(node, exact)) == []


async def test_refused_changes_name_the_problem(node: Node) -> None:
    answers = await alter(
        node,
        EntryData(entity=entity(user="a"), ops=(op("producer_byte_rate", -1),)),
        EntryData(entity=entity(user="b"), ops=(op("producer_byte_rate", 1.5),)),
        EntryData(entity=entity(user="c"), ops=(op("bogus", 1),)),
        EntryData(entity=entity(user="d"), ops=(op("request_percentage", 10),)),
        EntryData(
            entity=(EntityData(entity_type="ip", entity_name="1.2.3.4"),),
            ops=(op("producer_byte_rate", 1),),
        ),
        EntryData(
            entity=(*entity(user="e"), *entity(user="f")), ops=(op("producer_byte_rate", 1),)
        ),
        EntryData(
            entity=entity(user="g"), ops=(op("producer_byte_rate", 1), op("producer_byte_rate", 2))
        ),
    )
    assert [code for code, _ in answers] == [42] * 7  # INVALID_REQUEST
    messages = [message or "" for _, message in answers]
    assert "whole number" in messages[0] and "whole number" in messages[1]
    assert "Invalid configuration key bogus" in messages[2]
    assert "only producer_byte_rate and consumer_byte_rate" in messages[3]
    assert "not ip" in messages[4]
    assert "Duplicate user" in messages[5]
    assert "Duplicate quota key" in messages[6]
    assert listed(await describe(node)) == []  # nothing was written
    bad = await describe(
        node,
        ComponentData(entity_type="user", match_type=i8(2), match=None),
        ComponentData(entity_type="user", match_type=i8(1), match=None),
    )
    assert int(bad.error_code.value) == 42 and "Duplicate user" in bad.error_message


# ---------------------------------------------------------------------- throttled clients


def throttle_seen(bootstrap: str, client_id: str) -> int:
    """Produce ~100 KiB in one request; the largest throttle librdkafka reports after it."""
    seen: list[int] = []

    def stats(text: str) -> None:
        for broker in json.loads(text)["brokers"].values():
            seen.append(int(broker["throttle"]["max"]))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 200,
            "statistics.interval.ms": 100,
            "stats_cb": stats,
        }
    )
    for _ in range(100):
        producer.produce("throttled", b"x" * 1024)
    assert producer.flush(TIMEOUT_S) == 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        producer.poll(0.1)
    return max(seen, default=0)


async def test_a_producer_over_its_quota_is_told_to_back_off(node: Node) -> None:
    assert await alter(
        node, EntryData(entity=entity(client_id="slow"), ops=(op("producer_byte_rate", 1000),))
    ) == [(0, None)]
    host, port = node.advertised_address
    bootstrap = f"{host}:{port}"
    slow = await asyncio.to_thread(throttle_seen, bootstrap, "slow")
    fast = await asyncio.to_thread(throttle_seen, bootstrap, "fast")
    # ~100 KiB over a 10 s span at 1,000 B/s: far over, so throttled up to the 11 s bound.
    assert slow > 1000, slow
    assert fast == 0


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def now_ms(self) -> int:
        return int(self.now_s * 1000)

    def monotonic_s(self) -> float:
        return self.now_s


async def test_a_new_client_is_muted_an_old_one_waits(node: Node) -> None:
    assert await alter(
        node, EntryData(entity=entity(user="ANONYMOUS"), ops=(op("consumer_byte_rate", 1000),))
    ) == [(0, None)]
    clock = FakeClock()
    quotas = ClientQuotas(node.view, clock)
    peer = Peer(2, "127.0.0.1:1")
    throttle = quotas.throttle_ms("consumer_byte_rate", peer, "c", 20_000)
    assert throttle == 10_000  # (2000 - 1000) / 1000 * 10 s
    assert quotas.throttle_ms("producer_byte_rate", peer, "c", 20_000) == 0  # no such quota
    new = SimpleRequest(api_key=1, api_version=12, peer=peer)
    await quotas.throttled(new, throttle)  # type: ignore[arg-type]
    assert peer.session.muted_until_s == clock.now_s + 10
    old_peer = Peer(3, "127.0.0.1:2")
    old = SimpleRequest(api_key=1, api_version=7, peer=old_peer)
    began = asyncio.get_running_loop().time()
    await quotas.throttled(old, 50)  # type: ignore[arg-type]
    assert asyncio.get_running_loop().time() - began >= 0.04
    assert old_peer.session.muted_until_s == 0


class SimpleRequest:
    def __init__(self, api_key: int, api_version: int, peer: Peer) -> None:
        self.api_key, self.api_version, self.peer = api_key, api_version, peer
