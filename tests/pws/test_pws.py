"""Private weighted sampling: probability tables, DP inequalities, estimators, SbH, SQL macros."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql import pws
from dpsql.core.registration import source_of
from dpsql.core.validation import DPParameterError

from conftest import seeded

# delta giving L(0.1, delta) = 20 exactly (an integral L, where Lemma 3.2 applies as printed)
DELTA_L20 = (math.exp(0.1) - 1) / (math.exp(0.1 * 20) * (math.exp(0.1) + 1) - 2)


def dense(table: pws.FrequencyTable, n: int) -> np.ndarray:
    """Rows 0..n of pi_{i,j} as a dense matrix (column 0 = not reported)."""
    M = np.zeros((n + 1, n + 1))
    for i in range(n + 1):
        M[i, 0] = table.entry(i, 0)
        lo, v = table.row(i)
        M[i, lo:lo + len(v)] = v
    return M


def dp_excess(M: np.ndarray, eps: float) -> float:
    """max over adjacent rows and both directions of sum_j (P_a(j) - e^eps P_b(j))_+ (must be <= delta)."""
    ee = math.exp(eps)
    worst = 0.0
    for i in range(1, len(M)):
        worst = max(worst, np.maximum(M[i] - ee * M[i - 1], 0).sum(), np.maximum(M[i - 1] - ee * M[i], 0).sum())
    return worst


# ---------------------------------------------------------------------------
# docs/proofs/reference_checks.md C1-C4: key reporting probabilities
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("eps,delta,L,first_one", [(0.1, 0.01, 17.8270, 37), (0.01, 1e-6, 851.7384, 1705),
                                                   (1, 1e-5, 10.7410, 23), (0.5, 0.001, 11.0080, 24)])
def test_pi_star_basic_properties(eps, delta, L, first_one):
    assert pws.L_value(eps, delta) == pytest.approx(L, abs=1e-4)
    pi = pws.key_probabilities(eps, delta, 3000)
    assert pi[0] == 0 and pi[1] == pytest.approx(delta, rel=1e-15)
    assert np.all(np.diff(pi) >= 0) and np.all(pi <= 1)
    assert int(np.argmax(pi == 1.0)) == first_one
    assert np.count_nonzero(pi[1:] < 1) <= 2 * math.ceil(L)
    # closed form (Lemma 3.2 extended to non-integral L) equals the recursion of Alg. 3
    rec = pws.key_probabilities_recursion(eps, delta, np.r_[0.0, np.ones(3000)])
    np.testing.assert_allclose(pws.optimal_key_probabilities(eps, delta, 3000), rec, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(pi, rec)


def test_integral_L_lemma_3_2_as_printed():
    eps, delta = 0.1, DELTA_L20
    assert pws.L_value(eps, delta) == pytest.approx(20.0, abs=1e-12)
    rec = pws.key_probabilities_recursion(eps, delta, np.r_[0.0, np.ones(60)])
    # 2e-15 rather than 1e-15: L itself evaluates to 19.999999999999993 in double precision
    np.testing.assert_allclose(pws.lemma_3_2(eps, delta, 60), rec, rtol=0, atol=2e-15)
    assert rec[40] == pytest.approx(1 - delta, abs=1e-15) and rec[41] == 1.0
    assert rec[20] == pytest.approx((1 - delta) / (1 + math.exp(eps)), abs=1e-15)
    # symmetry 1 - pi*_{2L+1-i} = pi*_i
    np.testing.assert_allclose(1 - rec[41 - np.arange(1, 41)], rec[1:41], atol=2e-15)


@pytest.mark.parametrize("eps,delta,tau,ell", [(0.1, 0.001, 1e-3, 1), (0.1, 0.001, 0.01, 35), (0.1, 0.001, 0.1, 80),
                                               (1, 1e-5, 1.0, 23)])
def test_ppswor_two_piece_form_lemma_3_4(eps, delta, tau, ell):
    n = 3000
    q = pws.sampling_probabilities(np.arange(n + 1), tau, "ppswor")
    rec = pws.key_probabilities_recursion(eps, delta, q)
    two, got_ell = pws.ppswor_two_piece(eps, delta, tau, n)
    assert got_ell == ell
    np.testing.assert_allclose(two, rec, rtol=0, atol=2e-15)
    assert np.all(rec <= q) and np.all(np.diff(rec) >= 0)
    np.testing.assert_array_equal(pws.key_probabilities(eps, delta, n, tau), rec)


def test_count_of_positions_below_q_at_most_2_ceil_L():
    n = 3000
    q = pws.sampling_probabilities(np.arange(n + 1), 0.1, "ppswor")
    rec = pws.key_probabilities_recursion(0.1, 0.001, q)
    below = np.count_nonzero(rec[1:] < q[1:])
    assert below == 79  # > 2L = 78.6, <= 2 ceil(L) = 80
    assert below <= 2 * math.ceil(pws.L_value(0.1, 0.001))


def test_two_piece_form_fails_for_priority_sampling():
    n = 3000
    q = pws.sampling_probabilities(np.arange(n + 1), 0.01, "priority")
    rec = pws.key_probabilities_recursion(0.1, 0.001, q)
    star = pws.optimal_key_probabilities(0.1, 0.001, n)
    ell = int(np.nonzero(star[1:] >= q[1:])[0][0]) + 1
    two = np.where(np.arange(n + 1) < ell, star, q)
    assert np.abs(two - rec).max() == pytest.approx(0.031, abs=5e-4)
    # the table used by the sanitizer follows the recursion, not the two-piece form
    np.testing.assert_array_equal(pws.key_probabilities(0.1, 0.001, n, 0.01, "priority"), rec)


@pytest.mark.parametrize("scheme,tau,power", [("ppswor", 1e-3, 1.0), ("priority", 0.003, 1.0), ("ppswor", 0.05, 0.5),
                                              ("priority", 0.01, 1.5), ("ppswor", 0.2, 0.0)])
def test_key_table_with_settled_tail_equals_full_recursion(scheme, tau, power):
    n = 20000
    q = pws.sampling_probabilities(np.arange(n + 1), tau, scheme, power)
    rec = pws.key_probabilities_recursion(0.1, 0.001, q)
    np.testing.assert_array_equal(pws.key_probabilities(0.1, 0.001, n, tau, scheme, power), rec)


# ---------------------------------------------------------------------------
# docs/proofs/reference_checks.md C5: pi_{i,j}
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("eps,delta,tau,scheme", [(0.1, 0.01, None, "ppswor"), (1, 1e-3, None, "ppswor"),
                                                  (0.1, DELTA_L20, None, "ppswor"), (0.1, 0.001, 0.1, "ppswor"),
                                                  (0.5, 0.001, 0.05, "ppswor"), (0.1, 0.001, 0.01, "priority"),
                                                  (0.3, 0.01, 0.002, "priority"), (1, 1e-5, 1.0, "ppswor")])
def test_frequency_table_rows_satisfy_dp_inequalities(eps, delta, tau, scheme):
    n = 160
    table = pws.frequency_table(eps, delta, tau, scheme, 1.0, n=n)
    M = dense(table, n)
    pi = pws.key_probabilities(eps, delta, n, tau, scheme)
    q = pws.sampling_probabilities(np.arange(n + 1), tau, scheme)
    assert M.min() >= 0
    np.testing.assert_allclose(M[:, 1:].sum(axis=1), pi, atol=1e-12)
    np.testing.assert_allclose(np.diag(M)[1:], np.minimum(q[1:], delta), atol=1e-15)
    assert np.allclose(M[0], np.r_[1.0, np.zeros(n)])
    assert dp_excess(M, eps) <= delta + 1e-12
    assert np.all(np.triu(M[:, 1:], k=0)[:, :] >= 0)


def test_printed_app_b_construction_violates_dp_for_sampled_q():
    """ERRATUM: prefix-only lower bounds (App. B) are not enough once q < 1; ours are."""
    n = 40
    pi = pws.key_probabilities(0.5, 0.001, n, 0.05)
    ref = pws.frequency_rows_reference(0.5, 0.001, pi)
    R = np.zeros((n + 1, n + 1))
    for i, row in enumerate(ref):
        R[i, :len(row)] = row
    assert dp_excess(R, 0.5) - 0.001 == pytest.approx(0.2171891, abs=1e-6)  # exceeds delta by 217x delta
    assert dp_excess(dense(pws.frequency_table(0.5, 0.001, 0.05, n=n), n), 0.5) <= 0.001 + 1e-12


@pytest.mark.parametrize("eps,delta", [(0.1, 0.01), (1, 1e-3), (0.1, DELTA_L20)])
def test_construction_equals_printed_app_b_without_sampling(eps, delta):
    n = 90
    pi = pws.key_probabilities(eps, delta, n)
    ref = pws.frequency_rows_reference(eps, delta, pi)
    M = dense(pws.frequency_table(eps, delta, n=n), n)
    for i, row in enumerate(ref):
        np.testing.assert_allclose(M[i, :len(row)], row, atol=1e-15)


def test_lemma_4_2_corrected_row_60():
    eps, delta = 0.1, DELTA_L20
    table = pws.frequency_table(eps, delta, n=100)
    lo, v = table.row(60)
    assert (lo, len(v), np.count_nonzero(v)) == (20, 41, 41)
    assert table.entry(60, 20) == pytest.approx(7.758699e-3, rel=1e-6)
    assert table.entry(60, 39) == pytest.approx(5.187384e-2, rel=1e-6)
    assert table.entry(60, 40) == pytest.approx(5.732946e-2, rel=1e-6)
    printed = delta * math.exp((2 * 20 - 1 - 40) * eps)  # Lemma 4.2 as printed, continued to i-j = 40
    assert printed == pytest.approx(7.020361e-3, rel=1e-6) and abs(printed - table.entry(60, 20)) > 7e-4
    worst = max(abs(table.entry(i, j) - pws.optimal_frequency_probability(eps, delta, i, j))
                for i in range(1, 100) for j in range(1, i + 1))
    assert worst < 1e-15


def test_steady_rows_are_shifts():
    table = pws.frequency_table(0.1, 0.01, n=500)
    assert table.steady and table.m < 100
    lo, v = table.row(400)
    lo2, v2 = table.row(401)
    assert lo2 == lo + 1 and np.array_equal(v, v2)


# ---------------------------------------------------------------------------
# docs/proofs/reference_checks.md C6-C7: SbH
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("eps,delta,ratios", [(0.1, 0.01, {2: 3.8097, 5: 8.2694, 10: 13.2851, 17: 17.1773}),
                                              (0.01, 1e-6, {2: 3.9801, 5: 9.8030, 10: 19.1278})])
def test_pi_star_over_phi(eps, delta, ratios):
    star = pws.key_probabilities(eps, delta, 100)
    phi = pws.sbh_report_probability(np.arange(101), eps, delta)
    assert star[1] / phi[1] == pytest.approx(2.0, rel=1e-12)
    for i, r in ratios.items():
        assert star[i] / phi[i] == pytest.approx(r, abs=1e-4)
    L = int(pws.L_value(eps, delta))
    assert np.all(star[1:L + 1] / phi[1:L + 1] <= 2 / eps * 1.01)


def test_sbh_closed_forms_match_numerical_integration():
    eps, delta = 0.5, 1e-3
    T = pws.sbh_threshold(eps, delta)
    assert T == pytest.approx(14.8155, abs=1e-4)
    assert pws.sbh_report_probability(1, eps, delta) == pytest.approx(delta / 2, rel=1e-12)
    for i, phi, E, mse in [(10, 0.0450086, 0.756842, 97.7699), (T + 2, 0.81606, 14.4582, 56.3323)]:
        num = pws.sbh_moments_numeric(i, eps, delta)
        # reference numbers are printed to ~6 digits: compared at 1e-4 relative
        assert pws.sbh_report_probability(i, eps, delta) == pytest.approx(phi, rel=1e-4)
        assert pws.sbh_expectation(i, eps, delta) == pytest.approx(E, rel=1e-5)
        assert pws.sbh_mse(i, eps, delta) == pytest.approx(mse, rel=1e-5)
        assert num["phi"] == pytest.approx(float(pws.sbh_report_probability(i, eps, delta)), abs=1e-9)
        assert num["E"] == pytest.approx(float(pws.sbh_expectation(i, eps, delta)), abs=1e-8)
        assert num["mse"] == pytest.approx(float(pws.sbh_mse(i, eps, delta)), rel=1e-8)
    assert pws.sbh_report_probability(T + 3, eps, delta, 0.05, "ppswor") == pytest.approx(0.53305, abs=1e-5)
    assert pws.sbh_report_probability(T + 3, eps, delta, 0.02, "priority") == pytest.approx(0.327715, abs=1e-6)
    for i in (2.0, 10.0, T, T + 3, 30.0, 49.0, 60.0):
        pp = pws.sbh_moments_numeric(i, eps, delta, q=lambda j: -math.expm1(-0.05 * j))["phi"]
        pr = pws.sbh_moments_numeric(i, eps, delta, q=lambda j: min(1.0, 0.02 * j))["phi"]
        assert float(pws.sbh_report_probability(i, eps, delta, 0.05, "ppswor")) == pytest.approx(pp, abs=1e-9)
        assert float(pws.sbh_report_probability(i, eps, delta, 0.02, "priority")) == pytest.approx(pr, abs=1e-8)


# ---------------------------------------------------------------------------
# docs/proofs/reference_checks.md C8: estimators
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("eps,delta,min_a", [(0.1, 0.01, -2028.9168), (1, 1e-3, None)])
def test_unbiased_estimator_solves_triangular_system_exactly(eps, delta, min_a):
    table = pws.frequency_table(eps, delta, n=200)
    a = pws.estimator_coefficients(table, "identity", "unbiased", 60, exact=True)
    assert all(isinstance(x, Fraction) for x in a)
    for i in range(1, 61):
        lo, v = table.row(i)
        assert sum(Fraction(float(p)) * a[lo + k] for k, p in enumerate(v)) == i
    assert min(a) < 0
    if min_a is not None:
        assert float(min(a)) == pytest.approx(min_a, abs=1e-3)
    else:
        # double precision breaks down here (residual of order 60-100 with entries ~1e27)
        af = pws.estimator_coefficients(table, "identity", "unbiased", 60, exact=False)
        assert max(abs(x) for x in af) > 1e26
        resid = max(abs(sum(p * af[table.row(i)[0] + k] for k, p in enumerate(table.row(i)[1])) - i)
                    for i in range(1, 61))
        assert resid > 1.0
    moments = pws.estimator_moments(table, a, "identity", 60)
    assert np.abs(moments["bias"][1:]).max() < 1e-9


@pytest.mark.parametrize("eps,delta", [(0.1, 0.01), (1, 1e-3)])
@pytest.mark.parametrize("g", ["identity", "count"])
def test_biased_down_never_overestimates_and_is_monotone(eps, delta, g):
    table = pws.frequency_table(eps, delta, n=200)
    a = pws.estimator_coefficients(table, g, "biased_down", 60)
    assert a[0] == 0 and all(a[j] <= a[j + 1] + 1e-12 for j in range(1, 60))
    m = pws.estimator_moments(table, a, g, 60)
    assert np.all(m["bias"][1:] <= 1e-9)
    assert np.all(m["var"][1:] >= -1e-9)


def test_ml_estimator_is_biased_both_ways():
    table = pws.frequency_table(0.1, 0.01, n=200)
    a = pws.estimator_coefficients(table, "identity", "ml", 60)
    m = pws.estimator_moments(table, a, "identity", 60)
    assert m["bias"][5] == pytest.approx(-2.94, abs=0.01)
    assert m["bias"][1:].max() > 0 > m["bias"][1:].min()
    # MSE = Var + Bias^2 and the sum-level NRMSE follows (eq. 13)
    err = pws.sum_estimate_error([5, 5, 30], m, "identity")
    assert err["bias"] == pytest.approx(2 * m["bias"][5] + m["bias"][30])
    assert err["nrmse"] == pytest.approx(math.sqrt(err["var"] + err["bias"] ** 2) / 40)


def test_estimates_with_sampling_are_finite_and_biased_down_holds():
    table = pws.frequency_table(0.5, 0.001, 0.05, n=400)
    a = pws.estimator_coefficients(table, "identity", "biased_down", 200)
    m = pws.estimator_moments(table, a, "identity", 200)
    assert np.all(np.isfinite(a)) and np.all(m["bias"][1:] <= 1e-9)


# ---------------------------------------------------------------------------
# Sanitizers: pure functions and, C9, through the SQL macros on a seeded connection
# ---------------------------------------------------------------------------

def test_sanitize_tokens_inverse_cdf_exact_on_a_grid():
    table = pws.frequency_table(0.5, 0.001, n=60)
    i = 30
    grid = (np.arange(200000) + 0.5) / 200000
    tokens = pws.sanitize_tokens(np.full(len(grid), i), grid, table)
    counts = np.bincount(tokens, minlength=i + 1) / len(grid)
    expected = np.array([table.entry(i, j) for j in range(i + 1)])
    np.testing.assert_allclose(counts, expected, atol=1e-5)
    assert tokens.max() <= i


def load_frequencies(con, freqs: dict[int, int], name="agg"):
    keys, ws = [], []
    for w, count in freqs.items():
        keys += [f"f{w}_{k}" for k in range(count)]
        ws += [w] * count
    staged = pa.table({"k": pa.array(keys), "n": pa.array(ws, pa.int64())})  # noqa: F841
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT k AS key, n AS frequency FROM staged")


@pytest.mark.slow
@pytest.mark.parametrize("tau", [None, 0.05])
def test_sql_sanitizer_token_frequencies_match_pi_ij(tau):
    eps, delta, freqs = 0.5, 1e-3, {3: 20000, 12: 20000, 30: 20000}
    con = seeded(7)
    try:
        load_frequencies(con, freqs)
        tau_sql = "NULL" if tau is None else repr(tau)
        rows = con.execute(f"SELECT key, token FROM dp_weighted_sample('agg', {eps}, {delta}, tau := {tau_sql}, "
                           f"with_frequencies := true, freq_col := 'frequency')").fetchall()
        assert source_of(con).samples_drawn >= sum(freqs.values())
    finally:
        con.close()
    table = pws.frequency_table(eps, delta, tau, n=40)
    for w, count in freqs.items():
        got = np.bincount([t for k, t in rows if k.startswith(f"f{w}_")], minlength=w + 1)
        got[0] = count - got[1:].sum()
        p = np.array([table.entry(w, j) for j in range(w + 1)])
        assert abs(p.sum() - 1) < 1e-12 and got[p == 0].sum() == 0
        expected = p * count
        keep = expected >= 5  # pool sparse cells
        obs = np.r_[got[keep], got[~keep].sum()]
        exp = np.r_[expected[keep], expected[~keep].sum()]
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        pval = stats.chisquare(obs, exp).pvalue
        assert pval > 1e-3, (w, pval)


def test_sql_keys_only_reporting_rate_and_element_input():
    eps, delta = 0.5, 1e-3
    con = seeded(11)
    try:
        # element table: key "a" x 12 rows, 3000 keys with 12 rows each
        keys = np.repeat(np.array([f"k{i}" for i in range(3000)]), 12)
        staged = pa.table({"item": pa.array(keys)})  # noqa: F841
        con.execute("CREATE TABLE ev AS SELECT item FROM staged")
        n = con.execute("SELECT count(*) FROM dp_weighted_sample('ev', 0.5, 1e-3, key_col := 'item')").fetchall()[0][0]
        n2 = con.execute("SELECT count(*), count(token) FROM dp_weighted_sample('ev', 0.5, 1e-3, tau := 0.05, "
                         "key_col := 'item')").fetchall()[0]
    finally:
        con.close()
    p = pws.key_probabilities(eps, delta, 12)[12]
    assert stats.binomtest(n, 3000, p).pvalue > 1e-3
    p2 = pws.key_probabilities(eps, delta, 12, 0.05)[12]
    assert stats.binomtest(n2[0], 3000, p2).pvalue > 1e-3 and n2[1] == 0


def test_sql_helpers_and_threshold_sample():
    con = seeded(3)
    try:
        got = con.execute("SELECT dp_pws_q(10, 0.1), dp_pws_q(10, 0.05, scheme := 'priority'), "
                          "dp_pws_pi(1, 0.5, 1e-3), dp_pws_pi(3, 0.5, 1e-3), dp_pws_pi_ij(30, 25, 0.5, 1e-3), "
                          "dp_pws_L(0.1, 0.01), dp_sbh_threshold(0.5, 1e-3)").fetchall()[0]
        assert got[0] == pytest.approx(1 - math.exp(-1)) and got[1] == 0.5
        assert got[2] == pytest.approx(1e-3) and got[3] == pws.key_probabilities(0.5, 1e-3, 3)[3]
        assert got[4] == pws.frequency_table(0.5, 1e-3, n=40).entry(30, 25)
        assert got[5] == pytest.approx(17.8270, abs=1e-4) and got[6] == pytest.approx(14.8155, abs=1e-4)
        load_frequencies(con, {1: 5000, 50: 5000})
        a = con.execute("SELECT key FROM dp_threshold_sample('agg', 0.01, freq_col := 'frequency', salt := 99) "
                        "ORDER BY key").fetchall()
        b = con.execute("SELECT key FROM dp_threshold_sample('agg', 0.01, freq_col := 'frequency', salt := 99) "
                        "ORDER BY key").fetchall()
        assert a == b  # same salt: coordinated (identical) samples
        n1 = sum(1 for (k,) in a if k.startswith("f1_"))
        n50 = sum(1 for (k,) in a if k.startswith("f50_"))
        assert stats.binomtest(n1, 5000, 1 - math.exp(-0.01)).pvalue > 1e-3
        assert stats.binomtest(n50, 5000, 1 - math.exp(-0.5)).pvalue > 1e-3
    finally:
        con.close()


def test_sql_estimate_and_sbh():
    con = seeded(5)
    try:
        load_frequencies(con, {20: 3000, 60: 3000})
        con.execute("CREATE TABLE s AS SELECT * FROM dp_weighted_sample('agg', 0.5, 1e-3, with_frequencies := true, "
                    "freq_col := 'frequency')")
        est = con.execute("SELECT sum(estimate) FROM dp_weighted_sample_estimate('s', 0.5, 1e-3, g := 'identity', "
                          "estimator := 'biased_down')").fetchall()[0][0]
        table = pws.frequency_table(0.5, 1e-3, n=100)
        a = pws.estimator_coefficients(table, "identity", "biased_down", 60)
        m = pws.estimator_moments(table, a, "identity", 60)
        mean = 3000 * (m["E"][20] + m["E"][60])
        sd = math.sqrt(3000 * (m["var"][20] + m["var"][60]))
        assert abs(est - mean) < 5 * sd
        cnt = con.execute("SELECT sum(estimate) FROM dp_weighted_sample_estimate('s', 0.5, 1e-3)").fetchall()[0][0]
        assert 0 < cnt < 6000 * 1.1
        sbh = con.execute("SELECT count(*), min(noisy_frequency), max(inclusion_probability) "
                          "FROM dp_sbh_histogram('agg', 0.5, 1e-3, freq_col := 'frequency')").fetchall()[0]
        T = pws.sbh_threshold(0.5, 1e-3)
        assert sbh[1] >= T and sbh[2] == 1.0
        expected = 3000 * (pws.sbh_report_probability(20, 0.5, 1e-3) + pws.sbh_report_probability(60, 0.5, 1e-3))
        assert abs(sbh[0] - expected) < 5 * math.sqrt(expected)
        n_sampled = con.execute("SELECT count(*) FROM dp_sbh_histogram('agg', 0.5, 1e-3, tau := 0.02, "
                                "freq_col := 'frequency')").fetchall()[0][0]
        assert n_sampled < sbh[0]
    finally:
        con.close()


def test_sanitizer_draws_once_per_key(con):
    load_frequencies(con, {5: 1000, 40: 1000})
    src = source_of(con)
    for with_f in ("false", "true"):
        before = src.samples_drawn
        con.execute(f"SELECT * FROM dp_weighted_sample('agg', 1.0, 1e-5, with_frequencies := {with_f}, "
                    "freq_col := 'frequency')").fetchall()
        assert src.samples_drawn - before == 2000


# ---------------------------------------------------------------------------
# Bad parameters
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("args,match", [("0.5, 1e-3, tau := 0", "tau"), ("0.5, 1e-3, tau := -1", "tau"),
                                        ("0.5, 1e-3, scheme := 'bernoulli'", "scheme"), ("0.5, 1.0", "delta"),
                                        ("0.5, 1.5", "delta"), ("0, 1e-3", "epsilon"), ("-1, 1e-3", "epsilon"),
                                        ("0.5, 1e-3, power := -1", "power")])
def test_bad_parameters_error_before_reading_data(con, args, match):
    con.execute("CREATE TABLE empty_t (key VARCHAR)")
    with pytest.raises(Exception, match=match):
        con.execute(f"SELECT * FROM dp_weighted_sample('empty_t', {args})").fetchall()
    with pytest.raises(Exception, match=match):
        con.execute(f"SELECT * FROM dp_sbh_histogram('empty_t', {args})").fetchall()


def test_bad_parameters_python_and_other_macros(con):
    with pytest.raises(DPParameterError, match="tau"):
        pws.key_probabilities(0.5, 1e-3, 10, tau=0)
    with pytest.raises(DPParameterError, match="scheme"):
        pws.sampling_probabilities([1], 0.1, "uniform")
    with pytest.raises(DPParameterError, match="delta"):
        pws.L_value(0.5, 1.0)
    con.execute("CREATE TABLE e2 (key VARCHAR, token VARCHAR, n BIGINT)")  # every column, so one error per call
    with pytest.raises(Exception, match="tau"):
        con.execute("SELECT * FROM dp_threshold_sample('e2', NULL)").fetchall()
    with pytest.raises(Exception, match="estimator"):
        con.execute("SELECT * FROM dp_weighted_sample_estimate('e2', 0.5, 1e-3, estimator := 'mean')").fetchall()
    con.execute("INSERT INTO e2 VALUES ('a', 't', -2)")
    with pytest.raises(Exception, match="freq_col"):
        con.execute("SELECT * FROM dp_weighted_sample('e2', 0.5, 1e-3, freq_col := 'n')").fetchall()


def test_cli_weighted_sample_json_and_errors(tmp_path):
    import io
    import json

    import pyarrow.parquet as pq

    from dpsql.frontends.cli import main

    path = tmp_path / "ev.parquet"
    pq.write_table(pa.table({"item": np.repeat(np.array(["a", "b", "c"]), [400, 50, 1])}), path)
    out, err = io.StringIO(), io.StringIO()
    rc = main(["weighted-sample", str(path), "--epsilon", "1", "--delta", "1e-5", "--key-col", "item",
               "--with-frequencies", "--json", "--seed", "1"], out=out, err=err)
    assert rc == 0, err.getvalue()
    doc = json.loads(out.getvalue())
    assert doc["privacy_unit"].startswith("element") and doc["private"] is False
    keys = {r["key"]: r["token"] for r in doc["keys"]}
    assert "a" in keys and "c" not in keys or keys.get("c") == 1  # 'a' (400 rows) always reported (pi = 1)
    assert 1 <= keys["a"] <= 400
    for bad, word in ((["--tau", "0"], "tau"), (["--scheme", "x"], "scheme"), (["--key-col", "nope"], "--key-col")):
        err = io.StringIO()
        rc = main(["weighted-sample", str(path), "--epsilon", "1", "--delta", "1e-5", "--key-col", "item"] + bad,
                  out=io.StringIO(), err=err)
        assert rc == 2 and word in err.getvalue()


# ---------------------------------------------------------------------------
# Aggregated input declared unique: no re-aggregation, still validated, never fooled by name shadowing
# ---------------------------------------------------------------------------

def test_declared_unique_input_skips_aggregation_only_for_a_qualified_constrained_table(con):
    con.execute("CREATE TABLE pk (key VARCHAR PRIMARY KEY, n BIGINT)")
    con.execute("CREATE TABLE uq (item VARCHAR UNIQUE, n BIGINT)")
    con.execute("CREATE TABLE plain (key VARCHAR, n BIGINT)")
    got = con.execute("SELECT dp__pws_declared_unique('memory.main.pk', 'key'), "
                      "dp__pws_declared_unique('MEMORY.MAIN.PK', 'KEY'), dp__pws_declared_unique('pk', 'key'), "
                      "dp__pws_declared_unique('main.pk', 'key'), dp__pws_declared_unique('memory.main.pk', 'n'), "
                      "dp__pws_declared_unique('memory.main.uq', 'item'), "
                      "dp__pws_declared_unique('memory.main.plain', 'key')").fetchall()[0]
    assert got == (True, True, False, False, False, True, False)
    con.execute("INSERT INTO pk SELECT 'k' || i, 1 + i % 40 FROM range(3000) r(i)")
    src = source_of(con)
    for with_f in ("false", "true"):
        before = src.samples_drawn
        rows = con.execute(f"SELECT key, token FROM dp_weighted_sample('memory.main.pk', 1.0, 1e-5, "
                           f"with_frequencies := {with_f}, freq_col := 'n')").fetchall()
        assert src.samples_drawn - before == 3000
        assert len({k for k, _ in rows}) == len(rows)
        if with_f == "true":
            n_of = {f"k{i}": 1 + i % 40 for i in range(3000)}
            assert all(1 <= t <= n_of[k] for k, t in rows)
    # a CTE of the calling query named like the table shadows it for unqualified and two-part names; its
    # duplicated key must be aggregated (one draw per distinct key), the three-part name reads the table
    shadow = "WITH pk AS (SELECT 'dup' AS key, 5::BIGINT AS n FROM range(4)) "
    for name, draws in (("pk", 1), ("main.pk", 1), ("memory.main.pk", 3000)):
        before = src.samples_drawn
        con.execute(shadow + f"SELECT * FROM dp_weighted_sample('{name}', 1.0, 1e-5, freq_col := 'n')").fetchall()
        assert src.samples_drawn - before == draws, name


def test_declared_unique_input_is_still_validated(con):
    con.execute("CREATE TABLE pk (key BIGINT PRIMARY KEY, n DOUBLE)")
    for bad, word in (("(1, -1.0)", "whole numbers"), ("(1, 2.5)", "whole numbers"), ("(1, NULL)", "NULL")):
        con.execute("DELETE FROM pk")
        con.execute(f"INSERT INTO pk VALUES (2, 3.0), {bad}")
        with pytest.raises(Exception, match=word):
            con.execute("SELECT * FROM dp_weighted_sample('memory.main.pk', 1.0, 1e-5, freq_col := 'n')").fetchall()
    con.execute("DELETE FROM pk")
    con.execute("INSERT INTO pk VALUES (1, 0.0), (2, 400.0)")  # frequency 0 is not a key
    src = source_of(con)
    before = src.samples_drawn
    rows = con.execute("SELECT key FROM dp_weighted_sample('memory.main.pk', 1.0, 1e-5, freq_col := 'n')").fetchall()
    assert src.samples_drawn - before == 1 and rows == [(2,)]


def test_sanitizer_tables_grow_per_vector_like_one_table():
    """The UDF sizes its tables per vector (power of two >= the vector's largest frequency): same draws."""
    params = (0.5, 1e-3, 0.05, "ppswor", 1.0)
    w = np.array([1, 3, 7, 12, 30, 64, 65, 200, 1000])
    u = np.linspace(0.001, 0.999, len(w))
    big_k, big_t = pws.key_table(*params, n=4096), pws.frequency_table(*params, n=4096)
    for k in range(1, len(w) + 1):
        part_k, part_t = pws._grown(pws.key_table, params, int(w[:k].max())), \
            pws._grown(pws.frequency_table, params, int(w[:k].max()))
        np.testing.assert_array_equal(pws.sanitize_keys(w[:k], u[:k], part_k), pws.sanitize_keys(w[:k], u[:k], big_k))
        np.testing.assert_array_equal(pws.sanitize_tokens(w[:k], u[:k], part_t),
                                      pws.sanitize_tokens(w[:k], u[:k], big_t))


# ---------------------------------------------------------------------------
# Sanitizer kernels (compiled and numpy) and the parameter handle
# ---------------------------------------------------------------------------

KERNEL_PARAMS = [(0.5, 1e-3, None, "ppswor", 1.0), (0.5, 1e-3, 0.05, "ppswor", 1.0), (1.0, 1e-5, 0.01, "priority", 1.0)]


def kernel_or_skip(kernel: str) -> str:
    if kernel == "numba" and not pws.numba_available():
        pytest.skip("numba (extra 'fast') is not installed")
    return kernel


@pytest.mark.parametrize("params", KERNEL_PARAMS)
def test_sanitizer_kernels_map_the_same_uniforms_to_the_same_outputs(params):
    kernel_or_skip("numba")
    rng = np.random.default_rng(3)
    # 2^21 > MAX_PI_LOOKUP: keys only evaluates q for that key; frequency 0 is never reported
    w = np.r_[0, 0, rng.integers(1, 3000, 20000), 1 << 21, 1 << 21]
    u = np.r_[0.0, 0.5, rng.random(len(w) - 4), 0.0, 0.999999]
    kt = pws.key_table(*params, n=int(w.max()))
    keys = pws.sanitize_keys(w, u, kt, "numba")
    np.testing.assert_array_equal(keys, pws.sanitize_keys(w, u, kt, "numpy"))
    assert not keys[:2].any() and keys[-2]
    ft = pws.frequency_table(*params, n=4096)
    assert ft.steady  # rows beyond m are shifts: every frequency can be drawn
    # uniforms exactly on cumulative thresholds of some rows exercise the ties (C <= u passes the threshold)
    cum = ft.draw_arrays()[0]
    ties = [(r, c) for r in range(1, ft.m + 1, 7) for c in cum[r] if c < 1.0]
    wt = np.r_[w, [r for r, _ in ties]]
    ut = np.r_[u, [c for _, c in ties]]
    tokens = pws.sanitize_tokens(wt, ut, ft, "numba")
    np.testing.assert_array_equal(tokens, pws.sanitize_tokens(wt, ut, ft, "numpy"))
    assert (tokens <= np.maximum(wt, 0)).all() and (tokens[wt <= 0] == 0).all()
    assert ((tokens > 0) == (ut >= np.array([ft.entry(int(x), 0) for x in wt]))).all()


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
@pytest.mark.parametrize("tau", [None, 0.05])
def test_vectorised_sampler_draws_pi_and_pi_ij(kernel, tau):
    """One uniform per key: reported with probability pi_w, token j with probability pi_{w,j} (chi-square)."""
    kernel = kernel_or_skip(kernel)
    eps, delta, n = 0.5, 1e-3, 100_000
    kt, ft = pws.key_table(eps, delta, tau, n=4096), pws.frequency_table(eps, delta, tau, n=4096)
    rng = np.random.default_rng(20261122)
    for w in (1, 4, 12, 30, 90, 2500):
        pi = float(kt.reporting([w])[0])
        reported = int(pws.sanitize_keys(np.full(n, w), rng.random(n), kt, kernel).sum())
        assert abs(reported - n * pi) <= 5 * math.sqrt(n * pi * (1 - pi)) + 1, (w, reported, n * pi)
        got = np.bincount(pws.sanitize_tokens(np.full(n, w), rng.random(n), ft, kernel), minlength=w + 1)
        p = np.array([ft.entry(w, j) for j in range(w + 1)])
        assert len(got) == w + 1 and got[p == 0].sum() == 0
        expected = p * n
        keep = expected >= 5  # pool sparse cells
        obs, exp = np.r_[got[keep], got[~keep].sum()], np.r_[expected[keep], expected[~keep].sum()]
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        if len(exp) > 1:
            assert stats.chisquare(obs, exp).pvalue > 1e-3, (w, tau)


def test_sanitizer_spec_is_a_handle_of_validated_parameters(con):
    a = pws.sanitizer_spec(0.5, 1e-3, None, "ppswor", 1.0, True)
    assert a == pws.sanitizer_spec(0.5, 1e-3, None, "PPSWOR", 1, True)
    assert a != pws.sanitizer_spec(0.5, 1e-3, None, "ppswor", 1.0, False)
    assert pws._spec_params(a) == (0.5, 1e-3, None, "ppswor", 1.0, True)
    with pytest.raises(DPParameterError, match="epsilon"):
        pws.sanitizer_spec(0.0, 1e-3, None, "ppswor", 1.0, True)
    with pytest.raises(DPParameterError, match="with_frequencies"):
        pws.sanitizer_spec(0.5, 1e-3, None, "ppswor", 1.0, None)
    assert con.execute("SELECT dp__pws_spec(0.5, 1e-3, NULL, 'ppswor', 1.0, true)").fetchall() == [(a,)]
    src = source_of(con)
    before = src.samples_drawn
    for bad in ("-1", str(1 << 40)):  # only handles of validated parameter sets are accepted, before any draw
        with pytest.raises(Exception, match="unknown sanitizer spec"):
            con.execute(f"SELECT dp__pws_sanitize(range, {bad}) FROM range(1, 10)").fetchall()
    assert src.samples_drawn == before


def test_group_by_input_is_validated_before_any_draw_and_keeps_the_key_statistics(con):
    con.execute("CREATE TABLE t (key INTEGER, n DOUBLE)")
    src = source_of(con)
    for bad, word in (("(1, 2.0), (NULL, 0.0)", "key_col"), ("(1, 2.5)", "whole numbers"),
                      ("(1, -1.0)", "whole numbers"), ("(1, 1e19)", "whole numbers"), ("(1, NULL)", "NULL frequencies")):
        con.execute("DELETE FROM t")
        con.execute(f"INSERT INTO t VALUES (2, 3.0), {bad}")
        before = src.samples_drawn
        with pytest.raises(Exception, match=word):
            con.execute("SELECT * FROM dp_weighted_sample('t', 1.0, 1e-5, freq_col := 'n')").fetchall()
        assert src.samples_drawn == before  # the GROUP BY sees every row before the sanitizer runs
    con.execute("DELETE FROM t")
    con.execute("INSERT INTO t VALUES (1, 2.0), (1, 3.0), (2, 0.0), (3, 1.0), (3, 0.0)")
    assert con.execute("SELECT * FROM dp__pws_frequencies('t', freq_col := 'n') ORDER BY key").fetchall() \
        == [(1, 5), (3, 1)]
    # the GROUP BY groups the key column itself, so its min/max reach the planner: with the perfect-hash
    # threshold raised, integer keys of small range are aggregated without hashing
    con.execute("CREATE TABLE small AS SELECT (i % 1000)::INTEGER AS key, 1 AS n FROM range(5000) r(i)")
    con.execute("SET perfect_ht_threshold = 16")
    plan = con.execute("EXPLAIN SELECT * FROM dp__pws_frequencies('small', freq_col := 'n')").fetchall()[0][1]
    assert "Perfect Hash Group By" in plan or "PERFECT_HASH_GROUP_BY" in plan


# ---------------------------------------------------------------------------
# SbH noise: granular only (grid-snapped discrete Laplace)
# ---------------------------------------------------------------------------

def _granular_release_probability(f: int, T: float, scale: float, g: float) -> float:
    """P[f + g Z >= T], Z ~ DLap(scale/g): T - f is a whole number of grid steps."""
    from dpsql.core import calibration
    steps = (T - f) / g
    assert steps == int(steps)
    return math.exp(calibration.discrete_laplace_log_tail(int(steps), scale, g))


@pytest.mark.parametrize("granularity, freqs", [(1.0, (1, 10, 14, 16, 20)), (None, (5, 14, 15, 16, 20))])
def test_sbh_granular_release_probability_matches_the_discrete_laplace_tail(granularity, freqs):
    from dpsql.core import calibration
    eps, delta, n = 0.5, 1e-3, 20_000
    g = granularity if granularity is not None else calibration.choose_granularity(1 / eps, None, 1.0)
    T = calibration.discrete_laplace_threshold(1 / eps, g, delta / 2, 1.0)
    con = seeded(31)
    try:
        load_frequencies(con, {f: n for f in freqs})
        arg = "" if granularity is None else f", granularity := {granularity!r}"
        rows = con.execute("SELECT split_part(key, '_', 1), count(*), min(noisy_frequency), "
                           "bool_and(noisy_frequency / " + repr(g) + " = round(noisy_frequency / " + repr(g) + ")) "
                           f"FROM dp_sbh_histogram('agg', {eps}, {delta}, freq_col := 'frequency'{arg}) "
                           "GROUP BY 1").fetchall()
    finally:
        con.close()
    released = {int(k[1:]): (c, lo, on_grid) for k, c, lo, on_grid in rows}
    for f in freqs:
        p = _granular_release_probability(f, T, 1 / eps, g)
        count, lo, on_grid = released.get(f, (0, T, True))
        assert abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, (f, count, n * p)
        assert on_grid and lo >= T
    # a new key (frequency 1) passes with probability <= delta/2, as in the paper's continuous SbH
    assert _granular_release_probability(1, T, 1 / eps, g) <= delta / 2


def test_sbh_granular_threshold_is_close_to_the_continuous_one():
    from dpsql.core import calibration
    eps, delta = 0.5, 1e-3
    T_cont = pws.sbh_threshold(eps, delta)
    g = calibration.choose_granularity(1 / eps, None, 1.0)
    T = calibration.discrete_laplace_threshold(1 / eps, g, delta / 2, 1.0)
    assert g == 2.0 ** -15 and T / g == int(T / g)
    assert T_cont - 2 * g <= T <= T_cont + 2 * g
    assert calibration.discrete_laplace_threshold(1 / eps, 1.0, delta / 2, 1.0) == 16.0  # coarse: m = 15 steps


@pytest.mark.parametrize("eps, granularity", [(0.5, None), (1.0, 2.0 ** -3), (0.1, 1.0)])
def test_sbh_released_numbers_are_exact_grid_points(seeded_con, eps, granularity):
    """Mironov's low-bit attack tells frequency 5 from 6 by which doubles can come out: every released
    number is an exact multiple of g <= 1, i.e. each one is reachable from both frequencies."""
    from dpsql.core import calibration
    g = calibration.choose_granularity(1 / eps, granularity, 1.0)
    load_frequencies(seeded_con, {5: 3000, 6: 3000, 400: 3000})
    arg = "" if granularity is None else f", granularity := {granularity!r}"
    rows = seeded_con.execute(f"SELECT key, noisy_frequency FROM dp_sbh_histogram('agg', {eps}, 0.01, "
                              f"freq_col := 'frequency'{arg})").fetchall()
    values = np.array([v for _, v in rows])
    assert len(values) > 3000  # the keys of frequency 400 pass: T ~ 1 + ln(1/delta)/eps < 60 here
    steps = values / g
    assert np.all(steps == np.floor(steps))
    for f in (5, 6):  # v - f is a whole number of grid steps for every released v
        assert np.all((values - f) / g == np.floor((values - f) / g))


@pytest.mark.parametrize("args", ["noise := 'continuous'", "noise := 'continuous', granularity := 0.5"])
def test_sbh_continuous_noise_is_refused_before_the_charge(con, args):
    load_frequencies(con, {5: 10, 6: 10})
    dpsql.set_budget(con, 5.0, 1e-2)
    src, before = source_of(con), len(dpsql.releases(con))
    drawn = src.samples_drawn
    with pytest.raises(Exception, match=r"dpsql: noise := 'continuous' was removed"):
        con.execute(f"SELECT * FROM dp_sbh_histogram('agg', 0.5, 1e-3, freq_col := 'frequency', {args})").fetchall()
    assert len(dpsql.releases(con)) == before and src.samples_drawn == drawn
    with pytest.raises(DPParameterError, match="noise := 'continuous'"):
        pws.check_sbh_noise("continuous")
    assert pws.SBH_NOISE_MODES == ("granular",)


@pytest.mark.parametrize("args, match", [
    ("noise := 'exact'", "noise"), ("noise := NULL", "noise"),
    ("granularity := 0.3", "granularity"), ("granularity := 2", "granularity"), ("granularity := 0", "granularity"),
    ("granularity := 2^(-50)", "granularity"),  # 2^50 grid steps per unit of scale: beyond the sampler's 2^32
])
def test_sbh_bad_noise_mode_or_granularity_errors_before_reading_data(con, args, match):
    con.execute("CREATE TABLE empty_t (key VARCHAR)")
    with pytest.raises(Exception, match=match):
        con.execute(f"SELECT * FROM dp_sbh_histogram('empty_t', 0.5, 1e-3, {args})").fetchall()
    assert dpsql.releases(con) == []


def test_sbh_granularity_is_checked_against_the_noise_scale():
    assert pws.sbh_granularity(1.0, 1e-6, granularity=2.0 ** -32) == 2.0 ** -32  # scale / g = 2^32: allowed
    with pytest.raises(DPParameterError, match="too fine"):
        pws.sbh_granularity(1.0, 1e-6, granularity=2.0 ** -33)
    assert pws.sbh_granularity(0.5, 1e-3) == 2.0 ** -15 and pws.sbh_granularity(1e-6, 1e-3) == 1.0


def test_sbh_noisy_values_are_the_correctly_rounded_exact_sum():
    rng = np.random.default_rng(5)
    for g in (1.0, 2.0 ** -10, 2.0 ** -30):
        w = np.r_[rng.integers(0, 1000, 50), rng.integers(1 << 40, 1 << 62, 200), [(1 << 53) + 1, (1 << 62) + 3]]
        z = np.r_[rng.integers(-(1 << 40), 1 << 40, len(w) - 2), [1, -1]].astype(np.float64) * g
        got = pws.sbh_noisy_values(w, z, g)
        for wk, zk, r in zip(w.tolist(), z.tolist(), got.tolist()):
            exact = Fraction(wk) + Fraction(zk)
            err = abs(Fraction(r) - exact)
            # nearest double: neither neighbour is closer; and a multiple of g (ulp >= g or exact)
            assert err <= abs(Fraction(math.nextafter(r, math.inf)) - exact)
            assert err <= abs(Fraction(math.nextafter(r, -math.inf)) - exact)
            assert Fraction(r) / Fraction(g) == int(Fraction(r) / Fraction(g))
            if wk < 2 ** 52 * g and abs(zk) < 2 ** 52 * g:
                assert err == 0
    # the naive double sum rounds twice: 2^53 + 1 -> 2^53, then + 1 -> 2^53 (the exact sum is 2^53 + 2)
    assert pws.sbh_noisy_values([(1 << 53) + 1], [1.0], 1.0)[0] == float((1 << 53) + 2)


def test_sbh_draws_once_per_key(con):
    load_frequencies(con, {5: 1000, 40: 1000})
    src = source_of(con)
    before = src.samples_drawn
    con.execute("SELECT * FROM dp_sbh_histogram('agg', 1.0, 1e-5, freq_col := 'frequency')").fetchall()
    assert src.samples_drawn - before == 2000


def test_sbh_large_frequency_is_released_not_an_error(con):
    # 2^43 / 2^-10 = 2^53 grid steps: beyond the exact double range, released as the rounded exact sum
    con.execute("CREATE TABLE big AS SELECT 'a' AS key, (2::BIGINT ** 43)::BIGINT AS n")
    for g in (0.0009765625, 1.0):
        rows = con.execute(f"SELECT noisy_frequency FROM dp_sbh_histogram('big', 0.5, 1e-3, freq_col := 'n', "
                           f"granularity := {g})").fetchall()
        assert len(rows) == 1 and rows[0][0] / g == int(rows[0][0] / g)
        assert abs(rows[0][0] - 2.0 ** 43) < 80  # noise scale 2: |Lap| >= 80 has probability e^-40


# ---------------------------------------------------------------------------
# Release path: errors before the charge, no data in later errors, row order, constant parameters
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("sql, match", [
    ("dp_sbh_histogram('agg', 1.0, 1e-6, freq_col := 'frequency', granularity := 2^(-50))", "granularity"),
    ("dp_weighted_sample('agg', 1.0, 1e-6, tau := 1e-6, with_frequencies := true, freq_col := 'frequency')",
     "with_frequencies"),
    ("dp_weighted_sample('agg', 0.5, 1e-3, tau := 0.05, power := 0, with_frequencies := true, "
     "freq_col := 'frequency')", "with_frequencies"),
    ("dp_weighted_sample('agg', 1.0, 1e-6, tau := 1e-12, freq_col := 'frequency')", "tau"),
])
def test_parameter_limits_are_checked_before_the_charge(con, sql, match):
    """Limits that depend only on the parameters fail before the charge, whatever the data holds."""
    load_frequencies(con, {1234: 1, 5: 10})
    dpsql.set_budget(con, 5.0, 1e-2)
    src = source_of(con)
    drawn = src.samples_drawn
    with pytest.raises(Exception, match=match) as err:
        con.execute(f"SELECT * FROM {sql}").fetchall()
    assert "dpsql:" in str(err.value) and "1234" not in str(err.value)
    assert dpsql.releases(con) == [] and src.samples_drawn == drawn


def test_frequency_range_check_matches_the_tables():
    # ppswor tau = 0.01: q reaches 1 (in doubles) at 3,74x; tokens need rows up to q1 + 4 ceil(L) + 8
    pws.check_frequency_range(1.0, 1e-6, 1e-2, "ppswor", 1.0, True)
    q1 = pws._first_q_one(1e-2, "ppswor", 1.0)
    assert 3700 < q1 < 3800 and q1 + 4 * math.ceil(pws.L_value(1.0, 1e-6)) + 8 <= pws.MAX_FREQUENCY_ROWS
    assert pws.frequency_table(1.0, 1e-6, 1e-2, "ppswor", 1.0, n=1 << 20).steady  # every frequency served
    pws.check_frequency_range(0.5, 1e-3, 0.05, "ppswor", 0.0, False)  # constant q: two rows suffice
    with pytest.raises(DPParameterError, match="with_frequencies"):
        pws.check_frequency_range(1.0, 1e-6, 1e-5, "ppswor", 1.0, True)  # q1 = 3.7e6 rows
    with pytest.raises(DPParameterError, match="tau"):
        pws.check_frequency_range(1.0, 1e-6, 1e-9, "ppswor", 1.0, False)  # q1 = 3.7e10 > MAX_KEY_CHECK


SECRET = 987654321


DATA_ERRORS = [  # (rows of (key, n DOUBLE), the parameter the error names)
    ([("a", 3.0), ("secret", SECRET + 0.5)], "freq_col"),
    ([("a", 3.0), ("secret", -SECRET)], "freq_col"),
    ([("a", 3.0), ("secret", 1e30 + SECRET)], "freq_col"),
    ([("a", 3.0), ("secret", None)], "freq_col"),
    ([("a", 3.0), (None, float(SECRET))], "key_col"),
]


@pytest.mark.parametrize("macro", ["dp_weighted_sample", "dp_sbh_histogram"])
def test_data_errors_name_the_column_not_the_value(con, macro):
    con.execute("CREATE TABLE t (key VARCHAR, n DOUBLE)")
    for rows, match in DATA_ERRORS:
        con.execute("DELETE FROM t")
        con.executemany("INSERT INTO t VALUES (?, ?)", rows)
        with pytest.raises(Exception, match=match) as err:
            con.execute(f"SELECT * FROM {macro}('t', 1.0, 1e-5, freq_col := 'n')").fetchall()
        msg = str(err.value)
        assert "dpsql:" in msg and "98765" not in msg and "secret" not in msg, (rows, msg)


def test_data_errors_without_values_for_text_frequencies_and_overflowing_sums(con):
    con.execute(f"CREATE TABLE s AS SELECT 'secret' AS key, 'x{SECRET}' AS n")
    con.execute("CREATE TABLE o AS SELECT 'secret' AS key, n FROM (VALUES (4611686018427387904 + 987654321), "
                "(4611686018427387904)) v(n)")
    for tbl in ("s", "o"):
        for macro in ("dp_weighted_sample", "dp_sbh_histogram"):
            with pytest.raises(Exception, match="freq_col") as err:
                con.execute(f"SELECT * FROM {macro}('{tbl}', 1.0, 1e-5, freq_col := 'n')").fetchall()
            msg = str(err.value)
            assert "dpsql:" in msg and "98765" not in msg and "secret" not in msg and "4611" not in msg, msg


def test_sanitizer_table_errors_do_not_name_the_frequency():
    table = pws.frequency_table(0.5, 1e-3, 0.05, "ppswor", 1.0, n=10)
    assert not table.steady and table.m == 10
    w = np.array([3, SECRET])
    for call in (lambda: pws._draw_tokens(w, np.full(2, 0.5), table, SECRET, "numpy"), lambda: table.row(SECRET)):
        with pytest.raises(DPParameterError) as err:
            call()
        assert str(SECRET) not in str(err.value)


ORDER_KEYS = [f"k{i:03d}" for i in range(50)]


def _order_tables(con):
    """Element tables. D: 50 keys x 400 rows; D+v: the same plus one element of the last key stored first
    (e.g. the oldest row). In engine order (first seen) that key came first in D+v only."""
    body = "SELECT 'k' || lpad((i % 50)::VARCHAR, 3, '0') AS key FROM range(20000) r(i)"
    con.execute(f"CREATE TABLE d AS {body}")
    con.execute(f"CREATE TABLE dv AS SELECT 'k049' AS key UNION ALL {body}")
    con.execute("CREATE TABLE s_d AS SELECT 'k' || lpad(((i * 17) % 50)::VARCHAR, 3, '0') AS key, 300 AS token "
                "FROM range(50) r(i)")


@pytest.mark.parametrize("threads", [1, 4])
def test_released_rows_are_sorted_whatever_the_table_order(con, threads):
    """Row-order attack: an extra element stored first in the table put its key first in the output (with
    one thread the hash aggregation emitted groups in the order first seen). Every release (and the Python
    API) is sorted by key, so D and D+v give the same order."""
    con.execute(f"SET threads = {threads}")
    _order_tables(con)
    queries = [  # every key is released: frequency 400 is far above the thresholds at epsilon = 1
        "SELECT key FROM dp_weighted_sample('{t}', 1.0, 1e-5)",
        "SELECT key FROM dp_weighted_sample('{t}', 1.0, 1e-5, with_frequencies := true)",
        "SELECT key FROM dp_sbh_histogram('{t}', 1.0, 1e-5)",
        "SELECT key FROM dp_threshold_sample('{t}', 10.0)",
    ]
    for q in queries:
        for t in ("d", "dv"):
            assert [r[0] for r in con.execute(q.format(t=t)).fetchall()] == ORDER_KEYS, (q, t)
    for t in ("d", "dv"):
        got = pws.weighted_sample(con, t, epsilon=1.0, delta=1e-5, with_frequencies=True)
        assert got.column("key").to_pylist() == ORDER_KEYS
    est = con.execute("SELECT key FROM dp_weighted_sample_estimate('s_d', 1.0, 1e-5)").fetchall()
    assert [r[0] for r in est] == ORDER_KEYS


VOLATILE = "(CASE WHEN random() < 2.0 THEN {v} END)"

RELEASES = {
    "dp_weighted_sample": (
        "dp_weighted_sample({tbl}, {epsilon}, {delta}, tau := {tau}, scheme := {scheme}, power := {power}, "
        "with_frequencies := {with_frequencies}, key_col := {key_col}, freq_col := {freq_col})",
        dict(tbl="'agg'", epsilon="1.0", delta="1e-5", tau="0.5", scheme="'ppswor'", power="1.0",
             with_frequencies="true", key_col="'key'", freq_col="'frequency'"), True),
    "dp_sbh_histogram": (
        "dp_sbh_histogram({tbl}, {epsilon}, {delta}, tau := {tau}, scheme := {scheme}, power := {power}, "
        "key_col := {key_col}, freq_col := {freq_col}, noise := {noise}, granularity := {granularity})",
        dict(tbl="'agg'", epsilon="1.0", delta="1e-5", tau="0.5", scheme="'ppswor'", power="1.0", key_col="'key'",
             freq_col="'frequency'", noise="'granular'", granularity="0.5"), True),
    "dp_threshold_sample": (
        "dp_threshold_sample({tbl}, {tau}, scheme := {scheme}, power := {power}, key_col := {key_col}, "
        "freq_col := {freq_col}, salt := {salt})",
        dict(tbl="'agg'", tau="0.5", scheme="'ppswor'", power="1.0", key_col="'key'", freq_col="'frequency'",
             salt="7"), False),
    "dp_weighted_sample_estimate": (
        "dp_weighted_sample_estimate({sample_tbl}, {epsilon}, {delta}, tau := {tau}, scheme := {scheme}, "
        "power := {power}, g := {g}, estimator := {estimator}, key_col := {key_col}, token_col := {token_col})",
        dict(sample_tbl="'smp'", epsilon="1.0", delta="1e-5", tau="0.5", scheme="'ppswor'", power="1.0",
             g="'count'", estimator="'ml'", key_col="'key'", token_col="'token'"), False),
}


@pytest.mark.parametrize("macro", list(RELEASES))
def test_a_volatile_parameter_is_refused_naming_it_with_nothing_charged(con, macro):
    template, args, charges = RELEASES[macro]
    load_frequencies(con, {3: 20, 50: 20})
    con.execute("CREATE TABLE smp AS SELECT 'k' || i AS key, 1 + i % 5 AS token FROM range(20) r(i)")
    dpsql.set_budget(con, 5.0, 1e-2)
    src = source_of(con)
    con.execute(f"SELECT * FROM {template.format(**args)}").fetchall()  # the constant call works
    assert len(dpsql.releases(con)) == (1 if charges else 0)
    for param in args:
        before, drawn = len(dpsql.releases(con)), src.samples_drawn
        bad = dict(args, **{param: VOLATILE.format(v=args[param])})
        # column names select columns through COLUMNS(lambda ...), which the binder itself refuses to bind to a
        # non-constant expression: the query fails before it is planned
        refusal = ("Binder Error: Unsupported expression in COLUMNS" if param.endswith("_col")
                   else "must be a constant expression")  # the binder's refusal (sql/00_core/00_release.sql)
        with pytest.raises(Exception, match=refusal):
            con.execute(f"SELECT * FROM {template.format(**bad)}").fetchall()
        assert len(dpsql.releases(con)) == before and src.samples_drawn == drawn, param


def test_declarations_match_the_registered_macros(con):
    from test_optimize_release import check_declaration

    assert [m.macro for m in pws.MECHANISMS] == ["dp_weighted_sample", "dp_sbh_histogram"]
    for mech in pws.MECHANISMS:
        assert mech.family == "pws" and mech.unit == "element" and mech.proof == mech.name
        check_declaration(con, mech)
        for p in mech.params:  # each declared default passes its own check
            if not p.required and p.default is not None and p.check is not None:
                p.check(p.default)
    with pytest.raises(DPParameterError, match="delta is required by dp_weighted_sample"):
        pws.MECHANISMS[0].validate(tbl="t", epsilon=1.0)
    with pytest.raises(DPParameterError, match="epsilon"):
        pws.MECHANISMS[1].validate(tbl="t", epsilon=701.0, delta=1e-6)


def test_python_weighted_sample_names_its_parameters_as_the_macro():
    import inspect

    params = dict(inspect.signature(pws.weighted_sample).parameters)
    del params["con"]
    mech = pws.MECHANISMS[0]
    # the private table, the macro's tbl, is table in every Python release function
    assert list(params) == ["table" if n == "tbl" else n for n in mech.param_names]
    for name, p in params.items():
        decl = mech.param("tbl" if name == "table" else name)
        expected = inspect.Parameter.empty if decl.required else decl.default
        assert p.default == expected, name


@pytest.mark.parametrize("eps, delta, granularity", [(0.5, 1e-6, None), (1.0, 1e-3, 0.125), (0.1, 1e-5, 1.0)])
def test_sbh_calibration_is_the_macros_grid_and_threshold(con, eps, delta, granularity):
    cal = pws.sbh_calibration(eps, delta, granularity=granularity)
    g_sql = "NULL" if granularity is None else repr(granularity)
    g, T = con.execute(f"SELECT dp__sbh_granularity({eps}, {delta}, NULL, 'ppswor', 1.0, 'granular', {g_sql}) AS g, "
                       f"dp_discrete_laplace_threshold({1 / eps}, g, {delta / 2}, 1.0)").fetchall()[0]
    assert cal == {"scale": 1 / eps, "granularity": g, "threshold": T}
    assert pws.MECHANISMS[1].calibrate is pws.sbh_calibration


def test_estimate_reads_configurable_sample_columns(con):
    load_frequencies(con, {3: 20, 50: 20})
    con.execute("CREATE TABLE s AS SELECT * FROM dp_weighted_sample('agg', 0.5, 1e-3, with_frequencies := true, "
                "freq_col := 'frequency')")
    con.execute("CREATE TABLE s2 AS SELECT key AS k, token AS j FROM s")
    want = con.execute("SELECT key, token, estimate FROM dp_weighted_sample_estimate('s', 0.5, 1e-3)").fetchall()
    got = con.execute("SELECT key, token, estimate FROM dp_weighted_sample_estimate(sample_tbl := 's2', "
                      "epsilon := 0.5, delta := 1e-3, key_col := 'k', token_col := 'j')").fetchall()
    assert got == want and len(got) > 0
    with pytest.raises(Exception, match="token_col := 'token' is not a column of 's2'"):
        con.execute("SELECT * FROM dp_weighted_sample_estimate('s2', 0.5, 1e-3, key_col := 'k')").fetchall()
