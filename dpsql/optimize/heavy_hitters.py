"""Shifting heavy hitters, pure epsilon-DP: ThreshMonitor on a Poisson subsample of users ([SUB] Alg. 3, Thm 5.6).

Mechanism (``dp_shifting_heavy_hitters``, sql/80_optimize/optimize.sql). Public: the buckets ``Y``
(``buckets_tbl``) and the horizon ``T``. Private: each user's stream (at most one bucket per time
step). Keep each user with probability ``p = 1 - e^-epsilon``; then for every time ``t`` and every bucket
``y`` report ``(t, y)`` iff the number of active sampled users in ``y`` plus ``Exp(rate ln 2 / k)``
exceeds ``tau = 1.5 p tau*(k)``, ``tau*(k) = 4000 k ln(T |Y| / failure_probability) / epsilon``; a user
who has been in ``k`` reported buckets leaves.

Privacy (unit: one user's whole stream, add/remove). A user adds 1 to at most ``k`` reported counts,
and the counts are monotone: Repeated-AT with ``Δ = k`` is ``ln 2``-add-DP ([SUB] Thm 5.3); on the
subsample it is epsilon-DP (Cor. 3.2). Every bucket of ``Y`` is tested at every time, including those
with no user (else "count 1 vs 0" would become "tested vs not"). ``failure_probability`` and
``tau_constant`` move only the threshold. Full argument: ``docs/proofs/shifting_heavy_hitters.md``.
"""
from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.core.noise import NoiseSource
from dpsql.optimize.common import (_check_positive_param, _columns, _ids, _literal, _release, check_failure_probability,
                                   check_k)
from dpsql.optimize.subsampling import EPS0, above_threshold, exponential_rate, poisson_subsample, subsampling_probability
from dpsql.core.validation import DPParameterError, check_epsilon, sql_string
from dpsql.core.inputs import accepts_tables


def heavy_hitters_calibration(epsilon: float, k: int, horizon: int, n_buckets: int,
                              failure_probability: float = 0.05, tau_constant: float = 4000.0) -> dict:
    """``p = 1 - e^-eps``, ``tau*(k) = C k ln(T |Y| / beta) / eps`` with ``C = 4000``, ``tau = 1.5 p tau*(k)``,
    noise rate ``ln 2 / k`` ([SUB] Thm 5.6), ``beta`` = ``failure_probability``. ERRATUM: the paper prints
    C = 1000; its utility proof needs 4000, which we use.

    The utility theorem assumes eps <= 1; privacy holds for every eps > 0 and any ``tau_constant``.
    """
    epsilon, k, beta = check_epsilon(epsilon), check_k(k), check_failure_probability(failure_probability)
    horizon, n_buckets = check_k(horizon, "horizon"), check_k(n_buckets, "number of buckets")
    tau_constant = _check_positive_param("tau_constant", tau_constant, "the paper's value is 4000")
    p = subsampling_probability(epsilon)
    tau_star = tau_constant * k * (math.log(horizon) + math.log(n_buckets) - math.log(beta)) / epsilon  # no overflow
    return {"p": p, "tau_star": tau_star, "tau": 1.5 * p * tau_star, "rate": exponential_rate(EPS0, k)}


def _kth_missing(present_sorted: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The j-th (0-based) non-negative integer absent from ``present_sorted`` (distinct, sorted)."""
    gaps = present_sorted - np.arange(present_sorted.size)
    return j + np.searchsorted(gaps, j, side="right")


def _bernoulli_positions(source: NoiseSource, n: int, q: float) -> np.ndarray:
    """Positions in [0, n) each selected independently with probability q (geometric skips: ~n q + 1 draws)."""
    if n <= 0 or q <= 0.0:
        return np.zeros(0, dtype=np.int64)
    if q >= 1.0:
        return np.arange(n, dtype=np.int64)
    out: list[int] = []
    pos, log1mq = -1, math.log1p(-q)
    while True:
        u = 1.0 - float(source.uniform(1)[0])  # in (0, 1]
        pos += int(math.floor(math.log(u) / log1mq)) + 1
        if pos >= n:
            return np.asarray(out, dtype=np.int64)
        out.append(pos)


def _thresh_monitor(source: NoiseSource, user_idx, time_idx, bucket_idx, n_users: int, horizon: int,
                   n_buckets: int, k: int, tau: float, eps0: float = EPS0) -> list[tuple[int, int]]:
    """ThreshMonitor_{eps0, tau, k} ([SUB] Alg. 3) on the given (already subsampled) users: eps0-add-DP.

    Rows: user ``u`` is in bucket ``bucket_idx`` at time ``time_idx`` (0-based,
    at most one bucket per user and time). For every time t and **every**
    bucket y: report (t, y) iff ``w_t(y) + Exp(rate eps0/k) > tau`` where
    ``w_t(y)`` counts active users; users in a reported bucket spend one of
    their k contributions and leave after the k-th. An instance of Repeated-AT
    with Δ = k (each user adds 1 to at most k reported counts), so Thm 5.3
    gives eps0-add-DP. Buckets with ``w = 0`` are not skipped (skipping would
    turn "count 1 vs 0" into "tested vs not tested"): each is reported
    independently with probability ``P[Exp(rate) > tau] = 2^(-tau/k)`` at
    eps0 = ln 2, sampled by geometric skips over the zero buckets -- the same
    distribution as drawing their exponentials.
    """
    users, times, buckets = _ids(user_idx, "user ids"), _ids(time_idx, "time ids"), _ids(bucket_idx, "bucket ids")
    if not users.size == times.size == buckets.size:
        raise DPParameterError("user, time and bucket ids must have the same length")
    if users.size and (users.max() >= n_users or times.max() >= horizon or buckets.max() >= n_buckets):
        raise DPParameterError("ids out of range")
    key = np.unique(users * np.int64(horizon) + times, return_index=True)
    if key[0].size != users.size:
        raw = np.unique(np.stack([users, times, buckets]), axis=1)
        if raw.shape[1] != key[0].size:
            raise DPParameterError("a user is in two different buckets at the same time step; a stream has at most "
                                   "one bucket per user and time")
        users, times, buckets = raw
    rate = exponential_rate(eps0, k)
    q_zero = math.exp(-rate * tau) if tau > 0 else 1.0
    order = np.argsort(times, kind="stable")
    users, times, buckets = users[order], times[order], buckets[order]
    bounds = np.searchsorted(times, np.arange(horizon + 1))
    contributions = np.zeros(n_users, dtype=np.int64)
    reports: list[tuple[int, int]] = []
    for t in range(horizon):
        u, b = users[bounds[t]:bounds[t + 1]], buckets[bounds[t]:bounds[t + 1]]
        active = contributions[u] < k
        u, b = u[active], b[active]
        nz, counts = np.unique(b, return_counts=True)
        hit = nz[above_threshold(source, counts, tau, eps0, k)]
        zero_hits = _kth_missing(nz, _bernoulli_positions(source, n_buckets - nz.size, q_zero))
        for y in np.sort(np.concatenate([hit, zero_hits])):
            reports.append((t, int(y)))
        if hit.size:
            contributions[u[np.isin(b, hit)]] += 1
    return reports


def _shifting_heavy_hitters_arrays(source: NoiseSource, user_idx, time_idx, bucket_idx, n_users: int, horizon: int,
                                  n_buckets: int, k: int, epsilon: float, failure_probability: float = 0.05,
                                  tau_constant: float = 4000.0) -> list[tuple[int, int]]:
    """Pure eps-DP shifting heavy hitters ([SUB] Thm 5.6): users Poisson-subsampled once with
    ``p = 1 - e^-eps``, then ThreshMonitor_{ln 2, tau, k} with ``tau = 1.5 p tau*(k)``."""
    cal = heavy_hitters_calibration(epsilon, k, horizon, n_buckets, failure_probability, tau_constant)
    keep = poisson_subsample(source, int(n_users), cal["p"])
    users = _ids(user_idx, "user ids")
    rows = keep[users] if users.size else np.zeros(0, dtype=bool)
    return _thresh_monitor(source, users[rows], _ids(time_idx, "time ids")[rows], _ids(bucket_idx, "bucket ids")[rows],
                          n_users, horizon, n_buckets, k, cal["tau"], EPS0)


@accepts_tables("table", "buckets_tbl")
def shifting_heavy_hitters(con: duckdb.DuckDBPyConnection, table: str, buckets_tbl: str, k: int, horizon: int, *,
                           epsilon: float, failure_probability: float = 0.05, user_col: str = "user_id",
                           time_col: str = "t", bucket_col: str = "bucket") -> pa.Table:
    """Pure eps-DP shifting heavy hitters (``dp_shifting_heavy_hitters``): reported (t, bucket), sorted; charged once.

    ``table`` rows (user, t, bucket) with t in 1..horizon; ``buckets_tbl``
    lists the public bucket set Y in column ``bucket_col``; ``horizon`` = T is public.
    Rows outside Y x 1..horizon are ignored.
    """
    heavy_hitters_calibration(epsilon, k, check_k(horizon, "horizon"), 1, failure_probability)
    _columns(con, table, user_col=user_col, time_col=time_col, bucket_col=bucket_col)
    _columns(con, buckets_tbl, bucket_col=bucket_col)
    return _release(con, f"dp_shifting_heavy_hitters({sql_string(table)}, {sql_string(buckets_tbl)}, "
                         f"{int(k)}, horizon := {int(horizon)}, epsilon := {_literal(epsilon)}, "
                         f"failure_probability := {_literal(failure_probability)}, "
                         f"user_col := {sql_string(user_col)}, time_col := {sql_string(time_col)}, "
                         f"bucket_col := {sql_string(bucket_col)})")
