"""Progress and failures of the Spark backend's releases, as DuckDB's (:mod:`dpsql.core.runner`).

Every release of :mod:`dpsql.frontends.spark` runs its Spark jobs inside :func:`tracking`, which
:func:`dpsql.frontends.spark_ledger.charged` enters around the release (before its charge):

* **Progress.** ``progress``, if given, is called with a percentage (0-100) that only rises, and
  with 100 once the release succeeded: the convention of DuckDB's ``progress=``, through the same
  :class:`dpsql.core.runner.Reporter`. The release's jobs run under a job group of their own
  (``SparkContext.setJobGroup`` on the calling thread; the caller's group is back afterwards); a
  thread polls Spark's status tracker for that group every ``interval`` seconds. A release reports
  its steps (:func:`step`: the rounds of the multi-round methods, ``r`` of ``R``); within a step the
  tasks of its jobs move the percentage: job ``j`` of the step (0-based) with ``c`` of its ``n``
  tasks completed is ``1 - 2**-j * (1 - c / (2 n))`` of the step (Spark does not say how many jobs a
  step will run, so each job takes half of what remains). Rounds and task counts are functions of
  the public parameters and of the input's partitioning, never of a value of the data.
* **Failures.** An exception from Spark while the release runs (a task that failed on an executor:
  a Python UDF of the DataFrame raising, a cast of a value that does not fit, a file gone) becomes
  dpsql's :class:`~dpsql.core.errors.InputError`, as a data failure is on DuckDB, naming Spark's
  exception class and error condition but not its message, which may quote a value of the data.
  Nothing is charged: the charge follows the release.
* **Logs.** Spark also writes a failed task's message to its logs, on the driver's console in local mode
  (the executor's "Exception in task", the scheduler's "Lost task", PySpark's query-context logger), and
  that message may quote a value of the data. While a release runs, :func:`quiet_failure_logs` turns those
  loggers off in the driver's JVM (:data:`FAILURE_LOGGERS`) and in Python (:data:`PYTHON_FAILURE_LOGGERS`),
  and restores their levels after the last concurrent release ends. Executors on other machines keep their
  own logs (the cluster's, not the release's output); Spark Connect's server keeps its own.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from typing import Any, Callable, Iterator, Optional

from dpsql.core.errors import InputError, ParameterError
from dpsql.core.runner import Reporter

__all__ = ["check_progress", "tracking", "step", "spark_failure", "quiet_failure_logs", "FAILURE_LOGGERS",
           "PYTHON_FAILURE_LOGGERS"]

Progress = Callable[[float], None]

# The modules of the exceptions Spark raises for work the engine did (classic PySpark's captured JVM
# exceptions, Spark Connect's, Py4J's for the others): PySpark's own argument errors are not among them.
_ENGINE_MODULES = ("pyspark.errors.exceptions.captured", "pyspark.errors.exceptions.connect", "py4j.protocol")
_JOB_GROUP = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
_active = threading.local()  # the tracker of the release running on this thread

# The driver JVM's loggers that write a failed task's message (executor, scheduler, the Python runners), and
# PySpark's Python loggers that write a captured exception's message as it is raised.
FAILURE_LOGGERS = ("org.apache.spark.executor", "org.apache.spark.scheduler", "org.apache.spark.api.python",
                   "org.apache.spark.sql.execution.python")
PYTHON_FAILURE_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
_quiet_lock = threading.Lock()
_quiet: dict[str, Any] = {"releases": 0, "jvm": None, "levels": {}, "python": {}}


def check_progress(progress: object) -> Optional[Progress]:
    """``progress`` is None or a function of one number (DuckDB's ``dpsql.set_union`` checks the same)."""
    if progress is not None and not callable(progress):
        raise ParameterError(f"progress must be a function of one number (0-100) or None (got {progress!r})")
    return progress


def spark_failure(exc: BaseException) -> Optional[InputError]:
    """The dpsql error a Spark failure ``exc`` is reported as, None if ``exc`` is not one (e.g. dpsql's own)."""
    kind = type(exc)
    if not kind.__module__.startswith(_ENGINE_MODULES):
        return None
    condition = None
    getter = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    if callable(getter):
        try:
            condition = getter()
        except Exception:  # a condition is a bonus: the class name is enough
            condition = None
    named = kind.__name__ + (f" [{condition}]" if isinstance(condition, str) and condition.isidentifier() else "")
    return InputError(f"dpsql: Spark failed while computing the release ({named}); nothing was released or "
                      f"charged. Spark's message is not shown: it may quote a value of the data. Run an action "
                      f"on the DataFrame itself (e.g. its count()) to see it")


class _Tracker:
    """The job group of one release and the share of it done (see the module docstring)."""

    def __init__(self, sc: Any, reporter: Reporter):
        self.sc, self.reporter = sc, reporter
        self.group = f"dpsql-release-{uuid.uuid4().hex}"
        self._lock = threading.Lock()
        self._base, self._span = 0.0, 1.0
        self._before: set[int] = set()  # the group's jobs of the steps already done
        self._succeeded: set[int] = set()  # the group's jobs known to have succeeded (polling thread only)

    def step(self, done: int, total: int) -> None:
        jobs = self._jobs()
        with self._lock:
            self._base, self._span = done / total, 1.0 / total
            self._before = set(jobs)
        self.reporter.fraction(self._base)

    def _jobs(self) -> list[int]:
        try:
            return list(self.sc.statusTracker().getJobIdsForGroup(self.group))
        except Exception:  # progress is best effort; the release's own error wins
            return []

    def _within(self, jobs: list[int]) -> float:
        """The share of the current step done: job j (0-based) with c of n tasks done is 1 - 2^-j (1 - c/2n)."""
        tracker = self.sc.statusTracker()
        done, current = 0, 0.0
        for job in sorted(jobs):
            if job in self._succeeded:  # asked once: a poll asks only about the jobs still running
                done += 1
                continue
            info = tracker.getJobInfo(job)
            if info is None:
                continue
            if info.status == "SUCCEEDED":
                self._succeeded.add(job)
                done += 1
                continue
            tasks = completed = 0
            for stage in info.stageIds:
                s = tracker.getStageInfo(stage)
                if s is not None:
                    tasks, completed = tasks + s.numTasks, completed + s.numCompletedTasks
            if tasks:
                current = max(current, completed / tasks)
        return 1.0 - 0.5 ** done * (1.0 - current / 2.0)

    def poll(self) -> None:
        jobs = self._jobs()
        with self._lock:
            base, span, before = self._base, self._span, self._before
        try:
            within = self._within([j for j in jobs if j not in before])
        except Exception:
            within = 0.0
        self.reporter.fraction(min(1.0, base + span * within))
        self.reporter.poll()


def step(done: int, total: int) -> None:
    """The release running on this thread has done ``done`` of its ``total`` steps (public counts: rounds)."""
    tracker = getattr(_active, "tracker", None)
    if tracker is not None and total > 0:
        tracker.step(min(max(done, 0), total), total)


@contextlib.contextmanager
def _job_group(sc: Any, group: str) -> Iterator[None]:
    """Jobs started by this thread in the block belong to ``group``; the caller's job group is back after."""
    previous = [sc.getLocalProperty(key) for key in _JOB_GROUP]
    sc.setJobGroup(group, "dpsql release")
    try:
        yield
    finally:
        for key, value in zip(_JOB_GROUP, previous):
            sc.setLocalProperty(key, value)


def _jvm(session: Any) -> Any:
    try:
        return session.sparkContext._jvm
    except Exception:  # Spark Connect: no driver JVM here
        return None


def _set_jvm_levels(jvm: Any, levels: dict[str, Any]) -> None:
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    for name, level in levels.items():
        configurator.setLevel(name, level)


def _python_loggers() -> dict[str, logging.Logger]:
    """PySpark's loggers of :data:`PYTHON_FAILURE_LOGGERS`, made as PySpark makes them (its ``PySparkLogger``:
    PySpark calls them with keywords a plain ``logging.Logger`` refuses); none before PySpark 4."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:
        return {}
    return {name: PySparkLogger.getLogger(name) for name in PYTHON_FAILURE_LOGGERS}


@contextlib.contextmanager
def quiet_failure_logs(session: Any) -> Iterator[None]:
    """Within the block, the loggers that would write a failed task's message (module docstring) are off.

    Counted across threads: the first release to enter turns them off, the last to leave restores each
    logger's level as it found it. Best effort on the JVM side (a session without a log4j 2 driver JVM, e.g.
    Spark Connect, keeps its logs); the Python loggers are always turned off.
    """
    with _quiet_lock:
        if _quiet["releases"] == 0:
            jvm = _jvm(session)
            levels: dict[str, Any] = {}
            if jvm is not None:
                try:
                    manager = jvm.org.apache.logging.log4j.LogManager
                    levels = {name: manager.getLogger(name).getLevel() for name in FAILURE_LOGGERS}
                    _set_jvm_levels(jvm, {name: jvm.org.apache.logging.log4j.Level.OFF for name in levels})
                except Exception:  # no log4j 2 API reachable: nothing was changed
                    jvm, levels = None, {}
            python = _python_loggers()
            _quiet.update(jvm=jvm, levels=levels, python={name: lg.disabled for name, lg in python.items()})
            for lg in python.values():
                lg.disabled = True
        _quiet["releases"] += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet["releases"] -= 1
            if _quiet["releases"] == 0:
                for name, lg in _python_loggers().items():
                    lg.disabled = _quiet["python"].get(name, lg.disabled)
                if _quiet["jvm"] is not None:
                    try:
                        _set_jvm_levels(_quiet["jvm"], _quiet["levels"])
                    except Exception:  # the JVM went away with its session: nothing left to restore
                        pass
                _quiet.update(jvm=None, levels={}, python={})


def _context(session: Any) -> Any:
    try:
        return session.sparkContext
    except Exception:  # Spark Connect: no driver-side context, no status tracker
        return None


@contextlib.contextmanager
def tracking(session: Any, progress: Optional[Progress] = None, *, interval: float = 0.5) -> Iterator[None]:
    """Run a release's Spark jobs in the block: progress to ``progress``, Spark failures as dpsql's (module docstring).

    ``progress`` is called from this thread and from the polling thread, never at once.
    """
    try:
        with quiet_failure_logs(session), _tracked(session, progress, interval):
            yield
    except Exception as exc:
        mapped = spark_failure(exc)
        if mapped is None:
            raise
        raise mapped from None  # Spark's message (and its cause) may quote the data


@contextlib.contextmanager
def _tracked(session: Any, progress: Optional[Progress], interval: float) -> Iterator[None]:
    """The progress part of :func:`tracking`."""
    reporter = Reporter(progress) if progress is not None else None
    sc = _context(session) if reporter is not None else None
    if reporter is None or sc is None:
        yield
        return
    tracker = _Tracker(sc, reporter)
    stop = threading.Event()
    lock = threading.Lock()  # the callback is never called by two threads at once

    def poll() -> None:
        while not stop.wait(interval):
            with lock:
                tracker.poll()

    poller = threading.Thread(target=poll, name="dpsql-spark-progress", daemon=True)
    outer = getattr(_active, "tracker", None)
    _active.tracker = tracker
    try:
        with _job_group(sc, tracker.group):
            poller.start()
            yield
    finally:
        stop.set()
        if poller.is_alive():
            poller.join()
        _active.tracker = outer
    with lock:
        reporter.done()
