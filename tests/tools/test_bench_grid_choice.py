"""benchmarks/bench_grid_choice.py: the private choice's statistic, its sensitivity and its calibration.

The statistic ``f = q #{users with d <= D} - p #{users}`` (cut c = p/q) must move by at most
``max(p, q - p)`` when one user is added or removed with all its rows; the noise ``DLap(Delta/eps0)``
must make the pick eps0-DP exactly; and dpsql's sampler must pick ``greedy_update`` with the probability
the benchmark computes in closed form (it reports that probability as the wrong-pick rate).
"""
from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dpsql.core.noise import NoiseSource

# the benchmark's folder on the path only while importing it (it holds modules such as audit.py whose
# names must not shadow anything for the other tests of the session)
_saved_path = list(sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_grid_choice as choice  # noqa: E402

sys.path[:] = _saved_path

CUTS = [Fraction(c) for c in choice.CUTS] + [Fraction(1, 3)]


def _dlap_pmf(z: np.ndarray, t: float) -> np.ndarray:
    a = math.exp(-1.0 / t)
    return (1 - a) / (1 + a) * a ** np.abs(z)


@pytest.mark.parametrize("cut,expected", [(Fraction(1, 2), 1), (Fraction(7, 10), 7), (Fraction(9, 10), 9),
                                          (Fraction(1, 3), 2)])
def test_sensitivity_is_the_larger_term(cut, expected):
    assert choice.sensitivity(cut) == expected


def test_sensitivity_on_random_neighbouring_degree_lists():
    """Add or remove one user (its degree drawn at random): f moves by q - p or -p, never more than Delta,
    and both extremes occur, so the bound is tight."""
    rng = np.random.default_rng(7)
    for cut in CUTS:
        delta = choice.sensitivity(cut)
        seen = set()
        for _ in range(300):
            degrees = list(rng.integers(1, 9, rng.integers(0, 40)))
            D = int(rng.choice(choice.DEGREE_BOUNDS))
            f = choice.statistic(degrees, D, cut)
            added = degrees + [int(rng.integers(1, 9))]
            change = choice.statistic(added, D, cut) - f
            assert abs(change) <= delta
            seen.add(change)
            if degrees:
                k = int(rng.integers(len(degrees)))
                removed = degrees[:k] + degrees[k + 1:]
                assert abs(choice.statistic(removed, D, cut) - f) <= delta
        assert seen == {cut.denominator - cut.numerator, -cut.numerator}


def test_degree_counts_are_per_user_on_neighbouring_tables():
    """On a DuckDB table: removing one user with all its rows (duplicates included) leaves every other
    user's degree as it was, so f moves by at most Delta, and the counts match the degree lists."""
    import duckdb

    rng = np.random.default_rng(11)
    con = duckdb.connect()
    for _ in range(20):
        n = int(rng.integers(2, 30))
        deg = rng.integers(1, 8, n)
        users = np.repeat(np.arange(n), deg)
        items = rng.integers(1, 6, users.size)  # small vocabulary: repeated items within a user
        con.execute("CREATE OR REPLACE TABLE t AS SELECT * FROM (SELECT unnest(?) AS user_id, unnest(?) AS item)",
                    [users.tolist(), items.tolist()])
        gone = int(rng.integers(n))
        con.execute("CREATE OR REPLACE TABLE t2 AS SELECT * FROM t WHERE user_id <> ?", [gone])
        full, less = choice.degree_counts(con, "t"), choice.degree_counts(con, "t2")
        distinct = [len(set(items[users == u].tolist())) for u in range(n)]
        for D in choice.DEGREE_BOUNDS:
            assert full[str(D)] == sum(d <= D for d in distinct)
            for cut in CUTS:
                f = choice.statistic_from_counts(full[str(D)], full["users"], cut)
                assert f == choice.statistic(distinct, D, cut)
                g = choice.statistic_from_counts(less[str(D)], less["users"], cut)
                assert abs(f - g) <= choice.sensitivity(cut)
    con.close()


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("epsilon0", [0.02, 0.15, 1.0])
def test_calibration_is_exact(cut, epsilon0):
    """t = Delta/eps0; a shift of the statistic by Delta changes the pmf by exactly e^eps0 at most, and the
    pick's probabilities by at most e^eps0 either way (the pick is post-processing)."""
    delta = choice.sensitivity(cut)
    t = choice.noise_steps(cut, epsilon0)
    assert t == delta / epsilon0
    z = np.arange(-5 * delta, 5 * delta + 1)
    ratio = _dlap_pmf(z, t) / _dlap_pmf(z + delta, t)
    assert ratio.max() == pytest.approx(math.exp(epsilon0), rel=1e-12)
    bound = math.exp(epsilon0) * (1 + 1e-12)
    for f in range(-3 * delta - 2, 3 * delta + 3):
        for g in range(f - delta, f + delta + 1):
            p, q = choice.prob_greedy(f, cut, epsilon0), choice.prob_greedy(g, cut, epsilon0)
            assert p / q <= bound and (1 - p) / (1 - q) <= bound


@pytest.mark.parametrize("f", [-40, -7, -1, 0, 1, 9, 55])
def test_prob_greedy_is_the_discrete_laplace_tail(f):
    """P[f + Z >= 0] by the closed form equals the sum of the pmf over z >= -f (truncated far in the tail)."""
    cut, epsilon0 = Fraction(7, 10), 0.5
    t = choice.noise_steps(cut, epsilon0)
    z = np.arange(-f, -f + 4000)
    tail = _dlap_pmf(z, t).sum()
    assert choice.prob_greedy(f, cut, epsilon0) == pytest.approx(tail, rel=1e-12)
    assert choice.prob_greedy(f, cut, epsilon0) + choice.prob_greedy(-f - 1, cut, epsilon0) == pytest.approx(1.0)


def test_dpsql_sampler_picks_with_the_computed_probability():
    """20,000 picks per case from a seeded dpsql source: the frequency of greedy_update is within 4.5
    binomial standard deviations of the closed-form probability (a fixed seed; a correct sampler fails
    with probability about 1e-5 per case)."""
    source = NoiseSource(2026)
    n = 20_000
    for f, cut, epsilon0 in [(-12, Fraction(9, 10), 0.02), (3, Fraction(1, 2), 0.05), (-200, Fraction(7, 10), 0.15),
                             (0, Fraction(9, 10), 0.06)]:
        p = choice.prob_greedy(f, cut, epsilon0)
        t = choice.noise_steps(cut, epsilon0)
        z = source.discrete_laplace(np.full(n, t))
        freq = float(np.mean(f + z >= 0))
        assert abs(freq - p) <= 4.5 * math.sqrt(p * (1 - p) / n)
        picks = [choice.noisy_pick(source, f, cut, epsilon0) for _ in range(2000)]
        assert abs(np.mean(picks) - p) <= 4.5 * math.sqrt(p * (1 - p) / 2000)


def test_rejects_a_cut_outside_zero_one_and_a_nonpositive_budget():
    with pytest.raises(ValueError):
        choice.sensitivity(Fraction(1))
    with pytest.raises(ValueError):
        choice.noise_steps(Fraction(1, 2), 0.0)


def test_shares_bounds_and_cuts_replace_the_family_in_the_releases_and_the_scores(tmp_path, monkeypatch, capsys):
    # main() replaces the module's family; monkeypatch restores it for the other tests of the session
    for name in ("SHARES", "DEGREE_BOUNDS", "CUTS"):
        monkeypatch.setattr(choice, name, getattr(choice, name))
    counts = {"sips_cumulative@0.01": [10, 12], "greedy_update@0.01": [20, 22],
              "greedy_full": [21, 21], "sips_cumulative@0.5": [1, 1], "greedy_update@0.5": [1, 1]}
    # a point the README's table does not have: the reference is the fresh greedy_update alone
    row = {"point": "made-up-point", "shape": "few", "exponent": 1.0, "users": 10_000,
           "part": "tuning", "setting": "a", "degrees": {"users": 10_000, "5": 9_000},
           "counts": counts, "seconds": {k: [0.1, 0.1] for k in counts},
           "picks": {"choice_D5_c0.5_e0.01": [True, True]}, "load": [0.0, 0.0], "runs": 2}
    path = tmp_path / "rows.json"
    path.write_text(__import__("json").dumps(row) + "\n")
    choice.main(["--table", str(path), "--shares", "0.01", "--degree-bounds", "5", "--cuts", "0.5"])
    out = capsys.readouterr().out
    assert "chosen: choice_D5_c0.5_e0.01" in out
    assert "e0.02" not in out and "choice_D3" not in out and "c0.7" not in out
    assert [label for label, _, _ in choice.release_labels()] == [
        "sips_cumulative@0.01", "greedy_update@0.01", "greedy_full"]
    # 9,000 of 10,000 users with at most 5 items: f = 2 * 9,000 - 10,000 = 8,000, 80 noise scales above 0 at
    # eps0 = 0.01, so greedy_update is picked (P = 1 to 3 decimals) and the ratio is its mean at 0.99 epsilon
    # over the fresh greedy_update's at the full one
    assert "| 0.900 | 11.0 | 21.0 | 21.0 (greedy_update) | 1.000 | 21.0 |" in out
