"""Pure epsilon-DP combinatorial optimisation by subsampling ([SUB], paper 003), thin on :mod:`dpsql.subsampling`.

Privacy unit: one record, add/remove -- a universe element (coverage, set
cover), a user's whole stream (heavy hitters), a point (k-median). Every
mechanism here is "an ln 2-add-DP algorithm run on ``S_p(D)`` with
``p = 1 - e^-eps``" and hence pure eps-DP by [SUB] Cor. 3.2 (see
:mod:`dpsql.subsampling`), except DPGreedyScaling which splits its budget
itself (see :func:`_greedy_scaling`).

What the proofs take as public. [SUB] fixes the candidate universe ``[m]``
before the data: a record is ``x in X = {0,1}^m`` (its memberships in the m
sets, Sec. 1 footnote 6), a point of the metric ``[m]`` (App. G) or a stream
over the buckets Y and times 1..T (Sec. 5.2). Repeated-EM's candidates
``C_i = [m] minus {c*_1, ..., c*_{i-1}}`` (Sec. 4.1.1, App. D, G) and Repeated-AT's
tests (Alg. 3, 4) depend on earlier outputs only, and Thm 4.3 / 5.3 compare
``q_i(c; D)`` with ``q_i(c; D')`` over the *same* candidates (Assumptions 4.1,
5.1: scores are monotone in D, the candidate set is not a function of D). Were
the set ids read from the private rows, removing a set's only element would
remove the set from every ``C_i``: an output holding it has probability 0 on
D', and no epsilon bounds that. So every candidate list is a public table
(``candidates_tbl``, ``parts_tbl``, ``buckets_tbl``, k-median's
``candidates_tbl``); a candidate without private rows is still a candidate
(score 0); private rows outside the public universe are ignored (a set that
is not a candidate, a bucket not in Y, a time outside 1..T, a point that is
not a candidate): such a row is no membership of X, and an error instead
would tell whether some record holds a value the caller chose.

Layout: each mechanism has a numpy kernel (compact integer ids, CSR
set->elements and element->sets) taking a :class:`~dpsql.noise.NoiseSource`;
kernels are private (leading underscore): they release without charging, and
only the UDFs call them. Each public release function runs the SQL macro of
``sql/80_optimize.sql``, which validates, charges the ledger once and
returns rows in a data-independent order; the macro does the joins, the
dense ids and (where the subsample is drawn once) the Poisson subsample in
DuckDB, and calls the kernel once through an Arrow UDF over flat lists.
``nonprivate_*``, ``*_cost`` and ``coverage_value`` are evaluation: NOT private.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import duckdb
import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR

from dpsql.noise import NoiseSource
from dpsql.subsampling import (
    EPS0,
    above_threshold,
    exp_mech,
    exponential_rate,
    poisson_subsample,
    subsampling_probability,
)
from dpsql.udf import Udf, scalar
from dpsql.validation import (DELTA_MIN, DPParameterError, check_epsilon, check_identifier, check_table_name,
                              sql_string, warn_weak_parameters)

__all__ = [
    "check_k", "check_beta", "check_eta", "check_key_types",
    # releases: each runs its SQL macro, which charges the ledger once
    "max_coverage", "set_cover", "shifting_heavy_hitters", "matroid_coverage", "k_median",
    # pure calibration
    "greedy_scaling_epsilons", "heavy_hitters_calibration",
    # NOT private: evaluation of raw data and baselines
    "eval_set_cover_cost", "set_cover_cost", "coverage_value",
    "nonprivate_greedy_coverage", "nonprivate_greedy_set_cover",
    "udfs",
]

K_LIMIT = 1_000_000


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

def check_k(k: object, name: str = "k") -> int:
    """A whole number in [1, K_LIMIT] (a float with an integral value is accepted)."""
    if k is None:
        raise DPParameterError(f"{name} must not be NULL; pass a whole number >= 1, e.g. {name} := 10")
    if isinstance(k, bool) or not isinstance(k, numbers.Real) or not math.isfinite(float(k)) \
            or float(k) != int(float(k)) or not 1 <= int(float(k)) <= K_LIMIT:
        raise DPParameterError(f"{name} must be a whole number between 1 and {K_LIMIT} (got {k!r}), e.g. {name} := 10")
    return int(float(k))


def check_beta(beta: object) -> float:
    """A failure probability strictly between 0 and 1."""
    if beta is None or isinstance(beta, bool) or not isinstance(beta, numbers.Real) \
            or not 0.0 < float(beta) < 1.0:
        raise DPParameterError(f"beta must be a failure probability with 0 < beta < 1 (got {beta!r}), e.g. beta := 0.05")
    if float(beta) < DELTA_MIN:  # ln(1/beta) enters the round counts; a subnormal beta overflows them
        raise DPParameterError(f"beta must be >= {DELTA_MIN:g} (got {beta!r}), e.g. beta := 0.05")
    return float(beta)


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
# Compact arrays
# --------------------------------------------------------------------------

def _ids(values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be dense ids >= 0")
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
            raise ValueError("set ids and element ids must have the same length")
        if set_idx.size and (set_idx.max() >= n_sets or elem_idx.max() >= n_elems):
            raise ValueError("ids out of range of n_sets / n_elems")
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
# Max k-coverage: DPSubmodGreedy ([SUB] Thm 1.2, Sec. 4.1)
# --------------------------------------------------------------------------

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
                        epsilon: float = 1.0) -> list[int]:
    """Pure eps-DP max k-coverage: :func:`_coverage_greedy` at ln 2 on ``S_p`` of the elements, ``p = 1 - e^-eps``."""
    epsilon, k = check_epsilon(epsilon), check_k(k)
    keep = poisson_subsample(source, int(n_elems), subsampling_probability(epsilon))
    sub = _Coverage(set_idx, elem_idx, n_sets, n_elems).restrict(keep)
    return _coverage_greedy(source, sub.set_idx, sub.elem_idx, n_sets, n_elems, k, EPS0)


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


# --------------------------------------------------------------------------
# Set cover: DPGreedyScaling ([SUB] Alg. 4, Thm 1.4, App. E)
# --------------------------------------------------------------------------

def greedy_scaling_epsilons(epsilon: float, rounds: int) -> list[float]:
    """Per-round budgets ``eps_r = eps / (4 * 2^(R-r))``, r = 1..R, of DPGreedyScaling ([SUB] Alg. 4).

    Geometric: ``Σ_r eps_r = (eps/2)(1 - 2^-R) < eps/2``, so with the eps/2 of the ``Lap(2/eps)`` step the
    total stays below eps for every R (App. E).
    """
    epsilon = check_epsilon(epsilon)
    return [epsilon / (4.0 * 2.0 ** (rounds - r)) for r in range(1, int(rounds) + 1)]


def _greedy_scaling(source: NoiseSource, set_idx, elem_idx, n_sets: int, n_elems: int, epsilon: float = 1.0,
                   tau_constant: float = 1000.0) -> list[int]:
    """DPGreedyScaling_eps: a permutation of all ``n_sets`` sets (open-set model), pure eps-DP.

    ``n_elems`` is ``n = |D|`` (private). Steps, as printed in Alg. 4 with the
    errata of the spec:

    * ``n_min = 100 ln m``; ``n~ = max(n + Lap(2/eps), n_min)`` (ERRATUM: the
      paper prints ``Lap(0.5/eps)``; App. E charges eps/2 for this step, and
      ``n`` has sensitivity 1) -- eps/2-DP;
    * ``R = floor(log2(n~/n_min))`` rounds; round r uses
      ``eps_r = eps / (4 * 2^(R-r))``, a fresh subsample ``S_{p_r}(D)`` with
      ``p_r = 1 - e^-eps_r``, and for every remaining set in id order the
      Repeated-AT test ``|S_i ∩ D_s \\ covered| + Exp(rate ln 2) > p_r tau_r``
      with ``tau_r = tau_constant * n~ / 2^r``. The counts are monotone and an
      element adds 1 to at most one *reported* count per round (the set that
      covers it), so each round is ln 2-add-DP (Thm 5.3) and eps_r-DP after
      subsampling (Cor. 3.2); ``Σ_r eps_r < eps/2``;
    * the sets never picked follow in id order (data-independent).

    Basic composition: eps/2 + Σ eps_r < eps. ``tau_constant`` (1000 as
    printed) only moves data-independent thresholds, so privacy holds for any
    value; the paper's proof uses 1 in one place and needs 1000 in another
    (spec §5.7). With 1000 almost nothing is picked in the rounds unless
    ``n`` is astronomically large, and the order falls back to set ids.
    """
    epsilon = check_epsilon(epsilon)
    tau_constant = _check_positive_param("tau_constant", tau_constant, "the printed value is 1000")
    cov = _Coverage(set_idx, elem_idx, n_sets, n_elems)
    m = cov.n_sets
    if m <= 1:  # the only permutation: nothing to release, nothing to spend
        return list(range(m))
    n_min = 100.0 * math.log(m)
    n_tilde = max(cov.n_elems + float(source.laplace(np.array([2.0 / epsilon]))[0]), n_min)
    rounds = int(math.floor(math.log2(n_tilde / n_min)))
    covered = np.zeros(cov.n_elems, dtype=bool)
    remaining = np.ones(m, dtype=bool)
    perm: list[int] = []
    for r, eps_r in enumerate(greedy_scaling_epsilons(epsilon, rounds), start=1):
        tau_r = tau_constant * n_tilde / 2.0 ** r
        p_r = -math.expm1(-eps_r)
        sampled = poisson_subsample(source, cov.n_elems, p_r)
        alive = sampled & ~covered
        counts = cov.sizes(alive)
        ids = np.flatnonzero(remaining)
        # One Exp(ln 2) per remaining set, in id order (independent draws; drawn up front).
        theta = source.exponential(np.full(ids.size, EPS0)) if ids.size else np.zeros(0)
        threshold = p_r * tau_r
        # Counts only decrease within a round, so only sets passing with their round-start
        # counts can pass at all; re-test them in id order with the current counts.
        for pos in np.flatnonzero(counts[ids] + theta > threshold):
            i = int(ids[pos])
            if counts[i] + theta[pos] > threshold:
                perm.append(i)
                remaining[i] = False
                cov.cover(i, covered, counts, alive)
    perm.extend(int(i) for i in np.flatnonzero(remaining))
    return perm


def set_cover_cost(set_idx, elem_idx, n_sets: int, n_elems: int, perm: Sequence[int]) -> int:
    """Open-set cost of a permutation: every element takes the first set of ``perm`` holding it;
    the number of distinct sets taken (elements in no listed set are ignored). NOT private."""
    cov = _Coverage(set_idx, elem_idx, n_sets, n_elems)
    pos = np.full(cov.n_sets, np.iinfo(np.int64).max, dtype=np.int64)
    perm = np.asarray(perm, dtype=np.int64)
    pos[perm] = np.arange(perm.size)
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


# --------------------------------------------------------------------------
# Shifting heavy hitters: ThreshMonitor ([SUB] Alg. 3, Thm 5.6)
# --------------------------------------------------------------------------

def heavy_hitters_calibration(epsilon: float, k: int, horizon: int, n_buckets: int, beta: float = 0.05,
                              tau_constant: float = 4000.0) -> dict:
    """``p = 1 - e^-eps``, ``tau*(k) = C k ln(T |Y| / beta) / eps`` with ``C = 4000``, ``tau = 1.5 p tau*(k)``,
    noise rate ``ln 2 / k`` ([SUB] Thm 5.6; ERRATUM: printed C = 1000, the proof needs 4000 -- spec §5.6).

    The utility theorem assumes eps <= 1; privacy holds for every eps > 0 and any ``tau_constant``.
    """
    epsilon, k, beta = check_epsilon(epsilon), check_k(k), check_beta(beta)
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
    out, pos, log1mq = [], -1, math.log1p(-q)
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
        raise ValueError("user, time and bucket ids must have the same length")
    if users.size and (users.max() >= n_users or times.max() >= horizon or buckets.max() >= n_buckets):
        raise ValueError("ids out of range")
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
                                  n_buckets: int, k: int, epsilon: float = 1.0, beta: float = 0.05,
                                  tau_constant: float = 4000.0) -> list[tuple[int, int]]:
    """Pure eps-DP shifting heavy hitters ([SUB] Thm 5.6): users Poisson-subsampled once with
    ``p = 1 - e^-eps``, then ThreshMonitor_{ln 2, tau, k} with ``tau = 1.5 p tau*(k)``."""
    cal = heavy_hitters_calibration(epsilon, k, horizon, n_buckets, beta, tau_constant)
    keep = poisson_subsample(source, int(n_users), cal["p"])
    users = _ids(user_idx, "user ids")
    rows = keep[users] if users.size else np.zeros(0, dtype=bool)
    return _thresh_monitor(source, users[rows], _ids(time_idx, "time ids")[rows], _ids(bucket_idx, "bucket ids")[rows],
                          n_users, horizon, n_buckets, k, cal["tau"], EPS0)


# --------------------------------------------------------------------------
# Partition-matroid coverage: PrivContGreedy + swap rounding ([SUB] App. D, Thm 1.3)
# --------------------------------------------------------------------------

def _matroid_parts(part_of_set, capacities, n_sets: int) -> tuple[np.ndarray, np.ndarray]:
    part = _ids(part_of_set, "part ids")
    cap = np.asarray(capacities, dtype=np.int64).reshape(-1)
    if part.size != n_sets:
        raise DPParameterError("part_of_set must give one part id per set")
    if part.size and part.max() >= cap.size:
        raise DPParameterError("every part id needs a capacity")
    if cap.size and cap.min() < 0:
        raise DPParameterError("capacities must be >= 0")
    return part, cap


def _priv_cont_greedy(source: NoiseSource, cov: "_Coverage", part: np.ndarray, cap: np.ndarray, eps0: float,
                     passes: int, samples: int) -> tuple[np.ndarray, list[list[int]]]:
    """PrivContGreedy_{eps0, 1/passes, samples} ([SUB] Alg. 5) for coverage on a partition matroid.

    ``y`` starts at 0; each of the ``passes`` passes builds an independent set
    ``B`` greedily, each step an exponential mechanism (eps0, Δ = 1) over the
    sets that keep ``B`` independent, score ``G(y + e_u/passes) - G(y)`` with
    ``G(y) = (1/s) Σ_j F({u : z^j_u < y_u})`` for ``s = samples`` fixed uniform
    vectors ``z^j``. Scores are monotone and an element's contributions
    telescope to ``g_x(y_end) - g_x(0) <= 1`` (Obs. D.3): eps0-add-DP for any
    ``s``. Returns ``y`` and the passes' sets (``y = Σ_t 1_{B_t} / passes``).
    """
    m, step = cov.n_sets, 1.0 / passes
    z = source.uniform(samples * m).reshape(samples, m)  # data-independent, fixed for the run
    y = np.zeros(m)
    covered = np.zeros((samples, cov.n_elems), dtype=bool)
    uncovered = np.tile(cov.sizes(), (samples, 1))  # |S_u \ covered_j| per sample j
    rank = int(np.minimum(np.bincount(part, minlength=cap.size), cap).sum())
    bases: list[list[int]] = []
    for _ in range(passes):
        used = np.zeros(cap.size, dtype=np.int64)
        in_b = np.zeros(m, dtype=bool)
        basis: list[int] = []
        for _ in range(rank):
            candidate = ~in_b & (used[part] < cap[part])
            if not candidate.any():
                break
            flips = (z >= y) & (z < y + step)  # samples in which u enters {u : z_u < y_u}
            scores = np.where(candidate, (flips * uncovered).sum(axis=0) / samples, -np.inf)
            u = exp_mech(source, scores, eps0)
            for j in np.flatnonzero(flips[:, u]):
                cov.cover(u, covered[j], uncovered[j])
            y[u] += step
            in_b[u] = True
            used[part[u]] += 1
            basis.append(u)
        bases.append(basis)
    return y, bases


def _swap_round(source: NoiseSource, bases: list[list[int]], part: np.ndarray, cap: np.ndarray) -> list[int]:
    """Swap rounding (Chekuri-Vondrak-Zenklusen 2010) of ``y = mean of 1_B over bases`` on a partition matroid.

    Each independent set is padded with dummy elements to a basis of the padded
    matroid (then every part is a uniform matroid), bases are merged one by one:
    while they differ, an element ``i`` of one and ``j`` of the other in the same
    part are exchanged towards either side with probability proportional to
    the sides' weights. ``E[1_S] = y``; dummies are dropped at the end. Data
    independent (it only sees released sets); randomness from the source.
    """
    if not bases:
        return []
    n_parts = cap.size

    def padded(basis: list[int]) -> list[list[int]]:
        per = [[] for _ in range(n_parts)]
        for u in basis:
            per[int(part[u])].append(int(u))
        for p in range(n_parts):
            per[p] += [-(p * (int(cap.max()) + 1) + d + 1) for d in range(int(cap[p]) - len(per[p]))]
        return per

    merged, weight = padded(bases[0]), 1.0
    for basis in bases[1:]:
        other = padded(basis)
        for p in range(n_parts):
            a, b = set(merged[p]), set(other[p])
            while a != b:
                i, j = min(a - b), min(b - a)
                if float(source.uniform(1)[0]) < weight / (weight + 1.0):
                    b.remove(j)
                    b.add(i)
                else:
                    a.remove(i)
                    a.add(j)
            merged[p] = sorted(a)
        weight += 1.0
    return sorted(u for per in merged for u in per if u >= 0)


def _matroid_coverage_arrays(source: NoiseSource, set_idx, elem_idx, n_sets: int, n_elems: int, part_of_set,
                            capacities, epsilon: float = 1.0, eta: float = 0.2, beta: float = 0.05,
                            samples: Optional[int] = None) -> list[int]:
    """Pure eps-DP max coverage under a partition matroid ([SUB] Thm 1.3): ``A_{ln 2, eta/2, beta/2}`` on ``S_p``.

    ``A_{e, h, b}`` (Lemma D.6): PrivContGreedy at ``e/2`` with step ``h/2``
    (here ``passes = ceil(4/eta)``, step ``1/passes <= eta/4``), then
    ``ceil(10 ln(3/b)/h) = ceil(20 ln(6/beta)/eta)`` swap roundings of ``y``,
    then one exponential mechanism at ``e/2`` over the rounded sets with score
    ``F(S)`` (monotone, sensitivity 1). ln 2/2 + ln 2/2 = ln 2 (basic
    composition of add-DP), and Cor. 3.2 with ``p = 1 - e^-eps`` gives eps-DP.

    ``samples`` (s) only affects utility: Thm D.2's ``s = 6 k^2 T^4 ln(m/beta)``
    is in the millions for any real instance. What matters in practice is
    that a step of ``1/passes`` in ``y_u`` moves ``u`` into the random set in
    about ``s/passes`` of the samples; with few flips the scores are mostly 0
    and the mechanism picks blindly (measured: s = 16 with 20 passes reached
    ~55% of the non-private partition greedy's coverage, s = 160 reached
    >= 99.8% on the same planted instances). Default ``s = 8 * passes``
    (8 expected flips per step); each sample costs one boolean per element
    and one count per set. Privacy does not depend on ``s``.
    """
    epsilon, beta, eta = check_epsilon(epsilon), check_beta(beta), check_eta(eta)
    passes = int(math.ceil(4.0 / eta))
    samples = 8 * passes if samples is None else check_k(samples, "samples")
    part, cap = _matroid_parts(part_of_set, capacities, int(n_sets))
    keep = poisson_subsample(source, int(n_elems), subsampling_probability(epsilon))
    sub = _Coverage(set_idx, elem_idx, n_sets, n_elems).restrict(keep)
    _, bases = _priv_cont_greedy(source, sub, part, cap, EPS0 / 2, passes, samples)
    h = int(math.ceil(20.0 * math.log(6.0 / beta) / eta))
    rounded = [_swap_round(source, bases, part, cap) for _ in range(h)]
    values = np.array([np.unique(_gather(sub.set_ptr, sub.set_elems, np.asarray(s, dtype=np.int64))).size
                       for s in rounded], dtype=np.float64)
    return rounded[exp_mech(source, values, EPS0 / 2)]


# --------------------------------------------------------------------------
# k-median / k-means ([SUB] App. G, Thm 1.5)
# --------------------------------------------------------------------------

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


def _k_median(source: NoiseSource, locations, distances, k: int, q: int = 1, epsilon: float = 1.0,
             n_bound: Optional[int] = None) -> list[int]:
    """Pure eps-DP k-median (q=1) / k-means (q=2) ([SUB] Thm 1.5, App. G) over a finite metric.

    ``locations``: each record's point in [m]; ``distances``: the public m x m
    metric, diameter <= 1. ``n_bound``: a public upper bound on the number of
    records (DECIDE, spec §5.5: the bicriteria length ``L = ceil(2 k ln n)``
    must not depend on the private n, or the number of EM rounds would leak it).

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

        from dpsql.subsampling import repeated_em
        bicriteria = repeated_em(source, min(rounds, m), scores, eps_a, 1.0)
    t_arr = np.asarray(bicriteria, dtype=np.int64)
    nearest = t_arr[np.argmin(dq[t_arr][:, np.arange(m)], axis=0)]  # ties: first of T in order
    h = np.bincount(nearest, weights=w, minlength=m)[t_arr]
    h_noisy = h + source.exponential(np.full(t_arr.size, eps_a))
    return _local_search(dq, t_arr, h_noisy, k)


# --------------------------------------------------------------------------
# Python API over tables (runs the macros of sql/80_optimize.sql)
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


def _literal(value: object) -> str:
    """A validated number (or None) as a SQL literal: the macros see constants, never a column or a subquery."""
    return "NULL" if value is None else repr(float(value))


def _release(con: duckdb.DuckDBPyConnection, call: str) -> pa.Table:
    """Run one releasing macro (it validates, charges once and orders its rows) and return its rows in order."""
    return con.sql(f"FROM {call}").to_arrow_table()


def max_coverage(con: duckdb.DuckDBPyConnection, table: str, candidates_table: str, k: int, epsilon: float = 1.0,
                 *, set_col: str = "set_id", element_col: str = "element") -> pa.Table:
    """Pure eps-DP max k-coverage (``dp_max_coverage``): (rank, set_id) in the greedy's order, charged once.

    ``table`` rows (set, element) are private (the elements are the records);
    ``candidates_table`` (column ``set_col``) lists the public candidate sets:
    only those can be chosen, with or without rows in ``table``.
    """
    check_epsilon(epsilon), check_k(k)
    _columns(con, table, set_col=set_col, element_col=element_col)
    _columns(con, candidates_table, set_col=set_col)
    return _release(con, f"dp_max_coverage({sql_string(table)}, {sql_string(candidates_table)}, {int(k)}, "
                         f"epsilon := {_literal(epsilon)}, set_col := {sql_string(set_col)}, "
                         f"element_col := {sql_string(element_col)})")


def set_cover(con: duckdb.DuckDBPyConnection, table: str, candidates_table: str, epsilon: float = 1.0, *,
              set_col: str = "set_id", element_col: str = "element", tau_constant: float = 1000.0) -> pa.Table:
    """Pure eps-DP set cover (``dp_set_cover``, DPGreedyScaling): every candidate set of ``candidates_table``
    once, as (position, set_id) in the released order; charged once."""
    check_epsilon(epsilon)
    _check_positive_param("tau_constant", tau_constant, "the printed value is 1000")
    _columns(con, table, set_col=set_col, element_col=element_col)
    _columns(con, candidates_table, set_col=set_col)
    return _release(con, f"dp_set_cover({sql_string(table)}, {sql_string(candidates_table)}, "
                         f"epsilon := {_literal(epsilon)}, set_col := {sql_string(set_col)}, "
                         f"element_col := {sql_string(element_col)}, tau_constant := {_literal(tau_constant)})")


def eval_set_cover_cost(con: duckdb.DuckDBPyConnection, table: str, permutation_table: str, *,
                        set_col: str = "set_id", element_col: str = "element") -> int:
    """Open-set cost of a (position, set_id) permutation on ``table``. NON-PRIVATE evaluation of raw data."""
    _columns(con, table, set_col=set_col, element_col=element_col)
    _columns(con, permutation_table, set_col="position", element_col="set_id")
    rows = con.sql(f"FROM dp_eval_set_cover_cost({sql_string(table)}, {sql_string(permutation_table)}, "
                   f"set_col := {sql_string(set_col)}, element_col := {sql_string(element_col)})").fetchall()
    return int(rows[0][0])


def shifting_heavy_hitters(con: duckdb.DuckDBPyConnection, stream_table: str, buckets_table: str, k: int,
                           horizon: int, epsilon: float = 1.0, beta: float = 0.05, *, user_col: str = "user_id",
                           time_col: str = "t", bucket_col: str = "bucket") -> pa.Table:
    """Pure eps-DP shifting heavy hitters (``dp_shifting_heavy_hitters``): reported (t, bucket), sorted; charged once.

    ``stream_table`` rows (user, t, bucket) with t in 1..horizon; ``buckets_table``
    lists the public bucket set Y in column ``bucket_col``; ``horizon`` = T is public.
    Rows outside Y x 1..horizon are ignored.
    """
    heavy_hitters_calibration(epsilon, k, check_k(horizon, "horizon"), 1, beta)
    _columns(con, stream_table, user_col=user_col, time_col=time_col, bucket_col=bucket_col)
    _columns(con, buckets_table, bucket_col=bucket_col)
    return _release(con, f"dp_shifting_heavy_hitters({sql_string(stream_table)}, {sql_string(buckets_table)}, "
                         f"{int(k)}, epsilon := {_literal(epsilon)}, beta := {_literal(beta)}, "
                         f"horizon := {int(horizon)}, user_col := {sql_string(user_col)}, "
                         f"time_col := {sql_string(time_col)}, bucket_col := {sql_string(bucket_col)})")


def matroid_coverage(con: duckdb.DuckDBPyConnection, table: str, parts_table: str, capacities_table: str,
                     epsilon: float = 1.0, *, eta: float = 0.2, beta: float = 0.05, samples: Optional[int] = None,
                     set_col: str = "set_id", element_col: str = "element", part_col: str = "part",
                     capacity_col: str = "capacity") -> pa.Table:
    """Pure eps-DP coverage under a partition matroid (``dp_matroid_coverage``): (rank, set_id) in set_id order;
    charged once.

    ``parts_table`` (set_col, part_col) lists the public candidate sets, one
    part each; ``capacities_table`` (part_col, capacity_col) each part's capacity.
    """
    check_epsilon(epsilon), check_beta(beta), check_eta(eta)
    if samples is not None:
        check_k(samples, "samples")
    _columns(con, table, set_col=set_col, element_col=element_col)
    _columns(con, parts_table, set_col=set_col, part_col=part_col)
    _columns(con, capacities_table, part_col=part_col, capacity_col=capacity_col)
    return _release(con, f"dp_matroid_coverage({sql_string(table)}, {sql_string(parts_table)}, "
                         f"{sql_string(capacities_table)}, epsilon := {_literal(epsilon)}, eta := {_literal(eta)}, "
                         f"beta := {_literal(beta)}, samples := {_literal(samples)}, "
                         f"set_col := {sql_string(set_col)}, element_col := {sql_string(element_col)}, "
                         f"part_col := {sql_string(part_col)}, capacity_col := {sql_string(capacity_col)})")


def k_median(con: duckdb.DuckDBPyConnection, points_table: str, candidates_table: str, distances_table: str, k: int,
             q: int = 1, epsilon: float = 1.0, *, n_bound: Optional[int] = None, point_col: str = "point",
             candidate_col: str = "candidate_id") -> pa.Table:
    """Pure eps-DP k-median (q = 1) / k-means (q = 2) (``dp_k_median``): (rank, candidate_id) in candidate_id
    order; charged once.

    ``points_table`` (point_col): one private record per row, located at a
    candidate; ``candidates_table`` (candidate_col) and ``distances_table``
    (point, candidate, distance in [0, 1]) are the public metric; ``n_bound``
    a public upper bound on the number of points (required).
    """
    check_epsilon(epsilon), check_k(k)
    if q not in (1, 2):
        raise DPParameterError(f"q must be 1 (k-median) or 2 (k-means) (got {q!r})")
    _check_n_bound(n_bound)
    _columns(con, points_table, point_col=point_col)
    _columns(con, candidates_table, candidate_col=candidate_col)
    _columns(con, distances_table)  # its columns are fixed (point, candidate, distance); the binder checks them
    return _release(con, f"dp_k_median({sql_string(points_table)}, {sql_string(candidates_table)}, "
                         f"{sql_string(distances_table)}, {int(k)}, q := {int(q)}, epsilon := {_literal(epsilon)}, "
                         f"n_bound := {int(n_bound)}, point_col := {sql_string(point_col)}, "
                         f"candidate_col := {sql_string(candidate_col)})")


# --------------------------------------------------------------------------
# UDFs
# --------------------------------------------------------------------------

def _flat(arr: pa.Array, i: int, dtype=np.int64, what: str = "id") -> np.ndarray:
    """Row ``i`` of a LIST column as a numpy array (empty for NULL); a NULL element is an error."""
    value = arr[i]
    if not value.is_valid or value.values is None:
        return np.zeros(0, dtype=dtype)
    flat = value.values
    if flat.null_count:
        raise ValueError(f"dpsql: NULL {what} in an optimisation input list")
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=dtype)


def _scalars(arr: pa.Array) -> list:
    values = arr.to_pylist()
    if any(v is None for v in values):
        raise ValueError("dpsql: a size or parameter of an optimisation UDF is NULL")
    return values


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


def udfs(source: NoiseSource) -> list[Udf]:
    """Validation/calibration UDFs (pure) and the sequential kernels (draw noise: side effects)."""

    def coverage_check(k, epsilon, set_col, element_col):
        check_k(k), check_identifier("set_col", set_col), check_identifier("element_col", element_col)
        p = subsampling_probability(epsilon)
        warn_weak_parameters(epsilon, what="dp_max_coverage", stacklevel=1)
        return p

    def set_cover_check(epsilon, tau_constant, set_col, element_col):
        check_epsilon(epsilon), check_identifier("set_col", set_col), check_identifier("element_col", element_col)
        tau = _check_positive_param("tau_constant", tau_constant, "the printed value is 1000")
        warn_weak_parameters(epsilon, what="dp_set_cover", stacklevel=1)
        return tau

    def hh_cal(epsilon, k, beta, horizon, user_col, time_col, bucket_col):
        if horizon is None:
            raise DPParameterError("horizon must be given: the public number of time steps T, e.g. horizon := 100")
        for name, col in (("user_col", user_col), ("time_col", time_col), ("bucket_col", bucket_col)):
            check_identifier(name, col)
        cal = heavy_hitters_calibration(epsilon, k, horizon, 1, beta)
        warn_weak_parameters(epsilon, what="dp_shifting_heavy_hitters", stacklevel=1)
        return {"p": cal["p"], "k_max": check_k(k), "t_steps": check_k(horizon, "horizon")}

    def hh_tau(epsilon, k, beta, horizon, n_buckets):
        return heavy_hitters_calibration(epsilon, k, horizon, max(int(n_buckets), 1), beta)["tau"]

    def matroid_check(epsilon, eta, beta, samples, set_col, element_col, part_col, capacity_col):
        for name, col in (("set_col", set_col), ("element_col", element_col), ("part_col", part_col),
                          ("capacity_col", capacity_col)):
            check_identifier(name, col)
        check_epsilon(epsilon), check_beta(beta)
        eta = check_eta(eta)
        warn_weak_parameters(epsilon, what="dp_matroid_coverage", stacklevel=1)
        # resolved here so that the kernel gets the same s as _matroid_coverage_arrays' default
        return 8 * int(math.ceil(4.0 / eta)) if samples is None else check_k(samples, "samples")

    def k_median_cal(k, q, epsilon, n_bound, point_col, candidate_col):
        check_identifier("point_col", point_col), check_identifier("candidate_col", candidate_col)
        check_epsilon(epsilon)
        if q not in (1, 2):
            raise DPParameterError(f"q must be 1 (k-median) or 2 (k-means) (got {q!r})")
        warn_weak_parameters(epsilon, what="dp_k_median", stacklevel=1)
        return {"k_max": check_k(k), "q_exp": int(q), "n_max": _check_n_bound(n_bound)}

    def coverage_select(sets, elems, n_sets, n_elems, k):
        out = []
        for i, (m, n, kk) in enumerate(zip(_scalars(n_sets), _scalars(n_elems), _scalars(k))):
            out.append(_coverage_greedy(source, _flat(sets, i), _flat(elems, i), int(m), int(n), int(kk), EPS0))
        return pa.array(out, type=pa.list_(pa.int64()))

    def set_cover_select(sets, elems, n_sets, n_elems, epsilon, tau_constant):
        out = []
        for i, (m, n, e, c) in enumerate(zip(_scalars(n_sets), _scalars(n_elems), _scalars(epsilon),
                                             _scalars(tau_constant))):
            out.append(_greedy_scaling(source, _flat(sets, i), _flat(elems, i), int(m), int(n), float(e), float(c)))
        return pa.array(out, type=pa.list_(pa.int64()))

    def hh_select(users, times, buckets, n_users, horizon, n_buckets, k, tau):
        out = []
        for i, (nu, hz, nb, kk, tt) in enumerate(zip(_scalars(n_users), _scalars(horizon), _scalars(n_buckets),
                                                     _scalars(k), _scalars(tau))):
            reps = _thresh_monitor(source, _flat(users, i), _flat(times, i), _flat(buckets, i), int(nu), int(hz),
                                  int(nb), int(kk), float(tt), EPS0)
            out.append([t * int(nb) + y for t, y in reps])
        return pa.array(out, type=pa.list_(pa.int64()))

    def matroid_select(sets, elems, n_sets, n_elems, parts, caps, epsilon, eta, beta, samples):
        out = []
        for i, (m, n, e, h, b, s) in enumerate(zip(_scalars(n_sets), _scalars(n_elems), _scalars(epsilon),
                                                   _scalars(eta), _scalars(beta), _scalars(samples))):
            out.append(_matroid_coverage_arrays(source, _flat(sets, i), _flat(elems, i), int(m), int(n),
                                               _flat(parts, i), _flat(caps, i), float(e), float(h), float(b), int(s)))
        return pa.array(out, type=pa.list_(pa.int64()))

    def k_median_select(locations, rows, cols, dists, n_cands, k, q, epsilon, n_bound):
        out = []
        for i, (m, kk, qq, e, nb) in enumerate(zip(_scalars(n_cands), _scalars(k), _scalars(q), _scalars(epsilon),
                                                   _scalars(n_bound))):
            dist = _metric(_flat(rows, i), _flat(cols, i), _flat(dists, i, np.float64, "value"), int(m))
            if int(m) == 0:  # no candidates (public): nothing to choose
                out.append([])
                continue
            out.append(_k_median(source, _flat(locations, i), dist, int(kk), int(qq), float(e), int(nb)))
        return pa.array(out, type=pa.list_(pa.int64()))

    d, big, txt = DOUBLE, BIGINT, VARCHAR
    ids = duckdb.list_type(BIGINT)
    reals = duckdb.list_type(DOUBLE)
    return [
        Udf("dp__check_key_types", scalar(check_key_types), (txt, txt, txt), BOOLEAN),
        Udf("dp__max_coverage_check", scalar(coverage_check), (d, d, txt, txt), d),
        Udf("dp__set_cover_check", scalar(set_cover_check), (d, d, txt, txt), d),
        Udf("dp__heavy_hitters_calibration", scalar(hh_cal), (d, d, d, d, txt, txt, txt),
            duckdb.struct_type({"p": DOUBLE, "k_max": BIGINT, "t_steps": BIGINT})),
        Udf("dp__heavy_hitters_tau", scalar(hh_tau), (d, d, d, d, big), d),
        Udf("dp__max_coverage_select", coverage_select, (ids, ids, big, big, big), ids, side_effects=True),
        Udf("dp__set_cover_select", set_cover_select, (ids, ids, big, big, d, d), ids, side_effects=True),
        Udf("dp__heavy_hitters_select", hh_select, (ids, ids, ids, big, big, big, big, d), ids, side_effects=True),
        Udf("dp__matroid_coverage_check", scalar(matroid_check), (d, d, d, d, txt, txt, txt, txt), big),
        Udf("dp__k_median_calibration", scalar(k_median_cal), (d, d, d, d, txt, txt),
            duckdb.struct_type({"k_max": BIGINT, "q_exp": BIGINT, "n_max": BIGINT})),
        Udf("dp__matroid_coverage_select", matroid_select, (ids, ids, big, big, ids, ids, d, d, d, big), ids,
            side_effects=True),
        Udf("dp__k_median_select", k_median_select, (ids, ids, ids, reals, big, big, big, d, big), ids,
            side_effects=True),
    ]
