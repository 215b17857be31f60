"""The WAL device: a small process that owns a WAL's disk and fences its writers, as NVMe
reservations do on a multi-attached volume.

A block WAL lives on a disk of its own. When its broker dies, a survivor must read that disk,
upload what it holds and reset it, while the old broker, should it only be paused (a zombie),
must never again write to it. On EBS multi-attach the volume enforces this with NVMe
reservations. Here one process owns the disk (a file or a raw block device, opened with
:func:`~automq_ref.io.storage.block_device.open_device`) and serves it over a local socket (a
Unix socket or a TCP port on 127.0.0.1); every broker reaches the disk only through it, and it
keeps the reservation state:

- **Register** a key (a host becomes a *registrant*). A key is ``(node id, node epoch,
  failover)``: a node's own WAL registers ``(node, epoch, False)``, a survivor that takes a
  failed node's WAL over ``(failed node, failed epoch, True)``. A connection acts as the one key
  it registered; a second connection registering the same key joins that registrant.
- **Acquire** the reservation (type Write Exclusive): granted if nobody holds it or this key
  already does, else refused.
- **Preempt** (and abort) the registrant with a named key: its registration is removed and, if it
  held the reservation, the caller holds it now. Naming the victim makes it a compare-and-swap:
  a key that is not registered any more is refused.
- **Release** the reservation (a registrant that does not hold it releases nothing), and
  **unregister**.
- **Report** the holder and the registrants.

Reads are served to anyone, registered or not. A write or a flush is executed only for the
registrant holding the reservation; anyone else gets a *reservation conflict*, which the client
raises as :class:`~automq_ref.io.storage.block_device.ReservationConflictError` and the block
WAL turns into :class:`~automq_ref.io.storage.wal.WalFencedError`. Commands run one at a time
under one lock, in the order they reach the device, and each is checked when it runs: once a
preempt has run, no command of the preempted registrant is executed, so preempt and
preempt-and-abort are the same here (nothing of the victim is ever half executed).

The fence is the device's, not the zombie's: a paused broker that resumes sends its next write,
and the device refuses it. The block WAL acknowledges a group only after its write and its flush
both succeeded, so a zombie acknowledges nothing it wrote after the preempt. What it wrote
before is on the disk for the survivor's recovery to find; of that, it acknowledges only groups
whose flush ran before the preempt too.

Where this differs from NVMe: with no reservation held, NVMe lets every host write; this device
then refuses every write, so that a survivor releasing the reservation after its takeover does
not reopen the disk to a zombie. NVMe lets a non-holder Flush; this device refuses it, so a
zombie's flush cannot turn a write it made before the preempt into an acknowledgement after it.
The state is not persisted (NVMe without Persist Through Power Loss): a device process restart
clears it, and clients do not reconnect (a lost connection fails the WAL, which is reopened).
There is no real multi-host attach: the disk is reached through one process on one machine,
a single point of failure that a real volume is not.

Wire format: every frame is a 4-byte big-endian length and a payload. A request payload is an
operation byte and its fields; a reply payload a status byte (OK, CONFLICT, ERROR) and its data
(for CONFLICT and ERROR a UTF-8 message). ``python -m automq_ref.io.storage.wal_device --path
PATH --size BYTES --listen ADDRESS`` runs one; it prints ``wal-device listening ADDRESS`` once it
accepts connections. An address is ``HOST:PORT`` (port 0 picks a free one) or a socket path.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import logging
import os
import signal
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from automq_ref.io.storage.block_device import (
    IOV_MAX,
    BlockDevice,
    Buffer,
    ReservationConflictError,
    open_device,
)
from automq_ref.io.storage.wal import WalFencedError

log = logging.getLogger(__name__)

_LENGTH: Final = struct.Struct(">I")
_KEY: Final = struct.Struct(">iqB")
_POSITION_SIZE: Final = struct.Struct(">QI")
_POSITION: Final = struct.Struct(">Q")
_SIZE: Final = struct.Struct(">Q")
_COUNT: Final = struct.Struct(">I")
# Larger frames are refused: the block WAL writes at most a few MiB at once.
MAX_FRAME_BYTES: Final = 256 * 1024 * 1024


class Op(enum.IntEnum):
    INFO = 1
    READ = 2
    WRITE = 3
    FLUSH = 4
    REGISTER = 10
    UNREGISTER = 11
    ACQUIRE = 12
    RELEASE = 13
    PREEMPT = 14
    REPORT = 15


class Status(enum.IntEnum):
    OK = 0
    CONFLICT = 1
    ERROR = 2


@dataclass(frozen=True, slots=True, order=True)
class RegistrantKey:
    """Who a registrant is: a node's own WAL at an epoch, or a survivor's takeover of it."""

    node_id: int
    node_epoch: int
    failover: bool = False

    def encode(self) -> bytes:
        return _KEY.pack(self.node_id, self.node_epoch, int(self.failover))

    @classmethod
    def decode(cls, data: bytes | memoryview, offset: int = 0) -> RegistrantKey:
        node_id, node_epoch, failover = _KEY.unpack_from(data, offset)
        return cls(node_id, node_epoch, bool(failover))

    def __str__(self) -> str:
        return f"node {self.node_id} epoch {self.node_epoch}" + (
            " (failover)" if self.failover else ""
        )


@dataclass(frozen=True, slots=True)
class ReservationReport:
    holder: RegistrantKey | None
    registrants: tuple[RegistrantKey, ...]


class Conflict(Exception):
    """A command refused by the reservation rules (answered as CONFLICT)."""


# ------------------------------------------------------------------------------ the device


class Reservations:
    """The reservation state and its rules, apart from any I/O (one lock held by the caller)."""

    def __init__(self) -> None:
        self.holder: RegistrantKey | None = None
        self.registrants: set[RegistrantKey] = set()

    def register(self, key: RegistrantKey) -> None:
        self.registrants.add(key)

    def unregister(self, key: RegistrantKey) -> None:
        self._registered(key)
        self.registrants.discard(key)
        if self.holder == key:
            self.holder = None

    def acquire(self, key: RegistrantKey) -> None:
        self._registered(key)
        if self.holder is not None and self.holder != key:
            raise Conflict(f"the reservation is held by {self.holder}, not {key}")
        self.holder = key

    def release(self, key: RegistrantKey) -> None:
        self._registered(key)
        if self.holder == key:
            self.holder = None

    def preempt(self, key: RegistrantKey, victim: RegistrantKey) -> None:
        self._registered(key)
        if victim == key:
            self.acquire(key)
            return
        if victim not in self.registrants:
            raise Conflict(f"{victim} is not registered; nothing to preempt")
        self.registrants.discard(victim)
        if self.holder == victim:
            self.holder = key

    def check_write(self, key: RegistrantKey | None) -> None:
        """Write Exclusive: only the registrant holding the reservation writes or flushes."""
        if key is None or key not in self.registrants:
            who = "an unregistered host" if key is None else f"{key}, no longer registered,"
            raise Conflict(f"{who} may not write: the reservation is held by {self.holder}")
        if self.holder != key:
            raise Conflict(f"{key} does not hold the reservation (held by {self.holder})")

    def report(self) -> ReservationReport:
        return ReservationReport(self.holder, tuple(sorted(self.registrants)))

    def _registered(self, key: RegistrantKey | None) -> RegistrantKey:
        if key is None or key not in self.registrants:
            raise Conflict(f"{key or 'this host'} is not a registrant")
        return key


class DeviceServer:
    """Serves one :class:`BlockDevice` and its reservations on a socket, in threads of its own.

    ``start()`` binds and serves in a background thread (tests, benchmarks); the command line
    (``python -m automq_ref.io.storage.wal_device``) runs one in a process of its own."""

    def __init__(self, device: BlockDevice, listen: str) -> None:
        self.device = device
        self.reservations = Reservations()
        self.lock = threading.Lock()
        self._server = _make_server(listen, self)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """The address clients connect to: ``127.0.0.1:PORT`` or the socket's path."""
        bound = self._server.server_address
        if isinstance(bound, tuple):
            return f"{bound[0]}:{bound[1]}"
        return os.fsdecode(bytes(bound) if not isinstance(bound, str) else bound)

    def start(self) -> DeviceServer:
        # A short poll: stop() waits for the serving loop to notice.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="wal-device", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        """Stop serving, drop every connection (as a process exit would), close the device."""
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        if self._thread is not None:
            self._thread.join()
        with self.lock:
            self.device.close()
        if isinstance(self._server.server_address, str | bytes):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._server.server_address)

    def execute(self, connection: _Connection, payload: bytes) -> bytes:
        """Run one command and return the reply payload."""
        op = payload[0]
        body = memoryview(payload)[1:]
        try:
            with self.lock:
                data = self._execute_locked(connection, Op(op), body)
            return bytes([Status.OK]) + data
        except Conflict as conflict:
            return bytes([Status.CONFLICT]) + str(conflict).encode()
        except (OSError, ValueError, struct.error) as error:
            log.warning("wal-device: %s failed: %s", op, error)
            return bytes([Status.ERROR]) + f"{type(error).__name__}: {error}".encode()

    def _execute_locked(self, connection: _Connection, op: Op, body: memoryview) -> bytes:
        reservations = self.reservations
        if op is Op.INFO:
            return _SIZE.pack(self.device.size_bytes)
        if op is Op.READ:
            position, size = _POSITION_SIZE.unpack_from(body)
            return self.device.read(size, position)
        if op is Op.WRITE:
            reservations.check_write(connection.key)
            (position,) = _POSITION.unpack_from(body)
            self.device.write([body[_POSITION.size :]], position)
            return b""
        if op is Op.FLUSH:
            reservations.check_write(connection.key)
            self.device.sync()
            return b""
        if op is Op.REPORT:
            report = reservations.report()
            holder = b"\x00" if report.holder is None else b"\x01" + report.holder.encode()
            keys = b"".join(key.encode() for key in report.registrants)
            return holder + _COUNT.pack(len(report.registrants)) + keys
        if op is Op.REGISTER:
            new_key = RegistrantKey.decode(body)
            if connection.key is not None and connection.key != new_key:
                raise Conflict(f"this connection is already registered as {connection.key}")
            reservations.register(new_key)
            connection.key = new_key
            return b""
        key = connection.key
        if key is None:
            raise Conflict("register first")
        if op is Op.UNREGISTER:
            reservations.unregister(key)
            connection.key = None
        elif op is Op.ACQUIRE:
            reservations.acquire(key)
        elif op is Op.RELEASE:
            reservations.release(key)
        elif op is Op.PREEMPT:
            victim = RegistrantKey.decode(body)
            reservations.preempt(key, victim)
            log.info("wal-device: %s preempted %s", key, victim)
        return b""


class _Connection(socketserver.BaseRequestHandler):
    """One client: frames in, frames out, until the client goes away."""

    server: _Server
    key: RegistrantKey | None = None

    def handle(self) -> None:
        sock: socket.socket = self.request
        self.server.connections.add(sock)
        try:
            while True:
                try:
                    payload = _receive_frame(sock)
                except (ConnectionError, OSError):
                    return
                if payload is None:
                    return
                _send_frame(sock, [self.server.device_server.execute(self, payload)])
        finally:
            self.server.connections.discard(sock)


class _Server(socketserver.ThreadingMixIn, socketserver.BaseServer):
    device_server: DeviceServer
    connections: set[socket.socket]
    daemon_threads = True

    def close_connections(self) -> None:
        for sock in list(self.connections):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _TcpServer(_Server, socketserver.TCPServer):
    allow_reuse_address = True


class _UnixServer(_Server, socketserver.UnixStreamServer):
    pass


def _make_server(listen: str, device_server: DeviceServer) -> _Server:
    server: _Server
    if is_socket_path(listen):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen)
        server = _UnixServer(listen, _Connection)
    else:
        host, port = split_host_port(listen)
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the WAL device listens on the loopback only, not {host!r}")
        server = _TcpServer((host, port), _Connection)
    server.device_server = device_server
    server.connections = set()
    return server


# ------------------------------------------------------------------------------ addresses


def is_socket_path(address: str) -> bool:
    return address.startswith(("/", "./")) or ":" not in address


def split_host_port(address: str) -> tuple[str, int]:
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit():
        raise ValueError(f"a WAL device address is HOST:PORT or a socket path, not {address!r}")
    return host or "127.0.0.1", int(port)


def _connect(address: str) -> socket.socket:
    if is_socket_path(address):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: str | tuple[str, int] = address
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        target = split_host_port(address)
    try:
        sock.connect(target)
    except BaseException:
        sock.close()
        raise
    return sock


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:])
        if count == 0:
            return None
        got += count
    return bytes(data)


def _receive_frame(sock: socket.socket) -> bytes | None:
    head = _receive_exactly(sock, _LENGTH.size)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    if length == 0 or length > MAX_FRAME_BYTES:
        raise ConnectionError(f"WAL device frame of {length} bytes")
    return _receive_exactly(sock, length)


def _send_frame(sock: socket.socket, parts: Sequence[Buffer]) -> None:
    """One frame, its parts gathered by ``sendmsg`` (bodies are not copied), however many
    calls a short send takes."""
    pending = [memoryview(part).cast("B") for part in parts if len(part)]
    length = sum(len(part) for part in pending)
    pending.insert(0, memoryview(_LENGTH.pack(length)))
    while pending:
        sent = sock.sendmsg(pending[:IOV_MAX])
        while sent and pending:
            head = pending[0]
            if sent >= len(head):
                sent -= len(head)
                pending.pop(0)
            else:
                pending[0] = head[sent:]
                sent = 0


# ------------------------------------------------------------------------------ the client


class RemoteBlockDevice:
    """A :class:`BlockDevice` served by a WAL device process, with the reservation commands.

    Calls block (the block WAL runs them on its I/O thread) and are serialized on the one
    connection. A refused write or flush raises :class:`ReservationConflictError`; a lost
    connection raises ``ConnectionError``; a failure of the disk behind the device ``OSError``.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock = _connect(address)
        self._lock = threading.Lock()
        self.key: RegistrantKey | None = None
        try:
            size_bytes: int = _SIZE.unpack(self._call(Op.INFO))[0]
            self._size_bytes = size_bytes
        except BaseException:
            self._sock.close()
            raise

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    def _call(self, op: Op, *parts: Buffer) -> bytes:
        with self._lock:
            if self._sock.fileno() < 0:
                raise ConnectionError(f"WAL device {self.address}: connection closed")
            _send_frame(self._sock, [bytes([op]), *parts])
            reply = _receive_frame(self._sock)
        if reply is None:
            raise ConnectionError(f"WAL device {self.address} closed the connection")
        status, data = reply[0], reply[1:]
        if status == Status.CONFLICT:
            raise ReservationConflictError(f"WAL device {self.address}: {data.decode()}")
        if status != Status.OK:
            raise OSError(f"WAL device {self.address}: {data.decode()}")
        return data

    def write(self, buffers: Sequence[Buffer], position: int) -> None:
        pending = [buffer for buffer in buffers if len(buffer)]
        self._call(Op.WRITE, _POSITION.pack(position), *pending)

    def read(self, size: int, position: int) -> bytes:
        return self._call(Op.READ, _POSITION_SIZE.pack(position, size))

    def sync(self) -> None:
        self._call(Op.FLUSH)

    def register(self, key: RegistrantKey) -> None:
        self._call(Op.REGISTER, key.encode())
        self.key = key

    def unregister(self) -> None:
        self._call(Op.UNREGISTER)
        self.key = None

    def acquire(self) -> None:
        self._call(Op.ACQUIRE)

    def release(self) -> None:
        self._call(Op.RELEASE)

    def preempt(self, victim: RegistrantKey) -> None:
        """Preempt-and-abort ``victim``: it loses its registration and, if it held the
        reservation, this registrant holds it now."""
        self._call(Op.PREEMPT, victim.encode())

    def report(self) -> ReservationReport:
        data = self._call(Op.REPORT)
        holder = RegistrantKey.decode(data, 1) if data[0] else None
        offset = 1 + (_KEY.size if data[0] else 0)
        (count,) = _COUNT.unpack_from(data, offset)
        offset += _COUNT.size
        keys = tuple(RegistrantKey.decode(data, offset + i * _KEY.size) for i in range(count))
        return ReservationReport(holder, keys)

    def close(self) -> None:
        """Unregister (which releases the reservation if this registrant holds it) and hang
        up. A registrant that was preempted is registered no more: nothing to do."""
        if self._sock.fileno() < 0:
            return
        if self.key is not None:
            with contextlib.suppress(OSError):
                if self.key in self.report().registrants:
                    self.unregister()
        self._sock.close()

    def abandon(self) -> None:
        """Hang up without releasing anything, as a process that dies does."""
        self._sock.close()


def claim(device: RemoteBlockDevice, key: RegistrantKey) -> None:
    """Register ``key`` and take the reservation, preempting its holder when ``key`` may.

    ``key`` may preempt a holder of the same node at an older epoch, and at the same epoch only
    when the holder is not a failover and ``key`` is one (a survivor taking over a zombie); it
    is refused (:class:`WalFencedError`) by a newer epoch, a takeover of its own epoch, or a
    holder that changed under it (the preempt names the holder it read)."""
    try:
        holder = device.report().holder
        if holder is not None and holder != key:
            if holder.node_id != key.node_id:
                raise WalFencedError(f"the WAL device is reserved by node {holder.node_id}")
            if holder.node_epoch > key.node_epoch:
                raise WalFencedError(
                    f"node {key.node_id}'s WAL is reserved by epoch {holder.node_epoch}, "
                    f"newer than epoch {key.node_epoch}"
                )
            if holder.node_epoch == key.node_epoch and holder.failover and not key.failover:
                raise WalFencedError(
                    f"node {key.node_id}'s WAL was taken over at epoch {key.node_epoch}"
                )
        device.register(key)
        if holder is None or holder == key:
            device.acquire()
        else:
            device.preempt(holder)
        now = device.report().holder
    except ReservationConflictError as conflict:
        raise WalFencedError(f"taking the WAL device's reservation: {conflict}") from conflict
    if now != key:
        raise WalFencedError(f"the WAL device's reservation went to {now} while {key} took it")


# ------------------------------------------------------------------------------ the command


@contextlib.contextmanager
def serving(path: Path | str, size_bytes: int, listen: str) -> Iterator[DeviceServer]:
    """A device server on ``path`` in a background thread, stopped on exit."""
    server = DeviceServer(open_device(path, size_bytes), listen).start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m automq_ref.io.storage.wal_device",
        description="Serve a WAL file or raw block device with NVMe-like reservations.",
    )
    parser.add_argument("--path", required=True, help="the WAL file or block device")
    parser.add_argument("--size", type=int, required=True, help="device bytes to serve")
    parser.add_argument(
        "--listen", default="127.0.0.1:0", help="HOST:PORT (0: a free port) or a socket path"
    )
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = DeviceServer(open_device(arguments.path, arguments.size), arguments.listen)

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, terminate)
    print(f"wal-device listening {server.address}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        # serve_forever has returned, so shutdown() inside stop() does not wait.
        server.stop()


if __name__ == "__main__":
    main()
