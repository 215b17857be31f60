"""Zones for the zone router: a client's zone, the main/proxy mapping and the proxy's decision
where a produce goes. Pure functions of their arguments (no I/O, no clock), so that every broker
computes the same answers from the same metadata image.

**A client's zone.** A client declares it in its ``client.id``, read as a URL query string
(``automq_az=az2&automq_type=producer``): pairs split at ``&`` (trailing empty pairs dropped),
each at its first ``=``; names and values form-decoded (``+`` a space, ``%XX`` runs UTF-8); the
first value of a repeated name wins; a pair without ``=``, or with nothing after it, has no
value, and one without ``=`` or starting with it is a name taken as written. ``automq_az`` is
the zone and ``automq_type`` the client's type (``producer`` or ``consumer``). A client id with
a broken escape (``%G1``, a lone ``%``) in a part it decodes declares nothing. A client that
declares no zone is in the zone of the address it connects from, by ``automq.zone.cidr.blocks``:
the longest matching prefix wins, and among blocks of one length the first written. No zone (no
``automq_az``, no block holds the address, an address that is not IPv4): None.

**The main/proxy mapping** (computed from the live brokers, unfenced and not in controlled
shutdown, so recomputed whenever they change): for every zone R that has a live broker, every
live broker of another zone (a *main*) has exactly one *proxy* in R, a broker of R that serves
R's clients for the partitions the main leads. The mapping is the "dual" one. With S the most
brokers any zone has, each zone's brokers are hashed onto S slots, -1 to -S (a consistent-hash
ring, eight points per slot at the MD5 of ``"<slot>-<i>"``, a broker at the MD5 of its decimal
id, the first four bytes big-endian), then moved so that no slot holds two (the most crowded
slot gives its last-hashed brokers to empty slots, the most negative first), and
slot -1 prefers a broker numbered below 100 (the numbers deployments give their combined
controller-brokers): it hands another to an empty slot, or swaps it for another slot's. Brokers
that share a slot proxy one another; a broker whose slot has no broker of zone R gets R's
least-loaded broker (loads counted as pairs are made: slot -1 first, each slot's brokers by
id, zones by name; ties to the lowest id).
So with zones of equal size every proxy serves exactly one main of each other zone, and in
general a proxy serves at most ``max(zones - 1, ceil(mains / proxies))`` mains (the mains and
proxies of its zone). The mapping does not promise that a small change of the broker set moves
few pairs: a new broker can displace another from its slot, and S changes with the largest
zone.

**The proxy's decision** (:func:`route_out`) for one partition of a produce, given the client's
zone and the partition's leader: write it here (``LOCAL``), route it to the leader through the
channel (``ROUTE``), or answer ``NOT_LEADER_OR_FOLLOWER`` so that the client asks Metadata
again and goes where it should.
"""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from automq_ref.config import ZoneCidrBlock
from automq_ref.state_machines import stream_metadata as sm

ZONE_KEY = "automq_az"
CLIENT_TYPE_KEY = "automq_type"
# Points each slot has on the consistent-hash ring.
VIRTUAL_NODES = 8
# Node ids below this are combined controller-brokers in AutoMQ's deployments; the first slot
# prefers one (see the module docstring).
CONTROLLER_ID_BOUND = 100

# The two characters after a % (module docstring).
_ESCAPE = re.compile(r"[0-9A-Fa-f]{2}|\+[0-9A-Fa-f]|-0")


class ClientType(enum.Enum):
    PRODUCER = "producer"
    CONSUMER = "consumer"


@dataclass(frozen=True, slots=True)
class ClientIdMetadata:
    """What a client declares in its client id: its zone and its type (None: not declared)."""

    zone: str | None
    client_type: ClientType | None


def split_client_id(client_id: str | None) -> dict[str, list[str | None]]:
    """The client id as a query string: each name with its values in order (None for a pair
    without a value). Raises ValueError on a broken percent escape in a part it decodes."""
    if client_id is None or not client_id.strip():
        return {}
    pairs = client_id.split("&")
    while pairs and not pairs[-1]:  # trailing empty pairs are dropped
        pairs.pop()
    found: dict[str, list[str | None]] = {}
    for pair in pairs:
        equals = pair.find("=")
        # A pair without "=", or starting with one, keeps its whole text, undecoded, as name.
        name = _decode(pair[:equals]) if equals > 0 else pair
        value = _decode(pair[equals + 1 :]) if 0 < equals < len(pair) - 1 else None
        found.setdefault(name, []).append(value)
    return found


def _decode(text: str) -> str:
    """Form decoding: ``+`` is a space, each run of ``%XX`` escapes is UTF-8 (a bad sequence
    becomes U+FFFD). An escape's two characters are read as a signed hexadecimal number, so
    ``%+a`` is byte 10 and ``%-0`` byte 0, as AutoMQ reads them. Raises ValueError on any
    other escape."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "%":
            out.append(" " if char == "+" else char)
            index += 1
            continue
        run = bytearray()
        while index < len(text) and text[index] == "%":
            field = text[index + 1 : index + 3]
            if not _ESCAPE.fullmatch(field):
                raise ValueError(f"{text!r}: a broken % escape at {index}")
            run.append(int(field, 16))
            index += 3
        out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


def client_id_metadata(client_id: str | None) -> ClientIdMetadata:
    """The zone and type a client id declares (nothing, when it is malformed)."""
    try:
        pairs = split_client_id(client_id)
    except ValueError:
        return ClientIdMetadata(None, None)
    zone = (pairs.get(ZONE_KEY) or [None])[0]
    kind = (pairs.get(CLIENT_TYPE_KEY) or [None])[0]
    client_type = next((t for t in ClientType if t.value == kind), None)
    return ClientIdMetadata(zone, client_type)


def address_zone(blocks: Iterable[ZoneCidrBlock], host: str) -> str | None:
    """The zone of the first block, longest prefix first, holding ``host`` (an IPv4 address,
    or an IPv4 address mapped into IPv6); None when none holds it or it is not IPv4."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is None:
            return None
        address = address.ipv4_mapped
    best: ZoneCidrBlock | None = None
    for block in blocks:
        if address in block.network and (
            best is None or block.network.prefixlen > best.network.prefixlen
        ):
            best = block
    return None if best is None else best.zone


def client_zone(client_id: str | None, host: str, blocks: Iterable[ZoneCidrBlock]) -> str | None:
    """A client's zone: the one its client id declares, else the one its address is in."""
    declared = client_id_metadata(client_id).zone
    return declared if declared is not None else address_zone(blocks, host)


# ------------------------------------------------------------------ the main/proxy mapping


@dataclass(frozen=True, slots=True)
class ProxyMapping:
    """For each zone with a live broker (``by_zone``'s keys, the zones the mapping *covers*),
    each live broker of another zone (a main) and its proxy in that zone."""

    by_zone: Mapping[str, Mapping[int, int]]

    def covers(self, zone: str) -> bool:
        return zone in self.by_zone

    def proxy(self, zone: str, main: int) -> int | None:
        """The proxy of ``main`` in ``zone``; None when ``main`` is in ``zone`` itself, is not a
        live broker, or ``zone`` has no live broker."""
        return self.by_zone.get(zone, {}).get(main)

    def proxies_of(self, main: int) -> tuple[int, ...]:
        """``main``'s proxies, one per other zone, by zone name."""
        found = (self.by_zone[zone].get(main) for zone in sorted(self.by_zone))
        return tuple(proxy for proxy in found if proxy is not None and proxy != main)


def proxy_mapping(brokers: Iterable[sm.BrokerRegistration]) -> ProxyMapping:
    """The mapping over ``brokers``' live ones (unfenced, not in controlled shutdown), each in
    the zone of its rack (a broker without a rack is in the zone ``""``)."""
    live = tuple(sorted((b.node_id, b.rack) for b in brokers if b.live))
    return _mapping(live)


@functools.lru_cache(maxsize=32)
def _mapping(brokers: tuple[tuple[int, str], ...]) -> ProxyMapping:
    zones: dict[str, list[int]] = {}
    for node_id, zone in brokers:
        zones.setdefault(zone, []).append(node_id)
    slots = max((len(ids) for ids in zones.values()), default=0)
    if slots == 0:
        return ProxyMapping({})
    zone_of = {node_id: zone for node_id, zone in brokers}
    ring = _Ring(slots)
    # Each slot's brokers, at most one per zone, sorted by id.
    sharing: dict[int, list[int]] = {slot: [] for slot in ring.slots}
    for zone in sorted(zones):
        for slot, mains in _balanced_slots(ring, sorted(zones[zone])).items():
            sharing[slot].extend(mains)
    by_zone: dict[str, dict[int, int]] = {zone: {} for zone in zones}
    load: dict[int, int] = dict.fromkeys(zone_of, 0)
    for slot in ring.slots:
        members = sorted(sharing[slot])
        for proxy in members:
            for main in members:
                if main != proxy:
                    by_zone[zone_of[proxy]][main] = proxy
                    load[proxy] += 1
    for slot in ring.slots:
        members = sorted(sharing[slot])
        present = {zone_of[node_id] for node_id in members}
        for main in members:
            for zone in sorted(set(zones) - present):
                proxy = min(sorted(zones[zone]), key=lambda node_id: load[node_id])
                by_zone[zone][main] = proxy
                load[proxy] += 1
    return ProxyMapping(by_zone)


def _ring_hash(key: str) -> int:
    """The ring position of a key: the first four bytes of its MD5, big-endian."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


class _Ring:
    """Slots -1, -2, ..., -S on a consistent-hash ring, ``VIRTUAL_NODES`` points each; a point
    two slots hash to is the later slot's."""

    def __init__(self, count: int) -> None:
        self.slots = tuple(-1 - index for index in range(count))
        points: dict[int, int] = {}
        for slot in self.slots:
            for replica in range(VIRTUAL_NODES):
                points[_ring_hash(f"{slot}-{replica}")] = slot
        self._positions = sorted(points)
        self._owners = [points[position] for position in self._positions]

    def route(self, key: str) -> int:
        """The slot owning the first point at or after the key's hash (wrapping around)."""
        index = bisect.bisect_left(self._positions, _ring_hash(key))
        return self._owners[index % len(self._owners)]


def _balanced_slots(ring: _Ring, node_ids: list[int]) -> dict[int, list[int]]:
    """One zone's brokers (sorted by id) on the ring's slots, at most one per slot: hashed by
    decimal id, then the surplus of a crowded slot (its last-hashed brokers) moved to empty
    slots, the most negative first; then slot -1's preference for a
    broker below ``CONTROLLER_ID_BOUND``."""
    held: dict[int, list[int]] = {slot: [] for slot in ring.slots}
    for node_id in node_ids:
        held[ring.route(str(node_id))].append(node_id)
    # Most crowded first, the higher slot number first among equals.
    order = sorted(ring.slots, key=lambda slot: (len(held[slot]), slot), reverse=True)
    for crowded in order:
        if len(held[crowded]) <= 1:
            break
        for free in reversed(order):
            if len(held[crowded]) <= 1:
                break
            if not held[free]:
                held[free].append(held[crowded].pop())
    _prefer_controllers(order, held)
    return held


def _is_controller(node_id: int) -> bool:
    return -1 <= node_id < CONTROLLER_ID_BOUND


def _prefer_controllers(order: list[int], held: dict[int, list[int]]) -> None:
    """The slot numbered in the controller range (-1) gives a broker outside it to an empty
    slot, or swaps it for another slot's broker inside it."""
    for slot in order:
        if not _is_controller(slot):
            continue
        mains = held[slot]
        index = 0
        while index < len(mains):
            main = mains[index]
            if not _is_controller(main):
                for other in order:
                    if other == slot or _is_controller(other):
                        continue
                    if not held[other]:
                        held[other].append(mains.pop(index))
                        index -= 1
                        break
                    swap = next((j for j, m in enumerate(held[other]) if _is_controller(m)), None)
                    if swap is not None:
                        mains[index], held[other][swap] = held[other][swap], main
                        break
            index += 1


# ---------------------------------------------------------------- what a client is told


def client_leader(mapping: ProxyMapping, zone: str | None, leader: int) -> int:
    """The broker a client in ``zone`` is told leads a partition ``leader`` leads: its proxy
    in the client's zone, when the mapping covers that zone and the leader is elsewhere."""
    if zone is None or leader < 0:
        return leader
    proxy = mapping.proxy(zone, leader)
    return leader if proxy is None else proxy


def client_replicas(mapping: ProxyMapping, zone: str | None, leader: int) -> tuple[int, ...]:
    """The replicas (and ISR) a client in ``zone`` is told for a partition ``leader`` leads:
    only its proxy, for a client whose zone the mapping covers and that is not the leader's;
    the leader alone for a client in the leader's zone; for a client without a covered zone,
    the leader and its proxies in every zone (the brokers that can serve its reads)."""
    if leader < 0:
        return ()
    if zone is not None and mapping.covers(zone):
        return (client_leader(mapping, zone, leader),)
    return (leader, *mapping.proxies_of(leader))


# ------------------------------------------------------------- the proxy's produce decision


class Route(enum.Enum):
    LOCAL = "local"  # append here
    ROUTE = "route"  # send to the leader through the channel
    NOT_LEADER_OR_FOLLOWER = "not_leader_or_follower"  # the client must ask Metadata again


@dataclass(frozen=True, slots=True)
class RouteDecision:
    route: Route
    target: int | None = None  # the leader, for ROUTE


def route_out(
    *,
    node_id: int,
    zone: str,
    client_zone: str | None,
    leader: int | None,
    leader_zone: str | None,
    mapping: ProxyMapping,
) -> RouteDecision:
    """Where broker ``node_id`` (in ``zone``) sends one partition of a produce from a client in
    ``client_zone``, the partition led by ``leader`` (in ``leader_zone``; None: no leader
    known, written here as before)."""
    local = RouteDecision(Route.LOCAL)
    refuse = RouteDecision(Route.NOT_LEADER_OR_FOLLOWER)
    if leader is None:
        return local
    if client_zone is None:
        return local if leader == node_id else refuse
    if client_zone == zone:
        if leader == node_id:
            return local
        if leader_zone == zone:
            return refuse  # the client should send it to the leader, in its own zone
        if mapping.proxy(zone, leader) == node_id:
            return RouteDecision(Route.ROUTE, leader)
        return refuse  # another broker of this zone proxies the leader
    if mapping.covers(client_zone):
        return refuse  # the client should send it to a broker of its own zone
    # No live broker in the client's zone: it writes to leaders directly.
    return local if leader == node_id else refuse
