"""Shared fixtures. Tests never need ../shared: tests on real data skip when it is absent.

The tests live in one folder per room of the package (core, union, topk, groupby, pws, optimize,
frontends, tools), plus ``conformance`` (the checks every declared mechanism passes) and ``docs``.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

import dpsql
from dpsql.core.registration import source_of


# A test module may reuse another room's data or checks by module name (``import test_release``; pytest
# puts only the module's own folder on sys.path): every room's folder is importable.
sys.path[:0] = [str(p) for p in sorted(Path(__file__).resolve().parent.iterdir())
                if p.is_dir() and p.name.isidentifier() and str(p) not in sys.path]


# CI installs each extra into its own virtualenv and sets DPSQL_REQUIRE to the extras (and tools, e.g.
# tmux) it installed:
# there a test that skips because its extra is missing fails instead (a skip would hide a dependency
# the extra forgot to declare). The words identify the skip reasons of each extra's tests.
_EXTRA_SKIP_WORDS = {"dbt": ("dbt",), "fast": ("numba",), "plot": ("matplotlib",),
                     "spark": ("pyspark", "sqlglot", "java", "spark"), "tmux": ("tmux",),
                     "notebook": ("notebook", "jupysql", "ipython")}
_MISSING = ("not installed", "could not import", "no module", "not available", "no java", "not found")


def _required_but_skipped(report) -> str | None:
    """The DPSQL_REQUIRE extra a skip report blames on a missing package, if any."""
    required = [e for e in os.environ.get("DPSQL_REQUIRE", "").split(",") if e]
    if not (report.skipped and required):
        return None
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr).lower()
    if not any(phrase in reason for phrase in _MISSING):
        return None  # skipped for another reason (e.g. no shared data), not for a missing extra
    for extra in required:
        if any(word in reason for word in _EXTRA_SKIP_WORDS.get(extra, (extra,))):
            return f"DPSQL_REQUIRE={extra}: this test skipped although the extra is installed: {reason}"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    failure = _required_but_skipped(report)
    if failure:
        report.outcome, report.longrepr = "failed", failure


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # a module that skips as a whole (pytest.importorskip at its top) is held to DPSQL_REQUIRE too
    outcome = yield
    report = outcome.get_result()
    failure = _required_but_skipped(report)
    if failure:
        report.outcome, report.longrepr = "failed", failure


# CI runs the suite in two installs (.ci/run): the core one, then the one with every extra. A test that
# passed in the core install, with the same version of every package it runs on (.ci/run checks that),
# proves nothing new in the other. DPSQL_RECORD_SKIPPED=FILE: the core run writes there the tests it
# skipped (those that need an extra); DPSQL_ONLY_SKIPPED=FILE: the full run keeps only those and the
# `slow` tests (which the core run leaves out), and deselects the rest.
_SKIPPED: set[str] = set()


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get("DPSQL_RECORD_SKIPPED"):
        _SKIPPED.add(report.nodeid)


def pytest_collectreport(report):
    # a module that skips as a whole (pytest.importorskip at its top): its node id is the file's
    if report.skipped and os.environ.get("DPSQL_RECORD_SKIPPED"):
        _SKIPPED.add(report.nodeid)


def pytest_sessionfinish(session):
    path = os.environ.get("DPSQL_RECORD_SKIPPED")
    if path and not hasattr(session.config, "workerinput"):  # the controller has every worker's reports
        Path(path).write_text("".join(f"{nodeid}\n" for nodeid in sorted(_SKIPPED)))


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("DPSQL_ONLY_SKIPPED")
    if not path:
        return
    wanted = set(Path(path).read_text().splitlines())
    def kept(item) -> bool:
        return (item.nodeid in wanted or item.nodeid.split("::")[0] in wanted
                or item.get_closest_marker("slow") is not None)
    keep = [item for item in items if kept(item)]
    dropped = [item for item in items if not kept(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def shared_data_dir() -> Path | None:
    """The real datasets (../shared/data next to the checkout), or DPSQL_SHARED_DATA; None if absent."""
    env = os.environ.get("DPSQL_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path
    return None


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("the real datasets (../shared/data) are not available")
    return path


def seeded(seed: int):
    """A reproducible (NOT private) connection, without the expected warning in the test output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return dpsql.connect(seed=seed)


@pytest.fixture
def con():
    """A private (OS-entropy) connection."""
    c = dpsql.connect()
    yield c
    c.close()


@pytest.fixture
def seeded_con():
    c = seeded(20261122)
    yield c
    c.close()


def registered_signature(con, name: str) -> list[tuple[str, str, str | None]]:
    """``(name, type, default as SQL text or None)`` of each parameter of the table macro ``name`` as
    DuckDB holds it on ``con``.

    ``duckdb_functions()`` lists a macro's parameter names and types but not their defaults; DuckDB's
    binder prints the whole signature (its own rendering of the catalog entry) when a call does not
    bind, so a call without arguments makes DuckDB report it.
    """
    import duckdb

    from dpsql.core import sqltext

    with pytest.raises(duckdb.BinderException) as info:
        con.execute(f"FROM {name}()")
    text = str(info.value)
    head = f"\n\t{name}("
    assert head in text, f"DuckDB did not list the signature of {name}: {text}"
    line = text[text.index(head) + len(head):].split("\n", 1)[0]
    assert line.endswith(")"), line
    rows = con.execute("SELECT parameters, parameter_types FROM duckdb_functions() WHERE function_name = ? "
                       "AND function_type = 'table_macro'", [name]).fetchall()
    assert len(rows) == 1, name
    reported = [(p.name, p.type, p.default) for p in sqltext.parameters(line[:-1])]
    assert [(n, t) for n, t, _ in reported] == list(zip(*rows[0])), (name, reported)
    return reported


def same_value(con, a: str, b: str, sql_type: str) -> bool:
    """Whether the SQL expressions ``a`` and ``b`` are the same value of ``sql_type``, by DuckDB."""
    ((same,),) = con.execute(f"SELECT CAST({a} AS {sql_type}) IS NOT DISTINCT FROM CAST({b} AS {sql_type})").fetchall()
    return bool(same)


class LockstepPair:
    """Two connections seeded alike, reused by every example of a hypothesis test, whose streams are
    kept at the same point: the n-th query on one draws the same secret salt (the same cap) as the
    n-th on the other, as the first queries of two fresh connections with one seed do. (Opening two
    connections per example was most of these tests' time.)

    :meth:`get` re-aligns the pair before each example: the connection that has drawn fewer values
    draws salts until both have drawn as many, then both draw one more salt and compare them. If they
    differ (say an example failed between its two queries), a fresh pair replaces the old one."""

    def __init__(self, seed: int):
        self.seed = seed
        self.pair: tuple | None = None

    def get(self) -> tuple:
        if self.pair is not None and not self._in_step():
            self.close()
        if self.pair is None:
            self.pair = (seeded(self.seed), seeded(self.seed))
        return self.pair

    def _in_step(self) -> bool:
        a, b = self.pair
        sa, sb = source_of(a), source_of(b)
        if abs(sa.samples_drawn - sb.samples_drawn) > 8:
            return False
        for con, mine, other in ((a, sa, sb), (b, sb, sa)):
            while mine.samples_drawn < other.samples_drawn:
                con.execute("SELECT dp__secret_salt()").fetchall()
        return a.execute("SELECT dp__secret_salt()").fetchall() == b.execute("SELECT dp__secret_salt()").fetchall()

    def close(self) -> None:
        for c in self.pair or ():
            c.close()
        self.pair = None
