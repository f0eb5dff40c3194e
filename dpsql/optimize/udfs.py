"""The optimisation family's DuckDB UDFs: validation/calibration (pure) and the kernels (draw noise).

The macros of sql/80_optimize/optimize.sql call them; the kernels run once per query over flat id lists.
"""
from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR

from dpsql.core.noise import NoiseSource
from dpsql.optimize.common import (_check_positive_param, _flat, _scalars, check_eta, check_failure_probability,
                                   check_k, check_key_types)
from dpsql.optimize.heavy_hitters import _thresh_monitor, heavy_hitters_calibration
from dpsql.optimize.k_median import _check_n_bound, _k_median, _metric
from dpsql.optimize.matroid_coverage import _matroid_coverage_arrays
from dpsql.optimize.max_coverage import _coverage_greedy
from dpsql.optimize.set_cover import _greedy_scaling
from dpsql.optimize.subsampling import EPS0, subsampling_probability
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import DPParameterError, check_epsilon, check_identifier


def udfs(source: NoiseSource) -> list[Udf]:
    """Validation/calibration UDFs (pure) and the sequential kernels (draw noise: side effects)."""

    def coverage_check(k, epsilon, set_col, element_col):
        check_k(k), check_identifier("set_col", set_col), check_identifier("element_col", element_col)
        return subsampling_probability(epsilon)

    def set_cover_check(epsilon, tau_constant, set_col, element_col):
        check_epsilon(epsilon), check_identifier("set_col", set_col), check_identifier("element_col", element_col)
        return _check_positive_param("tau_constant", tau_constant, "the printed value is 1000")

    def hh_cal(epsilon, k, failure_probability, horizon, user_col, time_col, bucket_col):
        if horizon is None:
            raise DPParameterError("horizon must be given: the public number of time steps T, e.g. horizon := 100")
        for name, col in (("user_col", user_col), ("time_col", time_col), ("bucket_col", bucket_col)):
            check_identifier(name, col)
        cal = heavy_hitters_calibration(epsilon, k, horizon, 1, failure_probability)
        return {"p": cal["p"], "k_max": check_k(k), "t_steps": check_k(horizon, "horizon")}

    def hh_tau(epsilon, k, failure_probability, horizon, n_buckets):
        return heavy_hitters_calibration(epsilon, k, horizon, max(int(n_buckets), 1), failure_probability)["tau"]

    def matroid_check(epsilon, eta, failure_probability, samples, set_col, element_col, part_col, capacity_col):
        for name, col in (("set_col", set_col), ("element_col", element_col), ("part_col", part_col),
                          ("capacity_col", capacity_col)):
            check_identifier(name, col)
        check_epsilon(epsilon), check_failure_probability(failure_probability)
        eta = check_eta(eta)
        # resolved here so that the kernel gets the same s as _matroid_coverage_arrays' default
        return 8 * int(math.ceil(4.0 / eta)) if samples is None else check_k(samples, "samples")

    def k_median_cal(k, q, epsilon, n_bound, point_col, candidate_col, distance_point_col, distance_candidate_col,
                     distance_col):
        for name, col in (("point_col", point_col), ("candidate_col", candidate_col),
                          ("distance_point_col", distance_point_col),
                          ("distance_candidate_col", distance_candidate_col), ("distance_col", distance_col)):
            check_identifier(name, col)
        check_epsilon(epsilon)
        if q not in (1, 2):
            raise DPParameterError(f"q must be 1 (k-median) or 2 (k-means) (got {q!r})")
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

    def matroid_select(sets, elems, n_sets, n_elems, parts, caps, epsilon, eta, failure_probability, samples):
        out = []
        for i, (m, n, e, h, b, s) in enumerate(zip(_scalars(n_sets), _scalars(n_elems), _scalars(epsilon),
                                                   _scalars(eta), _scalars(failure_probability), _scalars(samples))):
            out.append(_matroid_coverage_arrays(source, _flat(sets, i), _flat(elems, i), int(m), int(n),
                                               _flat(parts, i), _flat(caps, i), float(e), float(h), float(b), int(s)))
        return pa.array(out, type=pa.list_(pa.int64()))

    def k_median_select(locations, rows, cols, dists, n_cands, k, q, epsilon, n_bound):
        out: list[list[int]] = []
        for i, (m, kk, qq, e, nb) in enumerate(zip(_scalars(n_cands), _scalars(k), _scalars(q), _scalars(epsilon),
                                                   _scalars(n_bound))):
            dist = _metric(_flat(rows, i), _flat(cols, i), _flat(dists, i, np.float64, "value"), int(m))
            if int(m) == 0:  # no candidates (public): nothing to choose
                out.append([])
                continue
            out.append(_k_median(source, _flat(locations, i), dist, int(kk), float(e), int(nb), int(qq)))
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
        Udf("dp__k_median_calibration", scalar(k_median_cal), (d, d, d, d, txt, txt, txt, txt, txt),
            duckdb.struct_type({"k_max": BIGINT, "q_exp": BIGINT, "n_max": BIGINT})),
        Udf("dp__matroid_coverage_select", matroid_select, (ids, ids, big, big, ids, ids, d, d, d, big), ids,
            side_effects=True),
        Udf("dp__k_median_select", k_median_select, (ids, ids, ids, reals, big, big, big, d, big), ids,
            side_effects=True),
    ]
