"""``automq_ref.checker.metadata_dump.latest_registrations``: each node's latest registration as
the ``pause-past-session`` nemesis reads it from a checked cluster's metadata log."""

from __future__ import annotations

from automq_ref.checker.metadata_dump import Registration, latest_registrations
from automq_ref.vocabulary.metadata_records import (
    BrokerRegistrationChangeRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)


def register(node_id: int, epoch: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(node_id, epoch, f"az{node_id}", ())


def test_a_registration_starts_fenced_and_follows_its_changes() -> None:
    records = [
        register(1, 10),
        register(2, 11),
        BrokerRegistrationChangeRecord(1, 10, False, False),
        BrokerRegistrationChangeRecord(2, 11, False, False),
        TopicRecord("t", "checked"),
        BrokerRegistrationChangeRecord(2, 11, True, False),  # its session lapsed
    ]
    assert latest_registrations(records) == {
        1: Registration(10, False),
        2: Registration(11, True),
    }


def test_changes_to_an_earlier_registration_are_ignored() -> None:
    records = [
        register(1, 10),
        BrokerRegistrationChangeRecord(1, 10, False, False),
        register(1, 12),  # it registered again
        BrokerRegistrationChangeRecord(1, 10, True, False),  # late, for the old epoch
        UnregisterBrokerRecord(1, 10),
    ]
    assert latest_registrations(records) == {1: Registration(12, True)}
    assert latest_registrations([*records, UnregisterBrokerRecord(1, 12)]) == {}
