"""k-median / k-means, pure epsilon-DP, over a public finite metric ([SUB] App. G, Thm 1.5).

Mechanism (``dp_k_median``, sql/80_optimize/optimize.sql). Public: the metric -- its points are the candidates
(``candidates_tbl``), ``distances_tbl`` gives every pairwise distance in [0, 1] -- and ``n_bound``, an
upper bound on the number of records. Private: the records, one row of ``tbl`` each, located at a
candidate. On the records kept with probability ``p = 1 - e^-epsilon``: (1) a bicriteria set ``T`` --
every candidate if ``2 k ln n_bound >= m``, else ``ceil(2 k ln n_bound)`` exponential mechanisms at
``ln 2 / 2`` with score the drop in cost; (2) per ``t in T`` the number of records nearest to ``t`` plus
``Exp(rate ln 2 / 2)``; (3) local search on those weighted points (post-processing).

Privacy (unit: one record, i.e. one row, add/remove). The scores of (1) are monotone and a record's
cost decreases telescope to at most 1: ``ln 2 / 2``-add-DP ([SUB] Thm 4.3); in (2) a record raises
exactly one count by 1 (one-sided noise): ``ln 2 / 2``-add-DP. Together ``ln 2``-add-DP, and
epsilon-DP on the subsample (Cor. 3.2). The number of rounds uses the public ``n_bound``, never the
private count. Full argument: ``docs/proofs/k_median.md``.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.core.noise import NoiseSource
from dpsql.optimize.common import K_LIMIT, _columns, _ids, _literal, _release, check_k
from dpsql.optimize.subsampling import EPS0, poisson_subsample, repeated_em, subsampling_probability
from dpsql.core.validation import DPParameterError, check_epsilon, sql_string
from dpsql.core.inputs import accepts_tables


def _check_n_bound(n_bound: object) -> int:
    """A public whole number in 1..N_BOUND_LIMIT (it enters ``ln n_bound`` and reaches the kernel as a BIGINT)."""
    if n_bound is None:
        raise DPParameterError("n_bound must be a public upper bound on the number of points, e.g. n_bound := 100000")
    if isinstance(n_bound, bool) or not isinstance(n_bound, numbers.Real) or not math.isfinite(float(n_bound)) \
            or float(n_bound) != int(float(n_bound)) or not 1 <= int(float(n_bound)) <= N_BOUND_LIMIT:
        raise DPParameterError(f"n_bound must be a whole number between 1 and {N_BOUND_LIMIT:.0e} (got {n_bound!r}), "
                               f"e.g. n_bound := 100000")
    return int(float(n_bound))


# n_bound travels to the kernel as a BIGINT; 1e300 overflowed it with a bare OverflowError.
N_BOUND_LIMIT = 10 ** 15


def _metric(rows: np.ndarray, cols: np.ndarray, dists: np.ndarray, m: int) -> np.ndarray:
    """The m x m matrix (candidate row, point column) from flat triples; every pair exactly once."""
    keys = rows * np.int64(max(m, 1)) + cols
    if keys.size != m * m or np.unique(keys).size != m * m:
        raise DPParameterError(f"distances_tbl must hold exactly one (point, candidate, distance) row for each of "
                               f"the {m} x {m} pairs of candidates (got {keys.size} rows)")
    dist = np.empty((m, m), dtype=np.float64)
    dist[rows, cols] = dists
    return dist


def _local_search(dq: np.ndarray, locations: np.ndarray, weights: np.ndarray, k: int, max_iter: int = 200) -> list[int]:
    """Weighted single-swap local search (Arya et al. 2004 style) over candidates [m]. NOT private by itself."""
    m = dq.shape[0]
    k = min(k, m)
    sub = dq[:, locations]  # candidate x weighted point

    def cost(centres):
        return float((sub[centres].min(axis=0) * weights).sum())

    centres: list[int] = []
    for _ in range(k):  # greedy start
        best = sub[centres].min(axis=0) if centres else np.full(locations.size, np.inf)
        totals = (np.minimum(sub, best) * weights).sum(axis=1)
        totals[centres] = np.inf
        centres.append(int(np.argmin(totals)))
    current = cost(centres)
    for _ in range(max_iter):
        improved = False
        for a in range(k):
            others = centres[:a] + centres[a + 1:]
            base = sub[others].min(axis=0) if others else np.full(locations.size, np.inf)
            totals = (np.minimum(sub, base) * weights).sum(axis=1)
            totals[others] = np.inf
            c = int(np.argmin(totals))
            if totals[c] < current * (1 - 1e-9):
                centres[a], current, improved = c, float(totals[c]), True
        if not improved:
            break
    return sorted(centres)


def _k_median(source: NoiseSource, locations, distances, k: int, epsilon: float, n_bound: Optional[int],
             q: int = 1) -> list[int]:
    """Pure eps-DP k-median (q=1) / k-means (q=2) ([SUB] Thm 1.5, App. G) over a finite metric.

    ``locations``: each record's point in [m]; ``distances``: the public m x m
    metric, diameter <= 1. ``n_bound``: a public upper bound on the number of
    records, required: the bicriteria length ``L = ceil(2 k ln n)`` uses it
    instead of the private n, whose value the number of EM rounds would leak.

    On ``D_s = S_p(D)``, ``p = 1 - e^-eps``, G.2 at ln 2: (1) G.1 bicriteria at
    ln 2/2: if ``2 k ln n_bound >= m`` then ``T = [m]``, else Repeated-EM with
    L rounds, score ``cost(T) - cost(T + c)`` (cost of the empty set: 1 per
    point) -- monotone, and a point's decreases telescope to at most 1, so
    ln 2/2-add-DP; (2) per t in T, ``h~_t = #{points nearest to t} + Exp(rate ln2/2)``
    (one-sided noise: a count rises by 1 in exactly one t when a point is added);
    (3) local search on the weighted points (post-processing).
    """
    epsilon, k = check_epsilon(epsilon), check_k(k)
    if q not in (1, 2):
        raise DPParameterError(f"q must be 1 (k-median) or 2 (k-means) (got {q!r})")
    if n_bound is None:
        raise DPParameterError("n_bound must be a public upper bound on the number of points, e.g. n_bound := 100000")
    n_bound = check_k(n_bound, "n_bound") if n_bound <= K_LIMIT else int(n_bound)
    dist = np.asarray(distances, dtype=np.float64)
    if dist.ndim != 2 or dist.shape[0] != dist.shape[1]:
        raise DPParameterError("distances must be a square m x m matrix")
    if not np.all(np.isfinite(dist)) or dist.min() < 0 or dist.max() > 1:
        raise DPParameterError("distances must lie in [0, 1] (rescale the metric to diameter <= 1)")
    m = dist.shape[0]
    locations = _ids(locations, "locations")
    if locations.size and locations.max() >= m:
        raise DPParameterError("locations must be point ids < m")
    dq = dist ** q
    keep = poisson_subsample(source, locations.size, subsampling_probability(epsilon))
    w = np.bincount(locations[keep], minlength=m).astype(np.float64)  # sampled points per location
    eps_a = EPS0 / 2
    if 2 * k * math.log(max(n_bound, 1)) >= m:
        bicriteria = list(range(m))
    else:
        rounds = int(math.ceil(2 * k * math.log(n_bound)))
        current = np.ones(m)  # per location: min(1, distance^q to T) -- the empty set costs 1

        def scores(chosen: list[int]) -> np.ndarray:
            if chosen:
                np.minimum(current, dq[chosen[-1]], out=current)
            gains = np.maximum(current[None, :] - dq, 0.0) @ w
            gains[chosen] = -np.inf
            return gains

        bicriteria = repeated_em(source, min(rounds, m), scores, eps_a, 1.0)
    t_arr = np.asarray(bicriteria, dtype=np.int64)
    nearest = t_arr[np.argmin(dq[t_arr][:, np.arange(m)], axis=0)]  # ties: first of T in order
    h = np.bincount(nearest, weights=w, minlength=m)[t_arr]
    h_noisy = h + source.exponential(np.full(t_arr.size, eps_a))
    return _local_search(dq, t_arr, h_noisy, k)


@accepts_tables("table", "candidates_tbl", "distances_tbl")
def k_median(con: duckdb.DuckDBPyConnection, table: str, candidates_tbl: str, distances_tbl: str, k: int, *,
             epsilon: float, n_bound: int, q: int = 1, point_col: str = "point",
             candidate_col: str = "candidate_id", distance_point_col: str = "point",
             distance_candidate_col: str = "candidate", distance_col: str = "distance") -> pa.Table:
    """Pure eps-DP k-median (q = 1) / k-means (q = 2) (``dp_k_median``): (rank, candidate_id) in candidate_id
    order; charged once.

    ``table`` (point_col): one private record per row, located at a candidate;
    ``candidates_tbl`` (candidate_col) and ``distances_tbl`` (distance_point_col,
    distance_candidate_col, distance_col in [0, 1]) are the public metric;
    ``n_bound`` a public upper bound on the number of points.
    """
    check_epsilon(epsilon), check_k(k)
    if q not in (1, 2):
        raise DPParameterError(f"q must be 1 (k-median) or 2 (k-means) (got {q!r})")
    _check_n_bound(n_bound)
    _columns(con, table, point_col=point_col)
    _columns(con, candidates_tbl, candidate_col=candidate_col)
    _columns(con, distances_tbl, distance_point_col=distance_point_col,
             distance_candidate_col=distance_candidate_col, distance_col=distance_col)
    return _release(con, f"dp_k_median({sql_string(table)}, {sql_string(candidates_tbl)}, "
                         f"{sql_string(distances_tbl)}, {int(k)}, epsilon := {_literal(epsilon)}, "
                         f"n_bound := {int(n_bound)}, q := {int(q)}, point_col := {sql_string(point_col)}, "
                         f"candidate_col := {sql_string(candidate_col)}, "
                         f"distance_point_col := {sql_string(distance_point_col)}, "
                         f"distance_candidate_col := {sql_string(distance_candidate_col)}, "
                         f"distance_col := {sql_string(distance_col)})")
