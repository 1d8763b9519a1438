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


# Near-collisions on purpose: one string of the key grammar's own pieces (digits that
# read as lengths, ':', braces, kind words and separators), split at two different
# points into (tenant, id), mostly at the pieces' seams and mostly with one kind.
# Independent draws almost never come this close.
_GRAMMAR_PIECES = st.sampled_from(
    [
        *("0", "1", "2", "9", "10", ":", "1:", ":1:", "{", "}", "}:", "{1:", "é", "x"),
        *("run", "runh", ":run:", "}:run:", "}:session:", "}:run:1:", "}:runh:2:"),
    ]
)
_GRAMMAR_TEXT = st.lists(_GRAMMAR_PIECES, min_size=1, max_size=12).map("".join)


@st.composite
def near_collisions(draw: st.DrawFn) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """Two (tenant, kind, id) whose tenant + id is the same string, cut in different places."""
    pieces = draw(st.lists(_GRAMMAR_PIECES, min_size=1, max_size=8))
    whole = "".join(pieces)
    seams = [sum(len(piece) for piece in pieces[:n]) for n in range(len(pieces) + 1)]
    cuts = st.one_of(st.sampled_from(seams), st.integers(0, len(whole)))
    cut = draw(cuts)
    other_cut = draw(cuts.filter(lambda c: c != cut))
    kind = draw(STATE_KINDS)
    other_kind = draw(st.one_of(st.just(kind), STATE_KINDS))
    return (
        (whole[:cut], kind, whole[cut:]),
        (whole[:other_cut], other_kind, whole[other_cut:]),
    )


@settings(max_examples=500, deadline=None)
@given(pair=near_collisions())
def test_near_collisions_build_distinct_keys(
    pair: tuple[tuple[str, str, str], tuple[str, str, str]],
) -> None:
    """One string split into (tenant, id) at two points never builds one key twice, whatever
    the kinds; nor one item key or reference."""
    first, second = pair
    assert first != second
    assert _state_keys(*first) != _state_keys(*second)
    assert QUEUE.item(first[0], first[2]) != QUEUE.item(second[0], second[2])
    assert ref(first[0], first[2]) != ref(second[0], second[2])


# The kind words of _state_keys, as the key layout spells them.
_KIND_WORDS = {
    "run": "run",
    "runh": "run_meta",
    "session": "session",
    "sessionh": "session_meta",
    "runs-session": "runs_by_session",
    "runs-ss": "runs_by_session_status",
}


def _parse_state_key(key: str) -> tuple[str, str, str]:
    """Read (tenant, kind, id) back from ``adk:state:{<len>:<tenant>}:<kind>:<len>:<id>``
    (``runs-ss`` keys end in one more segment, the status), refusing anything else.

    Written from the documented layout, not with the codec's own reader.
    """
    raw = key.encode("utf-8")
    pos = 0

    def expect(literal: bytes) -> None:
        nonlocal pos
        assert raw[pos : pos + len(literal)] == literal, (key, pos, literal)
        pos += len(literal)

    def segment() -> str:
        nonlocal pos
        colon = raw.index(b":", pos)
        digits = raw[pos:colon]
        assert digits.isdigit() and (digits == b"0" or not digits.startswith(b"0")), key
        end = colon + 1 + int(digits)
        assert end <= len(raw), key
        value = raw[colon + 1 : end].decode("utf-8")
        pos = end
        return value

    expect(b"adk:state:{")
    tenant = segment()
    expect(b"}:")
    colon = raw.index(b":", pos)
    kind = _KIND_WORDS[raw[pos:colon].decode("ascii")]
    pos = colon + 1
    record_id = segment()
    if kind == "runs_by_session_status":
        expect(b":")
        assert segment() == RunStatus.RUNNING.value, key
    assert pos == len(raw), f"trailing bytes in {key!r}"
    return tenant, kind, record_id


# Any NUL-free Unicode, short, empty, grammar-like or long (well past one length digit).
_ANY_ID = st.one_of(
    IDS,
    _GRAMMAR_TEXT,
    st.just(""),
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
        min_size=200,
        max_size=2000,
    ),
)


def test_the_parser_reads_the_documented_example() -> None:
    """The test's reader agrees with DESIGN section 3's example (and so with the layout)."""
    assert _parse_state_key("adk:state:{4:acme}:run:5:run_1") == ("acme", "run", "run_1")
    with pytest.raises(AssertionError):
        _parse_state_key("adk:state:{4:acme}:run:5:run_12")


@settings(max_examples=500, deadline=None)
@given(identity=st.tuples(_ANY_ID, STATE_KINDS, _ANY_ID))
def test_a_state_key_parses_back_to_its_identity(identity: tuple[str, str, str]) -> None:
    """parse(key(tenant, kind, id)) == (tenant, kind, id): the key builder is injective."""
    assert _parse_state_key(_state_keys(*identity)) == identity


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
        queue.prune_lock,
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
