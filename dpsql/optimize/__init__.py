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
the SQL macro of ``sql/80_optimize/optimize.sql``, which validates, charges the ledger once and returns rows in a
data-independent order. :mod:`dpsql.optimize.baselines` (``nonprivate_*``, ``*_cost``,
``coverage_value``) is evaluation: NOT private.
"""
from __future__ import annotations

from functools import partial
from typing import cast

from dpsql.core.mechanism import REQUIRED, AuditCase, Example, Mechanism, Param
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

# The examples' data (tests/conformance/test_release.py, tests/optimize/test_optimize_release.py): every table twice, so a
# test can pass a second valid value.
EXAMPLE_SETS = """
CREATE TABLE sets AS SELECT * FROM (VALUES (1, 10), (1, 11), (2, 11), (2, 12), (3, 13), (9, 14)) v(set_id, element);
CREATE TABLE sets2 AS SELECT * FROM sets;
CREATE TABLE cands AS SELECT * FROM (VALUES (1), (2), (3), (4)) v(set_id);
CREATE TABLE cands2 AS SELECT * FROM cands;
CREATE TABLE parts AS SELECT * FROM (VALUES (1, 'a'), (2, 'a'), (3, 'b'), (4, 'b')) v(set_id, part);
CREATE TABLE parts2 AS SELECT * FROM parts;
CREATE TABLE caps AS SELECT * FROM (VALUES ('a', 1), ('b', 2)) v(part, capacity);
CREATE TABLE caps2 AS SELECT * FROM caps;
"""
# 16,000 users in bucket 'a' at t = 1, 2: above tau = 11,413 at epsilon 5 (k = 2, T = 3, |Y| = 2)
EXAMPLE_STREAM = """
CREATE TABLE st AS SELECT i AS user_id, t, 'a' AS bucket FROM range(16000) r(i), range(1, 3) s(t);
CREATE TABLE st2 AS SELECT * FROM st;
CREATE TABLE bk AS SELECT * FROM (VALUES ('a'), ('b')) v(bucket);
CREATE TABLE bk2 AS SELECT * FROM bk;
"""
EXAMPLE_METRIC = """
CREATE TABLE kc AS SELECT range AS candidate_id FROM range(5);
CREATE TABLE kc2 AS SELECT * FROM kc;
CREATE TABLE kd AS SELECT a.candidate_id AS point, b.candidate_id AS candidate,
    abs(a.candidate_id - b.candidate_id) / 4 AS distance FROM kc a, kc b;
CREATE TABLE kd2 AS SELECT * FROM kd;
CREATE TABLE kp AS SELECT CASE WHEN range % 2 = 0 THEN 0 ELSE 4 END AS point FROM range(400);
CREATE TABLE kp2 AS SELECT * FROM kp;
"""
_COVERAGE_ARGS = {"tbl": "'sets'", "candidates_tbl": "'cands'", "epsilon": "1.0", "set_col": "'set_id'",
                  "element_col": "'element'"}
_SQL = "80_optimize/optimize.sql"

MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="max_coverage", family="optimize", macro="dp_max_coverage", unit="record",
        params=(_TBL, Param("candidates_tbl", "VARCHAR", REQUIRED, check_table_name, "public candidate sets"),
                _K, _EPSILON, _SET_COL, _ELEMENT_COL),
        description="max k-coverage: DPSubmodGreedy at ln 2 on a Poisson subsample of the elements",
        proof="max_coverage", calibrate=subsampling_probability, sql=_SQL,
        example=Example.of(EXAMPLE_SETS, ("rank",), **_COVERAGE_ARGS, k="2"),
        # candidate sets of the output: an element that is a set's only element, removed
        audit=(AuditCase("coverage", options=(("k", 5),), note="record level, public candidate sets, k = 5"),
               # the audit's own instrument: candidate sets taken from the private rows, which it must refute
               AuditCase("broken_coverage"))),
    Mechanism(
        name="set_cover", family="optimize", macro="dp_set_cover", unit="record",
        params=(_TBL, Param("candidates_tbl", "VARCHAR", REQUIRED, check_table_name, "public candidate sets"),
                _EPSILON, _SET_COL, _ELEMENT_COL,
                Param("tau_constant", "DOUBLE", 1000.0, _check_tau_constant, "threshold constant (utility only)")),
        description="set cover: DPGreedyScaling, a permutation of the candidate sets (open-set model)",
        proof="set_cover", sql=_SQL, example=Example.of(EXAMPLE_SETS, ("position",), **_COVERAGE_ARGS, tau_constant="1.0"),
        audit=(AuditCase("coverage", note="record level, public candidate sets"),)),
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
        proof="shifting_heavy_hitters", sql=_SQL,
        example=Example.of(EXAMPLE_STREAM, ("t", "bucket"), tbl="'st'", buckets_tbl="'bk'", k="2", epsilon="1.0",
                           failure_probability="0.05", horizon="3", user_col="'user_id'", time_col="'t'",
                           bucket_col="'bucket'")),
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
        proof="matroid_coverage", calibrate=subsampling_probability, sql=_SQL,
        example=Example.of(EXAMPLE_SETS, ("set_id",), tbl="'sets'", parts_tbl="'parts'", capacities_tbl="'caps'",
                           epsilon="1.0", eta="0.5", failure_probability="0.05", samples="16", set_col="'set_id'",
                           element_col="'element'", part_col="'part'", capacity_col="'capacity'")),
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
        proof="k_median", calibrate=subsampling_probability, sql=_SQL,
        example=Example.of(EXAMPLE_METRIC, ("candidate_id",), tbl="'kp'", candidates_tbl="'kc'", distances_tbl="'kd'",
                           k="2", q="1", epsilon="1.0", n_bound="1000", point_col="'point'",
                           candidate_col="'candidate_id'", distance_point_col="'point'",
                           distance_candidate_col="'candidate'", distance_col="'distance'")),
)
