"""The controller RPC: every event and response through its codec, malformed requests refused,
and each way a call fails (not the controller, outcome unknown, no answer, no connection)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from automq_ref.io.metadata.controller_rpc import (
    EVENT_TYPES,
    ControllerConnection,
    ControllerServer,
    DecisionUnknown,
    NotControllerError,
    NotSent,
    RemoteError,
    ReplyLost,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from automq_ref.state_machines import stream_metadata as sm


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_event_type_round_trips(data: st.DataObject) -> None:
    event_type = data.draw(st.sampled_from(sorted(EVENT_TYPES.values(), key=str)))
    event = data.draw(st.from_type(event_type))
    request_id = data.draw(st.integers(min_value=0, max_value=2**62))
    assert decode_request(encode_request(request_id, event)) == (request_id, event)


@given(response=st.from_type(sm.Response), index=st.integers(min_value=0, max_value=2**62))
def test_responses_round_trip(response: sm.Response, index: int) -> None:
    reply = decode_reply(encode_reply(3, response, index))
    assert (reply.id, reply.response, reply.index) == (3, response, index)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"{}",
        b'{"type": "Nope", "id": 1, "event": {}}',
        b'{"type": "CreateStream", "id": 1, "event": {"node_id": "x", "node_epoch": 1}}',
        b'{"type": "__class__", "id": 1, "event": {}}',
    ],
)
def test_malformed_requests_are_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="not a controller request"):
        decode_request(body)


async def test_the_connection_reports_each_way_a_request_fails() -> None:
    calls: list[sm.StreamMetadataEvent] = []

    async def decide(event: sm.StreamMetadataEvent) -> tuple[sm.Response, int]:
        calls.append(event)
        match event:
            case sm.CreateStream(node_id=1):
                raise NotControllerError("not me")
            case sm.CreateStream(node_id=2):
                raise DecisionUnknown("etcd went away")
            case sm.CreateStream(node_id=3):
                await asyncio.sleep(10)
        return sm.Response(stream_id=7), 12

    server = ControllerServer(decide)
    host, port = await server.start("127.0.0.1", 0)
    connection = ControllerConnection(f"{host}:{port}")
    try:
        answers = await asyncio.gather(
            *(connection.call(sm.CreateStream(9, n), 5) for n in range(5))
        )
        assert answers == [(sm.Response(stream_id=7), 12)] * 5
        with pytest.raises(RemoteError) as refused:
            await connection.call(sm.CreateStream(1, 1), 5)
        assert refused.value.kind == "not_controller"
        with pytest.raises(RemoteError) as unknown:
            await connection.call(sm.CreateStream(2, 1), 5)
        assert unknown.value.kind == "unknown"
        with pytest.raises(ReplyLost, match="no answer"):
            await connection.call(sm.CreateStream(3, 1), 0.2)
        slow = asyncio.ensure_future(connection.call(sm.CreateStream(3, 1), 5))
        await asyncio.sleep(0.05)
        await server.close()
        with pytest.raises(ReplyLost):
            await slow
    finally:
        await connection.close()
        await server.close()
    with pytest.raises(NotSent):
        await ControllerConnection(f"{host}:{port}").call(sm.CreateStream(9, 1), 1)
