"""Zones (automq_ref/kafka/zones.py and the zone settings in automq_ref/config.py): a client's
zone from its client id (a URL query string, malformed ones too) or its address, the zone
settings' grammar and its errors, the main/proxy mapping on known broker sets (the pairs
AutoMQ's dual mapping makes for them), and the proxy's route-out decision case by case."""

from __future__ import annotations

import ipaddress

import pytest

from automq_ref.config import (
    BrokerConfig,
    ConfigError,
    ZoneCidrBlock,
    load_config,
    parse_router_channels,
    parse_zone_cidr_blocks,
)
from automq_ref.kafka.zones import (
    ClientIdMetadata,
    ClientType,
    ProxyMapping,
    Route,
    RouteDecision,
    address_zone,
    client_id_metadata,
    client_leader,
    client_replicas,
    client_zone,
    proxy_mapping,
    route_out,
    split_client_id,
)
from automq_ref.state_machines import stream_metadata as sm

CHANNEL = "0@s3://router?region=us-east-1&endpoint=http://127.0.0.1:9000&batchInterval=250"


def config(*overrides: str) -> BrokerConfig:
    return load_config(overrides=list(overrides), environment={})


def problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as raised:
        config(*overrides)
    return "\n".join(raised.value.problems)


# ------------------------------------------------------------------------ the client id


@pytest.mark.parametrize(
    ("client_id", "zone", "client_type"),
    [
        ("automq_az=az2", "az2", None),
        ("automq_az=az2&automq_type=producer", "az2", ClientType.PRODUCER),
        ("automq_type=consumer&automq_az=us-east-1a", "us-east-1a", ClientType.CONSUMER),
        ("automq_type=other&automq_az=z", "z", None),
        # Percent- and form-decoded, names too.
        ("app=1&automq_az=a%20b+c", "a b c", None),
        ("automq_%61z=az1", "az1", None),
        ("automq_az=%E2%82%AC", "\u20ac", None),
        # The first value of a repeated name wins.
        ("automq_az=az1&automq_az=az2", "az1", None),
        # No value: none.
        ("automq_az=", None, None),
        ("automq_az", None, None),
        ("automq_az=&automq_az=az2", None, None),
        # A pair starting with "=" is a name as written.
        ("=automq_az=az1", None, None),
        # A plain client id declares nothing.
        ("my-producer", None, None),
        ("console-consumer-1234", None, None),
        ("", None, None),
        ("   ", None, None),
        (None, None, None),
        ("&&automq_az=az3&&", "az3", None),
        # A broken escape in a decoded part: nothing declared, whatever else the id says.
        ("automq_az=az1&x=%zz", None, None),
        ("automq_az=az1%", None, None),
        ("automq_az=az%4", None, None),
        # ... but not in a pair taken as written (no "=").
        ("100%&automq_az=az2", "az2", None),
        # An escape's two characters are read as a signed hexadecimal number.
        ("automq_az=a%+a", "a\n", None),
    ],
)
def test_the_client_id_declares_a_zone(
    client_id: str | None, zone: str | None, client_type: ClientType | None
) -> None:
    assert client_id_metadata(client_id) == ClientIdMetadata(zone, client_type)


def test_the_client_id_split_keeps_every_value() -> None:
    assert split_client_id("a=1&b&a=2&=c&a=") == {
        "a": ["1", "2", None],
        "b": [None],
        "=c": [None],
    }
    with pytest.raises(ValueError, match="escape"):
        split_client_id("a=%g0")


# -------------------------------------------------------------------- zones by address


BLOCKS = parse_zone_cidr_blocks(
    "az1@10.0.0.0/8,192.168.1.0/24<>az2@10.2.0.0/16<>az3@10.2.3.0/24,0.0.0.0/0<>az4@10.2.3.0/24"
)


@pytest.mark.parametrize(
    ("host", "zone"),
    [
        ("10.1.2.3", "az1"),
        ("192.168.1.77", "az1"),
        ("10.2.9.9", "az2"),  # the longer prefix wins
        ("10.2.3.4", "az3"),  # the first of equal prefixes wins
        ("8.8.8.8", "az3"),  # /0 holds every address
        ("::ffff:10.2.9.9", "az2"),  # IPv4 mapped into IPv6
        ("::1", None),
        ("?", None),
        ("", None),
    ],
)
def test_an_address_is_in_the_zone_of_the_longest_block_holding_it(
    host: str, zone: str | None
) -> None:
    assert address_zone(BLOCKS, host) == zone


def test_a_declared_zone_wins_over_the_address() -> None:
    assert client_zone("automq_az=az9", "10.1.1.1", BLOCKS) == "az9"
    assert client_zone("plain", "10.1.1.1", BLOCKS) == "az1"
    assert client_zone("automq_az=", "10.2.3.1", BLOCKS) == "az3"
    assert client_zone("plain", "10.1.1.1", ()) is None
    assert address_zone(parse_zone_cidr_blocks("az1@127.0.0.0/8"), "127.0.0.1") == "az1"


# ------------------------------------------------------------------------ the settings


def test_zone_cidr_blocks_parse_as_written() -> None:
    assert parse_zone_cidr_blocks("") == () == parse_zone_cidr_blocks("  ")
    assert parse_zone_cidr_blocks(" az1@10.0.0.7/8 , 10.1.0.0/16 <> az2@1.2.3.4/32") == (
        ZoneCidrBlock("az1", ipaddress.IPv4Network("10.0.0.0/8"), "10.0.0.7/8"),
        ZoneCidrBlock("az1", ipaddress.IPv4Network("10.1.0.0/16"), "10.1.0.0/16"),
        ZoneCidrBlock("az2", ipaddress.IPv4Network("1.2.3.4/32"), "1.2.3.4/32"),
    )
    assert config("automq.zone.cidr.blocks=az1@10.0.0.0/8").zone_cidr_blocks[0].zone == "az1"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("az1@10.0.0.0/8<>az2", "'az2': expected ZONE@CIDR"),
        ("az1@10.0.0.0/8<>", "'': expected ZONE@CIDR"),
        ("@10.0.0.0/8", "'@10.0.0.0/8': expected ZONE@CIDR"),
        ("az1@10.0.0.0/8@x", "expected ZONE@CIDR"),
        ("az1@10.0.0.0", "'10.0.0.0' (zone 'az1'): expected an IPv4 CIDR block"),
        ("az1@10.0.0.0/33", "'10.0.0.0/33' (zone 'az1')"),
        ("az1@10.0.0.0/8,", "'' (zone 'az1')"),
        ("az1@10.0.0.300/8", "'10.0.0.300' is not an IPv4 address"),
        ("az1@fd00::/8", "'fd00::' is not an IPv4 address"),
    ],
)
def test_a_bad_zone_cidr_block_is_named(value: str, named: str) -> None:
    found = problems(f"automq.zone.cidr.blocks={value}")
    assert found.startswith(f"automq.zone.cidr.blocks={value!r}: ")
    assert named in found


def test_router_channels_parse_as_object_wals() -> None:
    assert parse_router_channels("") == ()
    (channel,) = parse_router_channels(CHANNEL)
    assert channel.channel_id == 0 and channel.uri == CHANNEL
    assert channel.wal.store_uri.startswith("s3://router?")
    assert channel.wal.batch_interval_ms == 250
    assert channel.wal.max_bytes_in_batch == 8 * 1024 * 1024  # the default
    # A comma separates channels only before ID@; elsewhere it belongs to the URI.
    first, second = parse_router_channels(f"{CHANNEL},1@dir:///tmp/channel")
    assert (first.uri, second.channel_id, second.wal.store_uri) == (
        CHANNEL,
        1,
        "file:///tmp/channel",
    )
    on = config(f"automq.zonerouter.channels={CHANNEL}", "broker.rack=az1")
    assert on.zone_router_enabled and on.zone_router_channels == (channel,)
    assert not config().zone_router_enabled
    assert config().automq_zonerouter_local_write_mode == "router_channel"
    assert config(
        "automq.zonerouter.local.write.mode=DIRECT"
    ).automq_zonerouter_local_write_mode == ("direct")


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("s3://router?region=r", "channel 1 ('s3://router?region=r'): expected ID@URI"),
        (f"{CHANNEL},junk", "channel 1"),  # junk after a comma belongs to the first URI
        (f"{CHANNEL},0@dir:///x", "channel 2 ('0@dir:///x'): channel id 0 is given twice"),
        ("40000@dir:///x", "the channel id must be in 0..32767"),
        ("0@file:///x", "a channel is an object WAL"),
        ("0@device://127.0.0.1:1", "not the scheme 'device'"),
        ("0@s3://router?regoin=r", "unknown WAL parameter 'regoin'; did you mean 'region'?"),
        ("0@s3://router?batchInterval=0", "batchInterval='0' must be a positive integer"),
        ("0@s3://?region=r", "an s3:// WAL needs a bucket"),
    ],
)
def test_a_bad_router_channel_is_named(value: str, named: str) -> None:
    found = problems(f"automq.zonerouter.channels={value}", "broker.rack=az1")
    assert found.startswith(f"automq.zonerouter.channels={value!r}: ")
    assert named in found


def test_the_router_needs_a_rack_and_a_known_write_mode() -> None:
    assert "broker.rack is empty" in problems(f"automq.zonerouter.channels={CHANNEL}")
    assert problems("automq.zonerouter.local.write.mode=proxy") == (
        "automq.zonerouter.local.write.mode='proxy': expected one of router_channel, direct"
    )


# ----------------------------------------------------------------- the main/proxy mapping


def brokers(text: str, *down: int) -> list[sm.BrokerRegistration]:
    """``"1:az1 2:az2"``: live brokers by id and zone; ``down`` fenced."""
    found = []
    for item in text.split():
        node_id, zone = item.split(":")
        found.append(sm.BrokerRegistration(int(node_id), 1, zone, (), fenced=int(node_id) in down))
    return found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "1:az1 2:az2 3:az3",
            {"az1": {2: 1, 3: 1}, "az2": {1: 2, 3: 2}, "az3": {1: 3, 2: 3}},
        ),
        (
            "1:az1 2:az1 3:az2 4:az2 5:az3 6:az3",
            {
                "az1": {3: 2, 4: 1, 5: 2, 6: 1},
                "az2": {1: 4, 2: 3, 5: 3, 6: 4},
                "az3": {1: 6, 2: 5, 3: 5, 4: 6},
            },
        ),
        (
            "1:a 2:a 3:b 4:c",
            {"a": {3: 2, 4: 2}, "b": {1: 3, 2: 3, 4: 3}, "c": {1: 4, 2: 4, 3: 4}},
        ),
        (
            # Brokers numbered below 100 share slot -1 where they can.
            "5:az1 150:az1 160:az1 7:az2 170:az2 180:az2 9:az3",
            {
                "az1": {7: 5, 9: 5, 170: 150, 180: 160},
                "az2": {5: 7, 9: 7, 150: 170, 160: 180},
                "az3": {5: 9, 7: 9, 150: 9, 160: 9, 170: 9, 180: 9},
            },
        ),
        (
            " ".join(f"{node}:az{node % 3}" for node in range(100, 109)),
            {
                "az0": {100: 105, 101: 105, 103: 108, 104: 108, 106: 102, 107: 102},
                "az1": {101: 100, 102: 106, 104: 103, 105: 100, 107: 106, 108: 103},
                "az2": {100: 101, 102: 107, 103: 104, 105: 101, 106: 107, 108: 104},
            },
        ),
        ("1:az1", {"az1": {}}),
        ("", {}),
    ],
)
def test_the_mapping_of_known_broker_sets(text: str, expected: dict[str, dict[int, int]]) -> None:
    assert proxy_mapping(brokers(text)) == ProxyMapping(expected)


def test_fenced_and_shutting_down_brokers_are_left_out() -> None:
    fenced = brokers("1:az1 2:az2 3:az3 4:az2", 4)
    shutting_down = [
        *brokers("1:az1 2:az2 3:az3"),
        sm.BrokerRegistration(5, 1, "az2", (), fenced=False, in_controlled_shutdown=True),
    ]
    expected = proxy_mapping(brokers("1:az1 2:az2 3:az3"))
    assert proxy_mapping(fenced) == proxy_mapping(shutting_down) == expected


def test_what_clients_are_told() -> None:
    mapping = proxy_mapping(brokers("1:az1 2:az2 3:az3"))
    # A client in a covered zone: that zone's proxy, alone.
    assert [client_leader(mapping, "az2", leader) for leader in (1, 2, 3)] == [2, 2, 2]
    assert [client_replicas(mapping, "az2", leader) for leader in (1, 2, 3)] == [(2,)] * 3
    # No zone, or a zone without brokers: the leader, with its proxies.
    for zone in (None, "az9"):
        assert [client_leader(mapping, zone, leader) for leader in (1, 2, 3)] == [1, 2, 3]
        assert client_replicas(mapping, zone, 1) == (1, 2, 3)
        assert client_replicas(mapping, zone, 3) == (3, 1, 2)
    # No leader: nothing to rewrite.
    assert client_leader(mapping, "az2", -1) == -1 and client_replicas(mapping, "az2", -1) == ()
    # A leader that is not live (shutting down) has no proxies.
    assert client_leader(mapping, "az2", 7) == 7 and client_replicas(mapping, None, 7) == (7,)


# ------------------------------------------------------------------------- the route out


MAPPING = proxy_mapping(brokers("1:az1 2:az2 3:az3 4:az1"))
ZONE = {1: "az1", 2: "az2", 3: "az3", 4: "az1"}


@pytest.mark.parametrize(
    ("node", "client", "leader", "expected"),
    [
        # No leader known: written here.
        (1, "az1", None, RouteDecision(Route.LOCAL)),
        # A client without a zone writes to the leader.
        (1, None, 1, RouteDecision(Route.LOCAL)),
        (1, None, 2, RouteDecision(Route.NOT_LEADER_OR_FOLLOWER)),
        # A client of my zone: mine, another of my zone's (go there), routed when I proxy.
        (1, "az1", 1, RouteDecision(Route.LOCAL)),
        (1, "az1", 4, RouteDecision(Route.NOT_LEADER_OR_FOLLOWER)),
        (MAPPING.by_zone["az1"][2], "az1", 2, RouteDecision(Route.ROUTE, 2)),
        (MAPPING.by_zone["az1"][3], "az1", 3, RouteDecision(Route.ROUTE, 3)),
        (
            {1: 4, 4: 1}[MAPPING.by_zone["az1"][2]],
            "az1",
            2,
            RouteDecision(Route.NOT_LEADER_OR_FOLLOWER),
        ),
        # A client of another zone with brokers: it must use its own zone, even for my partition.
        (2, "az1", 2, RouteDecision(Route.NOT_LEADER_OR_FOLLOWER)),
        (2, "az3", 1, RouteDecision(Route.NOT_LEADER_OR_FOLLOWER)),
        # A client of a zone without brokers writes to the leader.
        (2, "az9", 2, RouteDecision(Route.LOCAL)),
        (2, "az9", 1, RouteDecision(Route.NOT_LEADER_OR_FOLLOWER)),
    ],
)
def test_the_route_out(
    node: int, client: str | None, leader: int | None, expected: RouteDecision
) -> None:
    decided = route_out(
        node_id=node,
        zone=ZONE[node],
        client_zone=client,
        leader=leader,
        leader_zone=None if leader is None else ZONE[leader],
        mapping=MAPPING,
    )
    assert decided == expected


def test_the_last_broker_of_a_zone_leaving() -> None:
    # Node 2 shutting down: zone az2 has no live broker, so its clients write to leaders.
    mapping = proxy_mapping(
        [
            *brokers("1:az1 3:az3"),
            sm.BrokerRegistration(2, 1, "az2", (), fenced=False, in_controlled_shutdown=True),
        ]
    )
    assert not mapping.covers("az2")
    decided = route_out(
        node_id=2, zone="az2", client_zone="az2", leader=1, leader_zone="az1", mapping=mapping
    )
    assert decided == RouteDecision(Route.NOT_LEADER_OR_FOLLOWER)
    assert client_leader(mapping, "az2", 1) == 1
