"""Progress a release reports from inside the engine: steps done of a public number of steps.

DuckDB's ``con.query_progress()`` stays at 0 % for a whole release: the engine reports a
percentage only while every pipeline's source can say how far it is, and a release's one-row
relations (its bound parameters, its calibration) cannot. So the long releases report their own
progress, from inside their SQL, to whoever listens on the connection's noise source
(:class:`reporting`, entered by :func:`dpsql.core.runner.run` around work with a progress callback):

* a multi-round SQL body (the union family's adaptive methods, for instance) calls
  ``dp__progress(r, R)`` once round ``r`` of ``R`` is stored: on one row (a count of the round's
  rows, never passed on), so every round is reported exactly once, in order, whatever the data;
  ``r`` and ``R`` (``len(split)``) are constants of the call, so the fraction ``r / R`` is a
  function of public parameters only. It says nothing about the data beyond the time a round
  takes, which the release's own duration shows as well;
* a Python kernel reports how much of its work is done (the union family's policies, between
  chunks of entries, and 1 when it ends) through :func:`shares`, which passes on every whole
  twentieth once: the same twenty values from a fixed public set whatever the data (the exact share
  would be a ratio of counts of the data; a kernel given no rows reports them too), reached at
  times that show what the release's duration shows.

A reported fraction reaches the callback as given; :func:`dpsql.core.runner.run` turns it into
the one increasing percentage its callback sees.
"""
from __future__ import annotations

import weakref
from types import TracebackType
from typing import Callable, Optional

import pyarrow as pa
from duckdb.sqltypes import BOOLEAN, INTEGER

from dpsql.core.noise import NoiseSource
from dpsql.core.udf import Udf

__all__ = ["reporting", "listener", "report", "shares", "udfs", "SHARE_STEPS"]

Fraction = Callable[[float], None]
SHARE_STEPS = 20  # :func:`shares` passes on multiples of 1/20 (5 %)

_LISTENERS: "weakref.WeakKeyDictionary[NoiseSource, Fraction]" = weakref.WeakKeyDictionary()


class reporting:
    """``with reporting(source, callback):`` -- work on the connections drawing from ``source`` calls
    ``callback(fraction)`` (0..1) as it advances; the previous listener is back afterwards."""

    def __init__(self, source: NoiseSource, callback: Fraction):
        self.source, self.callback = source, callback
        self._previous: Optional[Fraction] = None

    def __enter__(self) -> "reporting":
        self._previous = _LISTENERS.get(self.source)
        _LISTENERS[self.source] = self.callback
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self._previous is None:
            _LISTENERS.pop(self.source, None)
        else:
            _LISTENERS[self.source] = self._previous


def listener(source: NoiseSource) -> Optional[Fraction]:
    """The callback listening on ``source``, if any."""
    return _LISTENERS.get(source)


def report(source: NoiseSource, fraction: float) -> None:
    """Tell the listener on ``source`` (if any) that ``fraction`` (0..1) of the work is done."""
    callback = _LISTENERS.get(source)
    if callback is None:
        return
    try:
        callback(min(max(float(fraction), 0.0), 1.0))
    except Exception:  # progress is best effort: it never fails the release that reports it
        pass


def shares(source: NoiseSource) -> Optional[Fraction]:
    """A callback for work that knows the share of it done (0..1), reporting to the listener on ``source``
    the whole :data:`SHARE_STEPS`-ths reached, ``floor(20 share) / 20``: every twentieth up to it, each
    once and in order, so a kernel that reports 1 when it ends reports the same twenty values whatever
    its work (a jump over several twentieths, or no work at all, reports each one skipped); None if
    nobody listens."""
    if listener(source) is None:
        return None
    reached = [0]

    def passed_on(share: float) -> None:
        step = int(min(max(float(share), 0.0), 1.0) * SHARE_STEPS)
        while reached[0] < step:
            reached[0] += 1
            report(source, reached[0] / SHARE_STEPS)

    return passed_on


def udfs(source: NoiseSource) -> list[Udf]:
    """``dp__progress(step, steps)``: reports ``step / steps`` done to the listener on ``source``; always true.

    It has side effects, so DuckDB neither folds it while planning nor drops it: it runs once per
    vector of the relation it filters, and the first call of a step says the step is reached. Only
    the constant arguments are read, never a row; a wrong argument (not 1 <= step <= steps) reports
    nothing.
    """

    def progress(step: pa.Array, steps: pa.Array) -> pa.Array:
        n = len(step)
        if n:
            done, total = step[0].as_py(), steps[0].as_py()
            if done is not None and total and 0 < done <= total:
                report(source, done / total)
        return pa.array([True] * n, type=pa.bool_())

    return [Udf("dp__progress", progress, (INTEGER, INTEGER), BOOLEAN, side_effects=True)]
