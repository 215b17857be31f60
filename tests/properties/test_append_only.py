"""AppendOnly behaves as an immutable tuple under any interleaving of appends to any version."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.state_machines.append_only import AppendOnly


@given(st.lists(st.tuples(st.integers(min_value=0, max_value=50), st.integers()), max_size=60))
def test_every_version_stays_what_it_was(operations: list[tuple[int, int]]) -> None:
    versions: list[AppendOnly[int]] = [AppendOnly()]
    models: list[tuple[int, ...]] = [()]
    for pick, item in operations:
        index = pick % len(versions)
        versions.append(versions[index].appended(item))
        models.append((*models[index], item))
        for version, model in zip(versions, models, strict=True):
            assert tuple(version) == model
            assert len(version) == len(model)
            assert version == model
            if model:
                assert version[-1] == model[-1]
                assert version[0] == model[0]
                assert version[1:] == model[1:]


def test_appending_to_the_newest_version_shares_the_list() -> None:
    first = AppendOnly([1, 2])
    second = first.appended(3)
    third = second.appended(4)
    assert third._items is first._items  # no copies along one line of versions
    branch = second.appended(99)  # second already has a later version: copies
    assert branch._items is not first._items
    assert (tuple(second), tuple(third), tuple(branch)) == ((1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 99))
