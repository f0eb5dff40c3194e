"""Set cover, pure epsilon-DP: DPGreedyScaling in the open-set model ([SUB] Alg. 4, Thm 1.4, App. E).

Mechanism (``dp_set_cover``, sql/80_optimize/optimize.sql). Public: the candidate sets (``candidates_tbl``).
Private: the universe elements (records ``x in {0,1}^m``, the rows of ``tbl`` with that element). The
output is a permutation of all candidates; each element is served by the first set holding it. A noisy
size ``n~ = max(n + Lap(2/eps), 100 ln m)`` fixes ``R = floor(log2(n~ / (100 ln m)))`` rounds; round
``r`` subsamples the elements afresh with ``p_r = 1 - e^{-eps_r}``, ``eps_r = eps / (4 * 2^(R-r))``, and
picks, in id order, every remaining set whose count of new sampled elements plus ``Exp(rate ln 2)``
exceeds ``p_r tau_constant n~ / 2^r``; the sets never picked follow in id order.

Privacy (unit: one universe element with all its memberships, add/remove). ``n`` has sensitivity 1:
the Laplace step is eps/2-DP. Each round is a Repeated-AT over monotone counts to which an element adds
1 in at most one reported count (the set that covers it): ``ln 2``-add-DP ([SUB] Thm 5.3), hence
``eps_r``-DP on the subsample (Cor. 3.2). Basic composition: ``eps/2 + sum_r eps_r < eps``.
``tau_constant`` only moves data-independent thresholds. Full argument: ``docs/proofs/set_cover.md``.
"""
from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.core.noise import NoiseSource
from dpsql.optimize.common import _check_positive_param, _columns, _Coverage, _literal, _release
from dpsql.optimize.subsampling import EPS0, poisson_subsample
from dpsql.core.validation import check_epsilon, sql_string
from dpsql.core.inputs import accepts_tables


def greedy_scaling_epsilons(epsilon: float, rounds: int) -> list[float]:
    """Per-round budgets ``eps_r = eps / (4 * 2^(R-r))``, r = 1..R, of DPGreedyScaling ([SUB] Alg. 4).

    Geometric: ``Σ_r eps_r = (eps/2)(1 - 2^-R) < eps/2``, so with the eps/2 of the ``Lap(2/eps)`` step the
    total stays below eps for every R (App. E).
    """
    epsilon = check_epsilon(epsilon)
    return [epsilon / (4.0 * 2.0 ** (rounds - r)) for r in range(1, int(rounds) + 1)]


def _greedy_scaling(source: NoiseSource, set_idx, elem_idx, n_sets: int, n_elems: int, epsilon: float,
                   tau_constant: float = 1000.0) -> list[int]:
    """DPGreedyScaling_eps: a permutation of all ``n_sets`` sets (open-set model), pure eps-DP.

    ``n_elems`` is ``n = |D|`` (private). Steps, as printed in Alg. 4 with one
    correction:

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
    value; the paper's proof uses 1 in one place and needs 1000 in another,
    and we keep the printed 1000 as the default. With 1000 almost nothing is picked in the rounds unless
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


@accepts_tables("table", "candidates_tbl")
def set_cover(con: duckdb.DuckDBPyConnection, table: str, candidates_tbl: str, *, epsilon: float,
              set_col: str = "set_id", element_col: str = "element", tau_constant: float = 1000.0) -> pa.Table:
    """Pure eps-DP set cover (``dp_set_cover``, DPGreedyScaling): every candidate set of ``candidates_tbl``
    once, as (position, set_id) in the released order; charged once."""
    check_epsilon(epsilon)
    _check_positive_param("tau_constant", tau_constant, "the printed value is 1000")
    _columns(con, table, set_col=set_col, element_col=element_col)
    _columns(con, candidates_tbl, set_col=set_col)
    return _release(con, f"dp_set_cover({sql_string(table)}, {sql_string(candidates_tbl)}, "
                         f"epsilon := {_literal(epsilon)}, set_col := {sql_string(set_col)}, "
                         f"element_col := {sql_string(element_col)}, tau_constant := {_literal(tau_constant)})")
