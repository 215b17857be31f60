"""Every property the broker reads is documented in docs/broker.md: a newcomer looking up a
setting finds it there (a table row or the section about its feature). ``{a,b}`` in the page
stands for both spellings, as the autobalancer's rows write ``network.{in,out}``."""

from __future__ import annotations

import re
from pathlib import Path

from automq_ref.config import BrokerConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "broker.md"
_ALTERNATIVES = re.compile(r"\{([a-z0-9.,-]+)\}")


def spelled_out(text: str) -> set[str]:
    """Each backquoted name of the page, with every ``{a,b}`` expanded."""
    names: set[str] = set()
    for quoted in re.findall(r"`([^`\s]+)`", text):
        pending = [quoted]
        while pending:
            name = pending.pop()
            found = _ALTERNATIVES.search(name)
            if found is None:
                names.add(name.split("=", 1)[0])
                continue
            for choice in found.group(1).split(","):
                pending.append(name[: found.start()] + choice + name[found.end() :])
    return names


def test_spelled_out_expands_alternatives() -> None:
    assert spelled_out("`a.{in,out}.b` and `c=1`") == {"a.in.b", "a.out.b", "c"}


def test_every_property_is_documented() -> None:
    documented = spelled_out(PAGE.read_text())
    properties = {field.alias for field in BrokerConfig.model_fields.values() if field.alias}
    assert len(properties) > 50  # the settings are read: the test looks at something
    missing = sorted(properties - documented)
    assert not missing, f"properties not in docs/broker.md: {missing}"
