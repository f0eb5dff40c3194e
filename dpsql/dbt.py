"""dbt-duckdb plugin: makes dpsql's table macros callable from dbt models.

Enable it in the duckdb output of ``profiles.yml``::

    plugins:
      - module: dpsql.dbt

A model can then read ``select * from dp_set_union_weighted_gaussian({{ ref('user_items') }})``.

dbt-duckdb opens one connection and runs every model on a cursor of it. The
Python UDFs registered on the connection are shared with its cursors, but TEMP
macros belong to the one connection (or cursor) that created them, so the
macros are created again on each cursor.

This module imports dbt, so ``import dpsql`` never loads it; dbt-duckdb does.
"""
from __future__ import annotations

from dbt.adapters.duckdb.plugins import BasePlugin

import dpsql

__all__ = ["Plugin"]


class Plugin(BasePlugin):
    """dbt-duckdb looks for a class named ``Plugin`` in the module given in the profile."""

    def configure_connection(self, conn) -> None:
        dpsql.register(conn)

    def configure_cursor(self, cursor) -> None:
        dpsql.register_macros(cursor)
