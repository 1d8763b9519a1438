"""``enqueue_many`` of plain mappings against the ``WorkItem`` each describes, fuzzed.

The promise (docs/work-queue.md#enqueueing-a-batch): a mapping is taken as ``WorkItem(**mapping)``
would take it and refused exactly where that item would be, with the same error, word
for word. The fields come from the fuzz lane's own strategies (``test_fuzz_inputs``);
the "equivalent WorkItem" is the lane's ``build``: the validated item, or, where pydantic
refuses the fields, the one a caller skipping validation would hand over. Where only
pydantic refuses (the front would take the unvalidated item), the mapping is still
refused, naming the field pydantic named. Every backing, through ``fuzz_queue``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from statepact.errors import StatePersistenceError
from statepact.models import WorkItem
from statepact.queue import WorkQueue
from tests.fuzz.conftest import SEED_TENANTS, Target
from tests.fuzz.test_fuzz_inputs import (
    FUZZ,
    WRONG_TYPES,
    blobs,
    build,
    durations,
    ids,
    optional_ids,
    seeded_or,
)

item_fields = st.fixed_dictionaries(
    {
        "tenant": seeded_or(SEED_TENANTS, ids),
        "item_id": seeded_or(["seed-1", "fresh", "fresh-2"], ids),
    },
    optional={
        "payload": blobs,
        "priority": st.one_of(st.integers(-1001, 1001), WRONG_TYPES, st.just("7")),
        "queue": st.one_of(st.just("default"), optional_ids),
        "weight": st.one_of(st.integers(-1, 3), WRONG_TYPES),
        "unique_key": optional_ids,
        "unique_for": st.one_of(st.none(), durations),
        "timeout": st.one_of(st.none(), durations),
        "limit_key": optional_ids,
    },
)


def _outcome(target: Target[WorkQueue], items: list[Any]) -> tuple[str, Any]:
    """What ``enqueue_many(items)`` did: ("stored", records) or ("refused", type, message)."""
    try:
        return "stored", target.run(target.store.enqueue_many(items))
    except (ValueError, TypeError, StatePersistenceError) as exc:
        return "refused", (type(exc), str(exc))


@FUZZ
@given(fields=item_fields)
def test_a_mapping_is_refused_exactly_as_its_work_item(
    fuzz_queue: Target[WorkQueue], fields: dict[str, Any]
) -> None:
    """A mapping and its WorkItem, each as the second item of a batch: both stored (as the
    same record), or both refused with the same error and message."""
    fuzz_queue.clock.advance(1)
    lead = WorkItem(tenant="acme", item_id=f"lead-{fuzz_queue.clock.now().timestamp():.0f}")
    try:
        WorkItem(**fields)
        pydantic_refuses = False
    except ValidationError as exc:
        pydantic_refuses = True
        named = ".".join(str(part) for part in exc.errors()[0]["loc"])
    as_item = _outcome(fuzz_queue, [lead, build(WorkItem, fields)])
    as_mapping = _outcome(fuzz_queue, [lead, fields])
    if pydantic_refuses and as_item[0] == "stored":
        assert as_mapping[0] == "refused", f"{fields!r:.300} was stored"
        assert as_mapping[1][1].startswith(f"items[1].{named}:"), as_mapping
    else:
        assert as_mapping == as_item, f"{fields!r:.300}"
