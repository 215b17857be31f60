"""A client quota entity's record in the controller KV: its key names the entity, its value the
quotas set on it.

Key: ``quotas/`` and the entity's parts in Kafka's order (user first), ``TYPE=NAME`` joined by
``/``, each name percent-encoded and the default written ``<default>`` (which no encoded name
can be): ``quotas/user=alice/client-id=<default>``. Value: a JSON object, quota key ->
value (``{"producer_byte_rate": 1048576.0}``). An entity with no quota left has no record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote, unquote

QUOTA_KEY_PREFIX: Final = "quotas/"
DEFAULT_NAME: Final = "<default>"


class ClientQuotaFormatError(ValueError):
    """A KV record that is not a client quota record."""


EntityParts = tuple[tuple[str, str | None], ...]  # (entity type, name; None: the default)
ENTITY_TYPES: Final = ("user", "client-id")


def quota_key(parts: EntityParts) -> str:
    """The key of the entity of ``parts`` (user first)."""
    pieces = (
        f"{kind}={DEFAULT_NAME if name is None else quote(name, safe='')}" for kind, name in parts
    )
    return QUOTA_KEY_PREFIX + "/".join(pieces)


def parse_quota_key(key: str) -> EntityParts | None:
    """The entity a KV key names; None for a key that is not a quota key."""
    if not key.startswith(QUOTA_KEY_PREFIX):
        return None
    parts: list[tuple[str, str | None]] = []
    for piece in key[len(QUOTA_KEY_PREFIX) :].split("/"):
        kind, separator, name = piece.partition("=")
        if not separator or kind not in ENTITY_TYPES or any(k == kind for k, _ in parts):
            raise ClientQuotaFormatError(f"{key!r}: {piece!r} is not user=NAME or client-id=NAME")
        parts.append((kind, None if name == DEFAULT_NAME else unquote(name)))
    return tuple(parts)


def encode_quotas(values: Mapping[str, float]) -> bytes:
    return json.dumps(dict(sorted(values.items())), separators=(",", ":")).encode()


def decode_quotas(value: bytes) -> dict[str, float]:
    try:
        found = json.loads(value)
    except ValueError as error:
        raise ClientQuotaFormatError(f"not JSON: {error}") from error
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in found.items()
    ):
        raise ClientQuotaFormatError("not an object of quota key -> number")
    return {k: float(v) for k, v in found.items()}
