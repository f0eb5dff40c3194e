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

from typing import Any, Dict, Iterable, Iterator, Optional

from dbt.adapters.duckdb.plugins import BasePlugin

import dpsql
from dpsql.core import ledger, state
from dpsql.core.sqltext import CHARGE, Token, called, release_macros, tokens
from dpsql.core.validation import DPParameterError

__all__ = ["Plugin", "StoredReleaseError", "release_macros", "stored_release"]

# A statement that stores a query to be run on each read: a view, or a macro / function (dbt-duckdb's
# table_function materialization creates one). dbt inlines an ephemeral model into each model that refs it
# as the CTE __dbt__cte__<model name>.
_STORED_KINDS = ("view", "macro", "function")
_EPHEMERAL_PREFIX = "__dbt__cte__"


def _name(tok: Token) -> str:
    text = tok.text
    return (text[1:-1].replace('""', '"') if len(text) > 1 and text.startswith('"') else text).lower()


def _stored_kind(toks: list[Token]) -> Optional[str]:
    """``view``, ``macro`` or ``function`` if the statement creates one (CREATE [OR REPLACE] [TEMP] ...)."""
    words = [_name(t) for t in toks[:6]]
    if words[:1] != ["create"]:
        return None
    i = 3 if words[1:3] == ["or", "replace"] else 1
    i += 1 if words[i:i + 1] in (["temp"], ["temporary"]) else 0
    return words[i] if words[i:i + 1] and words[i] in _STORED_KINDS else None


def _ephemeral_models(sql: str, toks: list[Token]) -> Iterator[tuple[str, str]]:
    """``(model, text)`` of each ephemeral model's CTE ``__dbt__cte__<model> as (text)`` in the statement."""
    for i, tok in enumerate(toks[:-2]):
        name = _name(tok)
        if (tok.kind == "identifier" and name.startswith(_EPHEMERAL_PREFIX) and _name(toks[i + 1]) == "as"
                and toks[i + 2].text == "("):
            depth, end = 0, len(sql)
            for later in toks[i + 2:]:  # a parenthesis inside a string is part of its one token
                depth += (later.text == "(") - (later.text == ")")
                if depth == 0:
                    end = later.start
                    break
            yield name[len(_EPHEMERAL_PREFIX):], sql[toks[i + 2].end:end]


def stored_release(sql: str, releases: Iterable[str]) -> Optional[str]:
    """Why ``sql`` would store a release to be run again on each read, or None if it does not.

    ``releases`` are the release macro names (:func:`release_macros`); a call is found as
    :func:`dpsql.core.sqltext.called` finds it (a name before ``(``, in SQL or in a string: ``query('...')``
    runs the SQL in a string).
    """
    names = frozenset(n.lower() for n in releases)
    first = called(sql, names)
    if first is None:
        return None
    toks = [t for t in tokens(sql) if t.kind != "comment"]
    kind = _stored_kind(toks)
    if kind is not None:
        what = "a view" if kind == "view" else f"a {kind} (table_function)"
        return (f"creates {what} whose query calls the release {first}: every read of it would run the "
                f"release again, charging the budget and drawing fresh noise each time, and plain DuckDB cannot "
                f"read it (dpsql's macros are TEMP)")
    for model, text in _ephemeral_models(sql, toks):
        found = called(text, names)
        if found:
            return (f"inlines the ephemeral model {model}, which calls the release {found}: every "
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
