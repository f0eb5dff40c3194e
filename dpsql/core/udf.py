"""How a mechanism family declares its DuckDB UDFs.

Each family module (``dpsql.union``, ...) exposes ``udfs(source) -> list[Udf]``;
:mod:`dpsql.core.registration` registers them all as Arrow UDFs. Pure functions
(calibration, validation) must not set ``side_effects``: with constant
arguments DuckDB then evaluates them once, while planning. Anything that draws
randomness must set it, or DuckDB folds one draw into every row.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
from duckdb.sqltypes import DuckDBPyType

__all__ = ["Udf", "scalar"]


@dataclass(frozen=True)
class Udf:
    """One UDF: SQL name, Arrow body (arrays in, array out), DuckDB parameter and return types."""

    name: str
    fn: Callable[..., pa.Array]
    params: tuple[DuckDBPyType, ...]
    returns: DuckDBPyType
    side_effects: bool = False


def scalar(fn: Callable[..., Any]) -> Callable[..., pa.Array]:
    """Wrap a Python function of scalars as an Arrow UDF body (one Python call per row of the vector).

    Meant for calibration and validation functions, which DuckDB calls once per
    query with constant arguments; the per-row loop is irrelevant there.
    """

    def udf(*arrays: pa.Array) -> pa.Array:
        rows = zip(*(a.to_pylist() for a in arrays))
        return pa.array([fn(*row) for row in rows])

    udf.__name__ = fn.__name__
    # DuckDB checks the arity against the parameter types.
    setattr(udf, "__signature__", inspect.signature(fn))
    return udf
