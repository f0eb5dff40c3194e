"""dbt-duckdb plugin: makes dpsql's table macros callable from dbt models.

Enable it in the duckdb output of ``profiles.yml``::

    plugins:
      - module: dpsql.frontends.dbt

A model can then read (epsilon and delta are required, as in every release)::

    select * from dp_set_union_weighted_gaussian('{{ ref("user_items") }}', epsilon := 1.0, delta := 1e-5)

Every model run that releases something is charged to the privacy ledger of
the dbt database (``<path>.dpsql-ledger``, see :mod:`dpsql.core.ledger`). Optional
plugin ``config``: ``ledger`` (another ledger file) and ``budget`` (a mapping
with ``epsilon``, ``delta`` and optionally ``scope``) which sets that scope's
total budget when dbt connects, so a run that would exceed it fails::

    plugins:
      - module: dpsql.frontends.dbt
        config:
          budget: {epsilon: 3.0, delta: 1.0e-5}

Scopes. A release is charged to the ``'database'`` scope and to the scope of the
relation the model passes as ``tbl``: its catalog identity
``database.schema.table`` in lower case (:func:`dpsql.core.ledger.resolve_scope`),
where a DuckDB file's database is named after the file (``events`` for
``events.duckdb``). ``'{{ ref("user_items") }}'`` renders as
``"events"."main"."user_items"`` and charges ``events.main.user_items``, as does
a ``source()`` over the same table, and that is the scope that
``dpsql budget set events.duckdb --scope user_items`` and the plugin's
``budget: {scope: user_items}`` limit. The scope is the relation named in the
call, not its lineage: a model that releases from another model (a staging
table over ``user_items``) charges that model's scope, so bound an analyst with
the ``'database'`` scope.

Materializations. A model that calls a dpsql release must store the released
rows, so that reading it does not release again. Supported: ``table``,
``incremental`` (each run is one release of that run's input) and ``external``
(the rows are written to a file once). Refused: ``view`` and dbt-duckdb's
``table_function``, which store the query instead of its rows (every read would
run the release again, charging the budget and drawing fresh noise, and plain
DuckDB cannot read them: dpsql's macros are TEMP), and ``ephemeral``, which
dbt inlines into every model that refs it (each would run its own release).
dbt-duckdb has no plugin hook that sees a model's configuration, so the plugin
checks each statement instead: it subscribes to dbt's ``SQLQuery`` event,
which dbt fires before it executes a statement, and raises there when the
statement creates a view, macro or function whose body calls a dpsql release
(a release named in a string literal counts: ``query('...')`` runs it), or
inlines an ephemeral model (``__dbt__cte__<name>``) that calls one. The model
then fails before anything runs; nothing is released or charged. Python models
run their own queries and are not checked: read a release once there
(``session.sql(...).to_arrow_table()``), since a relation runs its query again
on each read.

dbt-duckdb opens one connection and runs every model on a cursor of it. The
Python UDFs registered on the connection are shared with its cursors, but TEMP
macros belong to the one connection (or cursor) that created them, so the
macros are created again on each cursor.

This module imports dbt, so ``import dpsql`` never loads it; dbt-duckdb does.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Optional

from dbt.adapters.duckdb.plugins import BasePlugin

import dpsql
from dpsql.core import ledger, state
from dpsql.core.sqltext import CHARGE, release_macros
from dpsql.core.validation import DPParameterError

__all__ = ["Plugin", "StoredReleaseError", "release_macros", "stored_release"]

def _call_pattern(names: Iterable[str]) -> re.Pattern:
    alternatives = "|".join(sorted((re.escape(n) for n in names), key=len, reverse=True))
    return re.compile(rf"(?<![\w$])({alternatives})\s*\(", re.IGNORECASE)


_TOKENS = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", re.DOTALL)


def _masked(sql: str) -> tuple[str, str]:
    """``(code, text)``: ``sql`` with comments and identifier quotes blanked; ``code`` also blanks strings.

    Both keep every character's position. ``code`` shows the statement's structure (a parenthesis
    in a string is no parenthesis). ``text`` keeps string literals, because ``query('...')`` runs
    the SQL in a string: a release named there is treated as a call. A quoted function name
    (``"dp_top_k"(...)``) is a call too.
    """
    code, text = list(sql), list(sql)
    for m in _TOKENS.finditer(sql):
        first, last = m.start(), m.end() - 1
        if m.group(0)[0] in "-/":
            blank = range(first, last + 1)
            code[first:last + 1] = text[first:last + 1] = [" "] * len(blank)
        elif m.group(0)[0] == "'":
            code[first + 1:last] = [" "] * (last - first - 1)
        else:  # "identifier": drop the quotes (a doubled quote inside becomes two spaces)
            for i in range(first, last + 1):
                if sql[i] == '"':
                    code[i] = text[i] = " "
    return "".join(code), "".join(text)


# A statement that stores a query to be run on each read: a view, or a macro / function (dbt-duckdb's
# table_function materialization creates one).
_STORED_QUERY = re.compile(r"\s*create\s+(?:or\s+replace\s+)?(?:(?:temp|temporary)\s+)?(view|macro|function)\b",
                           re.IGNORECASE)
# dbt inlines an ephemeral model into each model that refs it as the CTE __dbt__cte__<model name>.
_EPHEMERAL_CTE = re.compile(r"__dbt__cte__(\w+)\s+as\s*\(", re.IGNORECASE)


def _parenthesised(code: str, start: int) -> str:
    """The text from ``start`` (just after an opening parenthesis) to its matching close."""
    depth = 1
    for i in range(start, len(code)):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            depth -= 1
            if depth == 0:
                return code[start:i]
    return code[start:]


def stored_release(sql: str, releases: Iterable[str]) -> Optional[str]:
    """Why ``sql`` would store a release to be run again on each read, or None if it does not.

    ``releases`` are the release macro names (:func:`release_macros`).
    """
    code, text = _masked(sql)
    calls = _call_pattern(releases)
    first = calls.search(text)
    if first is None:
        return None
    stored = _STORED_QUERY.match(code)
    if stored:
        kind = "a view" if stored.group(1).lower() == "view" else f"a {stored.group(1).lower()} (table_function)"
        return (f"creates {kind} whose query calls the release {first.group(1)}: every read of it would run the "
                f"release again, charging the budget and drawing fresh noise each time, and plain DuckDB cannot "
                f"read it (dpsql's macros are TEMP)")
    for cte in _EPHEMERAL_CTE.finditer(code):
        body = _parenthesised(code, cte.end())
        found = calls.search(text, cte.end(), cte.end() + len(body))
        if found:
            return (f"inlines the ephemeral model {cte.group(1)}, which calls the release {found.group(1)}: every "
                    f"model that refs it would run a release of its own, charging the budget and drawing fresh "
                    f"noise each time")
    return None


class StoredReleaseError(DPParameterError):
    """A dbt statement would store a dpsql release as a query (view, table_function, ephemeral)."""


class Plugin(BasePlugin):
    """dbt-duckdb looks for a class named ``Plugin`` in the module given in the profile."""

    def initialize(self, plugin_config: Dict[str, Any]) -> None:
        unknown = set(plugin_config) - {"ledger", "budget"}
        if unknown:
            raise DPParameterError(f"dpsql.frontends.dbt plugin: unknown config keys {sorted(unknown)}; "
                                   f"use 'ledger' and/or 'budget'")
        self._ledger = plugin_config.get("ledger")
        budget = plugin_config.get("budget")
        if budget is not None and (not isinstance(budget, dict) or not {"epsilon", "delta"} <= set(budget)
                                   or set(budget) - {"epsilon", "delta", "scope"}):
            raise DPParameterError("dpsql.frontends.dbt plugin: budget must be a mapping with epsilon, delta "
                                   "and optionally scope, e.g. {epsilon: 3.0, delta: 1.0e-5}")
        self._budget = budget
        self._releases: frozenset[str] = frozenset({CHARGE})

    def configure_connection(self, conn) -> None:
        dpsql.register(conn, ledger=self._ledger)
        if self._budget is not None:
            state.set_budget(conn, self._budget["epsilon"], self._budget["delta"],
                              self._budget.get("scope", ledger.DATABASE_SCOPE))
        self._releases = release_macros(conn)
        self._subscribe()

    def configure_cursor(self, cursor) -> None:
        dpsql.register_macros(cursor)
        # dbt clears its event callbacks at the start of each command, while dbt-duckdb may keep
        # the connection (and this plugin) across commands in one process: subscribe again.
        self._subscribe()

    def _subscribe(self) -> None:
        try:
            from dbt_common.events.event_manager_client import get_event_manager
            manager = get_event_manager()
        except ImportError:  # dbt-common before 1.1
            # the same event manager, where older dbt-common keeps it
            from dbt_common.events.functions import EVENT_MANAGER as manager  # type: ignore[no-redef]
        if self.check_event not in manager.callbacks:
            manager.add_callback(self.check_event)

    def check_event(self, msg) -> None:
        """dbt event callback: refuse a statement that would store a release (see the module docstring)."""
        if getattr(getattr(msg, "info", None), "name", None) != "SQLQuery":
            return
        reason = stored_release(msg.data.sql, self._releases)
        if reason is None:
            return
        node = msg.data.node_info
        model = node.unique_id or node.node_name or "a statement"
        how = f" (materialized='{node.materialized}')" if node.materialized else ""
        raise StoredReleaseError(
            f"dpsql: {model}{how} {reason}. Materialize the model that calls the release as a table (or "
            f"incremental): {{{{ config(materialized='table') }}}}; nothing was released or charged")
