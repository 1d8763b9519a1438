"""``QueueLimits`` and ``Rate`` refuse what no backing could enforce, naming the field.

The backings' enforcement is in the conformance suite (``queue_suite/limits.py``);
these checks touch no backing, so they run once, here.
"""

from __future__ import annotations

import pytest

from statepact.queue import QueueLimits, Rate


def test_limits_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="per_tenant"):
        QueueLimits(per_tenant=0)
    with pytest.raises(ValueError, match="key_caps"):
        QueueLimits(key_caps={"k": -1})
    with pytest.raises(ValueError, match="per"):
        Rate(weight=10, per=0)
    with pytest.raises(ValueError, match="weight"):
        Rate(weight=0, per=60)
