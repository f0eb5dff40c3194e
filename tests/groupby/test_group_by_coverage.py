"""Private GROUP BY: the noise has the calibrated scale and the reported half-widths cover (fixed seeds,
explicit tolerances). Over a public list of groups no user is capped, so released - true is the noise
(plus the documented post-processing)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql import groupby as gb

from conftest import seeded
from test_group_by import items_table, load

N_GROUPS = 2500


def _covered(s: float, m: int) -> float:
    """P[|Z| <= m] for Z ~ N_Z(0, s^2) (grid steps), summed from the pmf; >= the interval's confidence."""
    z = np.arange(-int(50 * s) - 50, int(50 * s) + 51).astype(float)
    p = np.exp(-z * z / (2 * s * s))
    return float(p[np.abs(z) <= m].sum() / p.sum())


def _data():
    """Group k is held by k % 40 users, each with 1 + (u % 3) rows of value 1 + (u % 5) (totals 1..15)."""
    rows, truth = [], {}
    for k in range(N_GROUPS):
        users = [(k * 100 + u, 1 + (u % 3), 1 + (u % 5)) for u in range(k % 40)]
        for u, r, v in users:
            rows += [(u, f"x{k:04d}", v)] * r
        totals = np.array([min(12.0, r * v) for _, r, v in users])  # clamped to [0, 12]
        truth[f"x{k:04d}"] = (len(users), sum(min(2, r) for _, r, _ in users), totals)
    return rows, truth


@pytest.mark.slow
def test_gaussian_noise_has_the_calibrated_scale_and_the_intervals_cover():
    conf = 0.9
    rows, truth = _data()
    con = seeded(20261201)
    load(con, rows)
    items_table(con, list(truth))
    out = con.sql(f"SELECT * FROM dp_group_by('t', epsilon := 2.0, delta := 1e-5, items_tbl := 'pub', max_items := 1, "
                  f"max_rows := 2, aggregates := ['count', 'rows', 'sum', 'mean', 'variance', 'stddev'], "
                  f"value_col := 'v', lower := 0, upper := 12, confidence := {conf})").to_arrow_table().to_pylist()
    con.close()
    assert len(out) == N_GROUPS
    cal = gb.group_by_calibration(2.0, 1e-5, 1, ["count", "rows", "sum", "mean", "variance", "stddev"], "v", 0, 12,
                                  selection=None, confidence=conf, max_rows=2)
    assert out[0]["count_scale"] == cal.count_scale and out[0]["sum_scale"] == cal.sum_scale
    far = [r for r in out if truth[r["item"]][0] >= 10]  # counts and sums far from the clamp at 0
    n_true = np.array([truth[r["item"]][0] for r in far])
    for name, true in (("count", n_true), ("rows", np.array([truth[r["item"]][1] for r in far])),
                       ("sum", np.array([truth[r["item"]][2].sum() for r in far]))):
        z = np.array([r[name] for r in far]) - true
        sigma, ci = far[0][f"{name}_scale"], far[0][f"{name}_ci"]
        # E[Z^2] = sigma^2 (the discrete Gaussian's variance is sigma^2 up to e^(-2 pi^2 s^2) relative; the
        # integer rounding of count and rows adds nothing: their noise is an integer already): s.e. of the
        # ratio sqrt(2 / 1875) ~ 3.3 %
        assert abs(np.mean(z * z) / sigma ** 2 - 1) < 0.12, name
        # the interval covers P[|Z| <= ci] >= conf of the groups, that probability summed from the discrete
        # Gaussian's pmf (on the count's integer grid it is above conf by up to a step): binomial s.e. <= 0.7 %
        g = cal.measure(name).granularity
        assert abs(np.mean(np.abs(z) <= ci) - _covered(sigma / g, round(ci / g))) < 0.025, name
    # the derived intervals are conservative (union bounds): they cover at least conf of the groups (those with
    # >= 25 users: a noisy count <= 0, which gives no mean, is then 5 sigma away)
    big = [r for r in far if truth[r["item"]][0] >= 25]
    assert len(big) > 900 and all(r["mean"] is not None for r in big)  # 15 of every 40 groups
    for name, true in (("mean", np.array([truth[r["item"]][2].mean() for r in big])),
                       ("variance", np.array([truth[r["item"]][2].var() for r in big])),
                       ("stddev", np.array([truth[r["item"]][2].std() for r in big]))):
        covered = np.abs(np.array([r[name] for r in big]) - true) <= np.array([r[f"{name}_ci"] for r in big])
        assert np.mean(covered) >= conf - 0.01, name


@pytest.mark.slow
def test_the_medians_utility_gap_is_within_its_half_width():
    # u(released) >= max_j u(j) - median_ci for at least conf of the groups (the exponential mechanism's
    # guarantee; docs/proofs/group_by.md §7), over the values snapped to the grid of [0, 12]
    conf = 0.8
    rows, truth = _data()
    con = seeded(20261202)
    load(con, rows)
    items_table(con, list(truth))
    out = con.sql(f"SELECT item, median, median_ci FROM dp_group_by_public('t', 'pub', epsilon := 4.0, "
                  f"max_items := 1, aggregates := ['median'], value_col := 'v', lower := 0, upper := 12, "
                  f"confidence := {conf})").fetchall()
    con.close()
    step = 12 / 256
    gaps = []
    for item, median, ci in out:
        snapped = np.round(truth[item][2] / step)
        if len(snapped) < 10:
            continue

        def u(j):
            return -abs(int(np.sum(snapped < j)) - int(np.sum(snapped > j)))

        best = max(u(j) for j in range(257))
        gaps.append(best - u(round(median / step)) <= ci)
    # binomial s.e. sqrt(0.16 / 1875) ~ 0.9 %; the bound is loose (ln 257 of slack), so coverage is near 1
    assert len(gaps) > 1800 and np.mean(gaps) >= conf - 0.02
    assert math.isfinite(out[0][2])
