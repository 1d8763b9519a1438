"""``WorkQueueConformance``'s part: ``enqueue_many`` of plain mappings, taken and refused
exactly as the ``WorkItem`` each one describes."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from statepact.models import WorkItem
from statepact.queue import WorkQueue
from statepact.testing.queue_suite._common import SuiteBase, _item, _stats

__all__ = ["MappingConformance"]

# What a mapping may say beyond the ids: a WorkItem's fields, as pydantic would take them.
_FIELDS: dict[str, Any] = {
    "payload": {"n": 1, "tags": ["a"]},
    "priority": "3",  # WorkItem(priority="3") holds 3
    "unique_key": "k",
    "unique_for": 30,  # seconds, a timedelta once taken
    "timeout": 5,
    "limit_key": "openai:gpt-4o",
    "weight": 2,
}


def _outcome(error: BaseException) -> tuple[type[BaseException], str]:
    return type(error), str(error)


class MappingConformance(SuiteBase):
    """enqueue_many of mappings: the same records, the same refusals."""

    async def test_enqueue_many_takes_mappings_as_the_items_they_describe(
        self, work_queue: WorkQueue
    ) -> None:
        """A batch of mappings (WorkItems mixed in) stores what the same WorkItems would."""
        mapped = await work_queue.enqueue_many(
            [
                {"tenant": "acme", "item_id": "a", **_FIELDS},
                {"tenant": "acme", "item_id": "b"},
                _item("acme", "c", payload={"x": 1}),
            ]
        )
        built = await work_queue.enqueue_many(
            [
                WorkItem(tenant="globex", item_id="a", **_FIELDS),
                WorkItem(tenant="globex", item_id="b"),
                _item("globex", "c", payload={"x": 1}),
            ]
        )
        for one, other in zip(mapped, built, strict=True):
            assert one == other.model_copy(update={"tenant": "acme"})
            assert await work_queue.get_item("acme", one.item_id) == one
        assert mapped[0].priority == 3
        assert mapped[0].unique_for == timedelta(seconds=30)
        assert (await work_queue.stats()).tenants == _stats(acme=(3, 0, 0), globex=(3, 0, 0))

    @pytest.mark.parametrize(
        "fields",
        [
            {"tenant": ""},
            {"item_id": 7},
            {"payload": {"x": float("nan")}},
            {"payload": [1]},
            {"priority": 1001},
            {"priority": 1.5},
            {"weight": 0},
            {"queue": "elsewhere"},
            {"unique_for": 30},
            {"timeout": -1},
            {"limit_key": "a\x00b"},
        ],
    )
    async def test_enqueue_many_refuses_a_mapping_as_its_work_item(
        self, work_queue: WorkQueue, fields: dict[str, Any]
    ) -> None:
        """A mapping is refused with the error, word for word, that the WorkItem of its fields
        (built without validation where pydantic refuses it) is refused with; nothing is
        stored."""
        values = {"tenant": "acme", "item_id": "x", **fields}
        try:
            item = WorkItem(**values)
        except ValidationError:
            item = WorkItem.model_construct(**values)
        with pytest.raises((ValueError, TypeError)) as as_item:
            await work_queue.enqueue_many([_item("acme", "ok"), item])
        with pytest.raises((ValueError, TypeError)) as as_mapping:
            await work_queue.enqueue_many([_item("acme", "ok"), values])
        assert _outcome(as_mapping.value) == _outcome(as_item.value)
        assert str(as_mapping.value).startswith("items[1].")
        assert (await work_queue.stats()).tenants == {}

    @pytest.mark.parametrize(
        ("fields", "error", "named"),
        [
            ({"colour": "red"}, ValueError, "items[1].colour"),
            ({"tenant": None, "item_id": "x"}, TypeError, "items[1].tenant"),
            ({"item_id": "x"}, ValueError, "items[1].tenant"),
            ({"attempts": -1}, ValueError, "items[1].attempts"),
            ({"status": "sideways"}, ValueError, "items[1].status"),
            ({1: "one"}, ValueError, "items[1].1"),
        ],
    )
    async def test_enqueue_many_refuses_what_no_work_item_holds(
        self,
        work_queue: WorkQueue,
        fields: dict[Any, Any],
        error: type[Exception],
        named: str,
    ) -> None:
        """A mapping WorkItem(**mapping) refuses (a key it has no field for, a missing id, a
        value pydantic refuses) is refused naming ``items[i].field``; nothing is stored."""
        values = {"tenant": "acme", "item_id": "x", **fields} if "item_id" not in fields else fields
        with pytest.raises(error, match=re.escape(named)):
            await work_queue.enqueue_many([_item("acme", "ok"), values])
        assert (await work_queue.stats()).tenants == {}
