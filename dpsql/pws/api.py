"""The PWS family's Python release function (runs its SQL macro, which charges the ledger once)."""
from __future__ import annotations

from typing import Optional

import pyarrow as pa

from dpsql.core.errors import engine_errors
from dpsql.pws.params import check_pws_parameters
from dpsql.pws.sanitizer import check_frequency_range
from dpsql.core.validation import check_identifier, check_table_name, sql_string
from dpsql.core.inputs import accepts_tables


@accepts_tables("table")
def weighted_sample(con, table: str, *, epsilon: float, delta: float, tau: Optional[float] = None,
                    scheme: str = "ppswor", power: float = 1.0, with_frequencies: bool = False,
                    key_col: str = "key", freq_col: Optional[str] = None) -> pa.Table:
    """(epsilon, delta)-DP private weighted sample of ``table`` -- ELEMENT-level privacy, NOT user-level.

    Runs ``dp_weighted_sample`` on a connection prepared by :func:`dpsql.register`; returns Arrow columns
    ``key`` and ``token`` (NULL for keys only), rows sorted by key (the macro's ORDER BY: an order that depends
    on the released keys only). Every parameter is validated before the table is read or the budget charged.
    """
    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    check_frequency_range(epsilon, delta, tau, scheme, power, bool(with_frequencies))
    table = check_table_name(table)
    key_col = check_identifier("key_col", key_col)
    freq = "NULL" if freq_col is None else sql_string(check_identifier("freq_col", freq_col))
    sql = (f"SELECT key, token FROM dp_weighted_sample({sql_string(table)}, {epsilon!r}, {delta!r}, "
           f"tau := {'NULL' if tau is None else repr(tau)}, scheme := {sql_string(scheme)}, power := {power!r}, "
           f"with_frequencies := {'true' if with_frequencies else 'false'}, key_col := {sql_string(key_col)}, "
           f"freq_col := {freq})")
    with engine_errors():  # dpsql's own exception (e.g. BudgetExceededError), not duckdb's wrapper
        return con.sql(sql).to_arrow_table()
