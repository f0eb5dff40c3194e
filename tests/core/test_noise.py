"""Noise UDFs: independence per row, distributions, seeding, secure keying, salts, no float noise mode."""
from __future__ import annotations

import math
import multiprocessing
import secrets
import warnings

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql.core import noise
from dpsql.core.registration import source_of
from dpsql.core.validation import DPParameterError

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
    src = noise.secure_source()
    queue.put((src.gaussian(np.ones(8)).tolist(), src.salt()))


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
    assert children[0][0] != children[1][0]
    assert parent not in [c[0] for c in children]
    assert len({children[0][1], children[1][1], src.salt()}) == 3


# ---------------------------------------------------------------------------
# The generator: ChaCha20 keyed from the OS
# ---------------------------------------------------------------------------

# RFC 8439, section 2.3.2: key 00 01 .. 1f, nonce 00 00 00 09 00 00 00 4a 00 00 00 00, block count 1.
RFC8439_KEY = int.from_bytes(bytes(range(32)), "little")
RFC8439_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")


@pytest.mark.parametrize("source", [lambda: noise.secure_source(), lambda: noise.NoiseSource(seed=3)],
                         ids=["private", "seeded"])
def test_noise_comes_from_chacha20(source):
    bit_generator = source()._rng.bit_generator
    assert bit_generator.state["state"]["rounds"] == noise.CHACHA_ROUNDS == 20
    # The same bit generator class with the RFC's key and (block counter, nonce) reproduces the RFC's key
    # stream block: it is ChaCha20, not a look-alike. randomgen counts 32-bit words (16 per block) in
    # the 128-bit counter that fills state words 12..15.
    words = 1 + (0x09000000 << 32) + (0x4A000000 << 64)
    reference = type(bit_generator)(key=RFC8439_KEY, counter=16 * words, rounds=noise.CHACHA_ROUNDS)
    assert reference.random_raw(8).astype("<u8").tobytes() == RFC8439_BLOCK


def test_private_sources_are_keyed_independently():
    a, b = noise.NoiseSource(), noise.NoiseSource()
    assert not np.array_equal(a._rng.bit_generator.random_raw(4), b._rng.bit_generator.random_raw(4))
    # a seeded source is a function of its seed
    c, d = noise.NoiseSource(seed=5), noise.NoiseSource(seed=5)
    assert np.array_equal(c._rng.bit_generator.random_raw(4), d._rng.bit_generator.random_raw(4))


# ---------------------------------------------------------------------------
# Per-query secret salts
# ---------------------------------------------------------------------------

def _chacha_position(src: noise.NoiseSource) -> list[int]:
    return src._rng.bit_generator.state["state"]["ctr"].tolist()


def test_private_salts_come_from_the_os_not_from_the_noise_stream(monkeypatch):
    src = noise.NoiseSource()
    requested = []

    def fake_token_bytes(n):
        requested.append(n)
        return bytes([0x80 + len(requested)] * n)

    before = (_chacha_position(src), src.samples_drawn)
    monkeypatch.setattr(secrets, "token_bytes", fake_token_bytes)
    salts = [src.salt(), src.salt()]
    # 8 fresh OS bytes per salt, read as a signed 64-bit integer; the noise generator did not move
    assert requested == [8, 8]
    assert salts == [int.from_bytes(bytes([0x81] * 8), "little", signed=True),
                     int.from_bytes(bytes([0x82] * 8), "little", signed=True)]
    assert _chacha_position(src) == before[0]
    assert src.samples_drawn == before[1] + 2  # salts are counted with the draws


def test_secret_salt_udf_gives_a_fresh_salt_per_call(con):
    salts = [con.execute("SELECT dp__secret_salt()").fetchall()[0][0] for _ in range(200)]
    assert len(set(salts)) == 200
    assert all(-(2 ** 63) <= s < 2 ** 63 for s in salts)
    # 200 independent uniform signs: P[all on one side] = 2^-199
    assert min(salts) < 0 < max(salts)


def test_seeded_salts_are_reproducible_and_uniform():
    def salts(c, n):
        return [c.execute("SELECT dp__secret_salt()").fetchall()[0][0] for _ in range(n)]

    a, b, c = seeded(7), seeded(7), seeded(8)
    try:
        first = salts(a, 20)
        assert first == salts(b, 20)
        assert first != salts(c, 20)
    finally:
        for x in (a, b, c):
            x.close()
    # every one of the 64 bits is a fair coin: 4,000 draws, 5 standard errors (0.04) per bit
    src = noise.NoiseSource(seed=9)
    values = np.array([src.salt() for _ in range(4000)], dtype=np.int64).view(np.uint64)
    bits = (values[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.04)


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


@pytest.mark.parametrize("s", [0.6, 2.5, 30.0, 1024.0, 3000.0])  # >= 1024: the rounding sampler
def test_discrete_gaussian_sampler_matches_exact_pmf(s):
    src = noise.NoiseSource(seed=12)
    z = src.discrete_gaussian(np.full(200_000, s))
    assert z.dtype == np.int64
    bound = int(np.ceil(6 * s)) + 2
    assert _chi_square_pvalue(z, _dgauss_pmf(s), -bound, bound) > 1e-3


class _ScriptedGenerator:
    """Hands out fixed values in place of a Generator's draws (one call of each kind)."""

    def __init__(self, normal, k, v):
        self.normal, self.k, self.v = normal, k, v

    def standard_normal(self, m):
        return self.normal[:m].copy()

    def integers(self, low, high, size, dtype):
        assert (low, high, dtype) == (0, 1 << 16, np.uint16)
        return self.k[:size].astype(np.uint16)

    def random(self, n):
        self.v_used = n
        return self.v[:n].copy()


def test_rounding_sampler_accepts_exactly_when_the_two_part_uniform_is_below_a():
    from fractions import Fraction
    rng = np.random.default_rng(21)
    m, s = 4000, 1024.0  # the smallest s of the rounding sampler: the most rows on the slow path
    c = noise._TAIL * s + 0.25
    cut = math.floor(math.exp(-c / (s * s)) * (1 - 1e-12) * 65536)
    normal = rng.standard_normal(m)
    normal[:3] = [40.2, -41.0, 39.99]  # beyond and near the 40 s tail cut
    k = np.where(np.arange(m) % 2 == 0, rng.integers(0, 1 << 16, m), rng.integers(cut - 40, cut + 40, m))
    k = np.minimum(k, (1 << 16) - 1)
    v = rng.random(m)
    scripted = _ScriptedGenerator(normal, k, v)
    z, accept = noise._rounding_round(scripted, s, m)
    slow = iter(v[:scripted.v_used])
    for i in range(m):
        x = normal[i] * s
        zi = float(np.rint(x))
        assert z[i] == zi
        a = math.exp(((x - zi) * (x + zi) - c) / (2 * s * s))
        if int(k[i]) < cut and abs(zi) <= noise._TAIL * s:  # decided by the 16 leading bits alone ...
            assert accept[i] and Fraction(int(k[i]) + 1, 1 << 16) <= Fraction(a)  # ... correctly for any V
        else:
            u = (int(k[i]) + Fraction(next(slow))) / (1 << 16)
            assert accept[i] == (abs(zi) <= noise._TAIL * s and u < Fraction(a)), i
    assert next(slow, None) is None  # every remaining bit drawn was used, in row order
    # both branches and both outcomes of the slow path were exercised
    assert not accept[:2].any() and scripted.v_used > 500 and 10 < np.sum(~accept) < scripted.v_used


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
    ("SELECT dp__check_noise('exact', NULL)", "dpsql: noise must be 'granular'"),
    ("SELECT dp__check_noise(NULL, NULL)", "dpsql: noise must be 'granular'"),
])
def test_bad_granular_parameters_fail(con, sql, msg):
    with pytest.raises(Exception, match=msg):
        con.execute(sql).fetchall()


# ---------------------------------------------------------------------------
# No textbook floating-point noise on released numbers
# ---------------------------------------------------------------------------

def test_granular_is_the_only_noise_mode(con):
    assert noise.NOISE_MODES == ("granular",)
    assert noise.check_noise_mode("granular") == "granular"
    assert con.execute("SELECT dp__check_noise('granular', NULL), dp__check_noise('granular', 0.5)").fetchall() == [
        (True, True)]


@pytest.mark.parametrize("granularity", ["NULL", "0.5"])
def test_continuous_noise_mode_is_refused_with_the_reason(con, granularity):
    reason = r"dpsql: noise := 'continuous' was removed: .*low-order bits.*use noise := 'granular'"
    with pytest.raises(Exception, match=reason):
        con.execute(f"SELECT dp__check_noise('continuous', {granularity})").fetchall()
    with pytest.raises(DPParameterError, match=reason):
        noise.check_noise_mode("continuous")


def _float_laplace_could_give(o: float, x: float) -> bool:
    """Could ``o`` be ``x + dp_laplace_noise(1.0)`` with positive noise? (Mironov 2012, numpy's sampler)

    numpy draws U = j 2^-53 and, for U >= 1/2, returns -log(2 - U - U) = -log(k 2^-52) with
    U = 1 - k 2^-53, k in 1..2^52. Only k near 2^52 e^-(o - x) can round to o; each is tried
    with the sampler's own float operations.
    """
    if o <= x:
        return False
    k0 = int(2.0 ** 52 * math.exp(-(o - x)))
    for k in range(max(1, k0 - 3), min(2 ** 52, k0 + 4) + 1):
        u = 1.0 - k * 2.0 ** -53
        if x + -math.log(2.0 - u - u) == o:
            return True
    return False


def test_low_bits_of_float_noise_reveal_the_value_but_granular_noise_does_not(seeded_con):
    # Why float noise may only feed comparisons: an output of x + dp_laplace_noise tells x apart from
    # x + 1 by its low-order bits alone. The granular UDF's outputs are all on the grid of both.
    g = 2.0 ** -16
    float_out = [r[0] for r in seeded_con.execute(
        "SELECT 5.0 + dp_laplace_noise(1.0) AS o FROM range(20000)").fetchall()]
    # Far in the tail (noise > 3 for either candidate) the noise values are sparser than the doubles
    # near o (spacing ~e^noise 2^-52 against 2^-49), so most outputs only one candidate can explain.
    tail = [o for o in float_out if o > 9.0]
    assert len(tail) > 100
    as_5 = np.mean([_float_laplace_could_give(o, 5.0) for o in tail])
    as_6 = np.mean([_float_laplace_could_give(o, 6.0) for o in tail])
    assert as_5 == 1.0  # the check is exact for the true value
    # and rules out the neighbour for most of them (measured 0.16): an event of probability ~0.8 % under
    # x = 5 and 0 under x = 6, i.e. an unbounded privacy loss
    assert as_6 < 0.5
    granular_out = np.array([r[0] for r in seeded_con.execute(
        f"SELECT 5.0 + dp_granular_laplace_noise(1.0, {g!r}) FROM range(4000)").fetchall()])
    for x in (5.0, 6.0):
        assert np.all((granular_out - x) / g == np.round((granular_out - x) / g))
