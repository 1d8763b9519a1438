"""The Redis key codec: distinct identities never share a key, a tenant never spans slots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from statepact.models import RunStatus
from statepact.storage.redis._keys import QueueKeys, StateKeys, parse_ref, ref, seg

# Identifiers as callers may pass them: the awkward characters of the key
# grammar, spaces, any NUL-free Unicode (no lone surrogates), and long ones.
_AWKWARD = st.sampled_from([":", "{", "}", " ", "{}", "}{", "1:", ":1", "é", "日本", "🙂"])
_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)
IDS = st.one_of(
    _TEXT,
    st.lists(st.one_of(_AWKWARD, _TEXT), min_size=1, max_size=6).map("".join),
    st.text(alphabet="ab:{}", min_size=200, max_size=400),
)
STATUSES = st.sampled_from(list(RunStatus))

STATE = StateKeys("adk")
QUEUE = QueueKeys("adk", "default")


def _state_keys(tenant: str, kind: str, record_id: str) -> str:
    """Every id-bearing state key kind, by name."""
    builders = {
        "run": lambda: STATE.run(tenant, record_id),
        "run_meta": lambda: STATE.run_meta(tenant, record_id),
        "session": lambda: STATE.session(tenant, record_id),
        "session_meta": lambda: STATE.session_meta(tenant, record_id),
        "runs_by_session": lambda: STATE.runs_by_session(tenant, record_id),
        "runs_by_session_status": lambda: STATE.runs_by_session_status(
            tenant, record_id, RunStatus.RUNNING
        ),
    }
    return builders[kind]()


STATE_KINDS = st.sampled_from(
    ["run", "run_meta", "session", "session_meta", "runs_by_session", "runs_by_session_status"]
)


def test_documented_examples() -> None:
    """The keys DESIGN section 3 shows, byte for byte."""
    assert STATE.run("acme", "run_1") == "adk:state:{4:acme}:run:5:run_1"
    assert STATE.session("acme", "s1") == "adk:state:{4:acme}:session:2:s1"
    assert QUEUE.ready("acme").startswith("{adk:queue}:7:default:")


def test_segment_length_counts_utf8_bytes() -> None:
    """A segment's length is its UTF-8 byte length, which is what Lua's # counts."""
    assert seg("é") == "2:é"
    assert seg("🙂") == "4:🙂"


def test_prefix_cannot_be_confused() -> None:
    """``a`` holding ``b:c`` and ``a:b`` holding ``c`` differ, the seed's own example."""
    assert STATE.run("a", "b:c") != STATE.run("a:b", "c")
    assert ref("a", "b:c") != ref("a:b", "c")


@settings(max_examples=300, deadline=None)
@given(
    first=st.tuples(IDS, STATE_KINDS, IDS),
    second=st.tuples(IDS, STATE_KINDS, IDS),
)
def test_distinct_state_identities_build_distinct_keys(
    first: tuple[str, str, str], second: tuple[str, str, str]
) -> None:
    """Distinct (tenant, kind, id) never build the same state key."""
    if first != second:
        assert _state_keys(*first) != _state_keys(*second)
    else:
        assert _state_keys(*first) == _state_keys(*second)


@settings(max_examples=300, deadline=None)
@given(first=st.tuples(IDS, IDS), second=st.tuples(IDS, IDS))
def test_distinct_items_build_distinct_queue_keys(
    first: tuple[str, str], second: tuple[str, str]
) -> None:
    """Distinct (tenant, item_id) never build the same item key or reference."""
    assert (QUEUE.item(*first) == QUEUE.item(*second)) == (first == second)
    assert (ref(*first) == ref(*second)) == (first == second)
    assert (QUEUE.ready(first[0]) == QUEUE.ready(second[0])) == (first[0] == second[0])


@settings(max_examples=300, deadline=None)
@given(tenant=IDS, run_id=IDS, session_id=IDS, status=STATUSES)
def test_every_key_of_a_tenant_is_in_one_slot(
    tenant: str, run_id: str, session_id: str, status: RunStatus
) -> None:
    """A run's blob, counters, sequence and every index of its tenant share one cluster slot."""
    keys = [
        STATE.run(tenant, run_id),
        STATE.run_meta(tenant, run_id),
        STATE.session(tenant, session_id),
        STATE.session_meta(tenant, session_id),
        STATE.seq(tenant),
        STATE.runs(tenant),
        STATE.runs_by_status(tenant, status),
        STATE.runs_by_session(tenant, session_id),
        STATE.runs_by_session_status(tenant, session_id, status),
        STATE.sessions(tenant),
        STATE.op(tenant, "abcdefghijkl"),
    ]
    slots = {key_slot(key.encode("utf-8")) for key in keys}
    assert len(slots) == 1


@settings(max_examples=200, deadline=None)
@given(name=IDS, tenant=IDS, item_id=IDS)
def test_a_queue_is_one_slot(name: str, tenant: str, item_id: str) -> None:
    """Every key of a queue, whatever its name and tenants, hashes to the namespace's slot."""
    queue = QueueKeys("adk", name)
    keys = [
        *queue.fixed(),
        queue.item(tenant, item_id),
        queue.ready(tenant),
        queue.dead(tenant),
        queue.op("abcdefghijkl"),
    ]
    slots = {key_slot(key.encode("utf-8")) for key in keys}
    assert slots == {key_slot(b"{adk:queue}")}


@settings(max_examples=300, deadline=None)
@given(tenant=IDS, item_id=IDS)
def test_ref_round_trips(tenant: str, item_id: str) -> None:
    """``parse_ref`` reads back exactly what ``ref`` wrote."""
    assert parse_ref(ref(tenant, item_id)) == (tenant, item_id)
    assert parse_ref(ref(tenant, item_id).encode("utf-8")) == (tenant, item_id)


@pytest.mark.parametrize("bad", ["", "4:acme", "4:acme:", "4:acme:3:ab", "4:acme:1:ab", "x:y:1:a"])
def test_parse_ref_refuses_what_ref_never_wrote(bad: str) -> None:
    """A malformed reference is refused, not read as something else."""
    with pytest.raises(ValueError):
        parse_ref(bad)
