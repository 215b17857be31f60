"""A three-zone network on one machine, in Linux network namespaces, whose kernel counters say
how many bytes crossed zones.

One :class:`ZoneNetwork` is five namespaces (the instance's name ``amqz-<pid>-<tag>`` then the
role): one per zone (``az1``, ``az2``, ``az3``) for that zone's broker and clients, ``region``
for the regional services (etcd and the S3 server) and ``xz``, which holds nothing but the bridge
between the zones. Each zone has two links, both veth pairs:

- ``xz-<tag>`` into the bridge ``br-<tag>`` (in ``xz``), its only way to the other zones;
- ``rg-<tag>`` into the region (the region's end is ``<zone>-<tag>``), its only way to the
  regional services.

No namespace forwards IP packets and the bridge carries no address, so a byte from one zone to
another can only pass its sender's and its receiver's inter-zone links, and a byte between a zone
and etcd or S3 only that zone's regional link. The counters are read on the far ends of the
links (the bridge's ports, the region's ends): a port's received bytes are what its zone sent.
They count whole frames (Ethernet, IP and TCP headers with the payload; large TCP segments pass
a veth unsplit, so one header per segment) plus the zones' ARP; IPv6 is off in every namespace,
so no neighbour discovery adds to them.

Addresses (one ``10.B.0.0/16`` per instance, ``B`` chosen clear of the host's routes; the
namespaces are not linked to the host, so it never sees them):

- zone ``azN``: ``10.B.N.1`` on its loopback, the address its broker listens on and its clients
  send from (routes carry it as source), so it stays reachable inside the zone while a link is
  down;
- the region's services: ``10.B.100.1`` on the region's loopback;
- link addresses: ``10.B.0.N/24`` on the zones' bridge ports, ``10.B.200.(4N+1|4N+2)/30`` on
  each regional pair.

:meth:`ZoneNetwork.command` wraps a command to run in a zone or the region (``ip netns exec``);
:meth:`ZoneNetwork.inside` moves the calling thread into one for a block (so this process can
connect to a service there); :meth:`ZoneNetwork.counters` reads every link. Teardown
(:meth:`ZoneNetwork.close`, the context manager's exit, and an ``atexit`` hook) kills every
process left in the instance's namespaces and deletes them, which deletes every link; a run that
was killed leaves namespaces whose pid no longer lives, and :func:`cleanup` (``python -m
automq_ref.netzones cleanup``) removes those. Building needs root and iproute2;
:func:`unavailable_reason` says why not when they are missing, and :class:`ZoneNetworkError`
carries that reason.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "amqz-"
ZONES = ("az1", "az2", "az3")
REGION = "region"
BRIDGE_NS = "xz"
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
IP_TIMEOUT_S = 30.0
KILL_GRACE_S = 5.0
# Second octets tried for an instance's 10.B.0.0/16 (those the host routes are skipped).
SECOND_OCTETS = range(64, 192)


class ZoneNetworkError(Exception):
    """The network cannot be built or used: one line saying why."""


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (not root, no iproute2), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. in CI)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not on PATH (apt-get install -y iproute2)"
    return None


def _ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["ip", *arguments], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise ZoneNetworkError(f"`ip {' '.join(arguments)}` failed: {done.stderr.strip()}")
    return done


def _namespaces() -> list[str]:
    done = _ip("-j", "netns", "list", check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return []
    return [entry["name"] for entry in json.loads(done.stdout)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host routes or holds an address in."""
    found: list[ipaddress.IPv4Network] = []
    for arguments in (("-4", "-j", "route", "show", "table", "all"), ("-4", "-j", "addr")):
        done = _ip(*arguments, check=False)
        with contextlib.suppress(ValueError):
            for entry in json.loads(done.stdout or "[]"):
                destinations = [entry.get("dst")] + [
                    f"{info['local']}/{info['prefixlen']}" for info in entry.get("addr_info", [])
                ]
                for destination in destinations:
                    if destination and destination != "default" and destination[0].isdigit():
                        with contextlib.suppress(ValueError):
                            found.append(ipaddress.IPv4Network(destination, strict=False))
    return found


def _free_second_octet() -> int:
    taken = _host_networks()
    for octet in SECOND_OCTETS:
        candidate = ipaddress.IPv4Network(f"10.{octet}.0.0/16")
        if not any(candidate.overlaps(network) for network in taken):
            return octet
    raise ZoneNetworkError("every 10.B.0.0/16 the network could use overlaps a host route")


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@dataclass(frozen=True, slots=True)
class ZoneCounters:
    """Bytes over one zone's links since the network was built, from the zone's side."""

    zone: str
    to_zones: int  # this zone -> the other zones
    from_zones: int  # the other zones -> this zone
    to_region: int  # this zone -> etcd and S3
    from_region: int  # etcd and S3 -> this zone

    def minus(self, earlier: ZoneCounters) -> ZoneCounters:
        return ZoneCounters(
            self.zone,
            self.to_zones - earlier.to_zones,
            self.from_zones - earlier.from_zones,
            self.to_region - earlier.to_region,
            self.from_region - earlier.from_region,
        )


@dataclass(frozen=True, slots=True)
class Counters:
    """One reading of every link; ``later.minus(earlier)`` is what moved in between."""

    zones: dict[str, ZoneCounters]
    at_s: float  # time.monotonic() of the reading

    def minus(self, earlier: Counters) -> Counters:
        return Counters(
            {zone: now.minus(earlier.zones[zone]) for zone, now in self.zones.items()},
            self.at_s - earlier.at_s,
        )

    @property
    def cross_zone(self) -> int:
        """Bytes that left a zone for another (each counted once, at its sender)."""
        return sum(zone.to_zones for zone in self.zones.values())

    @property
    def regional(self) -> int:
        """Bytes between the zones and the region, both ways."""
        return sum(zone.to_region + zone.from_region for zone in self.zones.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            zone: {
                "to_zones": c.to_zones,
                "from_zones": c.from_zones,
                "to_region": c.to_region,
                "from_region": c.from_region,
            }
            for zone, c in self.zones.items()
        }


class ZoneNetwork:
    """Three zones and a region in namespaces; :meth:`build` (or ``with``) makes them."""

    def __init__(self, zones: Sequence[str] = ZONES, prefix: str = PREFIX) -> None:
        if not 1 <= len(zones) <= 9:
            raise ValueError("between 1 and 9 zones")
        self.zones = tuple(zones)
        self.tag = secrets.token_hex(2)
        self.instance = f"{prefix}{os.getpid()}-{self.tag}"
        self.octet = 0
        self.built = False
        self._touched = False  # something may exist to tear down
        self._processes: list[subprocess.Popen[bytes]] = []

    # Names and addresses.

    def namespace(self, where: str) -> str:
        """The namespace of a zone, of ``region`` or of ``xz`` (the bridge)."""
        if where not in (*self.zones, REGION, BRIDGE_NS):
            raise ValueError(f"{where!r}: expected one of {', '.join(self.zones)} or {REGION}")
        return f"{self.instance}-{where}"

    @property
    def namespaces(self) -> list[str]:
        return [self.namespace(where) for where in (*self.zones, REGION, BRIDGE_NS)]

    def zone_address(self, zone: str) -> str:
        """The address of ``zone``'s broker (and the source of its clients)."""
        return f"10.{self.octet}.{self.zones.index(zone) + 1}.1"

    @property
    def region_address(self) -> str:
        """The address of the regional services (etcd, S3)."""
        return f"10.{self.octet}.100.1"

    def link_names(self) -> list[str]:
        """Every link name the instance uses (all carry its tag)."""
        return [f"xz-{self.tag}", f"rg-{self.tag}", f"br-{self.tag}"] + [
            f"{zone}-{self.tag}" for zone in self.zones
        ]

    # Building and tearing down.

    def build(self) -> ZoneNetwork:
        reason = unavailable_reason()
        if reason is not None:
            raise ZoneNetworkError(reason)
        atexit.register(self.close)
        self._touched = True
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self.built = True
        return self

    def _build(self) -> None:
        self.octet = _free_second_octet()
        b, tag = self.octet, self.tag
        for name in self.namespaces:
            _ip("netns", "add", name)
            # No IPv6: its neighbour discovery would add unasked bytes to the counters.
            for key in ("all", "default"):
                self._sysctl(name, f"net.ipv6.conf.{key}.disable_ipv6", "1")
            _ip("-n", name, "link", "set", "lo", "up")
        bridge_ns, region_ns = self.namespace(BRIDGE_NS), self.namespace(REGION)
        _ip("-n", bridge_ns, "link", "add", f"br-{tag}", "type", "bridge")
        _ip("-n", bridge_ns, "link", "set", f"br-{tag}", "up")
        _ip("-n", region_ns, "addr", "add", f"{self.region_address}/32", "dev", "lo")
        for index, zone in enumerate(self.zones, start=1):
            ns, port = self.namespace(zone), f"{zone}-{tag}"
            _ip("-n", ns, "addr", "add", f"{self.zone_address(zone)}/32", "dev", "lo")
            # The inter-zone link: the zone's end and its port on the bridge.
            _ip(
                "-n",
                ns,
                "link",
                "add",
                f"xz-{tag}",
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                bridge_ns,
            )
            _ip("-n", bridge_ns, "link", "set", port, "master", f"br-{tag}")
            _ip("-n", bridge_ns, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"10.{b}.0.{index}/24", "dev", f"xz-{tag}")
            _ip("-n", ns, "link", "set", f"xz-{tag}", "up")
            # The regional link: a /30 of its own, so nothing else shares it.
            zone_end, region_end = f"10.{b}.200.{4 * index + 2}", f"10.{b}.200.{4 * index + 1}"
            _ip(
                "-n",
                ns,
                "link",
                "add",
                f"rg-{tag}",
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                region_ns,
            )
            _ip("-n", ns, "addr", "add", f"{zone_end}/30", "dev", f"rg-{tag}")
            _ip("-n", region_ns, "addr", "add", f"{region_end}/30", "dev", port)
            _ip("-n", ns, "link", "set", f"rg-{tag}", "up")
            _ip("-n", region_ns, "link", "set", port, "up")
            source = self.zone_address(zone)
            _ip(
                "-n",
                ns,
                "route",
                "add",
                f"{self.region_address}/32",
                "via",
                region_end,
                "src",
                source,
            )
            _ip("-n", region_ns, "route", "add", f"{source}/32", "via", zone_end)
        for zone in self.zones:
            self._zone_routes(zone)

    def _zone_routes(self, zone: str) -> None:
        """``zone``'s routes to the other zones' addresses, through the bridge. The kernel drops
        them when the link goes down, so :meth:`set_zone_link` puts them back."""
        for other_index, other in enumerate(self.zones, start=1):
            if other != zone:
                _ip(
                    "-n",
                    self.namespace(zone),
                    "route",
                    "replace",
                    f"{self.zone_address(other)}/32",
                    "via",
                    f"10.{self.octet}.0.{other_index}",
                    "src",
                    self.zone_address(zone),
                )

    def _sysctl(self, namespace: str, key: str, value: str) -> None:
        done = subprocess.run(
            ["ip", "netns", "exec", namespace, "sysctl", "-qw", f"{key}={value}"],
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise ZoneNetworkError(f"sysctl {key} in {namespace}: {done.stderr.strip()}")

    def close(self) -> None:
        """Kill what runs in the instance's namespaces (what :meth:`popen` started first,
        gracefully), then delete the namespaces and with them every link. Idempotent."""
        if not self._touched:
            return
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
        deadline = time.monotonic() + KILL_GRACE_S
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
        self._processes.clear()
        _remove_instance(self.instance)
        self.built = self._touched = False
        atexit.unregister(self.close)

    def __enter__(self) -> ZoneNetwork:
        return self.build()

    def __exit__(self, *_: object) -> None:
        self.close()

    # Using it.

    def command(self, where: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run in a zone's (or the region's) namespace."""
        return ["ip", "netns", "exec", self.namespace(where), *argv]

    def run(
        self, where: str, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(self.command(where, argv), check=False, **kwargs)

    def popen(self, where: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``where``; :meth:`close` stops it (SIGTERM, then SIGKILL)."""
        process: subprocess.Popen[bytes] = subprocess.Popen(self.command(where, argv), **kwargs)
        self._processes.append(process)
        return process

    @contextlib.contextmanager
    def inside(self, where: str) -> Iterator[None]:
        """Run the block with the calling thread in ``where``'s namespace (sockets made inside
        stay there), then move it back."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(NETNS_DIR / self.namespace(where), os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(home)

    def set_zone_link(self, zone: str, up: bool) -> None:
        """Cut ``zone`` off from the other zones (its inter-zone link down) or restore it."""
        _ip("-n", self.namespace(zone), "link", "set", f"xz-{self.tag}", "up" if up else "down")
        if up:
            self._zone_routes(zone)

    def counters(self) -> Counters:
        """Every link's bytes, read from the bridge's ports and the region's ends."""
        at_s = time.monotonic()
        bridge = _link_bytes(self.namespace(BRIDGE_NS))
        region = _link_bytes(self.namespace(REGION))
        zones = {}
        for zone in self.zones:
            port = f"{zone}-{self.tag}"
            # The far end receives what the zone sends.
            zones[zone] = ZoneCounters(
                zone,
                to_zones=bridge[port][0],
                from_zones=bridge[port][1],
                to_region=region[port][0],
                from_region=region[port][1],
            )
        return Counters(zones, at_s)


def _link_bytes(namespace: str) -> dict[str, tuple[int, int]]:
    """Each link's (received, sent) bytes in ``namespace``."""
    done = _ip("-n", namespace, "-j", "-s", "link", "show")
    return {
        entry["ifname"]: (entry["stats64"]["rx"]["bytes"], entry["stats64"]["tx"]["bytes"])
        for entry in json.loads(done.stdout)
    }


def _remove_instance(instance: str) -> list[str]:
    """Kill every process in ``instance``'s namespaces and delete them; the names deleted."""
    mine = [name for name in _namespaces() if name.startswith(f"{instance}-")]
    for signum in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids_in(mine)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + KILL_GRACE_S
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _pid_alive(pid) and not _zombie(pid)]
            time.sleep(0.05)
    for name in mine:
        _ip("netns", "delete", name, check=False)
    return mine


def _pids_in(namespaces: Sequence[str]) -> list[int]:
    pids: list[int] = []
    for name in namespaces:
        done = _ip("netns", "pids", name, check=False)
        pids += [int(pid) for pid in done.stdout.split() if pid.isdigit()]
    return pids


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def instances(prefix: str = PREFIX) -> dict[str, int]:
    """Every instance whose namespaces exist: name -> the pid that built it."""
    found: dict[str, int] = {}
    for name in _namespaces():
        if name.startswith(prefix):
            pid, _, rest = name.removeprefix(prefix).partition("-")
            tag = rest.partition("-")[0]
            if pid.isdigit() and tag:
                found[f"{prefix}{pid}-{tag}"] = int(pid)
    return found


def cleanup(prefix: str = PREFIX, everything: bool = False) -> list[str]:
    """Remove the leftovers of killed runs: the instances whose builder no longer lives (all of
    them with ``everything``); the namespaces deleted."""
    removed: list[str] = []
    for instance, pid in sorted(instances(prefix).items()):
        if everything or not _pid_alive(pid):
            removed += _remove_instance(instance)
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m automq_ref.netzones",
        description="the three-zone network's leftovers: list or remove them",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the instances whose namespaces exist, with their pids")
    clean = commands.add_parser("cleanup", help="remove instances whose builder is gone")
    clean.add_argument("--all", action="store_true", help="remove every instance, live or not")
    arguments = parser.parse_args(argv)
    if arguments.command == "list":
        for instance, pid in sorted(instances().items()):
            print(f"{instance} pid {pid} {'alive' if _pid_alive(pid) else 'gone'}")
        return 0
    reason = unavailable_reason()
    if reason is not None:
        print(f"netzones: {reason}", file=sys.stderr)
        return 2
    for name in cleanup(everything=arguments.all):
        print(f"removed {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
