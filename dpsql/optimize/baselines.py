"""NOT private: the non-private baselines and evaluations of the optimisation family.

Each reads raw data and returns exact values: for measuring the private mechanisms' utility only.
"""
from __future__ import annotations

from typing import Sequence

import duckdb
import numpy as np

from dpsql.optimize.common import _columns, _Coverage
from dpsql.core.validation import sql_string


def nonprivate_greedy_coverage(set_idx, elem_idx, n_sets: int, n_elems: int, k: int) -> list[int]:
    """Classic greedy max k-coverage (largest marginal gain, lowest id on ties). NOT private."""
    cov = _Coverage(set_idx, elem_idx, n_sets, n_elems)
    gains = cov.sizes()
    covered = np.zeros(cov.n_elems, dtype=bool)
    chosen: list[int] = []
    for _ in range(min(int(k), cov.n_sets)):
        g = gains.astype(np.float64)
        g[chosen] = -np.inf
        c = int(np.argmax(g))
        chosen.append(c)
        cov.cover(c, covered, gains)
    return chosen


def coverage_value(set_idx, elem_idx, n_sets: int, n_elems: int, chosen: Sequence[int]) -> int:
    """Number of elements covered by the sets ``chosen`` (evaluation; NOT private)."""
    cov = _Coverage(set_idx, elem_idx, n_sets, n_elems)
    covered = np.zeros(cov.n_elems, dtype=bool)
    for c in chosen:
        cov.cover(int(c), covered)
    return int(covered.sum())


def set_cover_cost(set_idx, elem_idx, n_sets: int, n_elems: int, perm: Sequence[int]) -> int:
    """Open-set cost of a permutation: every element takes the first set of ``perm`` holding it;
    the number of distinct sets taken (elements in no listed set are ignored). NOT private."""
    cov = _Coverage(set_idx, elem_idx, n_sets, n_elems)
    pos = np.full(cov.n_sets, np.iinfo(np.int64).max, dtype=np.int64)
    order = np.asarray(perm, dtype=np.int64)
    pos[order] = np.arange(order.size)
    row_pos = pos[cov.set_idx]
    listed = row_pos < np.iinfo(np.int64).max
    first = np.full(cov.n_elems, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, cov.elem_idx[listed], row_pos[listed])
    return int(np.unique(first[first < np.iinfo(np.int64).max]).size)


def nonprivate_greedy_set_cover(set_idx, elem_idx, n_sets: int, n_elems: int) -> list[int]:
    """Classic greedy set cover as a permutation (most new elements first; then unused sets). NOT private."""
    cov = _Coverage(set_idx, elem_idx, n_sets, n_elems)
    gains = cov.sizes()
    covered = np.zeros(cov.n_elems, dtype=bool)
    perm: list[int] = []
    used = np.zeros(cov.n_sets, dtype=bool)
    while True:
        g = np.where(used, -1, gains)
        c = int(np.argmax(g)) if g.size else 0
        if g.size == 0 or g[c] <= 0:
            break
        perm.append(c)
        used[c] = True
        cov.cover(c, covered, gains)
    perm.extend(int(i) for i in np.flatnonzero(~used))
    return perm


def eval_set_cover_cost(con: duckdb.DuckDBPyConnection, tbl: str, permutation_tbl: str, *,
                        set_col: str = "set_id", element_col: str = "element", position_col: str = "position",
                        permutation_set_col: str = "set_id") -> int:
    """Open-set cost of a (position, set_id) permutation on ``tbl``. NON-PRIVATE evaluation of raw data."""
    _columns(con, tbl, set_col=set_col, element_col=element_col)
    _columns(con, permutation_tbl, position_col=position_col, permutation_set_col=permutation_set_col)
    rows = con.sql(f"FROM dp_eval_set_cover_cost({sql_string(tbl)}, {sql_string(permutation_tbl)}, "
                   f"set_col := {sql_string(set_col)}, element_col := {sql_string(element_col)}, "
                   f"position_col := {sql_string(position_col)}, "
                   f"permutation_set_col := {sql_string(permutation_set_col)})").fetchall()
    return int(rows[0][0])
