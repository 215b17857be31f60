"""The metadata view: the node's local StreamMetadata image, and word of each change to it.

Everything above the metadata room reads the controller's decisions from a
:class:`MetadataView`, never from the controller: ``image`` is the image as of the last batch of
metadata records applied here, ``version`` counts those batches, and ``wait_for_change`` wakes a
reader once a newer one is applied. A reader that wants to act on changes reads ``version``
first, then ``image``, then waits past that version, so that no change slips between the two.
Writes go the other way, through a :class:`~automq_ref.io.metadata.client.ControllerClient`.

:class:`ImageView` is the view kept by whoever applies the batches: the in-process controller
publishes to it after each one (``Controller.subscribe``); a node following a remote controller
will publish what it replays from the log.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from automq_ref.state_machines import stream_metadata as sm


class MetadataView(Protocol):
    @property
    def image(self) -> sm.StreamMetadataImage:
        """The image as of the last batch applied here."""
        ...

    @property
    def version(self) -> int:
        """How many batches changed the image since this view was made."""
        ...

    async def wait_for_change(self, after_version: int) -> int:
        """Wait until ``version`` is past ``after_version``; return the new version."""
        ...


class ImageView:
    """A :class:`MetadataView` that is told each new image (``publish``)."""

    def __init__(self, image: sm.StreamMetadataImage) -> None:
        self._image = image
        self._version = 0
        self._changed = asyncio.Event()

    @property
    def image(self) -> sm.StreamMetadataImage:
        return self._image

    @property
    def version(self) -> int:
        return self._version

    def publish(self, image: sm.StreamMetadataImage) -> None:
        """A batch was applied and ``image`` is the result (an unchanged image is no change)."""
        if image is self._image:
            return
        self._image = image
        self._version += 1
        # Waiters hold the event of the version they saw; a fresh one serves the next change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for_change(self, after_version: int) -> int:
        while self._version <= after_version:
            await self._changed.wait()
        return self._version
