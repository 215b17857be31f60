"""The controller client: how everything above the metadata room asks the controller to decide.

:class:`ControllerClient` is the one way in: ``submit`` an event of the StreamMetadata machine and
await the response the controller decided (durable on the metadata log once it is answered).
Today the controller runs in the node's process and :class:`InProcessControllerClient` hands
the event to it; a remote client (the controller elsewhere, the log on etcd) implements the same
protocol, so that storage, the Kafka front end and the composition root never depend on
:class:`~automq_ref.io.metadata.controller.Controller` itself. What they read, they read from a
:class:`~automq_ref.io.metadata.view.MetadataView`.

:func:`register_node` is the first request of every start: the node proposes an epoch and gets
the one the controller granted, with the streams it still holds open (:class:`Registration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# ControllerError is what ``submit`` raises: part of this seam, so callers above it need not
# import the controller.
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.controller import ControllerError as ControllerError
from automq_ref.io.metadata.controller import ControllerUnavailable as ControllerUnavailable
from automq_ref.io.metadata.view import ImageView
from automq_ref.state_machines import stream_metadata as sm


class ControllerClient(Protocol):
    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        """Have the controller decide ``event``; its response, once the decision is durable.
        Raises :class:`ControllerError` when no decision could be made (the log unreachable,
        kept moving ahead; in a cluster, no controller elected in time or its answer lost)."""
        ...


class InProcessControllerClient:
    """The controller in this process: ``submit`` is its ``handle``."""

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        return await self._controller.handle(event)

    async def submit_indexed(self, event: sm.StreamMetadataEvent) -> tuple[sm.Response, int]:
        """``submit``, and the log index just past the decision (read with no await after
        it): where a trace places a step the decision commits."""
        response = await self._controller.handle(event)
        return response, self._controller.applied_index


def connect_in_process(controller: Controller) -> tuple[InProcessControllerClient, ImageView]:
    """A client of ``controller`` and a view of its image, notified after every batch it
    applies (its own decisions and what it replays from other writers)."""
    view = ImageView(controller.image)
    controller.subscribe(view.publish)
    return InProcessControllerClient(controller), view


class RegistrationError(Exception):
    """The controller did not register the node."""


@dataclass(frozen=True, slots=True)
class Registration:
    """A node's start as the controller decided it: the epoch it granted (every later request
    of this incarnation carries it; the WAL is opened with it) and the streams the node still
    holds open (recovered from its WAL, then closed)."""

    node_id: int
    node_epoch: int
    opening_streams: tuple[sm.OpeningStream, ...]


async def register_node(
    client: ControllerClient,
    node_id: int,
    proposed_epoch: int,
    rack: str = "",
    listeners: tuple[sm.Endpoint, ...] = (),
    wal_config: str = "",
) -> Registration:
    """Register node ``node_id``, proposing ``proposed_epoch`` (its clock); the controller
    grants an epoch above any it stored for the node. The broker is recorded with its
    ``rack``, ``listeners`` and WAL location (``wal_config``, its ``s3.wal.path``), fenced until
    its first heartbeat."""
    response = await client.submit(
        sm.RegisterNode(node_id, proposed_epoch, rack, listeners, wal_config)
    )
    if not response.ok or response.node_epoch is None:
        raise RegistrationError(f"node {node_id}: {response.error.value}: {response.message}")
    return Registration(node_id, response.node_epoch, response.opening_streams)
