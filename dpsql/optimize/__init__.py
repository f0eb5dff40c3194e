"""Pure epsilon-DP combinatorial optimisation by subsampling ([SUB], Ghazi et al.), thin on :mod:`dpsql.optimize.subsampling`.

Privacy unit: one record, add/remove -- a universe element with all its memberships (coverage, set
cover, matroid coverage), a user's whole stream (heavy hitters), a point (k-median). Every mechanism
here is "an ln 2-add-DP algorithm run on ``S_p(D)`` with ``p = 1 - e^-eps``" and hence pure eps-DP by
[SUB] Cor. 3.2 (see :mod:`dpsql.optimize.subsampling`), except DPGreedyScaling (set cover), which splits its
budget itself. One module per mechanism states its math and privacy argument.

What the proofs take as public. [SUB] fixes the candidate universe ``[m]`` before the data: a record is
``x in X = {0,1}^m`` (its memberships in the m sets), a point of the metric ``[m]`` or a stream over the
buckets Y and times 1..T. Repeated-EM's candidates ``C_i = [m] minus {c*_1, ..., c*_{i-1}}`` and
Repeated-AT's tests depend on earlier outputs only, and the privacy theorems compare ``q_i(c; D)`` with
``q_i(c; D')`` over the *same* candidates. Were the set ids read from the private rows, removing a set's
only element would remove the set from every ``C_i``: an output holding it has probability 0 on D', and
no epsilon bounds that. So every candidate list is a public table (``candidates_tbl``, ``parts_tbl``,
``buckets_tbl``); a candidate without private rows is still a candidate (score 0); private rows outside
the public universe are ignored: such a row is no membership of X, and an error instead would tell
whether some record holds a value the caller chose.

Layout: each mechanism has a numpy kernel (compact integer ids) taking a
:class:`~dpsql.core.noise.NoiseSource`; kernels are private (leading underscore): they release without
charging, and only the UDFs (:mod:`dpsql.optimize.udfs`) call them. Each public release function runs
the SQL macro of ``sql/80_optimize.sql``, which validates, charges the ledger once and returns rows in a
data-independent order. :mod:`dpsql.optimize.baselines` (``nonprivate_*``, ``*_cost``,
``coverage_value``) is evaluation: NOT private.
"""
from __future__ import annotations

from functools import partial
from typing import cast

from dpsql.core.mechanism import REQUIRED, Mechanism, Param
from dpsql.optimize.baselines import (coverage_value, eval_set_cover_cost, nonprivate_greedy_coverage,
                                      nonprivate_greedy_set_cover, set_cover_cost)
from dpsql.optimize.common import (ETA_MIN, K_LIMIT, _check_positive_param, _Coverage, check_beta, check_eta,
                                   check_failure_probability, check_k, check_key_types)
from dpsql.optimize.heavy_hitters import (_shifting_heavy_hitters_arrays, _thresh_monitor, heavy_hitters_calibration,
                                          shifting_heavy_hitters)
from dpsql.optimize.k_median import N_BOUND_LIMIT, _check_n_bound, _k_median, k_median
from dpsql.optimize.matroid_coverage import (_matroid_coverage_arrays, _priv_cont_greedy, _swap_round,
                                             matroid_coverage)
from dpsql.optimize.max_coverage import _coverage_greedy, _max_coverage_arrays, max_coverage
from dpsql.optimize.set_cover import _greedy_scaling, greedy_scaling_epsilons, set_cover
from dpsql.optimize.udfs import udfs
from dpsql.optimize.subsampling import subsampling_probability
from dpsql.core.validation import check_epsilon, check_identifier, check_table_name

__all__ = [
    "check_k", "check_failure_probability", "check_beta", "check_eta", "check_key_types",
    # releases: each runs its SQL macro, which charges the ledger once
    "max_coverage", "set_cover", "shifting_heavy_hitters", "matroid_coverage", "k_median",
    # pure calibration
    "greedy_scaling_epsilons", "heavy_hitters_calibration",
    # NOT private: evaluation of raw data and baselines
    "eval_set_cover_cost", "set_cover_cost", "coverage_value",
    "nonprivate_greedy_coverage", "nonprivate_greedy_set_cover",
    "udfs", "MECHANISMS",
]


def _col(name: str, default: str, doc: str) -> Param:
    return Param(name, "VARCHAR", default, partial(check_identifier, name), doc)


def _check_tau_constant(value: object) -> float:
    return _check_positive_param("tau_constant", value, "the printed value is 1000")


def _check_q(q: object) -> int:
    from dpsql.core.errors import ParameterError

    if q not in (1, 2):
        raise ParameterError(f"q must be 1 (k-median) or 2 (k-means) (got {q!r})")
    return int(cast(float, q))  # q == 1 or q == 2 here: a number, which `in` cannot narrow


_TBL = Param("tbl", "VARCHAR", REQUIRED, check_table_name, "the private table")
_EPSILON = Param("epsilon", "DOUBLE", REQUIRED, check_epsilon, "privacy parameter (pure DP), epsilon > 0")
_FAILURE = Param("failure_probability", "DOUBLE", 0.05, check_failure_probability,
                 "failure probability of the utility guarantee (no effect on privacy)")
_SET_COL = _col("set_col", "set_id", "the set id column (of tbl and of the public set list)")
_ELEMENT_COL = _col("element_col", "element", "the element column of tbl")
_K = Param("k", "DOUBLE", REQUIRED, check_k, "number of sets / centres to choose")

MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="max_coverage", family="optimize", macro="dp_max_coverage", unit="record",
        params=(_TBL, Param("candidates_tbl", "VARCHAR", REQUIRED, check_table_name, "public candidate sets"),
                _K, _EPSILON, _SET_COL, _ELEMENT_COL),
        description="max k-coverage: DPSubmodGreedy at ln 2 on a Poisson subsample of the elements",
        proof="max_coverage", calibrate=subsampling_probability),
    Mechanism(
        name="set_cover", family="optimize", macro="dp_set_cover", unit="record",
        params=(_TBL, Param("candidates_tbl", "VARCHAR", REQUIRED, check_table_name, "public candidate sets"),
                _EPSILON, _SET_COL, _ELEMENT_COL,
                Param("tau_constant", "DOUBLE", 1000.0, _check_tau_constant, "threshold constant (utility only)")),
        description="set cover: DPGreedyScaling, a permutation of the candidate sets (open-set model)",
        proof="set_cover"),
    Mechanism(
        name="shifting_heavy_hitters", family="optimize", macro="dp_shifting_heavy_hitters", unit="record",
        params=(_TBL, Param("buckets_tbl", "VARCHAR", REQUIRED, check_table_name, "public buckets Y"),
                _K, Param("horizon", "DOUBLE", REQUIRED, partial(check_k, name="horizon"),
                          "public number of time steps T"),
                _EPSILON, _FAILURE,
                _col("user_col", "user_id", "the user column of tbl"),
                _col("time_col", "t", "the time column of tbl (1..horizon)"),
                _col("bucket_col", "bucket", "the bucket column (of tbl and buckets_tbl)")),
        description="shifting heavy hitters: ThreshMonitor at ln 2 on a Poisson subsample of the users",
        proof="shifting_heavy_hitters"),
    Mechanism(
        name="matroid_coverage", family="optimize", macro="dp_matroid_coverage", unit="record",
        params=(_TBL, Param("parts_tbl", "VARCHAR", REQUIRED, check_table_name, "public sets, one part each"),
                Param("capacities_tbl", "VARCHAR", REQUIRED, check_table_name, "public capacity of each part"),
                _EPSILON, Param("eta", "DOUBLE", 0.2, check_eta, "approximation slack (utility only)"),
                _FAILURE,
                Param("samples", "DOUBLE", None, partial(check_k, name="samples"),
                      "uniform vectors per pass (utility only); NULL: 8 per pass"),
                _SET_COL, _ELEMENT_COL, _col("part_col", "part", "the part column (parts_tbl, capacities_tbl)"),
                _col("capacity_col", "capacity", "the capacity column of capacities_tbl")),
        description="coverage under a partition matroid: continuous greedy + swap rounding + EM, on a subsample",
        proof="matroid_coverage", calibrate=subsampling_probability),
    Mechanism(
        name="k_median", family="optimize", macro="dp_k_median", unit="record",
        params=(_TBL, Param("candidates_tbl", "VARCHAR", REQUIRED, check_table_name, "public candidate centres"),
                Param("distances_tbl", "VARCHAR", REQUIRED, check_table_name, "public metric, distances in [0, 1]"),
                _K, _EPSILON,
                Param("n_bound", "DOUBLE", REQUIRED, _check_n_bound, "public upper bound on the number of points"),
                Param("q", "DOUBLE", 1, _check_q, "1: k-median, 2: k-means"),
                _col("point_col", "point", "the location column of tbl (a candidate id)"),
                _col("candidate_col", "candidate_id", "the id column of candidates_tbl"),
                _col("distance_point_col", "point", "the point column of distances_tbl"),
                _col("distance_candidate_col", "candidate", "the candidate column of distances_tbl"),
                _col("distance_col", "distance", "the distance column of distances_tbl")),
        description="k-median / k-means: bicriteria Repeated-EM, noisy counts and local search, on a subsample",
        proof="k_median", calibrate=subsampling_probability),
)
