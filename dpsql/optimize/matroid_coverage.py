"""Coverage under a partition matroid, pure epsilon-DP: PrivContGreedy + swap rounding ([SUB] App. D, Thm 1.3).

Mechanism (``dp_matroid_coverage``, sql/80_optimize/optimize.sql). Public: the matroid -- the candidate sets,
one part each (``parts_tbl``), and each part's capacity (``capacities_tbl``). Private: the universe
elements (records ``x in {0,1}^m``, the rows of ``tbl`` with that element). On the elements kept with
probability ``p = 1 - e^-epsilon``: the continuous greedy at ``ln 2 / 2`` (``ceil(4/eta)`` passes, each
an independent set built by exponential mechanisms), ``ceil(20 ln(6/failure_probability)/eta)`` swap
roundings of its fractional point, and one exponential mechanism at ``ln 2 / 2`` over the rounded sets
with score their coverage.

Privacy (unit: one universe element with all its memberships, add/remove). The greedy's scores are
monotone and an element's contributions telescope to at most 1 (Obs. D.3): ``ln 2 / 2``-add-DP; swap
rounding sees only released sets (post-processing); the final choice has sensitivity 1: ``ln 2 / 2``.
Basic composition gives ``ln 2``-add-DP, and the subsample epsilon-DP (Cor. 3.2). ``eta``,
``failure_probability`` and ``samples`` affect utility only. Full argument:
``docs/proofs/matroid_coverage.md``.
"""
from __future__ import annotations

import math
from typing import Optional

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.core.noise import NoiseSource
from dpsql.optimize.common import (_columns, _Coverage, _gather, _ids, _literal, _release, check_eta,
                                   check_failure_probability, check_k)
from dpsql.optimize.subsampling import EPS0, exp_mech, poisson_subsample, subsampling_probability
from dpsql.core.validation import DPParameterError, check_epsilon, sql_string
from dpsql.core.inputs import accepts_tables


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
        per: list[list[int]] = [[] for _ in range(n_parts)]
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
                            capacities, epsilon: float, eta: float = 0.2, failure_probability: float = 0.05,
                            samples: Optional[int] = None) -> list[int]:
    """Pure eps-DP max coverage under a partition matroid ([SUB] Thm 1.3): ``A_{ln 2, eta/2, beta/2}`` on ``S_p``
    (``beta`` = ``failure_probability``).

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
    and the mechanism picks blindly (measured coverage by ``s``:
    benchmarks/README.md, "Figures moved out of the code"). Default ``s = 8 * passes``
    (8 expected flips per step); each sample costs one boolean per element
    and one count per set. Privacy does not depend on ``s``.
    """
    epsilon, beta, eta = check_epsilon(epsilon), check_failure_probability(failure_probability), check_eta(eta)
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


@accepts_tables("table", "parts_tbl", "capacities_tbl")
def matroid_coverage(con: duckdb.DuckDBPyConnection, table: str, parts_tbl: str, capacities_tbl: str, *,
                     epsilon: float, eta: float = 0.2, failure_probability: float = 0.05,
                     samples: Optional[int] = None, set_col: str = "set_id", element_col: str = "element",
                     part_col: str = "part", capacity_col: str = "capacity") -> pa.Table:
    """Pure eps-DP coverage under a partition matroid (``dp_matroid_coverage``): (rank, set_id) in set_id order;
    charged once.

    ``parts_tbl`` (set_col, part_col) lists the public candidate sets, one
    part each; ``capacities_tbl`` (part_col, capacity_col) each part's capacity.
    """
    check_epsilon(epsilon), check_failure_probability(failure_probability), check_eta(eta)
    if samples is not None:
        check_k(samples, "samples")
    _columns(con, table, set_col=set_col, element_col=element_col)
    _columns(con, parts_tbl, set_col=set_col, part_col=part_col)
    _columns(con, capacities_tbl, part_col=part_col, capacity_col=capacity_col)
    return _release(con, f"dp_matroid_coverage({sql_string(table)}, {sql_string(parts_tbl)}, "
                         f"{sql_string(capacities_tbl)}, epsilon := {_literal(epsilon)}, eta := {_literal(eta)}, "
                         f"failure_probability := {_literal(failure_probability)}, samples := {_literal(samples)}, "
                         f"set_col := {sql_string(set_col)}, element_col := {sql_string(element_col)}, "
                         f"part_col := {sql_string(part_col)}, capacity_col := {sql_string(capacity_col)})")
