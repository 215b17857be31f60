"""The object lifecycle: reclaiming objects nobody will read, from the store and then from the
metadata.

Two kinds of object are reclaimed. A prepared object whose deadline passed (its upload's commit
never came: the node died in between, an orphan) is marked destroyed (``ExpireObject``). A
destroyed object (an orphan, a compaction's source, a deleted stream's) is deleted from the
object store once the retention has passed, so that a read that found it just before still
completes, and then forgotten (``RemoveObject``). Which objects qualify is read from the
:class:`~automq_ref.io.metadata.view.MetadataView`; the decisions go through the
:class:`~automq_ref.io.metadata.client.ControllerClient`, which refuses one that the image it
decides on no longer allows; the deletes go to the :class:`ObjectStore`.

This lives with the storage, not with the controller: it is the only place where metadata
decisions lead to deleting objects, and the metadata room knows nothing of object stores.
"""

from __future__ import annotations

from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.object_store import ObjectStore
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import object_key

MAX_OBJECTS_PER_ROUND = 2000


async def run_object_lifecycle(
    client: ControllerClient,
    view: MetadataView,
    store: ObjectStore,
    namespace: str,
    now_ms: int,
    *,
    params: sm.StreamMetadataParams = sm.DEFAULT_PARAMS,
    max_objects: int = MAX_OBJECTS_PER_ROUND,
) -> tuple[int, int]:
    """One round: prepared objects past their deadline become MARK_DESTROYED, and destroyed
    objects past ``params``' retention are deleted from ``store``, then forgotten. Returns
    (expired, removed)."""
    expired = 0
    for object_id in sm.expired_objects(view.image, now_ms)[:max_objects]:
        if (await client.submit(sm.ExpireObject(object_id, now_ms))).ok:
            expired += 1
    removable = sm.removable_objects(view.image, now_ms, params)[:max_objects]
    if removable:
        # Delete first, forget second: a crash in between deletes again, never leaks.
        await store.delete_many(object_key(namespace, object_id) for object_id in removable)
    removed = 0
    for object_id in removable:
        if (await client.submit(sm.RemoveObject(object_id, now_ms))).ok:
            removed += 1
    return expired, removed
