"""The subsampling layer: Lemma 3.1 / Cor. 3.2 calibration, exact privacy of a subsampled greedy
(docs/proofs/reference_checks.md D1), Appendix C's counterexample (D2), Gumbel-max = softmax (D3),
Repeated-AT noise (D4)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql import optimize
from dpsql.optimize import subsampling
from dpsql.core.noise import NoiseSource
from dpsql.core.validation import DPParameterError

from conftest import seeded

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------
# Calibration (docs/proofs/reference_checks.md A11)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("eps, p", [(0.1, 0.0951626), (0.5, 0.3934693), (1.0, 0.6321206)])
def test_subsampling_probability_reference_values(eps, p):
    assert subsampling.subsampling_probability(eps) == pytest.approx(p, rel=1e-6)
    # Cor. 3.2: ln 2-add-DP on S_p is exactly eps-DP (the removal side binds).
    assert subsampling.subsampled_epsilon(LN2, subsampling.subsampling_probability(eps)) == pytest.approx(eps, abs=1e-12)


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0, 3.0, 10.0])
def test_cor_3_2_add_side_never_exceeds_eps(eps):
    p = subsampling.subsampling_probability(eps)
    assert math.log1p(p) <= eps + 1e-15  # 1 + p(e^{ln 2} - 1) = 1 + p <= e^eps


def test_lemma_3_1_general_formula():
    # eps0 = 2, p = 0.1: max(-ln 0.9, ln(1 + 0.1 (e^2 - 1))) = ln(1.6389...)
    assert subsampling.subsampled_epsilon(2.0, 0.1) == pytest.approx(math.log(1 + 0.1 * (math.e ** 2 - 1)), rel=1e-12)
    assert subsampling.subsampled_epsilon(LN2, 1.0) == math.inf  # no subsampling: removal side unbounded


def test_sql_calibration_matches_python(seeded_con):
    got = seeded_con.sql("SELECT dp_subsampling_probability(0.5), dp_subsampled_epsilon(ln(2), 1 - exp(-0.5))").fetchall()
    assert got[0][0] == pytest.approx(0.3934693, rel=1e-6)
    assert got[0][1] == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, None, "1"])
def test_bad_epsilon_is_refused(bad, seeded_con):
    with pytest.raises(DPParameterError, match="epsilon"):
        subsampling.subsampling_probability(bad)


def test_bad_epsilon_is_refused_in_sql(seeded_con):
    with pytest.raises(Exception, match="epsilon must be a finite number > 0"):
        seeded_con.sql("SELECT dp_subsampling_probability(-1.0)").fetchall()


@pytest.mark.parametrize("p", [0.0, 1.5, -0.1])
def test_bad_probability_is_refused(p):
    with pytest.raises(DPParameterError, match="p must"):
        subsampling.subsampled_epsilon(LN2, p)


# ---------------------------------------------------------------------------
# Exact enumeration on the tiny instance (docs/proofs/reference_checks.md D1)
# ---------------------------------------------------------------------------

SETS = [{0, 1}, {1, 2, 3}, {3, 4}, {0, 4}, {2}]
D_PRIME = {0, 1, 2, 3}
D_FULL = D_PRIME | {4}
K = 3


def _greedy_output_prob(data: set, output: tuple, eps0: float) -> float:
    """Exact Pr[DPSubmodGreedy_{eps0}(data) = output] via the module's softmax of the EM."""
    prob, covered, chosen = 1.0, set(), []
    for c in output:
        scores = np.array([-np.inf if i in chosen else len((S & data) - covered) for i, S in enumerate(SETS)])
        prob *= subsampling.exp_mech_probabilities(scores, eps0)[c]
        chosen.append(c)
        covered |= SETS[c] & data
    return prob


def _subsampled_prob(data: set, output: tuple, p: float) -> float:
    total = 0.0
    items = sorted(data)
    for r in range(len(items) + 1):
        for sample in itertools.combinations(items, r):
            total += p ** r * (1 - p) ** (len(items) - r) * _greedy_output_prob(set(sample), output, LN2)
    return total


OUTPUTS = list(itertools.permutations(range(len(SETS)), K))


@pytest.mark.parametrize("eps, expected", [(0.1, 0.069847), (0.5, 0.319294), (1.0, 0.567654)])
def test_exact_privacy_loss_of_subsampled_greedy(eps, expected):
    p = subsampling.subsampling_probability(eps)
    p_d = np.array([_subsampled_prob(D_FULL, o, p) for o in OUTPUTS])
    p_dp = np.array([_subsampled_prob(D_PRIME, o, p) for o in OUTPUTS])
    assert p_d.sum() == pytest.approx(1.0, abs=1e-12) and p_dp.sum() == pytest.approx(1.0, abs=1e-12)
    loss = np.max(np.abs(np.log(p_d / p_dp)))
    assert loss == pytest.approx(expected, abs=1e-6)
    assert loss <= eps


def test_without_subsampling_only_the_add_direction_is_bounded():
    p_d = np.array([_greedy_output_prob(D_FULL, o, LN2) for o in OUTPUTS])
    p_dp = np.array([_greedy_output_prob(D_PRIME, o, LN2) for o in OUTPUTS])
    add = np.log(p_d / p_dp)
    assert add.max() == pytest.approx(0.492476, abs=1e-6)
    assert add.max() <= LN2  # ln 2-add-DP (Thm 4.3)
    # the removal direction is not bounded by ln 2 ... (it is bounded only by composition)
    assert (-add).max() > 0


def test_implementation_samples_the_enumerated_distribution():
    """The real kernel (subsample + Gumbel-max greedy) against the exact distribution, eps = 1 (chi-square)."""
    source = NoiseSource(7)
    set_idx = np.array([i for i, S in enumerate(SETS) for _ in S])
    elem_idx = np.array([x for S in SETS for x in sorted(S)])
    runs = 6000
    counts = {o: 0 for o in OUTPUTS}
    for _ in range(runs):
        counts[tuple(optimize._max_coverage_arrays(source, set_idx, elem_idx, 5, 5, K, 1.0))] += 1
    p = subsampling.subsampling_probability(1.0)
    expected = np.array([_subsampled_prob(D_FULL, o, p) for o in OUTPUTS]) * runs
    observed = np.array([counts[o] for o in OUTPUTS])
    assert observed.sum() == runs
    big = expected >= 5  # pool sparse cells (if any)
    obs, exp = observed[big], expected[big]
    if (~big).any():
        obs, exp = np.append(obs, observed[~big].sum()), np.append(exp, expected[~big].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-3


# ---------------------------------------------------------------------------
# Appendix C counterexample (docs/proofs/reference_checks.md D2; ERRATUM: the chain holds with ">")
# ---------------------------------------------------------------------------

def _app_c_ratio(eps: float, L: int, m: int) -> float:
    """Pr[M(D') = o] / Pr[M(D) = o] for Repeated-EM_eps, D' = {}, D = {x}, f_x(S) = min(1, |S ∩ [m-L]|)."""
    output = list(range(m - L, m))  # o = (m-L+1, ..., m), 0-based
    prob_d, prob_dp, chosen = 1.0, 1.0, []
    for c in output:
        covered = any(i < m - L for i in chosen)
        gain_d = np.array([-np.inf if i in chosen else float(i < m - L and not covered) for i in range(m)])
        gain_dp = np.where(np.isinf(gain_d), -np.inf, 0.0)
        prob_d *= subsampling.exp_mech_probabilities(gain_d, eps)[c]
        prob_dp *= subsampling.exp_mech_probabilities(gain_dp, eps)[c]
        chosen.append(c)
    return prob_dp / prob_d


@pytest.mark.parametrize("eps, L, eps_prime, m, ratio", [(1.0, 3, 2.9, 59, 18.8053), (0.5, 5, 2.4, 101, 11.4770)])
def test_app_c_counterexample(eps, L, eps_prime, m, ratio):
    assert math.ceil(1 + (math.exp(eps) - 1) * L / (math.exp(eps) - math.exp(eps_prime / L))) == m
    got = _app_c_ratio(eps, L, m)
    assert got == pytest.approx(ratio, rel=1e-5)
    assert got > math.exp(eps_prime)  # removal direction exceeds eps' < L eps: not eps'-DP without subsampling


# ---------------------------------------------------------------------------
# Exponential mechanism (docs/proofs/reference_checks.md D3)
# ---------------------------------------------------------------------------

def test_gumbel_max_matches_softmax_including_zero_scores():
    source = NoiseSource(11)
    scores = np.array([0.0, 0.0, 1.0, 2.0, 3.0, -np.inf])
    eps = 0.8
    runs = 20000
    picks = np.bincount([subsampling.exp_mech(source, scores, eps) for _ in range(runs)], minlength=6)
    probs = subsampling.exp_mech_probabilities(scores, eps)
    assert picks[5] == 0 and probs[5] == 0
    assert picks[0] > 0 and picks[1] > 0  # zero-score candidates are selectable
    assert stats.chisquare(picks[:5], probs[:5] * runs).pvalue > 1e-3


def test_exp_mech_needs_a_candidate():
    with pytest.raises(ValueError, match="candidate"):
        subsampling.exp_mech(NoiseSource(1), np.array([-np.inf, -np.inf]), 1.0)


def test_repeated_em_stops_when_no_candidate_is_left():
    chosen = subsampling.repeated_em(NoiseSource(3), 10, lambda h: np.array([-np.inf if i in h else 0.0 for i in range(4)]))
    assert sorted(chosen) == [0, 1, 2, 3]


# ---------------------------------------------------------------------------
# Repeated-AT noise and Poisson subsampling (docs/proofs/reference_checks.md D4)
# ---------------------------------------------------------------------------

class RecordingSource(NoiseSource):
    """A seeded source that records the exponential noise it hands out (tests only)."""

    def __init__(self, seed):
        super().__init__(seed)
        self.exp_draws: list[np.ndarray] = []
        self.exp_rates: list[np.ndarray] = []

    def exponential(self, rate):
        out = super().exponential(rate)
        self.exp_draws.append(out)
        self.exp_rates.append(np.asarray(rate, dtype=float))
        return out


@pytest.mark.parametrize("k", [1, 4])
def test_thresh_monitor_noise_has_mean_k_over_ln2(k):
    rng = np.random.default_rng(k)
    n_users, horizon, n_buckets = 400, 50, 30
    users = np.repeat(np.arange(n_users), horizon)
    times = np.tile(np.arange(horizon), n_users)
    buckets = rng.integers(0, n_buckets, users.size)
    source = RecordingSource(k)
    optimize._thresh_monitor(source, users, times, buckets, n_users, horizon, n_buckets, k, tau=40.0)
    draws = np.concatenate(source.exp_draws)
    assert np.allclose(np.concatenate(source.exp_rates), LN2 / k)
    assert draws.size > 1000
    se = (k / LN2) / math.sqrt(draws.size)
    assert abs(draws.mean() - k / LN2) < 4 * se


def test_above_threshold_pass_probability():
    source = NoiseSource(5)
    k, tau, n = 3, 4.0, 40000
    passed = subsampling.above_threshold(source, np.full(n, 1.0), tau, LN2, k).mean()
    expected = 2.0 ** (-(tau - 1.0) / k)  # Pr[Exp(ln2/k) > tau - 1]
    assert abs(passed - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("p", [0.0951626, 0.6321206])
def test_poisson_subsample_rate(p):
    mask = subsampling.poisson_subsample(NoiseSource(9), 50000, p)
    assert abs(mask.mean() - p) < 4 * math.sqrt(p * (1 - p) / 50000)


def test_sql_poisson_keep_draws_per_row(seeded_con):
    kept = seeded_con.sql("SELECT count(*) FILTER (WHERE dp__poisson_keep(0.5, hash(range))) FROM range(20000)"
                          ).fetchall()[0][0]
    assert abs(kept - 10000) < 4 * math.sqrt(5000)


def test_sql_poisson_keep_is_not_hoisted_to_the_calibration_side(seeded_con):
    """Regression: WHERE dp__poisson_keep(p) with p from a one-row CTE was pushed to that CTE (one coin)."""
    for _ in range(5):
        kept, total = seeded_con.sql(
            "WITH cal AS (SELECT dp_subsampling_probability(1.0) AS p), "
            "e AS (SELECT DISTINCT range % 30000 AS element FROM range(60000)) "
            "SELECT (SELECT count(*) FROM e CROSS JOIN cal WHERE dp__poisson_keep(p, hash(element))), "
            "(SELECT count(*) FROM e)").fetchall()[0]
        p = 1 - math.exp(-1.0)
        assert abs(kept - p * total) < 4 * math.sqrt(p * (1 - p) * total)
