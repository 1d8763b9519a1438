"""The shared codec: ids, JSON, sizes, money and durations are refused once, naming the field."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Context, Decimal, localcontext
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statepact._codec import (
    COST_SCALE,
    DECIMAL_CONTEXT,
    MAX_DEPTH,
    MAX_ID_BYTES,
    check_size,
    decimal_context,
    decimal_to_nanos,
    decode_json,
    encode_json,
    encode_json_value,
    json_array,
    json_array_of_encoded,
    nanos_to_decimal,
    require_count,
    require_id,
    require_seconds,
    to_nanos,
    utf8_size,
)
from statepact.errors import StatePersistenceError
from statepact.models import RunRecord
from statepact.testing._inputs import (
    EACH_ACCEPTED_JSON,
    EACH_HOSTILE_DECIMAL_CONTEXT,
    EACH_REFUSED_JSON,
    assert_plain_json,
    assert_refused_at,
)

# -- ids -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "run_1", "ténant:{x}/ü 🦜", "x" * MAX_ID_BYTES])
def test_require_id_accepts_and_returns(value: str) -> None:
    assert require_id("run_id", value) == value


@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        (7, TypeError, "must be a str"),
        (None, TypeError, "must be a str"),
        (b"bytes", TypeError, "must be a str"),
        ("", ValueError, "must not be empty"),
        ("a\x00b", ValueError, "NUL"),
        ("lone \ud800 surrogate", ValueError, "not valid Unicode"),
        ("x" * (MAX_ID_BYTES + 1), ValueError, "bytes"),
        ("é" * (MAX_ID_BYTES // 2 + 1), ValueError, "bytes"),
    ],
)
def test_require_id_refuses_naming_the_field(
    value: object, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=f"^tenant: .*{says}"):
        require_id("tenant", value)


# -- JSON ----------------------------------------------------------------------


def test_encode_json_is_compact_utf8() -> None:
    encoded = encode_json("data", {"a": [1, 2.5, None, True], "ü": "日本"})
    assert encoded == '{"a":[1,2.5,null,true],"ü":"日本"}'.encode()


def test_encode_json_sorts_keys_on_request() -> None:
    assert encode_json("data", {"b": 1, "a": 2}, sort_keys=True) == b'{"a":2,"b":1}'
    assert encode_json("data", {"b": 1, "a": 2}) == b'{"b":1,"a":2}'


def test_encode_json_turns_tuples_into_lists() -> None:
    assert decode_json(encode_json("data", {"t": (1, (2, 3))})) == {"t": [1, [2, 3]]}


@pytest.mark.parametrize("value", [[1], "text", 3, None, (("a", 1),)])
def test_encode_json_wants_an_object(value: object) -> None:
    with pytest.raises(ValueError, match=r"^payload: must be a JSON object"):
        encode_json("payload", value)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"x": float("nan")}, r"data\['x'\]"),
        ({"x": [0, float("inf")]}, r"data\['x'\]\[1\]"),
        ({"x": {"y": float("-inf")}}, r"data\['x'\]\['y'\]"),
        ({"x": {1, 2}}, r"data\['x'\]: a set"),
        ({"x": b"raw"}, r"data\['x'\]: a bytes"),
        ({"x": Decimal("1.5")}, r"data\['x'\]: a Decimal"),
        ({"x": object()}, r"data\['x'\]: a object"),
        ({1: "int key"}, r"data: key 1 is a int"),
        ({"x": {None: 1}}, r"data\['x'\]: key None"),
        ({"x": "nul\x00"}, r"data\['x'\]: NUL"),
        ({"nul\x00key": 1}, r"data\['nul\\x00key'\]: NUL"),
        ({"x": "\udcff"}, r"data\['x'\]: is not valid Unicode"),
        ({"x": 2**128}, r"data\['x'\]: integer is too large"),
        ({"x": -(2**128)}, r"data\['x'\]: integer is too large"),
    ],
)
def test_encode_json_refuses_naming_where(value: dict[Any, Any], where: str) -> None:
    with pytest.raises(ValueError, match=f"^{where}"):
        encode_json("data", value)


def test_encode_json_accepts_the_largest_integers() -> None:
    value = {"big": 2**128 - 1, "small": -(2**128) + 1}
    assert decode_json(encode_json("data", value)) == value


def test_nesting_is_bounded() -> None:
    # A value may sit inside at most MAX_DEPTH containers, the outer object included.
    shallow: Any = "leaf"
    for _ in range(MAX_DEPTH - 1):
        shallow = [shallow]
    assert decode_json(encode_json("data", {"x": shallow})) == {"x": shallow}
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper than"):
        encode_json("data", {"x": deep})


def test_a_very_deep_value_is_refused_without_recursion_error() -> None:
    deep: Any = {}
    for _ in range(50_000):
        deep = {"d": deep}
    with pytest.raises(ValueError, match="nested deeper than"):
        encode_json("data", deep)


@EACH_ACCEPTED_JSON
def test_the_json_rule_accepts_as_plain_json(value: Any, stored: Any) -> None:
    """Every accepted type encodes to the plain JSON it stands for, nested or at the top."""
    for encoded in (
        encode_json("data", {"a": {"b": value}}),
        encode_json("data", {"a": {"b": value}}, sort_keys=True),
    ):
        decoded = decode_json(encoded)
        assert decoded == {"a": {"b": stored}}
        assert_plain_json(decoded)
    assert decode_json(encode_json_value("value", value)) == stored


@EACH_REFUSED_JSON
def test_the_json_rule_refuses_naming_the_path(value: Any, says: str) -> None:
    """Every refused type is a ValueError whose message starts with the path to it."""
    for path, call in (
        ("payload['a']['b']", lambda: encode_json("payload", {"a": {"b": value}})),
        ("value[0]['a']['b']", lambda: encode_json_value("value", [{"a": {"b": value}}])),
    ):
        with pytest.raises(ValueError) as caught:
            call()
        assert_refused_at(caught.value, path, says)


def test_what_is_encoded_is_what_was_checked() -> None:
    """A dict subclass whose items() differ from its storage is encoded as items() says, the
    view that was checked (json.dumps alone would read the storage and meet the NaN)."""

    class Masked(dict[str, Any]):
        def items(self) -> Any:
            return [("shown", 1)]

    assert decode_json(encode_json("data", Masked(hidden=float("nan")))) == {"shown": 1}


def test_a_mapping_keeps_its_order_unless_keys_are_sorted() -> None:
    from types import MappingProxyType

    value = MappingProxyType({"z": 1, "a": (2, MappingProxyType({"y": 3, "b": 4}))})
    assert encode_json("data", value) == b'{"z":1,"a":[2,{"y":3,"b":4}]}'
    assert encode_json("data", value, sort_keys=True) == b'{"a":[2,{"b":4,"y":3}],"z":1}'


def test_encode_json_value_takes_any_json_value() -> None:
    assert encode_json_value("value", [1, "ü"]) == '[1,"ü"]'
    assert encode_json_value("value", {"b": 1, "a": 2}, sort_keys=True) == '{"a":2,"b":1}'
    with pytest.raises(ValueError, match=r"^value"):
        encode_json_value("value", float("nan"))


_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**127), max_value=2**127)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
)
_keys = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
_json_values = st.recursive(
    _json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _json_values, max_size=5))
def test_json_round_trips_exactly(value: dict[str, Any]) -> None:
    decoded = decode_json(encode_json("data", value))
    assert decoded == value
    # Equality alone would let 1 == 1.0 through; the text must match too.
    assert json.dumps(decoded, sort_keys=True) == json.dumps(value, sort_keys=True)


# -- size ----------------------------------------------------------------------


def test_utf8_size_is_the_encoded_length() -> None:
    for text in ["", '{"v":1}', '"ü"', '"\u20ac\U0001f600"']:
        assert utf8_size(text) == len(text.encode("utf-8"))


def test_check_size_allows_the_limit_itself() -> None:
    check_size("data", 100, 100, where="run 'r1'")


def test_check_size_refuses_over_the_limit() -> None:
    with pytest.raises(StatePersistenceError, match="data of run 'r1' is 101 bytes") as caught:
        check_size("data", 101, 100, where="run 'r1'")
    assert caught.value.reason == "too_large"
    assert caught.value.retryable is False
    assert "max_value_bytes=100" in str(caught.value)


# -- money ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "nanos"),
    [
        (0, 0),
        (3, 3 * COST_SCALE),
        ("0.000000001", 1),
        (Decimal("1E-9"), 1),
        (Decimal("1234.567890123"), 1_234_567_890_123),
        (Decimal("2.500000000000"), 2_500_000_000),
        ("-0", 0),
    ],
)
def test_to_nanos_is_exact(value: object, nanos: int) -> None:
    assert to_nanos("cost", value) == nanos


@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        (0.1, TypeError, "floats are inexact"),
        (True, TypeError, "must be a Decimal"),
        (None, TypeError, "must be a Decimal"),
        ("abc", ValueError, "not a decimal number"),
        ("NaN", ValueError, "not a finite number"),
        (Decimal("Infinity"), ValueError, "not a finite number"),
        (-1, ValueError, "must not be negative"),
        ("-0.000000001", ValueError, "must not be negative"),
        ("0.0000000001", ValueError, "more precision than 1e-9"),
        (Decimal(2**62) / COST_SCALE, ValueError, "too large"),
    ],
)
def test_to_nanos_refuses_naming_cost(value: object, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=f"^cost: .*{says}"):
        to_nanos("cost", value)


def test_nanos_to_decimal_has_nine_places() -> None:
    assert nanos_to_decimal(1) == Decimal("0.000000001")
    assert nanos_to_decimal(1).as_tuple().exponent == -9
    assert nanos_to_decimal(0) == 0
    assert str(nanos_to_decimal(1_500_000_000)) == "1.500000000"


@given(st.integers(min_value=0, max_value=2**62 - 1))
def test_nanos_round_trip(nanos: int) -> None:
    assert to_nanos("cost", nanos_to_decimal(nanos)) == nanos


@EACH_HOSTILE_DECIMAL_CONTEXT
def test_costs_convert_exactly_whatever_the_callers_context(context: Context) -> None:
    """to_nanos, nanos_to_decimal and decimal_to_nanos ignore the caller's decimal context:
    its precision, traps and exponent range."""
    with localcontext(context):
        assert to_nanos("cost", "1.234567891") == 1_234_567_891
        assert to_nanos("cost", Decimal("4611686018.427387903")) == 2**62 - 1
        assert to_nanos("cost", "1." + "0" * 60) == COST_SCALE
        assert str(nanos_to_decimal(1_234_567_891)) == "1.234567891"
        assert str(nanos_to_decimal(2**63 - 1)) == "9223372036.854775807"
        assert decimal_to_nanos(Decimal("9223372036.854775807")) == 2**63 - 1
        for refused in ("1e999999999", "1e-999999999", "0.1234567891", "12345678901"):
            with pytest.raises(ValueError, match=r"^cost: "):
                to_nanos("cost", refused)


@EACH_HOSTILE_DECIMAL_CONTEXT
def test_a_record_keeps_its_cost_whatever_the_callers_context(context: Context) -> None:
    """pydantic's Decimal validation of RunRecord.cost does not round in the caller's context."""
    with localcontext(context):
        record = RunRecord(tenant="t", run_id="r", cost=Decimal("9223372036.854775807"))
        assert str(record.cost) == "9223372036.854775807"
        assert str(RunRecord(tenant="t", run_id="r", cost="1.234567891").cost) == "1.234567891"


def test_the_package_context_is_only_ever_copied() -> None:
    """decimal_context() runs in a copy: the shared context's flags never change."""
    with decimal_context() as inner:
        assert inner is not DECIMAL_CONTEXT
        assert to_nanos("cost", "0.5") == 500_000_000
        with pytest.raises(ValueError):
            to_nanos("cost", "0.1234567891")
    assert not any(DECIMAL_CONTEXT.flags.values())


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1e999999999", "too large"),
        (Decimal("-1E+999999999"), "must not be negative"),
        ("1e-999999999", "more precision than 1e-9"),
        ("1e999999999999999999999", "not a decimal number"),
        ("1." + "0" * 200 + "1", "more precision than 1e-9"),
    ],
)
def test_extreme_exponents_are_value_errors_naming_cost(value: object, says: str) -> None:
    with pytest.raises(ValueError, match=f"^cost: .*{says}"):
        to_nanos("cost", value)


@pytest.mark.parametrize("value", ["0e999999999", "0E-999999999", "-0.000", Decimal("-0E+5")])
def test_zero_in_any_spelling_is_zero(value: object) -> None:
    assert to_nanos("cost", value) == 0


# -- counts and durations ------------------------------------------------------


def test_require_count() -> None:
    assert require_count("iterations", 0) == 0
    assert require_count("iterations", 2**62 - 1) == 2**62 - 1
    with pytest.raises(TypeError, match=r"^iterations"):
        require_count("iterations", True)
    with pytest.raises(TypeError, match=r"^iterations"):
        require_count("iterations", 1.0)
    with pytest.raises(ValueError, match=r"^iterations: must not be negative"):
        require_count("iterations", -1)
    with pytest.raises(ValueError, match=r"^iterations: .* too large"):
        require_count("iterations", 2**62)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(1, 1.0), (0.25, 0.25), (timedelta(minutes=1, milliseconds=5), 60.005)],
)
def test_require_seconds_accepts(value: object, seconds: float) -> None:
    assert require_seconds("lease_for", value) == seconds


def test_require_seconds_zero_only_when_allowed() -> None:
    assert require_seconds("delay", 0, allow_zero=True) == 0.0
    assert require_seconds("delay", timedelta(0), allow_zero=True) == 0.0
    with pytest.raises(ValueError, match=r"^lease_for: must be positive"):
        require_seconds("lease_for", 0)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, ValueError),
        (timedelta(seconds=-1), ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (11 * 365 * 86_400, ValueError),
        (True, TypeError),
        ("5", TypeError),
        (None, TypeError),
    ],
)
def test_require_seconds_refuses(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"^lease_for"):
        require_seconds("lease_for", value)


@pytest.mark.parametrize(
    "text",
    ['{"a":[1,2.5,"x",null,true]}', ' {"a": 1} ', '"t\u00e9"', "7", "[]", '{"a":{"b":{}}}'],
)
def test_decode_json_reads_what_json_reads(text: str) -> None:
    """Bytes or text, compact (what encode_json writes) or not: what ``json.loads`` reads."""
    assert decode_json(text) == json.loads(text)
    assert decode_json(text.encode("utf-8")) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a":1}x', '{"a":1} {}', "[1,]"])
def test_decode_json_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError, match=re.escape(caught.value.msg)):
        decode_json(text.encode("utf-8"))


def test_a_whole_cost_is_its_nanos_and_zero_is_nine_places() -> None:
    assert to_nanos("cost", 4_611_686_018) == 4_611_686_018 * COST_SCALE
    with pytest.raises(ValueError, match="too large"):
        to_nanos("cost", 4_611_686_019)
    with pytest.raises(ValueError, match="negative"):
        to_nanos("cost", -1)
    assert nanos_to_decimal(0).as_tuple() == Decimal("0.000000000").as_tuple()


def test_a_batch_column_is_one_json_array_read_back_as_given() -> None:
    """A statement's batch column (ids, ints, or values encoded one by one) is one JSON
    text that reads back as the values, in order, whatever the text holds."""
    ids = ["a", 'quote"back\\slash', "é", "\U0001f600", "line\nbreak", "\u2028"]
    assert json.loads(json_array(ids)) == ids
    assert json.loads(json_array([0, -1000, 1000, 2**64])) == [0, -1000, 1000, 2**64]
    assert json_array([]) == "[]"
    values = [{"é": [1, 2.5, None]}, {}, {"k": "\U0001f600"}]
    encoded = [encode_json("value", value) for value in values]
    assert json.loads(json_array_of_encoded(encoded)) == values
