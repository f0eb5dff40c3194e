"""The Spark backend's ledger: every ``dpsql.frontends.spark`` release charged once, in DuckDB's ledger format.

A release on Spark is charged as one on DuckDB (:class:`dpsql.core.ledger.Ledger`):

* **Which ledger.** ``ledger=`` a path (a ledger file, e.g. the sidecar ``events.parquet.dpsql-ledger``
  that ``dpsql set-union events.parquet`` charges, shareable with ``dpsql budget ... FILE``) or a
  :class:`~dpsql.core.ledger.Ledger`; left out, the session's own in-memory ledger (:func:`session_ledger`),
  forgotten with the session, as an in-memory DuckDB database's.
* **Which scopes.** The files the DataFrame reads (``DataFrame.inputFiles()``, a local ``file:`` URI as the
  path DuckDB would charge for it, :func:`dpsql.core.ledger.file_scope`; other URIs as given), each a
  scope besides ``database``; or, with ``scope=``, that one scope (a table name in the ledger's database,
  or a file path). A DataFrame that reads no file Spark can name (made in memory, or by a source without
  files) needs ``scope=``: it is refused without one rather than charged to ``database`` alone.
* **When.** Budgets are checked before any Spark job runs (:meth:`Ledger.check_charge`), and the release is
  charged once, after its rows are computed and before they are returned (:meth:`Ledger.charge`, which
  checks again, atomically): a multi-step release (a selection, then aggregates) is one charge of its
  total. Refused then (another release spent the budget meanwhile), nothing is returned.
* **Failures and progress.** The release runs inside :func:`dpsql.frontends.spark_progress.tracking`: a
  Spark failure (e.g. a task failing on an executor) is raised as dpsql's ``InputError`` quoting no
  value of the data, and nothing is charged; ``progress`` gets the release's progress as DuckDB's does.
"""
from __future__ import annotations

import json
import os
import weakref
from typing import Any, Callable, Mapping, Optional, Union
from urllib.parse import unquote, urlparse

from dpsql.core.errors import DPParameterError
from dpsql.core.ledger import Ledger, ScopeSet, file_scope
from dpsql.core.release import calibration_text
from dpsql.frontends import spark_progress

__all__ = ["session_ledger", "ledger_for", "scopes_of", "charged"]

_SESSION_LEDGERS: "weakref.WeakKeyDictionary[Any, Ledger]" = weakref.WeakKeyDictionary()


def session_ledger(session: Any) -> Ledger:
    """The in-memory ledger of a SparkSession (made on first use): the ledger of releases given no ``ledger=``."""
    found = _SESSION_LEDGERS.get(session)
    if found is None:
        found = _SESSION_LEDGERS[session] = Ledger(None)
    return found


def ledger_for(session: Any, ledger: Union[None, str, os.PathLike, Ledger]) -> Ledger:
    """The ledger a release on ``session`` is charged to (see the module docstring)."""
    if ledger is None:
        return session_ledger(session)
    if isinstance(ledger, Ledger):
        return ledger
    if isinstance(ledger, (str, os.PathLike)) and os.fspath(ledger).strip():
        return Ledger(os.fspath(ledger))
    raise DPParameterError(f"dpsql: ledger must be a ledger file's path or a dpsql.core.ledger.Ledger, or left out "
                           f"for the session's in-memory ledger (got a {type(ledger).__name__})")


def _file_key(uri: str) -> str:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return file_scope(unquote(parsed.path) if parsed.scheme else uri)
    return uri


def scopes_of(df: Any, scope: Optional[str], ledger: Ledger) -> ScopeSet:
    """What a release of ``df`` is charged to besides ``database``: ``scope`` if given, else its input files.
    Reads the plan only (no Spark job)."""
    if scope is not None:
        if not isinstance(scope, str) or not scope.strip():
            raise DPParameterError("dpsql: scope must name a table or a file (a non-empty string), or be left out "
                                   "to charge the files the DataFrame reads")
        return ScopeSet([(ledger.scope(scope), None)])
    files = df.inputFiles()
    if not files:
        raise DPParameterError(
            "dpsql: the DataFrame reads no file Spark can name (it was made in memory, or by a source without "
            "files), so there is no scope to charge beside 'database'; pass scope='<name>' (the same name for "
            "every release of the same data, so that its budget holds)")
    return ScopeSet(sorted({(_file_key(f), None) for f in files}))


def charged(df: Any, *, ledger: Union[None, str, os.PathLike, Ledger], scope: Optional[str], mechanism: str,
            epsilon: float, delta: float, parameters: Mapping[str, Any], calibration: Any, seeded: bool,
            release: Callable[[], Any], progress: Optional[Callable[[float], None]] = None) -> Any:
    """Check the budgets, run ``release()`` (it returns the materialised result), charge once, return the result.

    Everything that can refuse the release (the ledger, the scope, the budgets) does so before
    ``release()`` starts a Spark job; a charge refused after it (the budget spent meanwhile) returns nothing.
    ``release()`` and the charge run inside :func:`dpsql.frontends.spark_progress.tracking` (``progress``,
    100 once charged; a Spark failure raised as dpsql's error, before any charge).
    """
    target = ledger_for(df.sparkSession, ledger)
    scopes = scopes_of(df, scope, target)
    target.check_charge(mechanism, str(scopes), epsilon, delta, scope=scopes)
    with spark_progress.tracking(df.sparkSession, progress):  # 100 % once charged, as on DuckDB
        result = release()
        try:
            target.charge(mechanism, "user", str(scopes), epsilon, delta, json.dumps(dict(parameters), default=repr),
                          calibration_text(calibration), seeded=seeded, scope=scopes)
        except BaseException:
            unpersist = getattr(result, "unpersist", None)
            if callable(unpersist):
                unpersist()
            raise
    return result
