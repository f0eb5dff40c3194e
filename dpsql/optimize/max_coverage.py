"""Max k-coverage, pure epsilon-DP: DPSubmodGreedy on a Poisson subsample ([SUB] Thm 1.2, Sec. 4.1).

Mechanism (``dp_max_coverage``, sql/80_optimize/optimize.sql). Public: the candidate sets (``candidates_tbl``).
Private: the universe elements, each a record ``x in {0,1}^m`` (its memberships, the rows of ``tbl``
with that element). Keep each element independently with probability ``p = 1 - e^-epsilon``, then run
``min(k, m)`` exponential mechanisms at ``ln 2``: round ``i`` picks a not-yet-chosen candidate ``c`` with
probability ``∝ 2^{q_i(c)}``, ``q_i(c)`` = sampled elements of ``S_c`` not covered by the sets chosen so far.

Privacy (unit: one universe element with all its memberships, add/remove). The scores are monotone in
the data and an added element raises the chosen set's score in at most one round (the round that covers
it), so Repeated-EM is ``ln 2``-add-DP ([SUB] Thm 4.3); on ``S_p(D)`` with ``p = 1 - e^-epsilon`` it is
epsilon-DP ([SUB] Cor. 3.2, :mod:`dpsql.optimize.subsampling`). The candidate list is public, so the support of
the output does not depend on the data. Full argument: ``docs/proofs/max_coverage.md``.
"""
from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.core.noise import NoiseSource
from dpsql.optimize.common import _columns, _Coverage, _literal, _release, check_k
from dpsql.optimize.subsampling import EPS0, exp_mech, poisson_subsample, subsampling_probability
from dpsql.core.validation import check_epsilon, sql_string
from dpsql.core.inputs import accepts_tables


def _coverage_greedy(source: NoiseSource, set_idx, elem_idx, n_sets: int, n_elems: int, k: int,
                    eps0: float = EPS0) -> list[int]:
    """DPSubmodGreedy_{eps0} for coverage on the given (already subsampled) data: eps0-add-DP.

    Repeated-EM with ``L = min(k, m)`` rounds, candidates = every set not yet
    chosen (including sets of gain 0), score ``q_i(c)`` = number of elements of
    ``S_c`` not covered by the sets chosen so far. Monotone (an added element
    never lowers a gain) and realised sensitivity 1 (the added element
    contributes 1 to the chosen set's gain in at most one round: the round
    that covers it), so Thm 4.3 gives eps0-add-DP.
    """
    cov = _Coverage(set_idx, elem_idx, n_sets, n_elems)
    gains = cov.sizes()
    covered = np.zeros(cov.n_elems, dtype=bool)
    scores = gains.astype(np.float64)
    chosen: list[int] = []
    for _ in range(min(int(k), cov.n_sets)):
        scores[:] = gains
        scores[chosen] = -np.inf
        c = exp_mech(source, scores, eps0)
        chosen.append(c)
        cov.cover(c, covered, gains)
    return chosen


def _max_coverage_arrays(source: NoiseSource, set_idx, elem_idx, n_sets: int, n_elems: int, k: int,
                        epsilon: float) -> list[int]:
    """Pure eps-DP max k-coverage: :func:`_coverage_greedy` at ln 2 on ``S_p`` of the elements, ``p = 1 - e^-eps``."""
    epsilon, k = check_epsilon(epsilon), check_k(k)
    keep = poisson_subsample(source, int(n_elems), subsampling_probability(epsilon))
    sub = _Coverage(set_idx, elem_idx, n_sets, n_elems).restrict(keep)
    return _coverage_greedy(source, sub.set_idx, sub.elem_idx, n_sets, n_elems, k, EPS0)


@accepts_tables("table", "candidates_tbl")
def max_coverage(con: duckdb.DuckDBPyConnection, table: str, candidates_tbl: str, k: int, *, epsilon: float,
                 set_col: str = "set_id", element_col: str = "element") -> pa.Table:
    """Pure eps-DP max k-coverage (``dp_max_coverage``): (rank, set_id) in the greedy's order, charged once.

    ``table`` rows (set, element) are private (the elements are the records);
    ``candidates_tbl`` (column ``set_col``) lists the public candidate sets:
    only those can be chosen, with or without rows in ``table``.
    """
    check_epsilon(epsilon), check_k(k)
    _columns(con, table, set_col=set_col, element_col=element_col)
    _columns(con, candidates_tbl, set_col=set_col)
    return _release(con, f"dp_max_coverage({sql_string(table)}, {sql_string(candidates_tbl)}, {int(k)}, "
                         f"epsilon := {_literal(epsilon)}, set_col := {sql_string(set_col)}, "
                         f"element_col := {sql_string(element_col)})")
