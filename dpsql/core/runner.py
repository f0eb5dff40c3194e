"""Running a release: its SQL in a worker thread, progress, and Ctrl-C ordered with the charge.

The one place where the CLI (``dpsql set-union`` and the other release commands), the shell
(``dpsql shell``) and the Python API (``dpsql.set_union(..., progress=...)``) run work that may
charge the ledger of a connection, with :func:`run`.

The guarantee: **nothing is charged after Ctrl-C, and a charged release reaches the caller.**

* The work runs in a worker thread while the calling thread waits, so Ctrl-C (SIGINT) is seen by
  the main thread whatever DuckDB is doing. :class:`Interrupts` only records it; the waiting thread
  acts on it.
* Ctrl-C before the charge: under the lock the charge holds, every later charge is forbidden (the
  gate :meth:`Interrupts.charging`, which :func:`run` puts on the connection's ledger with
  :meth:`dpsql.core.ledger.Ledger.gated`, raises instead of charging), and DuckDB is interrupted
  (``con.interrupt()``). The ledger records nothing; :class:`Interrupted` (a ``KeyboardInterrupt``)
  is raised once the worker has stopped.
* Ctrl-C after the charge: only noted. The work runs to its end and its result is returned; the
  caller is told that Ctrl-C came late (``notice``, once, and :attr:`Interrupts.requested`).
* A progress callback that raises is reported once (a ``RuntimeWarning``) and no longer called; the
  work goes on, so its charged result is returned.
* :func:`run` returns only once the worker has stopped: the connection is never left busy (closing
  a busy connection aborts the process).

Progress is the engine's ``con.query_progress()`` percentage, polled, or, once a finer source has
reported, its fraction mapped onto what remains below 100 %; the values passed on increase strictly
and end at 100 when the work succeeds. The callback runs in the waiting thread, never in one of
DuckDB's. The finer sources: the steps a release reports from inside the engine on the connection's
noise source (:mod:`dpsql.core.progress`: the rounds of the multi-round set-union methods, the share
of users a policy kernel has processed), listened to for every run with a callback, and ``finer``
(any other, e.g. a test's). DuckDB's own percentage stays at 0 during a release (its one-row
relations report none), so for a release the finer source is what moves.

Ctrl-C is handled only where a signal handler can be set (the main thread). Elsewhere, e.g. inside
the worker of an outer :func:`run` (the CLI's command runs ``dpsql.set_union`` in its worker), the
outer run's gate and interrupt cover the connection.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
import warnings
from types import FrameType, TracebackType
from typing import Any, Callable, ContextManager, Iterator, Optional, TypeVar, Union

import duckdb

from dpsql.core import progress as steps
from dpsql.core.errors import DpsqlError
from dpsql.core.noise import NoiseSource
from dpsql.core.state import current_ledger, source_of

__all__ = ["Interrupted", "Interrupts", "Reporter", "run", "LATE", "REFUSED"]

T = TypeVar("T")
Progress = Callable[[float], None]
# A finer progress source: given a function of one fraction (0..1), the context in which it reports.
Finer = Callable[[Callable[[float], None]], ContextManager[Any]]

LATE = "dpsql: interrupted after the release was charged; finishing it so that its rows are not lost"
REFUSED = "dpsql: interrupted (Ctrl-C) before the release was charged"
_TICK = 0.1  # how often the waiting thread looks at Ctrl-C (seconds)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the work before anything was charged: nothing was released or recorded."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Interrupts:
    """``with Interrupts(notice) as ctrl_c:`` -- Ctrl-C in the block is recorded, not raised.

    :func:`run` acts on it: before the charge it stops the work (nothing charged), after the charge
    it calls ``notice(LATE)`` once and lets the work finish. ``notice`` defaults to a
    ``RuntimeWarning``. The block may be longer than the run (the CLI's covers the whole command,
    the shell's the drawing of the rows): Ctrl-C before the run stops it before it starts, and
    :attr:`requested` tells afterwards that Ctrl-C came at all. In a thread other than the main one
    no handler can be set: nothing is recorded.
    """

    _active: Optional["Interrupts"] = None  # the scope of the main thread, if any

    def __init__(self, notice: Optional[Callable[[str], None]] = None):
        self._notice = notice
        self._lock = threading.Lock()  # held by the charge (charging) and by the decision to stop
        self._requests: list[int] = []  # appended by the signal handler (atomic), read by run()
        self._handled = 0
        self._noted = False
        self.stopping = False  # Ctrl-C came before any charge: no charge may follow
        self.charged = False  # a charge went through the gate
        self._installed = False
        self._previous: Union[Callable[[int, Optional[FrameType]], Any], int, None] = None
        self._outer: Optional[Interrupts] = None

    @property
    def requested(self) -> bool:
        """Whether Ctrl-C came during the block (before or after the charge)."""
        return bool(self._requests)

    def __enter__(self) -> "Interrupts":
        if _main_thread():
            self._previous = signal.signal(signal.SIGINT, self._record)
            self._installed = True
            self._outer, Interrupts._active = Interrupts._active, self
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)
            Interrupts._active, self._installed = self._outer, False

    def _record(self, signum: int, frame: Optional[FrameType]) -> None:
        # A signal handler: it runs in the main thread between two bytecodes, possibly while that
        # thread holds a lock, so it takes none.
        self._requests.append(signum)

    @contextlib.contextmanager
    def charging(self) -> Iterator[None]:
        """The gate every charge passes while :func:`run` runs: refuses it once Ctrl-C asked to stop."""
        with self._lock:
            if self.stopping:
                raise DpsqlError(REFUSED)
            yield
            self.charged = True

    def check(self) -> None:
        """Raise :class:`Interrupted` if Ctrl-C stopped the work (called by work between its steps)."""
        if self.stopping:
            raise Interrupted()

    def _take(self, con: Optional[duckdb.DuckDBPyConnection]) -> None:
        """Act on the Ctrl-C not handled yet: stop (interrupting ``con``) before the charge, else note it."""
        if self._handled == len(self._requests):
            return
        self._handled = len(self._requests)
        with self._lock:
            late = self.charged
            if not late:
                self.stopping = True
        if not late:
            if con is not None:
                con.interrupt()
        elif not self._noted:
            self._noted = True
            self._say(LATE)

    def _say(self, line: str) -> None:
        try:
            if self._notice is None:
                warnings.warn(line, RuntimeWarning, stacklevel=4)
            else:
                self._notice(line)
        except Exception:  # e.g. a closed stderr: the release matters more than the notice
            pass


class Reporter:
    """The engine's percentage and a finer source's fraction, passed on as one strictly increasing percentage.

    ``fraction(f)`` (0..1, from any thread) records the finer source's share of the work done;
    ``poll(engine)`` passes on, in the calling thread, that share mapped onto what remained below
    100 % when the finer source began, else ``engine()``'s percentage (DuckDB's ``query_progress``);
    ``done()`` polls once more (a step reported since the last poll is passed on), then passes on 100. A
    value not above the last one passed on is dropped. A callback that raises is reported once (a
    ``RuntimeWarning``) and no longer called. Also the Spark backend's
    (:mod:`dpsql.frontends.spark_progress`), so both report by the same convention.
    """

    def __init__(self, callback: Progress):
        self._callback: Optional[Progress] = callback
        self._last = -1.0
        self._lock = threading.Lock()
        self._fraction: Optional[float] = None  # set by the finer source, from any thread
        self._base: Optional[float] = None  # the percentage reached when the finer source began

    def fraction(self, value: float) -> None:
        with self._lock:  # reports may come from several engine threads: keep the largest
            value = min(max(float(value), 0.0), 1.0)
            if self._fraction is None or value > self._fraction:
                self._fraction = value

    def poll(self, engine: Optional[Callable[[], float]] = None) -> None:
        fraction = self._fraction
        if fraction is not None:
            if self._base is None:
                self._base = max(self._last, 0.0)
            self._emit(self._base + (99.0 - self._base) * fraction)
            return
        if engine is None:
            return
        try:
            pct = float(engine())
        except Exception:  # progress is best effort; the work's own error wins
            return
        self._emit(min(pct, 100.0))

    def done(self) -> None:
        # Polls come once a tick (or once an interval), so work that reports a step and ends before the
        # next poll would otherwise go from its last poll straight to 100: that step is passed on first.
        self.poll()
        self._emit(100.0)

    def _emit(self, pct: float) -> None:
        if self._callback is None or not pct > self._last:
            return
        self._last = pct
        try:
            self._callback(pct)
        except Exception as exc:  # the work may be charged already: never lose it to a callback
            warnings.warn(f"dpsql: the progress callback failed ({type(exc).__name__}); progress is no longer "
                          f"reported, the release goes on", RuntimeWarning, stacklevel=4)
            self._callback = None


def _source(con: duckdb.DuckDBPyConnection) -> Optional[NoiseSource]:
    """The noise source of ``con``'s UDFs, whose releases report their steps; None if ``con`` is not registered."""
    try:
        return source_of(con)
    except DpsqlError:
        return None


def run(con: duckdb.DuckDBPyConnection, work: Callable[[], T], *, interrupts: Optional[Interrupts] = None,
        progress: Optional[Progress] = None, finer: Optional[Finer] = None, interval: float = 0.5) -> T:
    """``work()`` (which runs SQL on ``con``) in a worker thread, with the guarantee of the module.

    ``interrupts``: the Ctrl-C scope (default: the one the main thread has open, else, in the main
    thread, one for this run whose late notice is a ``RuntimeWarning``). ``progress``: called with a
    percentage every ``interval`` seconds while it rises, and at the end of a successful run with the
    last step reported (if not passed on yet), then 100.
    ``finer``: a finer progress source (see :data:`Finer`), entered around the work, besides the steps
    the connection's releases report (:mod:`dpsql.core.progress`), listened to whenever ``progress`` is given.
    """
    if interrupts is None and _main_thread():
        if Interrupts._active is None:
            with Interrupts() as own:
                return run(con, work, interrupts=own, progress=progress, finer=finer, interval=interval)
        interrupts = Interrupts._active
    ledger = current_ledger(con)
    reporter = Reporter(progress) if progress is not None else None
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # raised again in the waiting thread
            result["error"] = exc

    with contextlib.ExitStack() as stack:
        if interrupts is not None and ledger is not None:
            stack.enter_context(ledger.gated(interrupts.charging))
        if interrupts is not None:
            interrupts._take(None)  # Ctrl-C before the run: it does not start
            interrupts.check()
        if reporter is not None:
            source = _source(con)
            if source is not None:
                stack.enter_context(steps.reporting(source, reporter.fraction))
            if finer is not None:
                stack.enter_context(finer(reporter.fraction))
        worker = threading.Thread(target=target, name="dpsql-release")
        worker.start()
        try:
            due = time.monotonic() + interval
            while worker.is_alive():
                worker.join(_TICK)
                if interrupts is not None:
                    interrupts._take(con)
                if reporter is not None and worker.is_alive() and time.monotonic() >= due:
                    reporter.poll(con.query_progress)
                    due = time.monotonic() + interval
        finally:
            worker.join()  # whatever happened here, the connection is not left busy
    if interrupts is not None:
        interrupts._take(None)  # a Ctrl-C that came as the work ended (the worker is gone: nothing to interrupt)
    if "error" in result:
        if interrupts is not None and interrupts.stopping:
            raise Interrupted() from None
        raise result["error"]
    if reporter is not None:
        reporter.done()
    return result["value"]
