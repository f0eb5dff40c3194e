"""dpsql.core.runner: a release in a worker thread, progress, and Ctrl-C ordered with the charge.

Real seeded connections and a real release (dp_set_union_weighted_gaussian); Ctrl-C is a real SIGINT
sent to this process, handled by the main thread while it waits, as in the CLI's and the shell's tests.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import warnings

import duckdb
import pytest

import dpsql
from dpsql.core import runner
from dpsql.core.ledger import Ledger

from conftest import seeded

SEED = 20260501
RELEASE = ("SELECT item FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 10) "
           "ORDER BY item")
# 997 users with about n / 997 rows each over 50 items: every item is held by many users and is released.
TABLE = "CREATE TABLE t AS SELECT i % 997 AS user_id, 'i' || (i % 50) AS item FROM range({n}) r(i)"


def _connection(n: int = 20_000) -> duckdb.DuckDBPyConnection:
    con = seeded(SEED)
    con.execute(TABLE.format(n=n))
    return con


def _release(con: duckdb.DuckDBPyConnection) -> list:
    return con.sql(RELEASE).fetchall()


def _charges(con: duckdb.DuckDBPyConnection) -> int:
    return con.execute("SELECT count(*) FROM dp_releases()").fetchall()[0][0]


@pytest.fixture
def reference() -> list:
    """The rows of the release on a fresh connection with the same seed, run without the runner."""
    con = _connection()
    try:
        rows = _release(con)
    finally:
        con.close()
    assert rows  # the release is not empty: delivering it is observable
    return rows


def _sigint_soon() -> None:
    """Ctrl-C to this process; its handler runs in the main thread, which is waiting for the worker."""
    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_before_the_charge_interrupts_duckdb_and_charges_nothing():
    con = seeded(SEED)
    # A billion generated rows (a view over range()): the release would read for minutes before its charge.
    con.execute("CREATE VIEW big AS SELECT 'u' || (i % 100000) AS user_id, 'i' || (i % 5000) AS item "
                "FROM range(1000000000) r(i)")
    errors: list[BaseException] = []

    def work():
        try:
            return con.sql("SELECT item FROM dp_set_union_weighted_gaussian('big', epsilon := 1.0, "
                           "delta := 1e-5, max_items := 10)").fetchall()
        except BaseException as exc:
            errors.append(exc)
            raise

    timer = threading.Timer(0.5, _sigint_soon)
    started = time.perf_counter()
    timer.start()
    try:
        with runner.Interrupts(notice=lambda line: None) as ctrl_c:
            with pytest.raises(runner.Interrupted):
                runner.run(con, work, interrupts=ctrl_c)
    finally:
        timer.cancel()
    assert time.perf_counter() - started < 20  # DuckDB stopped reading; it did not finish the billion rows
    assert ctrl_c.stopping and not ctrl_c.charged
    assert len(errors) == 1 and isinstance(errors[0], duckdb.InterruptException)  # con.interrupt() stopped it
    assert _charges(con) == 0
    assert con.execute("SELECT 42").fetchall() == [(42,)]  # the connection is not left busy
    con.close()


def test_ctrl_c_before_the_charge_forbids_the_charge():
    # Ctrl-C lands between two steps of the work, when no query runs (so interrupting DuckDB stops
    # nothing): the release that follows is refused at its charge, under the gate's lock.
    con = _connection()
    errors: list[str] = []

    def work():
        _sigint_soon()
        time.sleep(0.5)  # the main thread takes the Ctrl-C meanwhile
        try:
            return _release(con)
        except duckdb.Error as exc:
            errors.append(str(exc))
            raise

    with runner.Interrupts(notice=lambda line: None) as ctrl_c:
        with pytest.raises(runner.Interrupted):
            runner.run(con, work, interrupts=ctrl_c)
    assert len(errors) == 1 and runner.REFUSED in errors[0]
    assert _charges(con) == 0
    con.close()


def test_ctrl_c_before_the_run_does_not_start_the_work():
    con = _connection()
    started = []
    with runner.Interrupts(notice=lambda line: None) as ctrl_c:
        _sigint_soon()
        time.sleep(0.1)
        with pytest.raises(runner.Interrupted):
            runner.run(con, lambda: started.append(1), interrupts=ctrl_c)
    assert started == [] and ctrl_c.requested and _charges(con) == 0
    con.close()


def _interrupt_after_each_charge(monkeypatch):
    real = Ledger.charge

    def charge_then_interrupt(self, *args, **kwargs):
        release = real(self, *args, **kwargs)
        _sigint_soon()
        time.sleep(0.3)  # the main thread takes the Ctrl-C while the release is still running
        return release

    monkeypatch.setattr(Ledger, "charge", charge_then_interrupt)


def test_ctrl_c_after_the_charge_delivers_the_rows_and_says_it_came_late(monkeypatch, reference):
    con = _connection()
    _interrupt_after_each_charge(monkeypatch)
    notices: list[str] = []
    with runner.Interrupts(notice=notices.append) as ctrl_c:
        rows = runner.run(con, lambda: _release(con), interrupts=ctrl_c)
    assert rows == reference
    assert _charges(con) == 1
    assert notices == [runner.LATE]
    assert ctrl_c.requested and ctrl_c.charged and not ctrl_c.stopping
    con.close()


def test_python_api_ctrl_c_after_the_charge_returns_the_rows_with_a_warning(monkeypatch, reference):
    con = _connection()
    _interrupt_after_each_charge(monkeypatch)
    with pytest.warns(RuntimeWarning, match="interrupted after the release was charged"):
        out = dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1.0, delta=1e-5, max_items=10,
                              progress=lambda pct: None)
    assert sorted(out.column("item").to_pylist()) == [item for (item,) in reference]
    assert _charges(con) == 1
    con.close()


def test_a_raising_progress_callback_warns_once_and_the_rows_arrive(reference):
    con = _connection()
    calls = []

    def broken(pct):
        calls.append(pct)
        raise OSError(5, "Input/output error")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = runner.run(con, lambda: _release(con), progress=broken, interval=0.01)
    failed = [w for w in caught if issubclass(w.category, RuntimeWarning) and "progress callback failed" in str(w.message)]
    assert len(failed) == 1 and len(calls) == 1  # reported once, then no longer called
    assert rows == reference
    assert _charges(con) == 1
    con.close()


def test_progress_rises_and_ends_at_100(reference):
    # Two long scans before the release: the engine's percentage rises during each and falls back to
    # about 0 when the second begins; what the callback sees only rises. (DuckDB reports little
    # progress for a release itself: its work is in materialised CTEs.)
    con = _connection()
    # DuckDB tracks progress only with its progress bar on (off by default under pytest); never drawn here.
    con.execute("SET enable_progress_bar = true; SET enable_progress_bar_print = false")

    def work():
        for _ in range(2):
            con.sql("SELECT count(*) FROM range(100000000) a WHERE hash(a.range) % 7 = 3").fetchall()
        return _release(con)

    seen: list[float] = []
    rows = runner.run(con, work, progress=seen.append, interval=0.01)
    assert rows == reference
    assert len(seen) >= 3, seen  # the engine reported while the scans ran
    assert all(0 <= a < b <= 100 for a, b in zip(seen, seen[1:])), seen
    assert seen[-1] == 100.0
    con.close()


def _finer_source():
    """A finer progress source for run(): (the dict whose "to" is its callback while entered, the source)."""
    report: dict = {}

    @contextlib.contextmanager
    def finer(callback):
        report["to"] = callback
        try:
            yield
        finally:
            report.pop("to")

    return report, finer


def test_a_finer_source_takes_over_from_the_engine(reference):
    con = _connection()
    report, finer = _finer_source()

    def work():
        report["to"](0.25)
        time.sleep(0.5)
        report["to"](0.75)
        time.sleep(0.5)
        return _release(con)

    seen: list[float] = []
    rows = runner.run(con, work, progress=seen.append, finer=finer, interval=0.01)
    assert rows == reference and "to" not in report  # the source was detached after the run
    # The fractions are mapped onto 0..99 and the engine's own percentage no longer shows; 100 at the end.
    assert seen[-1] == 100.0 and 99 * 0.75 in seen and set(seen[:-1]) <= {99 * 0.25, 99 * 0.75}, seen
    con.close()


def test_a_step_reported_just_before_the_end_is_passed_on_before_100():
    # The waiting thread polls once a tick (0.1 s): work that reports its last step and ends within the
    # tick used to go straight to 100 (MAD2R's first round on a small table, now and then). Reporter.done()
    # passes on the last step reported first, so the callback sees it whatever the timing.
    con = _connection()
    report, finer = _finer_source()

    def work():
        report["to"](0.5)
        return 7

    for _ in range(20):
        seen: list[float] = []
        assert runner.run(con, work, progress=seen.append, finer=finer, interval=10.0) == 7
        assert seen == [99.0 * 0.5, 100.0], seen
    con.close()


def test_a_failing_work_raises_its_error_without_reaching_100():
    con = _connection()
    seen: list[float] = []
    with pytest.raises(duckdb.Error, match="epsilon"):
        runner.run(con, lambda: con.sql("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := -1.0, "
                                        "delta := 1e-5)").fetchall(),
                   progress=seen.append)
    assert 100.0 not in seen and _charges(con) == 0
    con.close()


@pytest.mark.parametrize("method, rounds", [("sips_cumulative", 7), ("mad2r", 2)])
def test_a_multi_round_release_reports_its_rounds_between_0_and_100(method, rounds):
    # DuckDB's percentage stays at 0 for a release; before the rounds reported themselves, the callback
    # of the default method (and of MAD2R) saw nothing until 100. Now every value before the end is a
    # round done, r of R mapped onto 0..99 (MAD2R reports its first round: the end is the release's).
    con = seeded(SEED)
    con.execute("CREATE TABLE big AS SELECT i // 7 AS user_id, 'i' || (hash(i) % 20000) AS item "
                "FROM range(300000) r(i)")
    seen: list[float] = []
    out = runner.run(con, lambda: con.sql(f"SELECT count(*) FROM dp_set_union_{method}('big', 1.0, 1e-5)").fetchall(),
                     progress=seen.append, interval=0.01)
    assert out[0][0] >= 0 and _charges(con) == 1
    assert seen[-1] == 100.0 and all(a < b for a, b in zip(seen, seen[1:])), seen
    marks = [99.0 * r / rounds for r in range(1, rounds + (1 if method == "sips_cumulative" else 0))]
    between = [v for v in seen[:-1] if v > 0]  # DuckDB's own 0 % may come first
    assert between, seen
    assert all(any(v == pytest.approx(m) for m in marks) for v in between), (seen, marks)
    con.close()
