"""Private GROUP BY: the calibration's exact numbers (Gaussian noise, contribution bounds, the accountant, the
half-widths), derived from the math of docs/proofs/group_by.md §4 and dpsql/groupby/calibration.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtri

from dpsql import groupby as gb
from dpsql.core import accounting, calibration
from dpsql.core.calibration import default_granularity
from dpsql.core.validation import DPParameterError


# -- the goal -----------------------------------------------------------------------------


def test_default_count_half_width_is_a_sixth_of_the_laplace_one():
    # (epsilon, delta) = (1, 1e-5), every default: max_items = max_groups = 100, selection sips_cumulative at
    # (0.5, 1e-5), split 0.5, count only, 95 %.
    cal = gb.group_by_calibration(1.0, 1e-5)
    # sips_cumulative (with dropping): its rounds are one Gaussian mechanism of s = gaussian_sigma(0.5, 0.6 (1 -
    # 1e-9) delta) per unit of l2 sensitivity, plus novel items with probability 0.4 delta
    s = calibration.gaussian_sigma(0.5, 0.6 * (1 - 1e-9) * 1e-5)
    rho_s, events = 1 / (2 * s * s), 0.4e-5
    assert gb.selection_zcdp("sips_cumulative", 0.5, 1e-5, 100) == (pytest.approx(rho_s, rel=1e-9),
                                                                     pytest.approx(events, rel=1e-12))
    rho_a = accounting.zcdp_budget(1.0, 1e-5 - events) - rho_s
    assert cal.aggregate_rho == pytest.approx(rho_a, rel=1e-9)
    # count: integer grid, l2 sqrt(100) = 10 steps, sigma = 10 / sqrt(2 rho_a)
    sigma = 10 / math.sqrt(2 * rho_a)
    assert (cal.noise, cal.count_granularity) == ("gaussian", 1.0)
    assert cal.count_scale == pytest.approx(sigma, rel=1e-9) and 50.67 < cal.count_scale < 50.68
    assert cal.count_ci == math.ceil(sigma * float(ndtri(0.975))) == 100.0
    # the baseline: Laplace, scale 100 / 0.5 = 200, half-width 599.1 (200 ln 20 on the grid)
    old = gb.group_by_calibration(1.0, 1e-5, noise="laplace")
    assert old.count_scale == 200.0 and 599.0 < old.count_ci < 599.2
    assert cal.count_ci <= old.count_ci / 3 / 1.99  # a sixth, the goal was a third


def test_default_accounting_composes_to_the_charged_budget():
    cal = gb.group_by_calibration(1.0, 1e-5)
    acc = cal.accounting
    assert acc is not None and acc.accountant == accounting.ZCDP
    rho_s, events = gb.selection_zcdp("sips_cumulative", 0.5, 1e-5, 100)
    # delta at epsilon 1 of the composed rho, plus the selection's novel items: within the charge
    assert acc.mechanism_delta == pytest.approx(accounting.zcdp_delta(rho_s + cal.aggregate_rho, 1.0), rel=1e-12)
    assert acc.event_delta == events and acc.delta <= 1e-5 and acc.epsilon <= 1.0
    assert (cal.selection_epsilon, cal.selection_delta, cal.aggregate_delta) == (0.5, 1e-5, 1e-5 - events)


# -- selection and aggregates: the two composition routes -------------------------------------


def test_gaussian_domain_selection_composes_by_zcdp():
    # weighted_gaussian at (1, 1e-6): sigma_D = gaussian_sigma(1, 5e-7) per unit, novel items 5e-7
    cal = gb.group_by_calibration(2.0, 1e-6, 8, selection="weighted_gaussian")
    sigma_d = calibration.gaussian_sigma(1.0, 5e-7)
    rho_s = 1 / (2 * sigma_d ** 2)
    rho_a = accounting.zcdp_budget(2.0, 5e-7) - rho_s
    assert (cal.selection_epsilon, cal.selection_delta) == (1.0, 1e-6)
    assert cal.aggregate_rho == pytest.approx(rho_a, rel=1e-12)
    assert cal.count_scale == pytest.approx(math.sqrt(8) / math.sqrt(2 * rho_a), rel=1e-12)
    assert cal.accounting.accountant == "zcdp" and cal.accounting.delta <= 1e-6


@pytest.mark.parametrize("method", ["count_laplace", "weighted_laplace", "policy_laplace", "greedy_update"])
def test_selection_without_a_gaussian_form_composes_by_shares(method):
    # basic composition: the selection at (epsilon split, delta split), the aggregates' rho converts to the rest
    assert gb.selection_zcdp(method, 0.5, 1e-5, 10) is None
    cal = gb.group_by_calibration(1.0, 1e-5, 10, selection=method, split=0.4)
    assert (cal.selection_epsilon, cal.selection_delta) == (0.4, pytest.approx(0.4e-5, rel=1e-15))
    rho_a = accounting.zcdp_budget(0.6, 0.6e-5)
    assert cal.aggregate_rho == rho_a and cal.aggregate_delta == pytest.approx(0.6e-5, rel=1e-15)
    assert cal.count_scale == math.sqrt(10) / math.sqrt(2 * rho_a)
    assert cal.accounting.accountant == "basic"


@pytest.mark.parametrize("method", ["count_gaussian", "mad", "mad2r", "sips", "sips_cumulative", "policy_gaussian"])
def test_every_gaussian_selection_leaves_the_aggregates_a_positive_share(method):
    cal = gb.group_by_calibration(1.0, 1e-5, 10, selection=method)
    rho_s, events = gb.selection_zcdp(method, 0.5, 1e-5, 10)
    assert cal.aggregate_rho > 0 and cal.accounting.accountant == "zcdp"
    total = accounting.zcdp_delta(rho_s + cal.aggregate_rho, 1.0) + events
    assert total <= 1e-5


def test_the_selection_alone_may_use_the_whole_zcdp_budget():
    # at split 0.99 the exact Gaussian of the selection at (0.99, delta/2) has more zCDP than the RDP conversion
    # allows at (1, delta/2): nothing is left for the aggregates
    with pytest.raises(DPParameterError, match="split is too large for Gaussian aggregates"):
        gb.group_by_calibration(1.0, 1e-5, 10, selection="weighted_gaussian", split=0.99)
    # Laplace aggregates are pure: any split works
    assert gb.group_by_calibration(1.0, 1e-5, 10, selection="weighted_gaussian", split=0.99, noise="laplace")


def test_public_list_gives_the_whole_budget_to_the_aggregates():
    cal = gb.group_by_calibration(1.0, 1e-5, 4, selection=None)
    rho = accounting.zcdp_budget(1.0, 1e-5)
    assert (cal.noise, cal.selection, cal.aggregate_rho) == ("gaussian", None, rho)
    assert cal.count_scale == 2 / math.sqrt(2 * rho)  # sqrt(4) / sqrt(2 rho)
    assert cal.accounting.delta <= 1e-5
    assert gb.group_by_calibration(1.0, None, 4, selection=None).noise == "laplace"  # no delta: Laplace
    with pytest.raises(DPParameterError, match="noise := 'gaussian' needs delta"):
        gb.group_by_calibration(1.0, None, 4, selection=None, noise="gaussian")


# -- every measurement ---------------------------------------------------------------------------


def test_gaussian_measurements_share_rho_equally():
    # public list at (1, 1e-5), L0 = 3, max_rows 4, [lower, upper] = [-2, 6]: M = 6, centre 2, R = 4;
    # every aggregate: 5 measurements (count, rows, sum, sumsq, median), rho_m = rho / 5
    aggs = ["count", "rows", "sum", "mean", "variance", "stddev", "median"]
    cal = gb.group_by_calibration(1.0, 1e-5, 10, aggs, "v", -2, 6, selection=None, max_groups=3, max_rows=4)
    assert [m.name for m in cal.measures] == ["count", "rows", "sum", "sumsq", "median"]
    rho_m = accounting.zcdp_budget(1.0, 1e-5) / 5
    by = {m.name: m for m in cal.measures}
    assert all(by[n].rho == rho_m for n in ("count", "rows", "sum", "sumsq", "median"))
    # count, rows: integers on the integer grid, per-group bound 1 and max_rows
    assert by["count"].scale == math.sqrt(3) * 1 / math.sqrt(2 * rho_m) and by["count"].granularity == 1.0
    assert by["rows"].scale == math.sqrt(3) * 4 / math.sqrt(2 * rho_m) and by["rows"].steps == 4
    # sum: bound M = 6 rounded to the grid g = default grid of the continuous sigma: floor(6/g) + 1 steps
    g = default_granularity(math.sqrt(3) * 6 / math.sqrt(2 * rho_m))
    assert by["sum"].granularity == g and by["sum"].steps == math.floor(6 / g) + 1
    assert by["sum"].scale == g * (math.sqrt(3) * (math.floor(6 / g) + 1) / math.sqrt(2 * rho_m))
    # sumsq: bound R^2 = 16
    g = default_granularity(math.sqrt(3) * 16 / math.sqrt(2 * rho_m))
    assert by["sumsq"].bound == 16.0 and by["sumsq"].steps == math.floor(16 / g) + 1
    # median: L0 exponential mechanisms of eps0 are L0 eps0^2 / 8-zCDP
    eps0 = math.sqrt(8 * rho_m / 3)
    assert by["median"].epsilon0 == eps0 and by["median"].scale == 2 / eps0
    assert by["median"].ci == 2 / eps0 * math.log(257 / (1 - 0.95))
    # half-widths: ceil(s z) steps at 95 %; the mean's at 97.5 %, the variance's at 1 - 0.05/3
    for name in ("count", "rows", "sum", "sumsq"):
        m = by[name]
        assert m.ci == m.granularity * math.ceil(m.scale / m.granularity * float(ndtri(0.975)))
    assert by["count"].ci_mean == math.ceil(by["count"].scale * float(ndtri(0.9875)))
    assert by["sumsq"].ci_mean is None
    z = float(ndtri(1 - 0.05 / 6))
    assert by["sum"].ci_variance == by["sum"].granularity * math.ceil(by["sum"].scale / by["sum"].granularity * z)
    assert by["rows"].ci_variance is None


def test_laplace_measurements_share_epsilon_equally():
    aggs = ["rows", "median", "variance"]
    cal = gb.group_by_calibration(2.0, None, 10, aggs, "v", 0, 4, selection=None, max_groups=5, max_rows=3)
    by = {m.name: m for m in cal.measures}
    assert list(by) == ["count", "rows", "sum", "sumsq", "median"]
    eps_m = 2.0 / 5
    # rows: l1 = L0 max_rows = 15 on a grid g <= 1 (integers stay on it): b = 15 / eps_m exactly
    assert by["rows"].scale == 15 / eps_m
    # sumsq: R = 2, R^2 = 4, l1 = 5 * 4 rounded: b = g (floor(20 / g) + 5) / eps_m
    g = default_granularity(20 / eps_m)
    assert by["sumsq"].scale == g * (math.floor(20 / g) + 5) / eps_m
    # median: basic composition over the L0 groups a user holds: eps0 = eps_m / L0
    assert by["median"].epsilon0 == eps_m / 5 and by["median"].ci == 2 / (eps_m / 5) * math.log(257 / (1 - 0.95))


def test_max_groups_is_the_aggregates_cap_and_defaults_to_max_items():
    assert gb.group_by_calibration(1.0, 1e-5, 10).max_groups == 10
    a = gb.group_by_calibration(1.0, 1e-5, 100, max_groups=4)
    b = gb.group_by_calibration(1.0, 1e-5, 100, max_groups=16)
    assert (a.max_groups, b.max_groups) == (4, 16)
    assert b.count_scale == pytest.approx(2 * a.count_scale, rel=1e-12)  # sigma grows with sqrt(L0)
    # the selection is calibrated with max_items alone
    assert a.selection_epsilon == b.selection_epsilon and a.aggregate_rho == b.aggregate_rho
    # once the selection has released |S| groups, no user contributes to more: L0 = min(max_groups, |S|), same rho
    for groups, l0 in ((3, 3), (16, 16), (500, 16), (0, 1)):
        c = gb.group_by_calibration(1.0, 1e-5, 100, max_groups=16, groups=groups)
        assert (c.max_groups, c.released_groups, c.aggregate_rho) == (l0, groups, b.aggregate_rho)
        assert c.count_scale == pytest.approx(math.sqrt(l0 / 16) * b.count_scale, rel=1e-12)


# -- half-widths ---------------------------------------------------------------------------------


def _discrete_gaussian_tail(s: float, m: int) -> float:
    """P[|Z| > m] for Z ~ N_Z(0, s^2), summed exactly (|z| <= 60 s + 60)."""
    z = np.arange(-int(60 * s) - 60, int(60 * s) + 61)
    p = np.exp(-z.astype(float) ** 2 / (2 * s * s))
    return float(p[np.abs(z) > m].sum() / p.sum())


@pytest.mark.parametrize("s,conf", [(0.4, 0.9), (0.8, 0.95), (3.3, 0.95), (20.5, 0.99), (57.0, 0.8)])
def test_gaussian_ci_covers_and_is_at_most_one_step_wide(s, conf):
    for g in (1.0, 2.0 ** -7):
        w = gb.gaussian_ci(s * g, g, conf)
        m = round(w / g)
        assert w == m * g
        assert _discrete_gaussian_tail(s, m) <= 1 - conf
        assert m == 0 or _discrete_gaussian_tail(s, m - 2) > 1 - conf  # the smallest valid m is m or m - 1


def test_median_ci_bounds_the_exponential_mechanisms_utility_gap():
    # the exact distribution of the mechanism on a utility vector: P[u <= OPT - ci] <= 1 - confidence
    rng = np.random.default_rng(4)
    for _ in range(20):
        n, eps0, conf = int(rng.integers(2, 300)), float(rng.uniform(0.05, 3)), float(rng.uniform(0.5, 0.99))
        u = -rng.integers(0, 60, size=n).astype(float)
        w = np.exp(eps0 * (u - u.max()) / 2)
        ci = gb.median_ci(eps0, n, conf)
        assert w[u <= u.max() - ci].sum() / w.sum() <= 1 - conf


# -- checks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    ({"noise": "uniform"}, "noise must be 'gaussian' or 'laplace'"),
    ({"max_groups": 0}, "max_groups must be a whole number between 1 and 100000"),
    ({"max_groups": 2.5}, "max_groups must be a whole number"),
    ({"max_rows": 0, "aggregates": ["rows"]}, "max_rows must be a whole number"),
    ({"max_rows": 3}, "max_rows is used only by the 'rows' aggregate"),
    ({"aggregates": ["median"], "value_col": "v", "lower": 1, "upper": 1}, None),
])
def test_invalid_bounds_are_refused(kwargs, match):
    if match is None:  # lower == upper is a valid (degenerate) range
        assert gb.group_by_calibration(1.0, 1e-5, 10, **kwargs).measure("median") is not None
        return
    with pytest.raises(DPParameterError, match=match):
        gb.group_by_calibration(1.0, 1e-5, 10, **kwargs)


@pytest.mark.parametrize("cols,match", [
    ([], "group_cols must be a non-empty list"),
    ("a", "group_cols must be a non-empty list"),
    (["a", "A"], "must not repeat a column"),
    (["a", "count"], "may not be named 'count'"),
    (["dp__KEY"], "may not be named 'dp__KEY'"),
    (["a", "sum_ci"], "may not be named 'sum_ci'"),
])
def test_invalid_group_cols_are_refused(cols, match):
    with pytest.raises(DPParameterError, match=match):
        gb.check_group_cols(cols)
