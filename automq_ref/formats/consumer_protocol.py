"""The consumer protocol's subscription, as a group member's JoinGroup metadata carries it.

A member of a group of protocol type ``consumer`` sends, for each assignor it offers, a
``ConsumerProtocolSubscription``: an int16 version, then (every version starts with version 0's
fields) the topics it subscribes to, an int32 count of int16-length UTF-8 strings, then user data
and, in later versions, more. The coordinator reads only the topics, as version 0, whatever the
version (as Kafka's ``ClassicGroup.computeSubscribedTopics`` does), to tell whether a group
consumes a topic (OffsetDelete refuses to delete the offsets of a topic the group consumes).
"""

from __future__ import annotations

import struct

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def subscription_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a subscription, or None when ``metadata`` is not one (too short, a negative
    count or length, bytes that are not UTF-8)."""
    try:
        offset = _INT16.size  # the version: every version is read as version 0
        (count,) = _INT32.unpack_from(metadata, offset)
        offset += _INT32.size
        if count < 0:
            return None
        topics: set[str] = set()
        for _ in range(count):
            (length,) = _INT16.unpack_from(metadata, offset)
            offset += _INT16.size
            if length < 0 or offset + length > len(metadata):
                return None
            topics.add(bytes(metadata[offset : offset + length]).decode("utf-8"))
            offset += length
    except (struct.error, UnicodeDecodeError):
        return None
    return frozenset(topics)
