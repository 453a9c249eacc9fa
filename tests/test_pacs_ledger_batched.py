"""Group commit in the PACS ledger: rows the listener's associations write at the same time share one transaction
(one sync of the ledger), and one row's error fails only the call that wrote it."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager

import pytest

from pipeline.pacs.ledger import Ledger


def _instance(sop: str):
    def write(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO instances (sop_uid, series_uid, generation) VALUES (?, '1.2.3', 1)", (sop,))

    return write


def _counting(ledger: Ledger) -> list[int]:
    real, counted = ledger.tx, []

    @contextmanager
    def tx():
        counted.append(1)
        with real() as db:
            yield db

    ledger.tx = tx  # type: ignore[method-assign]
    return counted


def _run_at_once(ledger: Ledger, first_row, rows) -> list[BaseException | None]:
    """``ledger.batched`` of ``first_row`` in a thread, then of each of ``rows`` in a thread of its own while the
    first one's transaction is under way: the first transaction is held open until every other call waits in the
    ledger's queue (so that they arrive together however slowly the machine starts the threads). The calls' errors."""
    under_way = threading.Event()

    def held_first(db: sqlite3.Connection) -> None:
        under_way.set()
        deadline = time.monotonic() + 30
        while len(ledger._queued) < len(rows) and time.monotonic() < deadline:
            time.sleep(0.01)
        first_row(db)

    works = [held_first, *rows]
    errors: list[BaseException | None] = [None] * len(works)

    def call(i: int) -> None:
        try:
            ledger.batched(works[i])
        except BaseException as exc:  # noqa: BLE001 - compared below
            errors[i] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert under_way.wait(30), "the first transaction did not begin"
    rest = [threading.Thread(target=call, args=(i,)) for i in range(1, len(works))]
    for t in rest:
        t.start()
    for t in [first, *rest]:
        t.join(timeout=30)
    return errors


def test_rows_written_at_once_share_a_transaction_and_are_all_committed(tmp_path):
    ledger = Ledger(tmp_path)
    counted = _counting(ledger)
    errors = _run_at_once(ledger, _instance("1.0"), [_instance(f"1.{i}") for i in range(1, 9)])
    assert errors == [None] * 9
    assert len(counted) == 2, counted  # the first alone, then the eight that waited together (not nine)
    with sqlite3.connect(tmp_path / "pacs" / "ledger.sqlite") as other:  # committed: another connection sees them
        assert other.execute("SELECT COUNT(*) FROM instances").fetchone()[0] == 9
    ledger.close()


def test_one_rows_error_fails_only_its_own_call(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.batched(_instance("2.0"))
    rows = [_instance("2.2"), _instance("2.0"), _instance("2.3")]  # 2.0 again: its primary key is taken
    errors = _run_at_once(ledger, _instance("2.1"), rows)
    assert [type(e) for e in errors] == [type(None), type(None), sqlite3.IntegrityError, type(None)]
    rows = sorted(r["sop_uid"] for r in ledger.rows("SELECT sop_uid FROM instances"))
    assert rows == ["2.0", "2.1", "2.2", "2.3"]
    ledger.close()


def test_a_single_call_raises_its_own_error(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.batched(_instance("3.0"))
    with pytest.raises(sqlite3.IntegrityError):
        ledger.batched(_instance("3.0"))
    ledger.batched(_instance("3.1"))  # the ledger goes on
    assert len(ledger.rows("SELECT sop_uid FROM instances")) == 2
    ledger.close()
