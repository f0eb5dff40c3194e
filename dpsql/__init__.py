"""dpsql: differentially private domain discovery as SQL inside DuckDB.

``dpsql.connect()`` / ``dpsql.register(con)`` put every dpsql UDF and TEMP macro
on a DuckDB connection; ``dpsql.set_union(con, table, method=...)`` is the Python
entry point of the set-union family.
"""
from dpsql.core.registration import connect, register, register_macros
from dpsql.union import DEFAULT_METHOD, METHODS, calibrate, set_union
from dpsql.core.errors import BudgetError, DPParameterError, DpsqlError, InputError, LedgerIOError, ParameterError
from dpsql.pws import weighted_sample  # ELEMENT-level privacy (one row), not user-level
from dpsql.topk import hitting_set, top_k, top_k_limited_domain
from dpsql.groupby import group_by
from dpsql.groupby.bigquery import sql  # BigQuery's SELECT WITH DIFFERENTIAL_PRIVACY, as one group_by release
from dpsql.core.ledger import BudgetExceededError
from dpsql.core.state import budget, releases, set_budget
from dpsql import optimize
from dpsql.optimize import subsampling

__version__ = "0.1.0"

__all__ = ["connect", "register", "register_macros", "set_union", "calibrate", "METHODS", "DEFAULT_METHOD",
           "DPParameterError", "__version__", "top_k", "hitting_set", "top_k_limited_domain", "group_by", "weighted_sample",
           "set_budget", "budget", "releases", "BudgetExceededError", "DpsqlError", "ParameterError", "InputError",
           "BudgetError", "LedgerIOError", "sql"]
