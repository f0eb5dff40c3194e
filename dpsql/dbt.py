"""dbt-duckdb plugin: makes dpsql's table macros callable from dbt models.

Enable it in the duckdb output of ``profiles.yml``::

    plugins:
      - module: dpsql.dbt

A model can then read ``select * from dp_set_union_weighted_gaussian('{{ ref("user_items") }}')``.

Every model run that releases something is charged to the privacy ledger of
the dbt database (``<path>.dpsql-ledger``, see :mod:`dpsql.ledger`). Optional
plugin ``config``: ``ledger`` (another ledger file) and ``budget`` (a mapping
with ``epsilon``, ``delta`` and optionally ``scope``) which sets that scope's
total budget when dbt connects, so a run that would exceed it fails::

    plugins:
      - module: dpsql.dbt
        config:
          budget: {epsilon: 3.0, delta: 1.0e-5}

dbt-duckdb opens one connection and runs every model on a cursor of it. The
Python UDFs registered on the connection are shared with its cursors, but TEMP
macros belong to the one connection (or cursor) that created them, so the
macros are created again on each cursor.

This module imports dbt, so ``import dpsql`` never loads it; dbt-duckdb does.
"""
from __future__ import annotations

from typing import Any, Dict

from dbt.adapters.duckdb.plugins import BasePlugin

import dpsql
from dpsql import ledger
from dpsql.validation import DPParameterError

__all__ = ["Plugin"]


class Plugin(BasePlugin):
    """dbt-duckdb looks for a class named ``Plugin`` in the module given in the profile."""

    def initialize(self, plugin_config: Dict[str, Any]) -> None:
        unknown = set(plugin_config) - {"ledger", "budget"}
        if unknown:
            raise DPParameterError(f"dpsql.dbt plugin: unknown config keys {sorted(unknown)}; "
                                   f"use 'ledger' and/or 'budget'")
        self._ledger = plugin_config.get("ledger")
        budget = plugin_config.get("budget")
        if budget is not None and (not isinstance(budget, dict) or not {"epsilon", "delta"} <= set(budget)
                                   or set(budget) - {"epsilon", "delta", "scope"}):
            raise DPParameterError("dpsql.dbt plugin: budget must be a mapping with epsilon, delta "
                                   "and optionally scope, e.g. {epsilon: 3.0, delta: 1.0e-5}")
        self._budget = budget

    def configure_connection(self, conn) -> None:
        dpsql.register(conn, ledger=self._ledger)
        if self._budget is not None:
            ledger.set_budget(conn, self._budget["epsilon"], self._budget["delta"],
                              self._budget.get("scope", ledger.DATABASE_SCOPE))

    def configure_cursor(self, cursor) -> None:
        dpsql.register_macros(cursor)
