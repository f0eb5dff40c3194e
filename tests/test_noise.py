"""Noise UDFs: independence per row, distributions, seeding, secure keying."""
from __future__ import annotations

import math
import multiprocessing
import warnings

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql import noise
from dpsql.registration import source_of

from conftest import seeded

N = 20_000

# (SQL function, argument, scipy distribution with the same parameterisation)
DISTRIBUTIONS = [
    ("dp_gaussian_noise", 2.5, stats.norm(scale=2.5)),
    ("dp_laplace_noise", 0.7, stats.laplace(scale=0.7)),
    ("dp_gumbel_noise", 3.0, stats.gumbel_r(scale=3.0)),
    ("dp_exponential_noise", 4.0, stats.expon(scale=1 / 4.0)),  # rate 4 -> mean 1/4
]


@pytest.mark.parametrize("fn, arg, dist", DISTRIBUTIONS)
def test_every_row_gets_independent_noise(con, fn, arg, dist):
    # A constant argument must not let DuckDB fold the call into one value for all rows.
    values = np.array([r[0] for r in con.execute(f"SELECT {fn}({arg}) FROM range({N})").fetchall()])
    assert len(np.unique(values)) == N
    # Nor through a CTE constant, as the macros pass their calibration.
    rows = con.execute(f"WITH c AS (SELECT {arg} AS p) SELECT {fn}(p) FROM range(1000), c").fetchall()
    assert len({r[0] for r in rows}) == 1000
    # Consecutive draws are uncorrelated.
    assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 4 / np.sqrt(N)


@pytest.mark.parametrize("fn, arg, dist", DISTRIBUTIONS)
def test_distributions_pass_ks(seeded_con, fn, arg, dist):
    values = [r[0] for r in seeded_con.execute(f"SELECT {fn}({arg}) FROM range({N})").fetchall()]
    assert stats.kstest(values, dist.cdf).pvalue > 1e-3


def test_scale_may_vary_per_row(seeded_con):
    rows = seeded_con.execute(
        "SELECT i % 2 AS g, dp_gaussian_noise(CASE WHEN i % 2 = 0 THEN 1.0 ELSE 100.0 END) "
        f"FROM range({N}) r(i)").fetchall()
    small = np.array([v for g, v in rows if g == 0])
    large = np.array([v for g, v in rows if g == 1])
    assert np.std(small) == pytest.approx(1.0, rel=0.05)
    assert np.std(large) == pytest.approx(100.0, rel=0.05)


def _draws(c, n=50):
    return [r[0] for r in c.execute(f"SELECT dp_laplace_noise(1.0) FROM range({n})").fetchall()]


def test_seeded_connection_reproduces_and_unseeded_does_not():
    a, b, c = seeded(7), seeded(7), seeded(8)
    try:
        assert _draws(a) == _draws(b)
        assert _draws(a) != _draws(c)
    finally:
        for x in (a, b, c):
            x.close()
    p, q = dpsql.connect(), dpsql.connect()
    try:
        assert _draws(p) != _draws(q)
        assert _draws(p) != _draws(p)
    finally:
        p.close()
        q.close()


def test_seeded_connection_warns_not_private():
    with pytest.warns(UserWarning, match="NOT differentially private"):
        c = dpsql.connect(seed=1)
    c.close()


def test_unseeded_connections_share_the_secure_source():
    p, q = dpsql.connect(), dpsql.connect()
    try:
        assert source_of(p) is source_of(q) is noise.secure_source()
        assert not source_of(p).seeded
    finally:
        p.close()
        q.close()


def test_sources_count_their_draws(seeded_con):
    src = source_of(seeded_con)
    before = src.samples_drawn
    seeded_con.execute("SELECT dp_gumbel_noise(1.0) FROM range(1234)").fetchall()
    assert src.samples_drawn - before == 1234


@pytest.mark.parametrize("sql, msg", [
    ("SELECT dp_gaussian_noise(0.0)", "sigma"),
    ("SELECT dp_laplace_noise(-1.0)", "scale"),
    ("SELECT dp_gumbel_noise('inf'::DOUBLE)", "scale"),
    ("SELECT dp_exponential_noise(NULL)", "rate"),
    ("SELECT dp_gaussian_noise(CASE WHEN i = 3 THEN -1 ELSE 1 END) FROM range(5) r(i)", "sigma"),
])
def test_bad_noise_parameters_fail(con, sql, msg):
    with pytest.raises(Exception, match=msg):
        con.execute(sql).fetchall()


def test_seed_must_be_an_integer():
    with pytest.raises(ValueError, match="seed"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsql.connect(seed="7")


def _child_draw(queue):
    queue.put(noise.secure_source().gaussian(np.ones(8)).tolist())


def test_forked_child_does_not_repeat_parent_noise():
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    src = noise.secure_source()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child_draw, args=(queue,)) for _ in range(2)]
    for p in procs:
        p.start()
    children = [queue.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    parent = src.gaussian(np.ones(8)).tolist()
    assert children[0] != children[1]
    assert parent not in children


# ---------------------------------------------------------------------------
# Granular (snapped) noise: integer samplers on a 2^-k grid
# ---------------------------------------------------------------------------

def _chi_square_pvalue(samples: np.ndarray, pmf, lo: int, hi: int) -> float:
    """Chi-square of integer samples against ``pmf`` on lo..hi, both tails pooled into one cell each."""
    z = np.arange(lo, hi + 1)
    p = pmf(z)
    below = np.sum(samples < lo)
    above = np.sum(samples > hi)
    inside = np.bincount(samples[(samples >= lo) & (samples <= hi)] - lo, minlength=len(z))
    observed = np.concatenate([[below + above], inside])
    cells_p = np.concatenate([[max(1.0 - p.sum(), 0.0)], p])
    keep = cells_p * len(samples) >= 5  # the chi-square approximation needs >= 5 expected per cell
    obs = np.concatenate([observed[keep], [observed[~keep].sum()]])
    exp_ = np.concatenate([cells_p[keep], [cells_p[~keep].sum()]]) * len(samples)
    if exp_[-1] < 5:  # pool the rare cells into the first kept one
        obs[0] += obs[-1]
        exp_[0] += exp_[-1]
        obs, exp_ = obs[:-1], exp_[:-1]
    return stats.chisquare(obs, exp_).pvalue


def _dlap_pmf(t: float):
    a = np.exp(-1.0 / t)
    return lambda z: (1 - a) / (1 + a) * a ** np.abs(z)


def _dgauss_pmf(s: float):
    support = np.arange(-60 * int(s + 1), 60 * int(s + 1) + 1)
    norm = np.exp(-support.astype(float) ** 2 / (2 * s * s)).sum()
    return lambda z: np.exp(-np.asarray(z, dtype=float) ** 2 / (2 * s * s)) / norm


@pytest.mark.parametrize("t", [0.4, 3.0, 40.0])
def test_discrete_laplace_sampler_matches_exact_pmf(t):
    src = noise.NoiseSource(seed=11)
    z = src.discrete_laplace(np.full(200_000, t))
    assert z.dtype == np.int64
    bound = int(np.ceil(12 * t)) + 2
    assert _chi_square_pvalue(z, _dlap_pmf(t), -bound, bound) > 1e-3


@pytest.mark.parametrize("s", [0.6, 2.5, 30.0, 3000.0])  # 3000: the rounding sampler (s >= 1024)
def test_discrete_gaussian_sampler_matches_exact_pmf(s):
    src = noise.NoiseSource(seed=12)
    z = src.discrete_gaussian(np.full(200_000, s))
    assert z.dtype == np.int64
    bound = int(np.ceil(6 * s)) + 2
    assert _chi_square_pvalue(z, _dgauss_pmf(s), -bound, bound) > 1e-3


def test_discrete_samplers_take_a_parameter_per_row():
    src = noise.NoiseSource(seed=13)
    s = np.array([1.0, 50.0, 5000.0])[np.arange(150_000) % 3]  # both samplers in one call
    z = src.discrete_gaussian(s).astype(float)
    # sd of N_Z(0, s^2) is s to ~1e-9 for s >= 1 (Poisson summation); 1.5 % ~ 7 standard errors at n = 50,000
    for k, sd in enumerate((1.0, 50.0, 5000.0)):
        assert np.std(z[k::3]) == pytest.approx(sd, rel=0.015)


@pytest.mark.parametrize("fn, param", [("dp_granular_laplace_noise", 1.7), ("dp_granular_gaussian_noise", 2.3)])
def test_granular_udfs_return_exact_grid_multiples(seeded_con, fn, param):
    g = 2.0 ** -10
    v = np.array([r[0] for r in seeded_con.execute(f"SELECT {fn}({param}, {g!r}) FROM range({N})").fetchall()])
    steps = v / g
    assert np.all(steps == np.round(steps))
    # the grid varies per row too
    rows = seeded_con.execute(f"SELECT i % 3, {fn}({param}, CASE i % 3 WHEN 0 THEN 1.0 WHEN 1 THEN 0.25 "
                              "ELSE 0.0009765625 END) FROM range(3000) r(i)").fetchall()
    for k, x in rows:
        step = (1.0, 0.25, 0.0009765625)[k]
        assert x / step == round(x / step)
    # scale is in value units: the sd of the noise is sqrt(2) * scale, resp. sigma (5 % ~ 7 standard errors)
    expected_sd = param * (math.sqrt(2) if "laplace" in fn else 1.0)
    assert np.std(v) == pytest.approx(expected_sd, rel=0.05)


@pytest.mark.parametrize("fn", ["dp_granular_laplace_noise", "dp_granular_gaussian_noise"])
def test_granular_udfs_draw_once_per_row_and_are_not_folded(seeded_con, fn):
    src = source_of(seeded_con)
    before = src.samples_drawn
    rows = seeded_con.execute(f"WITH c AS (SELECT 1.0 AS p) SELECT {fn}(p, dp_granularity(p)) FROM range(1000), c"
                              ).fetchall()
    assert src.samples_drawn - before == 1000
    # 2^16..2^17 grid steps per unit of scale: about 2 collisions expected among 1000 draws
    assert len({r[0] for r in rows}) >= 980


def test_round_to_grid_is_exact_nearest_multiple():
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1000, 10_000)
    for g in (1.0, 0.5, 2.0 ** -20, 8.0):
        r = noise.round_to_grid(x, g)
        assert np.all(r / g == np.round(r / g))
        assert np.all(np.abs(r - x) <= g / 2)
    # ties go to the even multiple; values on the grid stay put
    assert noise.round_to_grid([0.5, 1.5, 2.5, -0.5, 3.0], 1.0).tolist() == [0.0, 2.0, 2.0, -0.0, 3.0]
    with pytest.raises(ValueError, match="granularity"):
        noise.round_to_grid([1e20], 2.0 ** -10)
    with pytest.raises(ValueError, match="granularity"):
        noise.round_to_grid([1.0], 0.1)


def test_round_to_grid_sql(con):
    rows = con.execute("SELECT dp_round_to_grid(1.3, 0.25), dp_round_to_grid(-1.3, 0.5), "
                       "dp_round_to_grid(NULL, 0.5)").fetchall()
    assert rows == [(1.25, -1.5, None)]


@pytest.mark.parametrize("sql, msg", [
    ("SELECT dp_granular_laplace_noise(1.0, 0.3)", "granularity"),
    ("SELECT dp_granular_laplace_noise(1.0, NULL)", "granularity"),
    ("SELECT dp_granular_laplace_noise(1.0, -0.5)", "granularity"),
    ("SELECT dp_granular_gaussian_noise(0.0, 0.5)", "sigma"),
    ("SELECT dp_granular_laplace_noise(NULL, 0.5)", "scale"),
    ("SELECT dp_granular_gaussian_noise(1e12, 0.0009765625)", "too fine"),
    ("SELECT dp_round_to_grid(1.0, 3.0)", "granularity"),
    ("SELECT dp__check_noise('exact', NULL)", "noise"),
    ("SELECT dp__check_noise('continuous', 0.5)", "granularity"),
])
def test_bad_granular_parameters_fail(con, sql, msg):
    with pytest.raises(Exception, match=msg):
        con.execute(sql).fetchall()
