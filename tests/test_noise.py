"""Noise UDFs: independence per row, distributions, seeding, secure keying."""
from __future__ import annotations

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
