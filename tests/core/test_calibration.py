"""Calibration numbers (reference numbers of docs/proofs/count_*.md and weighted_*.md) and their defining properties."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dpsql.core import calibration as cal
from dpsql.union import basic
from dpsql.core.validation import DPParameterError

E10 = math.exp(-10)


@pytest.mark.parametrize("eps, delta, expected", [
    (1.0, 5e-6, 3.884141),
    (1.0, 1e-5, 3.730632),
    (3.0, E10 / 2, 1.332791),
    (0.1, 5e-6, 32.486035),
    (0.5, 2.5e-6, 7.661109),
    (0.1, 5e-7, 37.867164),
    (0.9, 4.5e-6, 4.303919),
    (1.0, 5e-12, 6.324115),
])
def test_analytic_gaussian_sigma_reference_values(eps, delta, expected):
    sigma = cal.gaussian_sigma(eps, delta)
    assert sigma == pytest.approx(expected, abs=1e-6)
    # The returned sigma meets the target and is (nearly) the smallest that does.
    assert cal.gaussian_delta(sigma, eps) == pytest.approx(delta, abs=1e-12)
    assert cal.gaussian_delta(sigma, eps) <= delta
    assert cal.gaussian_delta(0.999 * sigma, eps) > delta
    assert sigma < cal.classical_gaussian_sigma(eps, delta) or eps >= 1.0


def test_analytic_beats_classical_at_eps_one():
    assert cal.classical_gaussian_sigma(1.0, 5e-6) == pytest.approx(4.9858, abs=1e-4)
    assert cal.gaussian_sigma(1.0, 5e-6) < cal.classical_gaussian_sigma(1.0, 5e-6)


@pytest.mark.parametrize("sigma, delta", [(3.884141, 5e-6), (1.332791, math.exp(-10) / 2), (40.0, 1e-15),
                                          (0.3, 1e-3)])
def test_gaussian_epsilon_inverts_gaussian_delta(sigma, delta):
    import dp_accounting
    e = cal.gaussian_epsilon(sigma, delta)
    assert cal.gaussian_delta(sigma, e) <= delta
    assert cal.gaussian_delta(sigma, e * (1 - 1e-9)) > delta
    assert e == pytest.approx(dp_accounting.get_epsilon_gaussian(sigma, delta), rel=1e-9)
    assert cal.gaussian_epsilon(2 * sigma, delta, 2.0) == pytest.approx(e, rel=1e-12)
    assert cal.gaussian_epsilon(sigma, 0.99) == 0.0  # (0, 0.99)-DP already


def test_gaussian_delta_cross_check_with_dp_accounting():
    from dp_accounting.pld import privacy_loss_distribution as pld  # a core dependency
    dist = pld.from_gaussian_mechanism(3.884141)
    assert dist.get_delta_for_epsilon(1.0) == pytest.approx(5e-6, rel=1e-3)
    assert cal.gaussian_delta(3.884141, 1.0) == pytest.approx(5e-6, rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(eps=st.floats(0.05, 5.0), log_delta=st.floats(-14, -2), sens=st.floats(0.1, 10.0))
def test_sigma_scale_equivariance_and_monotonicity(eps, log_delta, sens):
    delta = 10.0 ** log_delta
    base = cal.gaussian_sigma(eps, delta)
    assert cal.gaussian_sigma(eps, delta, sens) == pytest.approx(sens * base, rel=1e-12)
    assert cal.gaussian_sigma(eps * 1.1, delta) < base
    assert cal.gaussian_sigma(eps, delta * 1.1) < base


@pytest.mark.parametrize("max_items, expected", [
    (1, 18.1569), (10, 19.3160), (50, 20.3364), (100, 20.7897), (150, 21.0557), (200, 21.2444), (300, 21.5097),
])
def test_weighted_gaussian_threshold_eps1(max_items, expected):
    c = basic.weighted_gaussian_calibration(1.0, 1e-5, max_items)
    assert c.noise == "gaussian"
    assert c.scale == pytest.approx(3.884141, abs=1e-6)
    assert c.threshold == pytest.approx(expected, abs=1e-4)
    # Lemma C.1 of [MM] is a valid (looser) threshold.
    assert 1 + c.scale * math.sqrt(2 * math.log(2 * max_items / 1e-5)) >= c.threshold


def test_lemma_c1_bound_value():
    sigma = cal.gaussian_sigma(1.0, 5e-6)
    assert 1 + sigma * math.sqrt(2 * math.log(2 * 100 / 1e-5)) == pytest.approx(23.5222, abs=1e-4)


@pytest.mark.parametrize("max_items, rho_gauss, rho_lap", [
    (1, 6.4353, 4.1023), (10, 6.4353, 4.1023), (50, 6.6862, 4.4263), (100, 6.8237, 4.6473),
    (200, 6.9689, 4.8734), (300, 7.0561, 5.0069),
])
def test_dpsu_thresholds_eps3(max_items, rho_gauss, rho_lap):
    g = basic.weighted_gaussian_calibration(3.0, E10, max_items)
    lap = basic.weighted_laplace_calibration(3.0, E10, max_items)
    assert g.scale == pytest.approx(1.332791, abs=1e-6)
    assert g.threshold == pytest.approx(rho_gauss, abs=1e-4)
    assert lap.scale == pytest.approx(1 / 3)
    assert lap.threshold == pytest.approx(rho_lap, abs=1e-4)


def test_dpsu_cutoffs_and_count_baselines_eps3():
    g = basic.weighted_gaussian_calibration(3.0, E10, 100)
    lap = basic.weighted_laplace_calibration(3.0, E10, 100)
    assert g.threshold + 5 * g.scale == pytest.approx(13.4876, abs=1e-4)   # Gamma_Gauss(100), alpha = 5
    assert lap.threshold + 5 * lap.scale == pytest.approx(6.3140, abs=1e-4)  # Gamma_Lap(100)
    cl = basic.count_laplace_calibration(3.0, E10, 100)
    assert (cl.noise, cl.scale) == ("laplace", pytest.approx(33.333, abs=1e-3))
    assert cl.threshold == pytest.approx(464.73, abs=1e-2)
    cg = basic.count_gaussian_calibration(3.0, E10, 100)
    assert (cg.noise, cg.scale) == ("gaussian", pytest.approx(13.3279, abs=1e-4))
    assert cg.threshold == pytest.approx(68.237, abs=1e-3)
    generic = cal.gaussian_threshold(g.scale, E10 / 2, 100, cal.one)
    assert generic == pytest.approx(7.7237, abs=1e-4)
    assert generic > g.threshold


@pytest.mark.parametrize("eps, delta, max_items", [(1.0, 1e-5, 100), (3.0, E10, 50), (0.5, 1e-6, 7), (1.0, 1e-5, 1)])
def test_gaussian_novel_item_event_is_exactly_delta_half(eps, delta, max_items):
    c = basic.weighted_gaussian_calibration(eps, delta, max_items)
    probs = [1 - norm.cdf((c.threshold - 1 / math.sqrt(t)) / c.scale) ** t for t in range(1, max_items + 1)]
    assert max(probs) <= delta / 2 * (1 + 1e-9)
    assert max(probs) == pytest.approx(delta / 2, rel=1e-6)


@pytest.mark.parametrize("eps, delta, max_items", [(1.0, 1e-5, 100), (3.0, E10, 50), (0.5, 1e-6, 7)])
def test_laplace_novel_item_event_is_exactly_delta(eps, delta, max_items):
    c = basic.weighted_laplace_calibration(eps, delta, max_items)
    probs = [1 - (1 - math.exp(-eps * (c.threshold - 1 / t)) / 2) ** t for t in range(1, max_items + 1)]
    assert max(probs) <= delta * (1 + 1e-9)
    assert max(probs) == pytest.approx(delta, rel=1e-6)


def test_threshold_argmax_is_not_assumed_at_an_endpoint():
    # For the h of the set-union methods the maximum sits at t = 1 or t = max_items,
    # but the formula is a maximum over every t: an h with a bump inside must be found.
    sigma, d = 4.0, 5e-6
    h = lambda t: 5.0 if t == 137 else 0.0  # noqa: E731
    values = [h(t) + sigma * norm.isf(-math.expm1(math.log1p(-d) / t)) for t in range(1, 301)]
    argmax = max(range(300), key=values.__getitem__) + 1
    assert argmax == 137
    assert cal.gaussian_threshold(sigma, d, 300, h) == pytest.approx(max(values), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.1, 5.0), log_delta=st.floats(-12, -3), max_items=st.integers(1, 200))
def test_thresholds_grow_with_max_items(eps, log_delta, max_items):
    delta = 10.0 ** log_delta
    for fn in (basic.weighted_gaussian_calibration, basic.weighted_laplace_calibration,
               basic.count_gaussian_calibration, basic.count_laplace_calibration):
        assert fn(eps, delta, max_items + 1).threshold >= fn(eps, delta, max_items).threshold - 1e-9


@pytest.mark.parametrize("call, param", [
    (lambda: cal.gaussian_sigma(0.0, 1e-5), "epsilon"),
    (lambda: cal.gaussian_sigma(-1.0, 1e-5), "epsilon"),
    (lambda: cal.gaussian_sigma(float("inf"), 1e-5), "epsilon"),
    (lambda: cal.gaussian_sigma(float("nan"), 1e-5), "epsilon"),
    (lambda: cal.gaussian_sigma(1.0, 0.0), "delta"),
    (lambda: cal.gaussian_sigma(1.0, 1.0), "delta"),
    (lambda: cal.gaussian_sigma(1.0, None), "delta"),
    (lambda: cal.gaussian_sigma(1.0, 1e-5, -2.0), "sensitivity"),
    (lambda: basic.weighted_gaussian_calibration(1.0, 1e-5, 0), "max_items"),
    (lambda: basic.weighted_gaussian_calibration(1.0, 1e-5, 2.5), "max_items"),
    (lambda: basic.weighted_laplace_calibration(1.0, 1e-5, True), "max_items"),
    (lambda: basic.count_laplace_calibration(0.0, 1e-5, 10), "epsilon"),
    (lambda: cal.laplace_threshold(-1.0, 1e-5, 10), "scale"),
])
def test_bad_parameters_name_the_parameter(call, param):
    with pytest.raises(DPParameterError, match=param):
        call()


def test_sql_calibration_functions_equal_python(con):
    row = con.execute(
        "SELECT dp_gaussian_sigma(1.0, 5e-6), dp_gaussian_sigma(1.0, 5e-6, sensitivity := 2.0), "
        "dp_gaussian_threshold(1.0, 1e-5, 100), dp_laplace_threshold(3.0, exp(-10), 100), "
        "dp_gaussian_threshold(1.0, 1e-5), "
        "dp_set_union_noise_scale('count_gaussian', epsilon := 3.0, delta := exp(-10), max_items := 100), "
        "dp_set_union_threshold('count_laplace', epsilon := 3.0, delta := exp(-10), max_items := 100)").fetchall()[0]
    assert row[0] == pytest.approx(cal.gaussian_sigma(1.0, 5e-6), rel=1e-15)
    assert row[1] == pytest.approx(2 * cal.gaussian_sigma(1.0, 5e-6), rel=1e-12)
    assert row[2] == pytest.approx(20.7897, abs=1e-4)
    assert row[3] == pytest.approx(4.6473, abs=1e-4)
    assert row[4] == row[2]  # max_items defaults to 100
    assert row[5] == pytest.approx(13.3279, abs=1e-4)
    assert row[6] == pytest.approx(464.73, abs=1e-2)


@pytest.mark.parametrize("sql, param", [
    ("SELECT dp_gaussian_sigma(0.0, 1e-5)", "epsilon"),
    ("SELECT dp_gaussian_sigma(1.0, 2.0)", "delta"),
    ("SELECT dp_gaussian_threshold(1.0, 1e-5, 0)", "max_items"),
    ("SELECT dp_laplace_threshold(1.0, NULL, 10)", "delta"),
    ("SELECT dp_set_union_threshold('nope', epsilon := 1.0, delta := 1e-5)", "method"),
])
def test_sql_calibration_errors_name_the_parameter(con, sql, param):
    with pytest.raises(Exception, match=param):
        con.execute(sql).fetchall()


# ---------------------------------------------------------------------------
# Granular noise: grid, sensitivity after rounding, discrete Laplace / Gaussian
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("scale, expected", [(2.0, 2.0 ** -15), (3.7, 2.0 ** -15), (1.0, 2.0 ** -16),
                                             (0.75, 2.0 ** -17), (1000.0, 2.0 ** -7)])
def test_default_granularity(scale, expected):
    assert cal.default_granularity(scale) == expected
    assert cal.choose_granularity(scale) == expected
    assert cal.choose_granularity(1e9, max_granularity=1.0) == 1.0
    assert cal.choose_granularity(scale, 0.25) == 0.25


@pytest.mark.parametrize("args, steps", [
    ((1.0, 2.0 ** -15, 1, True), 32768),     # integer counts, on the grid: no growth
    ((1.0, 2.0 ** -15, 1, False), 32769),    # off the grid: + 1 step
    ((0.3, 0.25, 1, False), 2),              # floor(1.2) + 1
    ((0.3, 0.25, 3, False), 4),              # floor(1.2) + 3 coordinates
    ((0.3, 0.25, 1, True), 1),               # on the grid and below one step: still >= 1
    ((5.0, 2.0, 1, True), 2),                # grid values 2 apart within distance 5: at most 4 = 2 steps
])
def test_grid_sensitivity_hand_values(args, steps):
    assert cal.grid_sensitivity(*args) == steps
    assert cal.rounded_sensitivity(*args) == steps * args[1]


@settings(max_examples=300, deadline=None)
@given(x=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=5), k=st.integers(-3, 20),
       frac=st.lists(st.floats(-1.0, 1.0), min_size=5, max_size=5), sens=st.floats(0.01, 10.0))
def test_rounded_l1_distance_within_rounded_sensitivity(x, k, frac, sens):
    import numpy as np
    from dpsql.core.noise import round_to_grid
    g = 2.0 ** -k
    xa = np.array(x)
    d = np.array(frac[:len(x)])
    if np.abs(d).sum() > 0:
        d = d / np.abs(d).sum() * sens  # l1 norm exactly sens (up to rounding, clipped below)
    ya = xa + d
    actual = float(np.abs(ya - xa).sum())
    bound = cal.rounded_sensitivity(max(actual, 1e-300), g, coordinates=len(x))
    assert float(np.abs(round_to_grid(ya, g) - round_to_grid(xa, g)).sum()) <= bound


def test_discrete_laplace_scale_and_threshold_hand_values():
    assert cal.discrete_laplace_scale(0.5, 1.0, 1.0, on_grid=True) == 2.0
    assert cal.discrete_laplace_scale(1.0, 0.3, 0.25) == 0.5                  # 2 steps of 0.25
    assert cal.discrete_laplace_scale(1.0, 1.0, 0.25, coordinates=4) == 2.0   # 4 + 4 steps
    # t = 2, alpha = e^-1/2: alpha^m / (1 + alpha) <= 5e-4 first at m = 15 (3.44e-4; m = 14 gives 5.68e-4)
    assert cal.discrete_laplace_threshold(2.0, 1.0, 5e-4) == 16.0
    # alpha^m <= 0.01 (1 + alpha) = 0.016065 first at m = 9 (ln 0.016065 / -0.5 = 8.26); grid 0.5
    assert cal.discrete_laplace_threshold(1.0, 0.5, 0.01, base=0.0) == 4.5


@pytest.mark.parametrize("scale, g, delta_novel", [(2.0, 1.0, 5e-4), (2.0, 2.0 ** -15, 5e-4), (0.1, 2.0 ** -20, 1e-9),
                                                   (50.0, 4.0, 1e-3)])
def test_discrete_laplace_threshold_is_the_smallest_grid_point(scale, g, delta_novel):
    rho = cal.discrete_laplace_threshold(scale, g, delta_novel, base=1.0)
    m = (rho - 1.0) / g
    assert m == int(m)
    assert math.exp(cal.discrete_laplace_log_tail(int(m), scale, g)) <= delta_novel
    assert math.exp(cal.discrete_laplace_log_tail(int(m) - 1, scale, g)) > delta_novel
    if scale / g >= 2 ** 15:  # fine grid: the continuous threshold 1 + b ln(1/(2 delta)) within a few steps
        assert abs(rho - (1.0 + scale * math.log(1.0 / (2.0 * delta_novel)))) <= 2 * g


def test_discrete_laplace_tail_sums_the_pmf():
    t = 3.0
    a = math.exp(-1 / t)
    pmf = lambda z: (1 - a) / (1 + a) * a ** abs(z)  # noqa: E731
    for m in (-7, -1, 0, 1, 5):
        direct = sum(pmf(z) for z in range(m, 400))
        assert math.exp(cal.discrete_laplace_log_tail(m, 3.0, 1.0)) == pytest.approx(direct, rel=1e-12)


def _brute_force_delta(s: float, eps: float, shift: int) -> float:
    """sum_z max(0, p(z - D) - e^eps p(z)) over a support wide enough that the rest is < 1e-300."""
    import numpy as np
    z = np.arange(-60 * int(s + 2) - shift, 60 * int(s + 2) + shift + 1, dtype=float)
    w = np.exp(-z * z / (2 * s * s))
    norm = w.sum()
    p_shift = np.exp(-(z - shift) ** 2 / (2 * s * s)) / norm
    return float(np.maximum(p_shift - math.exp(eps) * w / norm, 0).sum())


@pytest.mark.parametrize("s, eps, shift", [(0.8, 0.5, 1), (1.5, 1.0, 1), (3.0, 0.5, 2), (7.3, 1.0, 3), (40.0, 0.2, 5)])
def test_discrete_gaussian_delta_equals_the_brute_force_sum(s, eps, shift):
    # granularity 1, values on the grid: shift steps = sensitivity
    got = cal.discrete_gaussian_delta(s, eps, float(shift), 1.0, on_grid=True)
    assert got == pytest.approx(_brute_force_delta(s, eps, shift), rel=1e-9)


@pytest.mark.parametrize("eps, delta, sens, g, on_grid", [
    (1.0, 1e-5, 1.0, 1.0, True),          # integer counts, coarse grid: far from the continuous regime
    (0.5, 1e-6, 1.0, 0.25, True),
    (2.0, 1e-8, 1.0, 2.0 ** -4, False),
    (1.0, 1e-5, 1.0, None, False),        # default grid
])
def test_discrete_gaussian_sigma_meets_delta_exactly_and_tightly(eps, delta, sens, g, on_grid):
    sigma = cal.discrete_gaussian_sigma(eps, delta, sens, g, on_grid)
    grid = g if g is not None else cal.default_granularity(cal.gaussian_sigma(eps, delta, sens))
    achieved = cal.discrete_gaussian_delta(sigma, eps, sens, grid, on_grid)
    assert achieved <= delta
    assert achieved >= delta * (1 - 1e-3)
    assert cal.discrete_gaussian_delta(sigma * (1 - 1e-3), eps, sens, grid, on_grid) > delta
    # the result is the continuous calibration of the rounded sensitivity, corrected by < 1 %
    d = cal.rounded_sensitivity(sens, grid, 1, on_grid)
    assert sigma == pytest.approx(cal.gaussian_sigma(eps, delta, d), rel=1e-2)


def test_sql_granular_calibration_equals_python(con):
    row = con.execute(
        "SELECT dp_granularity(2.0), dp_granularity(1e9, max_granularity := 1), "
        "dp_rounded_sensitivity(0.3, 0.25, coordinates := 3), dp_discrete_laplace_scale(0.5, on_grid := true), "
        "dp_discrete_laplace_threshold(2.0, 1.0, 5e-4), dp_discrete_gaussian_sigma(1.0, 1e-5, granularity := 1, "
        "on_grid := true), dp_discrete_gaussian_delta(3.0, 1.0, granularity := 1, on_grid := true)").fetchall()[0]
    assert row[:5] == (2.0 ** -15, 1.0, 1.0, 2.0, 16.0)
    assert row[5] == cal.discrete_gaussian_sigma(1.0, 1e-5, 1.0, 1.0, True)
    assert row[6] == cal.discrete_gaussian_delta(3.0, 1.0, 1.0, 1.0, True)


@pytest.mark.parametrize("sql, param", [
    ("SELECT dp_granularity(1.0, 0.3)", "granularity"),
    ("SELECT dp_granularity(1.0, 2.0, max_granularity := 1)", "granularity"),
    ("SELECT dp_rounded_sensitivity(1.0, 0.0)", "granularity"),
    ("SELECT dp_rounded_sensitivity(1.0, 0.5, coordinates := 1.5)", "coordinates"),
    ("SELECT dp_discrete_laplace_scale(0.0)", "epsilon"),
    ("SELECT dp_discrete_laplace_threshold(1.0, 'inf'::DOUBLE, 1e-3)", "granularity"),
    ("SELECT dp_discrete_gaussian_sigma(1.0, 1e-5, granularity := 1e-12)", "granularity"),
    ("SELECT dp_discrete_gaussian_sigma(1.0, 0.0)", "delta"),
])
def test_sql_granular_calibration_errors_name_the_parameter(con, sql, param):
    with pytest.raises(Exception, match=param):
        con.execute(sql).fetchall()
