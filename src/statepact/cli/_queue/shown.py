"""How ``statepact queue`` shows items and refusals, for every action alike."""

from __future__ import annotations

from typing import Any

from statepact.cli._common import CommandError
from statepact.models import WorkItem

__all__ = ["SHOWN_CHARS", "clip", "item_json", "refused"]

#: The most characters of an item's payload or last error a human-readable line shows.
SHOWN_CHARS = 120


def clip(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else f"{text[: SHOWN_CHARS - 3]}..."


def item_json(item: WorkItem) -> dict[str, Any]:
    return item.model_dump(mode="json")


def refused(exc: ValueError | TypeError) -> CommandError:
    """A front's refusal of an argument (``tenant: must not be empty``) as the command's."""
    return CommandError(str(exc).splitlines()[0])
