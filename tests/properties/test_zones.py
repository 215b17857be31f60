"""The main/proxy mapping and the proxy's produce decision (automq_ref/kafka/zones.py) over
arbitrary broker sets: every live broker of another zone has exactly one proxy in each zone,
a live broker of that zone; fenced and shutting-down brokers take no part; a proxy serves at
most ``max(zones - 1, ceil(mains / proxies))`` mains (exactly ``zones - 1`` when the zones are
of equal size); the mapping depends only on the set of live brokers; and for any client and
partition, exactly one broker accepts the produce, the one Metadata names to that client.

The mapping does not promise that a small change of the broker set moves few pairs, so that is
not a property here (the module's docstring says why)."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.kafka import zones
from automq_ref.kafka.zones import (
    ProxyMapping,
    Route,
    client_leader,
    client_replicas,
    proxy_mapping,
    route_out,
)
from automq_ref.state_machines import stream_metadata as sm

ZONES = ("az1", "az2", "az3", "az4", "")


@st.composite
def broker_sets(draw: st.DrawFn) -> list[sm.BrokerRegistration]:
    """Up to 16 brokers with distinct ids (some below 100, some above, as deployments number
    them), in up to five zones, some fenced or shutting down."""
    ids = draw(
        st.lists(
            st.one_of(st.integers(0, 120), st.integers(1000, 1020)),
            unique=True,
            max_size=16,
        )
    )
    zones = draw(st.lists(st.sampled_from(ZONES), min_size=1, max_size=5, unique=True))
    brokers = []
    for node_id in ids:
        state = draw(st.sampled_from(["live", "live", "live", "fenced", "shutdown"]))
        brokers.append(
            sm.BrokerRegistration(
                node_id,
                1,
                draw(st.sampled_from(zones)),
                (),
                fenced=state == "fenced",
                in_controlled_shutdown=state == "shutdown",
            )
        )
    return brokers


def live(brokers: list[sm.BrokerRegistration]) -> dict[int, str]:
    return {b.node_id: b.rack for b in brokers if b.live}


@given(broker_sets())
def test_every_main_has_one_proxy_in_each_other_zone(brokers: list[sm.BrokerRegistration]) -> None:
    mapping = proxy_mapping(brokers)
    zone_of = live(brokers)
    assert set(mapping.by_zone) == set(zone_of.values())
    for zone, pairs in mapping.by_zone.items():
        # The mains of a zone are exactly the live brokers of the other zones...
        assert set(pairs) == {node for node, z in zone_of.items() if z != zone}
        # ... and each one's proxy is a live broker of the zone.
        assert all(zone_of.get(proxy) == zone for proxy in pairs.values())


@given(broker_sets())
def test_a_proxy_serves_a_bounded_share(brokers: list[sm.BrokerRegistration]) -> None:
    mapping = proxy_mapping(brokers)
    zone_of = live(brokers)
    sizes = Counter(zone_of.values())
    for zone, pairs in mapping.by_zone.items():
        served = Counter(pairs.values())
        bound = max(len(sizes) - 1, math.ceil(len(pairs) / sizes[zone]))
        assert max(served.values(), default=0) <= bound
        if len(set(sizes.values())) == 1:
            # Zones of equal size: each slot holds one broker of every zone.
            assert all(served[node] == len(sizes) - 1 for node, z in zone_of.items() if z == zone)


@given(broker_sets(), st.randoms(use_true_random=False))
def test_the_mapping_depends_only_on_the_live_brokers(
    brokers: list[sm.BrokerRegistration], random: object
) -> None:
    shuffled = list(brokers)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    mapping = proxy_mapping(brokers)
    assert proxy_mapping(shuffled) == mapping
    assert proxy_mapping([b for b in brokers if b.live]) == mapping
    # Computed afresh (not from the cache), the same answer.
    fresh = zones._mapping.__wrapped__(tuple(sorted(live(brokers).items())))
    assert fresh == mapping


@given(broker_sets(), st.data())
def test_exactly_the_broker_metadata_names_accepts_a_produce(
    brokers: list[sm.BrokerRegistration], data: st.DataObject
) -> None:
    zone_of = live(brokers)
    if not zone_of:
        return
    mapping = proxy_mapping(brokers)
    leader = data.draw(st.sampled_from(sorted(zone_of)), label="leader")
    client = data.draw(st.one_of(st.none(), st.sampled_from([*ZONES, "elsewhere"])), "zone")
    named = client_leader(mapping, client, leader)
    accepting = {}
    for node, zone in zone_of.items():
        decision = route_out(
            node_id=node,
            zone=zone,
            client_zone=client,
            leader=leader,
            leader_zone=zone_of[leader],
            mapping=mapping,
        )
        if decision.route is not Route.NOT_LEADER_OR_FOLLOWER:
            accepting[node] = decision
    assert set(accepting) == {named}
    decision = accepting[named]
    if named == leader:
        assert decision.route is Route.LOCAL
    else:
        assert decision.route is Route.ROUTE and decision.target == leader
        assert zone_of[named] == client
    replicas = client_replicas(mapping, client, leader)
    assert named in replicas and len(set(replicas)) == len(replicas)


def test_no_brokers_no_mapping() -> None:
    assert proxy_mapping([]) == ProxyMapping({})
