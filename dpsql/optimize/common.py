"""Pieces the optimisation mechanisms share: parameter checks, the set system on compact ids, the macro runner.

Nothing here releases anything.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.core.errors import InputError, engine_errors
from dpsql.core.validation import DELTA_MIN, K_LIMIT, DPParameterError, check_k, check_identifier, check_table_name, sql_string



# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

def check_failure_probability(failure_probability: object) -> float:
    """A failure probability (of a utility guarantee) strictly between 0 and 1."""
    value = failure_probability
    if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not 0.0 < float(value) < 1.0:
        raise DPParameterError(f"failure_probability must be a probability with 0 < failure_probability < 1 "
                               f"(got {value!r}), e.g. failure_probability := 0.05")
    if float(value) < DELTA_MIN:  # ln(1/failure_probability) enters the round counts; a subnormal one overflows them
        raise DPParameterError(f"failure_probability must be >= {DELTA_MIN:g} (got {value!r}), "
                               f"e.g. failure_probability := 0.05")
    return float(value)


# The name before the parameter was renamed (beta now means MAD's sigma multiple only).
check_beta = check_failure_probability


# ceil(4/eta) passes of the continuous greedy: eta below this would mean more than 10,000 passes.
ETA_MIN = 4e-4


def check_eta(eta: object) -> float:
    """The approximation slack of matroid coverage: ETA_MIN <= eta < 1."""
    eta = _check_positive_param("eta", eta, "it is the approximation slack, e.g. eta := 0.2")
    if eta >= 1:
        raise DPParameterError(f"eta must be < 1 (got {eta!r}); e.g. eta := 0.2")
    if eta < ETA_MIN:
        raise DPParameterError(f"eta must be >= {ETA_MIN:g} (got {eta!r}): it runs ceil(4/eta) passes; e.g. eta := 0.2")
    return eta


def _check_positive_param(name: str, value: object, hint: str) -> float:
    if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(float(value)) or float(value) <= 0:
        raise DPParameterError(f"{name} must be a finite number > 0 (got {value!r}); {hint}")
    return float(value)


# --------------------------------------------------------------------------
# Compact arrays: a set system on dense integer ids
# --------------------------------------------------------------------------

def _ids(values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise DPParameterError(f"{name} must be dense ids >= 0")
    return arr


def _csr(rows: np.ndarray, cols: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the 0/1 matrix with ones at (rows, cols)."""
    order = np.argsort(rows, kind="stable")
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return indptr, cols[order]


def _gather(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenation of the CSR rows ``rows`` (vectorised)."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return indices[:0]
    starts, ends = indptr[rows], indptr[rows + 1]
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return indices[:0]
    shift = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return indices[shift + np.arange(total)]


def _dedupe(a: np.ndarray, b: np.ndarray, n_b: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (a, b) pairs sorted by (a, b). Sort + diff: numpy's hash-based unique was ~20x slower here."""
    keys = a * np.int64(max(n_b, 1)) + b
    keys.sort()
    if keys.size:
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    return keys // max(n_b, 1), keys % max(n_b, 1)


class _Coverage:
    """A set system on compact ids: set->elements and element->sets CSR (duplicate pairs removed)."""

    def __init__(self, set_idx, elem_idx, n_sets: int, n_elems: int):
        set_idx, elem_idx = _ids(set_idx, "set ids"), _ids(elem_idx, "element ids")
        if set_idx.size != elem_idx.size:
            raise DPParameterError("set ids and element ids must have the same length")
        if set_idx.size and (set_idx.max() >= n_sets or elem_idx.max() >= n_elems):
            raise DPParameterError("ids out of range of n_sets / n_elems")
        self.n_sets, self.n_elems = int(n_sets), int(n_elems)
        self.set_idx, self.elem_idx = _dedupe(set_idx, elem_idx, self.n_elems)
        # pairs come sorted by set: the set->elements CSR needs no second sort
        self.set_ptr = np.zeros(self.n_sets + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.set_idx, minlength=self.n_sets), out=self.set_ptr[1:])
        self.set_elems = self.elem_idx
        self.elem_ptr, self.elem_sets = _csr(self.elem_idx, self.set_idx, self.n_elems)

    def restrict(self, keep_elems: np.ndarray) -> "_Coverage":
        """The same sets over the kept elements only (a Poisson subsample)."""
        rows = keep_elems[self.elem_idx]
        return _Coverage(self.set_idx[rows], self.elem_idx[rows], self.n_sets, self.n_elems)

    def sizes(self, alive: Optional[np.ndarray] = None) -> np.ndarray:
        """|S_i ∩ alive| per set (alive = boolean mask over elements; None = all)."""
        rows = self.set_idx if alive is None else self.set_idx[alive[self.elem_idx]]
        return np.bincount(rows, minlength=self.n_sets).astype(np.int64)

    def cover(self, s: int, covered: np.ndarray, gains: Optional[np.ndarray] = None,
              alive: Optional[np.ndarray] = None) -> np.ndarray:
        """Mark S_s covered; decrement ``gains`` of every set holding a newly covered (alive) element."""
        elems = self.set_elems[self.set_ptr[s]:self.set_ptr[s + 1]]
        new = elems[~covered[elems]]
        covered[new] = True
        if gains is not None:
            counted = new if alive is None else new[alive[new]]
            gains -= np.bincount(_gather(self.elem_ptr, self.elem_sets, counted), minlength=self.n_sets)
        return new


# --------------------------------------------------------------------------
# Running the macros (the Python release functions) and reading the UDFs' inputs
# --------------------------------------------------------------------------

def _columns(con: duckdb.DuckDBPyConnection, table: str, **cols: str) -> None:
    table = check_table_name(table)
    try:
        names = {str(r[0]).lower() for r in
                 con.execute(f"SELECT name FROM pragma_table_info({sql_string(table)})").fetchall()}
    except duckdb.CatalogException:
        raise DPParameterError(f"table {table!r} does not exist (create it or a view of your data first)") from None
    for param, col in cols.items():
        check_identifier(param, col)
        if col.lower() not in names:
            raise DPParameterError(f"{param} := {col!r} is not a column of {table!r}; its columns are "
                                   f"{', '.join(sorted(names))}")


def _literal(value: Optional[float]) -> str:
    """A validated number (or None) as a SQL literal: the macros see constants, never a column or a subquery."""
    return "NULL" if value is None else repr(float(value))


def _release(con: duckdb.DuckDBPyConnection, call: str) -> pa.Table:
    """Run one releasing macro (it validates, charges once and orders its rows) and return its rows in order."""
    with engine_errors():  # dpsql's own exception (e.g. BudgetExceededError), not duckdb's wrapper
        return con.sql(f"FROM {call}").to_arrow_table()


def _flat(arr: pa.Array, i: int, dtype=np.int64, what: str = "id") -> np.ndarray:
    """Row ``i`` of a LIST column as a numpy array (empty for NULL); a NULL element is an error."""
    value = arr[i]
    if not value.is_valid or value.values is None:
        return np.zeros(0, dtype=dtype)
    flat = value.values
    if flat.null_count:
        raise InputError(f"dpsql: NULL {what} in an optimisation input list")
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=dtype)


def _scalars(arr: pa.Array) -> list:
    values = arr.to_pylist()
    if any(v is None for v in values):
        raise InputError("dpsql: a size or parameter of an optimisation UDF is NULL")
    return values


_INTEGER_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
                            "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT"})


def check_key_types(name: str, private_type: str, common_type: str) -> bool:
    """A private key column may be joined with a public one when converting it to their common type cannot fail.

    ``private_type`` is the private column's type and ``common_type`` the type
    both sides take in the join (DuckDB's UNION type). A failing conversion
    would raise an error quoting a private value after the charge; the safe
    ones are none, any type to VARCHAR, integer widening and an integer or
    FLOAT to DOUBLE. Anything else is refused before the charge.
    """
    safe = (private_type == common_type or common_type == "VARCHAR"
            or (private_type in _INTEGER_TYPES and common_type in _INTEGER_TYPES)
            or ((private_type in _INTEGER_TYPES or private_type == "FLOAT") and common_type == "DOUBLE"))
    if not safe:
        raise DPParameterError(
            f"dpsql: {name} has type {private_type} in the private table, and joining it with the public table "
            f"would convert it to {common_type}, which can fail on a value; give both columns the same type "
            f"(e.g. a view with CAST) and try again; nothing was read or charged")
    return True
