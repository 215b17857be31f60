"""``key=value`` fields for log lines, so that a person can read them and a script can grep them.

Every line the broker logs about an event starts with a few words saying what happened (``topic
created``, ``group rebalanced``) and ends with the event's fields, ``key=value`` separated by
spaces, rendered by :func:`fields`. A value that is empty or holds a space, a quote, a backslash,
an ``=`` or an unprintable character is written as a JSON string (``reason="not supported"``),
so that a line always splits back into its fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

_PLAIN_FORBIDDEN = frozenset(' ="\\')


def fields(**values: object) -> str:
    """``key=value key=value ...`` for the given keyword arguments, in their order."""
    return " ".join(f"{key}={value_text(value)}" for key, value in values.items())


def value_text(value: object) -> str:
    """One field's value as it appears in a line (a mapping: ``name=value`` pairs joined by
    commas, quoted as one value)."""
    if isinstance(value, Mapping):
        text = ",".join(f"{name}={item}" for name, item in sorted(value.items()))
    elif isinstance(value, float):
        text = f"{value:.3f}".rstrip("0").rstrip(".")
    else:
        text = str(value)
    if text and text.isprintable() and not _PLAIN_FORBIDDEN.intersection(text):
        return text
    return json.dumps(text)
