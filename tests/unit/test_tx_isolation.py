"""The list-append isolation checker on hand-written histories: each anomaly is found, and a
serial history shows none."""

from __future__ import annotations

from statepact.testing.isolation import Op, TxnRecord, check_history


def txn(name: str, *ops: tuple[str, str, object], committed: bool = True) -> TxnRecord:
    record = TxnRecord(name, committed=committed)
    for kind, key, value in ops:
        record.ops.append(Op(kind, key, tuple(value) if isinstance(value, list) else value))  # type: ignore[arg-type]
    return record


def names(*records: TxnRecord) -> list[str]:
    return sorted(a.name for a in check_history(records))


def test_serial_history_is_clean() -> None:
    history = [
        txn("t1", ("append", "x", 1)),
        txn("t2", ("read", "x", [1]), ("append", "y", 2), ("read", "y", [2])),
        txn("t3", ("read", "x", [1]), ("append", "x", 3)),
        txn("final", ("read", "x", [1, 3]), ("read", "y", [2])),
    ]
    assert check_history(history) == []


def test_g0_dirty_write_cycle() -> None:
    anomalies = check_history(
        [
            txn("t1", ("append", "x", 1), ("append", "y", 4)),
            txn("t2", ("append", "x", 2), ("append", "y", 3)),
            txn("final", ("read", "x", [1, 2]), ("read", "y", [3, 4])),
        ]
    )
    assert [(a.name, sorted(a.txns)) for a in anomalies] == [("G0", ["t1", "t2"])]


def test_g1a_aborted_read() -> None:
    assert names(
        txn("t1", ("append", "x", 1), committed=False),
        txn("t2", ("read", "x", [1])),
        txn("final", ("read", "x", [])),
    ) == ["G1a"]


def test_g1b_intermediate_read() -> None:
    found = names(
        txn("t1", ("append", "x", 1), ("append", "x", 2)),
        txn("t2", ("read", "x", [1])),
        txn("final", ("read", "x", [1, 2])),
    )
    assert "G1b" in found


def test_g1c_circular_information_flow() -> None:
    assert names(
        txn("t1", ("append", "x", 1), ("read", "y", [2])),
        txn("t2", ("append", "y", 2), ("read", "x", [1])),
        txn("final", ("read", "x", [1]), ("read", "y", [2])),
    ) == ["G1c"]


def test_g_single_read_skew() -> None:
    anomalies = check_history(
        [
            txn("t0", ("append", "x", 1), ("append", "y", 2)),
            txn("t1", ("read", "x", [1]), ("read", "y", [2, 4])),
            txn("t2", ("append", "x", 3), ("append", "y", 4)),
            txn("final", ("read", "x", [1, 3]), ("read", "y", [2, 4])),
        ]
    )
    assert [(a.name, sorted(a.txns)) for a in anomalies] == [("G-single", ["t1", "t2"])]


def test_g2_write_skew() -> None:
    anomalies = check_history(
        [
            txn("t1", ("read", "x", []), ("read", "y", []), ("append", "x", 1)),
            txn("t2", ("read", "x", []), ("read", "y", []), ("append", "y", 2)),
            txn("final", ("read", "x", [1]), ("read", "y", [2])),
        ]
    )
    assert [(a.name, sorted(a.txns)) for a in anomalies] == [("G2", ["t1", "t2"])]


def test_own_appends_are_not_dependencies() -> None:
    assert (
        check_history(
            [
                txn("t1", ("append", "x", 1), ("read", "x", [1]), ("append", "x", 2)),
                txn("final", ("read", "x", [1, 2])),
            ]
        )
        == []
    )


def test_lost_append_garbage_and_incompatible_order() -> None:
    assert names(
        txn("t1", ("append", "x", 1)),
        txn("t2", ("append", "x", 2)),
        txn("final", ("read", "x", [2])),
    ) == ["lost-append"]
    assert names(txn("t1", ("read", "x", [99]))) == ["garbage"]
    found = names(
        txn("t1", ("append", "x", 1)),
        txn("t2", ("append", "x", 2)),
        txn("r1", ("read", "x", [1])),
        txn("r2", ("read", "x", [2])),
    )
    assert "incompatible-order" in found


def test_aborted_transactions_reads_are_not_checked() -> None:
    assert (
        check_history(
            [
                txn("t1", ("read", "x", [42]), committed=False),
                txn("final", ("read", "x", [])),
            ]
        )
        == []
    )
