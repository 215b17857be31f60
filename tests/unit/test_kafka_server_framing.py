"""The listener's framing: frames split anywhere across reads, frames read into a buffer of
their own, pipelined frames answered in order, and the size limit; a connection that goes away
(or fails) with answers admitted but not yet awaited closes them rather than dropping them."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import random
import struct
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import uvloop

from automq_ref.kafka import server as kafka_server
from automq_ref.kafka.server import KafkaServer, Peer, Reply
from tests.waiting import PATIENCE_S

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]
# The broker serves on uvloop; the standard loop must work too.
RUNNERS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


class Echo:
    """Answers each frame with its length and first bytes; keeps what it was given."""

    def __init__(self) -> None:
        self.frames: list[bytes | bytearray] = []

    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        self.frames.append(frame)
        return [struct.pack(">i", len(frame)), bytes(frame[:8])]


def frame(api_key: int, body: bytes) -> bytes:
    payload = struct.pack(">hhi", api_key, 9, 1) + body
    return struct.pack(">i", len(payload)) + payload


async def exchange(
    server_limit: int, frames: list[bytes], cuts: list[int]
) -> tuple[Echo, list[bytes]]:
    handler = Echo()
    server = KafkaServer(handler, max_request_bytes=server_limit)
    host, port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(host, port)
        stream = b"".join(frames)
        edges = [0, *sorted(cut for cut in cuts if 0 < cut < len(stream)), len(stream)]
        for start, stop in itertools.pairwise(edges):
            writer.write(stream[start:stop])
            await writer.drain()
            await asyncio.sleep(0)
        replies = []
        for _ in frames:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            replies.append(await reader.readexactly(size))
        writer.close()
        return handler, replies
    finally:
        await server.close()


def check(handler: Echo, frames: list[bytes], replies: list[bytes]) -> None:
    assert [bytes(seen) for seen in handler.frames] == [whole[4:] for whole in frames]
    for seen in handler.frames:  # Produce (api key 0) frames are mutable, the others are not
        assert isinstance(seen, bytearray if seen[:2] == b"\x00\x00" else bytes)
    assert replies == [struct.pack(">i", len(whole) - 4) + whole[4:12] for whole in frames]


@RUNNERS
@pytest.mark.parametrize("seed", range(6))
def test_frames_split_anywhere_arrive_whole_and_in_order(seed: int, run: Runner[Any]) -> None:
    chooser = random.Random(seed)
    sizes = [0, 1, 7, 100, 5_000, kafka_server.SCRATCH_BYTES // 4 + 1, 300_000, 2_000_000]
    frames = [
        frame(chooser.choice([0, 1, 3]), chooser.randbytes(chooser.choice(sizes)))
        for _ in range(12)
    ]
    total = sum(len(whole) for whole in frames)
    cuts = [chooser.randrange(total) for _ in range(chooser.choice([0, 3, 40]))]
    cuts += [chooser.randrange(4)]  # a size prefix split across reads
    handler, replies = run(exchange(10_000_000, frames, cuts))
    check(handler, frames, replies)


@RUNNERS
def test_many_small_pipelined_frames(run: Runner[Any]) -> None:
    frames = [frame(index % 2, bytes([index % 256]) * (index % 50)) for index in range(3_000)]
    handler, replies = run(exchange(10_000_000, frames, []))
    check(handler, frames, replies)


@RUNNERS
def test_frame_above_the_limit_closes_the_connection(run: Runner[Any]) -> None:
    async def closed() -> bytes:
        server = KafkaServer(Echo(), max_request_bytes=1_000)
        host, port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(frame(0, bytes(2_000)))
            await writer.drain()
            left = await asyncio.wait_for(reader.read(), PATIENCE_S)
            writer.close()
            return left
        finally:
            await server.close()

    assert run(closed()) == b""


class Held:
    """Answers each frame with a coroutine that waits for ``released`` (as a Produce's answer
    waits for the WAL); the first one raises instead when ``fail_first``."""

    def __init__(self, fail_first: bool = False) -> None:
        self.released = asyncio.Event()
        self.fail_first = fail_first
        self.answers: list[Coroutine[Any, Any, Any]] = []

    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        answer = self._answer(len(self.answers))
        self.answers.append(answer)
        return answer

    async def _answer(self, number: int) -> list[bytes]:
        await self.released.wait()
        if number == 0 and self.fail_first:
            raise RuntimeError("the first request fails")
        return [struct.pack(">i", number)]


async def held_then_gone(handler: Held, frames: int, client_leaves: bool) -> bytes:
    server = KafkaServer(handler)
    host, port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"".join(frame(0, bytes(10)) for _ in range(frames)))
        await writer.drain()
        while len(handler.answers) < frames:
            await asyncio.sleep(0.001)
        left = b""
        if client_leaves:
            writer.close()
        else:
            handler.released.set()
            left = await asyncio.wait_for(reader.read(), PATIENCE_S)
            writer.close()
        while server._connections:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)
        return left
    finally:
        await server.close()


@RUNNERS
def test_answers_of_a_connection_that_goes_away_are_closed(run: Runner[Any]) -> None:
    handler = Held()
    run(held_then_gone(handler, 5, client_leaves=True))
    # The first was being awaited (it ends cancelled); the others never ran and are closed,
    # not left to be collected unawaited.
    states = [inspect.getcoroutinestate(answer) for answer in handler.answers]
    assert states == [inspect.CORO_CLOSED] * 5


@RUNNERS
def test_answers_behind_a_failed_one_are_closed_with_the_connection(run: Runner[Any]) -> None:
    handler = Held(fail_first=True)
    # The failure closes the connection before any answer is written.
    assert run(held_then_gone(handler, 5, client_leaves=False)) == b""
    states = [inspect.getcoroutinestate(answer) for answer in handler.answers]
    assert states == [inspect.CORO_CLOSED] * 5
