"""The StreamMetadata machine's cluster-wide decisions outside the spec: the conditional KV
requests (put-if-absent, compare-and-set, compare-and-delete), the producer-id blocks, and the
node epoch granted at registration."""

from __future__ import annotations

from automq_ref.formats.kv_integer import encode_kv_integer
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import EMPTY_IMAGE, StreamErrorCode
from automq_ref.vocabulary.naming import PRODUCER_ID_KEY

E = StreamErrorCode


class Controller:
    """The machine stepped on its own image, as the controller shell would."""

    def __init__(self, image: sm.StreamMetadataImage = EMPTY_IMAGE) -> None:
        self.image = image

    def __call__(self, event: sm.StreamMetadataEvent) -> sm.Response:
        transition = sm.step(self.image, event)
        response = sm.response_of(transition)
        if not response.ok:
            assert transition.state == self.image and not sm.records_of(transition)
        self.image = transition.state
        return response


def test_put_if_absent_answers_the_existing_value() -> None:
    c = Controller()
    assert c(sm.PutKV("k", b"1", False)).ok
    refused = c(sm.PutKV("k", b"2", False))
    assert (refused.error, refused.value) == (E.KEY_EXIST, b"1")
    assert c.image.kv["k"] == b"1"


def test_compare_and_set() -> None:
    c = Controller()
    absent = c(sm.PutKV("k", b"1", True, expected=b"0"))
    assert (absent.error, absent.value) == (E.VALUE_NOT_MATCHED, None)
    assert "k" not in c.image.kv
    assert c(sm.PutKV("k", b"1", True)).ok
    assert c(sm.PutKV("k", b"2", True, expected=b"1")).ok
    stale = c(sm.PutKV("k", b"3", True, expected=b"1"))
    assert (stale.error, stale.value) == (E.VALUE_NOT_MATCHED, b"2")
    assert not stale.ok and c.image.kv["k"] == b"2"
    # The put-if-absent rule still holds under a matching condition.
    assert c(sm.PutKV("k", b"3", False, expected=b"2")).error is E.KEY_EXIST


def test_compare_and_delete() -> None:
    c = Controller()
    assert c(sm.PutKV("k", b"1", False)).ok
    stale = c(sm.DeleteKV("k", expected=b"0"))
    assert (stale.error, stale.value) == (E.VALUE_NOT_MATCHED, b"1")
    assert c.image.kv["k"] == b"1"
    deleted = c(sm.DeleteKV("k", expected=b"1"))
    assert deleted.ok and deleted.value == b"1" and "k" not in c.image.kv
    gone = c(sm.DeleteKV("k", expected=b"1"))
    assert (gone.error, gone.value) == (E.VALUE_NOT_MATCHED, None)
    assert c(sm.DeleteKV("k")).ok  # unconditional: absent is fine


def test_producer_id_blocks_follow_each_other_across_nodes() -> None:
    c = Controller()
    assert c(sm.RegisterNode(0, 1)).ok and c(sm.RegisterNode(1, 1)).ok
    first = c(sm.AllocateProducerIds(0, 1, 1000))
    second = c(sm.AllocateProducerIds(1, 1, 1000))
    third = c(sm.AllocateProducerIds(0, 1, 10))
    assert [r.first_producer_id for r in (first, second, third)] == [0, 1000, 2000]
    assert c.image.kv[PRODUCER_ID_KEY] == encode_kv_integer(2010)


def test_producer_ids_continue_from_a_counter_written_by_a_put() -> None:
    """Data written before the event existed (the broker moved the counter with PutKV)."""
    c = Controller()
    assert c(sm.RegisterNode(0, 1)).ok
    assert c(sm.PutKV(PRODUCER_ID_KEY, encode_kv_integer(3000), True)).ok
    assert c(sm.AllocateProducerIds(0, 1, 1000)).first_producer_id == 3000
    assert c.image.kv[PRODUCER_ID_KEY] == b"4000"


def test_producer_ids_check_the_node_and_the_counter() -> None:
    c = Controller()
    assert c(sm.AllocateProducerIds(0, 1, 10)).error is E.NODE_EPOCH_NOT_EXIST
    assert c(sm.RegisterNode(0, 5)).ok
    assert c(sm.AllocateProducerIds(0, 4, 10)).error is E.NODE_EPOCH_EXPIRED
    assert c(sm.AllocateProducerIds(0, 5, 0)).error is E.INVALID_REQUEST
    assert c(sm.FenceNode(0, 5)).ok
    assert c(sm.AllocateProducerIds(0, 5, 10)).error is E.NODE_FENCED
    assert c(sm.RegisterNode(0, 6)).ok
    assert c(sm.PutKV(PRODUCER_ID_KEY, b"twelve", True)).ok
    broken = c(sm.AllocateProducerIds(0, 6, 10))
    assert broken.error is E.STREAM_INNER_ERROR and "not a decimal integer" in broken.message


def test_registration_grants_an_epoch_above_the_stored_one() -> None:
    c = Controller()
    assert c(sm.RegisterNode(0, 1_000)).node_epoch == 1_000  # first start: the proposal
    assert c(sm.RegisterNode(0, 2_000)).node_epoch == 2_000  # a later clock: the proposal
    assert c(sm.RegisterNode(0, 1_500)).node_epoch == 2_001  # the clock went back
    assert c(sm.RegisterNode(0, 2_001)).node_epoch == 2_002  # a retried registration
    assert c.image.nodes[0].node_epoch == 2_002
    assert c(sm.CreateStream(0, 2_001)).error is E.NODE_EPOCH_EXPIRED  # the older incarnation
    assert c(sm.FenceNode(0, 2_002)).ok
    registered = c(sm.RegisterNode(0, 0))
    assert registered.node_epoch == 2_003 and not c.image.nodes[0].failover_mode
