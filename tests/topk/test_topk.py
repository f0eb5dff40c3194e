"""Unknown-domain top-k, k-hitting set, limited-domain baseline: calibration, budget split, behaviour."""
from __future__ import annotations

import itertools
import math
import sys

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql.core import calibration, registration
from dpsql.union import basic
from dpsql.tools import metrics
from dpsql import topk
from dpsql.core.noise import NoiseSource
from dpsql.core.validation import DPParameterError

from conftest import seeded


def load(con, rows, name="t", item_type="VARCHAR"):
    """Create table ``name`` from (user, item) tuples through Arrow."""
    staged = pa.table({"u": pa.array([r[0] for r in rows], pa.int64()),  # noqa: F841 (replacement scan)
                       "i": pa.array([str(r[1]) for r in rows], pa.string())})
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT u AS user_id, i::{item_type} AS item FROM staged")


def nested_rows(n_items=20, extra=11, copies=1):
    """Item j is held by ``copies`` users for each of 0..n_items+extra-1-j: N(i_j) = copies (n_items + extra - j)."""
    rows = []
    for c in range(copies):
        for u in range(n_items + extra):
            user = c * 1000 + u
            rows += [(user, f"i{j:02d}") for j in range(n_items) if j <= n_items + extra - 1 - u]
    return rows


class RecordingSource(NoiseSource):
    """A seeded source that records the scale of every Gaussian/Laplace/Gumbel draw (NOT private)."""

    def __init__(self, seed):
        super().__init__(seed)
        self.calls = []

    def gaussian(self, sigma):
        self.calls.append(("gaussian", np.array(sigma, dtype=float, ndmin=1)))
        return super().gaussian(sigma)

    def laplace(self, scale):
        self.calls.append(("laplace", np.array(scale, dtype=float, ndmin=1)))
        return super().laplace(scale)

    def gumbel(self, scale):
        self.calls.append(("gumbel", np.array(scale, dtype=float, ndmin=1)))
        return super().gumbel(scale)

    def scales(self, kind):
        arrays = [a for k, a in self.calls if k == kind]
        return np.concatenate(arrays) if arrays else np.zeros(0)


def recording_connection(seed=3):
    con = duckdb.connect()
    con.execute("SET threads = 1")
    source = RecordingSource(seed)
    registration.register_functions(con, source)
    registration.register_macros(con)
    return con, source


# ---------------------------------------------------------------------------
# Calibration (docs/proofs/reference_checks.md A9)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("k, expected", [(1, 0.5), (5, 0.100000), (10, 0.063360), (20, 0.044802),
                                         (50, 0.028336), (100, 0.020036), (200, 0.014168)])
def test_lemma_b1_eps0_at_half_budget(k, expected):
    assert topk.peeling_epsilon(0.5, 5e-6, k) == pytest.approx(expected, abs=5e-7)


@pytest.mark.parametrize("k, expected", [(10, 0.129058), (100, 0.040812)])
def test_lemma_b1_eps0_at_full_budget(k, expected):
    assert topk.peeling_epsilon(1.0, 1e-5, k) == pytest.approx(expected, abs=5e-7)


def test_lemma_b1_is_the_max_of_its_two_terms():
    for eps, delta, k in itertools.product([0.1, 0.5, 1, 3], [1e-8, 1e-5, 1e-3], [1, 2, 7, 50]):
        l = 8 * math.log(1 / delta)
        assert topk.peeling_epsilon(eps, delta, k) == max(eps / k, math.sqrt((l + 8 * eps) / k) - math.sqrt(l / k))
        assert topk.peeling_epsilon(eps, delta, k) >= eps / k


def test_sql_calibration_states_the_accountant(con):
    [(c,)] = con.execute("SELECT dp__top_k_calibration(10, 1.0, 1e-5, 100, 'weighted_gaussian', 'u', 'i')").fetchall()
    cal = topk.top_k_calibration(10, 1.0, 1e-5, 100)
    assert c == {"k": 10, "gumbel_scale": cal.gumbel_scale, "accountant": "zcdp",
                 "total_epsilon": cal.accounting.epsilon, "total_delta": cal.accounting.delta}
    assert c["total_epsilon"] <= 1.0 and c["total_delta"] <= 1e-5


def test_sql_calibration_functions_match_python(con):
    [(a, b)] = con.execute("SELECT dp_peeling_epsilon(0.5, 5e-6, 10), "
                           "dp_limited_domain_epsilon(1.0, 5e-6, 10)").fetchall()
    assert a == topk.peeling_epsilon(0.5, 5e-6, 10)
    assert b == topk.limited_domain_epsilon(1.0, 5e-6, 10)


@pytest.mark.parametrize("k", [1, 5, 10, 100, 200])
def test_limited_domain_step_epsilon_is_the_largest_that_composes_to_epsilon(k):
    e = topk.limited_domain_epsilon(1.0, 5e-6, k)
    assert topk.limited_domain_composed_epsilon(e, 5e-6, k) <= 1.0
    assert topk.limited_domain_composed_epsilon(e * (1 + 1e-9), 5e-6, k) > 1.0 or e == 1.0
    assert e >= 1.0 / k  # never worse than basic composition


def test_limited_domain_threshold_offset():
    cal = topk.limited_domain_calibration(10, 50, 1.0, 1e-5)  # no cap: min(inf, k_bar) = k_bar
    e = topk.limited_domain_epsilon(1.0, 5e-6, 10)
    assert (cal.step_epsilon, cal.step_delta, cal.delta_prime) == (e, 5e-6, 5e-6)
    assert cal.offset == pytest.approx(1 + math.log(50 / 5e-6) / e, rel=1e-12)
    assert cal.gumbel_scale == 1 / e
    capped = topk.limited_domain_calibration(10, math.inf, 1.0, 1e-5, max_items=100)
    assert capped.offset == pytest.approx(1 + math.log(100 / 5e-6) / e, rel=1e-12)


# ---------------------------------------------------------------------------
# Parameter validation
# ---------------------------------------------------------------------------

BAD_K = [(0, ">= 1"), (-3, ">= 1"), (2.5, "whole number"), ("NULL", "NULL")]


@pytest.mark.parametrize("macro", ["dp_top_k", "dp_hitting_set"])
@pytest.mark.parametrize("k, words", BAD_K)
@pytest.mark.parametrize("table", ["t", "empty"])
def test_bad_k_errors_name_k_even_on_empty_input(con, macro, k, words, table):
    load(con, nested_rows())
    con.execute("CREATE OR REPLACE TABLE empty (user_id BIGINT, item VARCHAR)")
    with pytest.raises(duckdb.Error, match=rf"k must .*{words}"):
        con.execute(f"SELECT * FROM {macro}('{table}', {k}, epsilon := 1.0, delta := 1e-5)").fetchall()


@pytest.mark.parametrize("k, words", BAD_K[:3])
def test_bad_k_errors_in_python(con, k, words):
    load(con, nested_rows())
    for fn in (topk.top_k, topk.hitting_set):
        with pytest.raises(DPParameterError, match=rf"k must .*{words}"):
            fn(con, "t", k, epsilon=1.0, delta=1e-5)
    with pytest.raises(DPParameterError, match="k must"):
        topk.top_k(con, "t", True, epsilon=1.0, delta=1e-5)


def test_bad_parameters_of_the_limited_domain_baseline(con):
    load(con, nested_rows())
    budget = "epsilon := 1.0, delta := 1e-5"
    cases = [(f"5, 3, {budget}", "k_bar must be >= k"), (f"5, 2.5, {budget}", "k_bar must be a whole number"),
             (f"0, 5, {budget}", "k must be >= 1"), (f"5, 'infinity'::DOUBLE, {budget}", "needs a finite max_items"),
             ("5, 10, epsilon := 0, delta := 1e-5", "epsilon"), (f"5, 10, {budget}, max_items := 0", "max_items")]
    for args, words in cases:
        with pytest.raises(duckdb.Error, match=words):
            con.execute(f"SELECT * FROM dp_top_k_limited_domain('t', {args})").fetchall()


def test_bad_domain_method_and_budget(con):
    load(con, nested_rows())
    # Two checks refuse it: top-k's own (naming domain_method) and dp_set_union's (naming its `method`),
    # which receives the value; DuckDB runs them in parallel and either may raise first. Both list the
    # methods and quote the value, before anything is charged.
    with pytest.raises(duckdb.Error, match=r"(domain_)?method must be one of .*\(got 'nope'\)"):
        con.execute("SELECT * FROM dp_top_k('t', 3, epsilon := 1.0, delta := 1e-5, domain_method := 'nope')").fetchall()
    assert len(dpsql.releases(con)) == 0
    with pytest.raises(duckdb.Error, match="delta"):
        con.execute("SELECT * FROM dp_hitting_set('t', 3, epsilon := 1.0, delta := 1.5)").fetchall()
    with pytest.raises(DPParameterError, match="user_col"):
        topk.top_k(con, "t", 3, epsilon=1.0, delta=1e-5, user_col="nope")


def test_python_leaves_the_calibration_to_the_macro(con, monkeypatch):
    # top_k / hitting_set / top_k_limited_domain check their parameters by the declaration and run the
    # macro, whose checks calibrate: a calibration error (a delta too small to halve) is the macro's,
    # raised as dpsql's ParameterError with nothing charged, and Python does not calibrate a second time
    load(con, nested_rows())
    callers = []
    for name in ("top_k_calibration", "limited_domain_calibration"):
        original = getattr(topk, name)

        def spy(*args, _original=original, **kwargs):
            callers.append(sys._getframe(1).f_code.co_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(topk, name, spy)
    with pytest.raises(DPParameterError, match="delta must be >= 2e-15 for top-k"):
        topk.top_k(con, "t", 3, epsilon=1.0, delta=1.5e-15)
    assert len(dpsql.releases(con)) == 0
    for out in (topk.top_k(con, "t", 3, epsilon=1.0, delta=1e-5), topk.hitting_set(con, "t", 3, epsilon=1.0, delta=1e-5),
                topk.top_k_limited_domain(con, "t", 3, 5, epsilon=1.0, delta=1e-5)):
        assert out.column_names == ["rank", "item"]
    assert len(dpsql.releases(con)) == 3
    python_api = {"top_k", "hitting_set", "top_k_limited_domain", "_release", "_unknown_domain"}
    assert callers and not python_api & set(callers), callers  # only the macros' calibration UDFs


# ---------------------------------------------------------------------------
# Budget split (exact): which epsilon/delta each step uses
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("macro", ["dp_top_k", "dp_hitting_set"])
@pytest.mark.parametrize("eps, delta, k", [(1.0, 1e-5, 10), (0.3, 1e-7, 3)])
def test_budget_split_is_exactly_half_and_half(macro, eps, delta, k):
    con, source = recording_connection()
    try:
        load(con, nested_rows(copies=30))
        out = con.execute(f"SELECT item FROM {macro}('t', {k}, epsilon := {eps}, delta := {delta}, "
                          f"max_items := 50)").fetchall()
        sigma = source.scales("gaussian")
        gumbel = source.scales("gumbel")
    finally:
        con.close()
    # Domain: WGM at (eps/2, delta/2), i.e. sigma(eps/2, delta/4) ([DPSU] Thm 5.1 at half budget).
    assert np.all(sigma == basic.weighted_gaussian_calibration(eps / 2, delta / 2, 50).scale)
    assert sigma[0] == calibration.gaussian_sigma(eps / 2, delta / 4)
    # Selection: Gumbel(1/eps0), eps0 composed with the Gaussian domain by zCDP (docs/proofs/top_k.md),
    # larger than Lemma B.1's at (eps/2, delta/2) of basic composition (the old calibration).
    assert gumbel.size > 0
    eps0 = selection_epsilon(eps, delta, k)
    assert np.all(gumbel == pytest.approx(1.0 / eps0, rel=2e-3))
    assert np.all(gumbel == 1.0 / topk.top_k_calibration(k, eps, delta, 50).step_epsilon)
    assert eps0 > topk.peeling_epsilon(eps / 2, delta / 2, k)
    assert len(out) <= k


def zcdp_delta_continuous(rho: float, eps: float) -> float:
    """[CKS20] Prop. 12 for a rho-zCDP curve, minimised over all orders alpha > 1 with scipy."""
    from scipy.optimize import minimize_scalar
    f = lambda a: (a - 1) * (a * rho - eps + math.log1p(-1 / a)) - math.log(a)  # noqa: E731
    return math.exp(minimize_scalar(f, bounds=(1.0001, 1e5), method="bounded", options={"xatol": 1e-10}).fun)


def selection_epsilon(eps: float, delta: float, k: int) -> float:
    """eps0 recomputed from the math: the WGM domain at (eps/2, delta/2) is 1/(2 sigma_D^2)-zCDP plus
    delta/4 of novel items; k peeling steps are k eps0^2/8-zCDP; the total rho converts to (eps, 3 delta/4)."""
    from scipy.optimize import brentq
    sigma_d = calibration.gaussian_sigma(eps / 2, delta / 4)
    rho = brentq(lambda r: zcdp_delta_continuous(r, eps) - 0.75 * delta, 1e-12, eps, xtol=1e-15, rtol=1e-12)
    return math.sqrt(8 * (rho - 1 / (2 * sigma_d ** 2)) / k)


@pytest.mark.parametrize("eps, delta, k", [(1.0, 1e-5, 10), (1.0, 1e-5, 100), (3.0, math.exp(-10), 100),
                                           (0.3, 1e-7, 3)])
@pytest.mark.parametrize("method", sorted(topk.GAUSSIAN_DOMAIN_METHODS))
def test_tight_selection_composes_within_the_charge(eps, delta, k, method):
    cal = topk.top_k_calibration(k, eps, delta, 100, method)
    acc = cal.accounting
    assert acc.accountant == "zcdp"
    assert (cal.domain_epsilon, cal.domain_delta, cal.select_epsilon, cal.select_delta) == (
        eps / 2, delta / 2, eps / 2, delta / 2)  # the ledger's charges: the user's (eps, delta) once
    # The accountant's total is within the charge; recomputed over all Renyi orders it is too.
    assert acc.delta <= delta and acc.epsilon <= eps
    assert acc.event_delta == delta / 4
    rho = 1 / (2 * calibration.gaussian_sigma(eps / 2, delta / 4) ** 2) + k * cal.step_epsilon ** 2 / 8
    assert zcdp_delta_continuous(rho, eps) + delta / 4 <= delta
    # within 0.2% of the largest eps0 the conversion allows, and better than basic composition
    assert cal.step_epsilon == pytest.approx(selection_epsilon(eps, delta, k), rel=2e-3)
    assert cal.step_epsilon > topk.peeling_epsilon(eps / 2, delta / 2, k)
    assert cal.gumbel_scale == 1 / cal.step_epsilon


@pytest.mark.parametrize("k, eps, delta, expected", [(10, 1.0, 1e-5, 0.129935), (100, 1.0, 1e-5, 0.041089),
                                                     (10, 3.0, math.exp(-10), 0.375530),
                                                     (100, 3.0, math.exp(-10), 0.118753)])
def test_tight_selection_reference_numbers(k, eps, delta, expected):
    # docs/proofs/reference_checks.md A9b
    assert topk.top_k_calibration(k, eps, delta, 100).step_epsilon == pytest.approx(expected, abs=5e-7)


def test_basic_composition_where_it_is_better_or_the_domain_is_not_gaussian():
    # k = 1: Lemma B.1's basic term eps/2 beats the zCDP route
    cal = topk.top_k_calibration(1, 1.0, 1e-5, 100)
    assert cal.accounting.accountant == "basic" and cal.step_epsilon == 0.5
    # a Laplace domain is pure-DP at eps/2: its zCDP cost (eps/2)^2/2 exceeds what the route saves
    cal = topk.top_k_calibration(10, 1.0, 1e-5, 100, "weighted_laplace")
    assert cal.accounting.accountant == "basic"
    assert cal.step_epsilon == topk.peeling_epsilon(0.5, 5e-6, 10)
    assert (cal.accounting.epsilon, cal.accounting.delta) == (1.0, 1e-5)


def test_domain_method_is_dispatched_with_half_the_budget():
    con, source = recording_connection()
    try:
        load(con, nested_rows())
        con.execute("SELECT * FROM dp_top_k('t', 5, epsilon := 2.0, delta := 1e-5, domain_method := 'weighted_laplace')").fetchall()
        assert source.scales("gaussian").size == 0
        assert np.all(source.scales("laplace") == 1.0)  # Lap(1/(eps/2)) with eps = 2
        assert np.all(source.scales("gumbel") == 1.0 / topk.peeling_epsilon(1.0, 5e-6, 5))
    finally:
        con.close()


# ---------------------------------------------------------------------------
# Behaviour
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3, 10, 20])
def test_vanishing_noise_gives_the_exact_top_k(k):
    con = seeded(7)
    try:
        load(con, nested_rows())
        out = topk.top_k(con, "t", k, epsilon=1000.0, delta=1e-5)
    finally:
        con.close()
    assert out.column("rank").to_pylist() == list(range(1, k + 1))
    assert out.column("item").to_pylist() == [f"i{j:02d}" for j in range(k)]


def test_domain_smaller_than_k_returns_the_whole_domain_in_noisy_order():
    con = seeded(8)
    try:
        load(con, nested_rows(n_items=6))
        out = topk.top_k(con, "t", 50, epsilon=1000.0, delta=1e-5)
        hs = topk.hitting_set(con, "t", 50, epsilon=1000.0, delta=1e-5)
    finally:
        con.close()
    assert out.column("item").to_pylist() == [f"i{j:02d}" for j in range(6)]
    assert sorted(hs.column("item").to_pylist()) == [f"i{j:02d}" for j in range(6)]
    assert hs.column("rank").to_pylist() == list(range(1, 7))


def greedy_users(shared=20, sizes=(10, 12, 14, 16, 30, 28, 26, 24, 22, 20)):
    """Item j has ``sizes[j]`` users of its own; ``shared`` further users hold items 0..3.

    Greedy takes item 3 first (count 36), which hits the shared users, and then
    follows the own-block sizes: 4, 5, 6, 7, 8, 9, 2, 1 -- not the order of the counts.
    """
    users, u = {}, 0
    for j, size in enumerate(sizes):
        for _ in range(size):
            users[u] = {f"x{j:02d}"}
            u += 1
    for _ in range(shared):
        users[u] = {f"x{j:02d}" for j in range(4)}
        u += 1
    return users


def greedy_gaps(users, k):
    """Smallest gap between the best and second-best marginal gain over the greedy rounds."""
    alive, remaining, gaps = set(users), set(metrics.item_counts(users)), []
    for _ in range(min(k, len(remaining))):
        gains = sorted((sum(1 for u in alive if x in users[u]), x) for x in remaining)
        if len(gains) > 1:
            gaps.append(gains[-1][0] - gains[-2][0])
        best = gains[-1][1]
        remaining.discard(best)
        alive = {u for u in alive if best not in users[u]}
    return min(gaps)


def test_vanishing_noise_user_peeling_equals_the_non_private_greedy():
    users = greedy_users()
    k = 8
    assert greedy_gaps(users, k) >= 1, "test data must have a unique greedy choice each round"
    con = seeded(9)
    try:
        load(con, [(u, x) for u, s in users.items() for x in sorted(s)])
        out = topk.hitting_set(con, "t", k, epsilon=1000.0, delta=1e-5)
    finally:
        con.close()
    assert out.column("item").to_pylist() == metrics.greedy_hitting_set(users, k)
    assert metrics.greedy_hitting_set(users, k) == ["x03", "x04", "x05", "x06", "x07", "x08", "x09", "x02"]


def test_user_peeling_runs_min_k_domain_rounds_with_fresh_noise():
    # Item "all" hits every user in round 1; the remaining rounds select among zero counts.
    rows = [(u, "all") for u in range(60)] + [(u, f"y{u % 4}") for u in range(60)]
    con, source = recording_connection()
    try:
        load(con, rows)
        out = con.execute("SELECT rank, item FROM dp_hitting_set('t', 10, epsilon := 50.0, delta := 1e-5)").fetchall()
        draws = source.scales("gumbel").size
    finally:
        con.close()
    assert [r for r, _ in out] == [1, 2, 3, 4, 5]
    assert out[0][1] == "all" and len({i for _, i in out}) == 5
    assert draws == 5 + 4 + 3 + 2 + 1  # a fresh draw for every remaining item in every round


def test_user_peeling_core_rounds_and_noise_count():
    drawn = []

    def gumbel(n):
        drawn.append(n)
        return np.zeros(n)

    # users: {0,1}, {0}, {2}; no noise -> greedy with lowest-id ties
    chosen = topk.user_peeling(np.array([0, 1, 0, 2]), np.array([0, 2, 3, 4]), 4, 10, gumbel)
    assert chosen.tolist() == [0, 2, 1, 3]
    assert drawn == [4, 3, 2, 1]
    assert topk.user_peeling(np.zeros(0), np.zeros(1), 0, 5, gumbel).tolist() == []


@pytest.mark.parametrize("macro", ["dp_top_k", "dp_hitting_set"])
def test_output_is_sound_and_ranked(macro):
    rows = [(u, f"w{(u * 7 + j) % 40}") for u in range(200) for j in range(5)]
    con = seeded(12)
    try:
        load(con, rows)
        out = con.execute(f"SELECT rank, item FROM {macro}('t', 15, epsilon := 4.0, delta := 1e-5)").fetchall()
        items = {r[0] for r in con.execute("SELECT DISTINCT item FROM t").fetchall()}
        types = con.execute(f"SELECT typeof(rank), typeof(item) FROM {macro}('t', 3, epsilon := 4.0, delta := 1e-5)").fetchall()
    finally:
        con.close()
    assert [r for r, _ in out] == list(range(1, len(out) + 1))
    assert len({i for _, i in out}) == len(out) and {i for _, i in out} <= items
    assert types[0] == ("BIGINT", "VARCHAR")


def test_item_type_is_preserved():
    con = seeded(13)
    try:
        con.execute("CREATE TABLE b AS SELECT (i % 50)::BIGINT AS user_id, (i % 3)::BIGINT AS item FROM range(150) r(i)")
        for macro, extra in (("dp_top_k", ""), ("dp_hitting_set", ""), ("dp_top_k_limited_domain", ", 3")):
            [(t,)] = con.execute(f"SELECT DISTINCT typeof(item) FROM {macro}('b', 2{extra}, epsilon := 10.0, delta := 1e-5)").fetchall()
            assert t == "BIGINT"
    finally:
        con.close()


@pytest.mark.slow
def test_one_shot_gumbel_top_k_has_the_sequential_peeling_distribution():
    """dp_top_k's ordered output vs the exact law of 2-fold peeling EM (chi-square, 12 outcomes)."""
    counts = {"a": 100, "b": 100, "c": 99, "d": 98}  # one item per user: every item is in the domain
    rows = [(u, x) for x, n in counts.items() for u in range(1000 * ord(x), 1000 * ord(x) + n)]
    eps, k, runs = 2.0, 2, 400  # rarest outcome (d, c): ~11 expected
    eps0 = topk.peeling_epsilon(eps / 2, 5e-6, k)
    con = seeded(2024)
    try:
        load(con, rows)
        seen = {}
        for _ in range(runs):
            out = tuple(r[0] for r in con.execute(
                f"SELECT item FROM dp_top_k('t', {k}, epsilon := {eps}, delta := 1e-5) ORDER BY rank").fetchall())
            seen[out] = seen.get(out, 0) + 1
    finally:
        con.close()
    # Sequential peeling: pick x w.p. exp(eps0 N(x)) / sum, remove it, repeat.
    weights = {x: math.exp(eps0 * (n - 100)) for x, n in counts.items()}
    outcomes = list(itertools.permutations(counts, k))
    expected = []
    for a, b in outcomes:
        z = sum(weights.values())
        expected.append(runs * weights[a] / z * weights[b] / (z - weights[a]))
    observed = [seen.get(o, 0) for o in outcomes]
    assert sum(observed) == runs  # always two items: the whole domain was found
    _, p = stats.chisquare(observed, expected)
    assert p > 0.001, (observed, [round(e, 1) for e in expected])


def test_limited_domain_with_vanishing_noise_returns_the_top_k():
    con = seeded(14)
    try:
        load(con, nested_rows())
        # k_bar = 6: h_bot = N_(7) + ~1.07 = 26.07 lies below N_(5) = 27. (With k_bar = k = 5,
        # h_bot = N_(6) + 1.07 = 27.07 and the 5th item would correctly miss it: the "+1" of [DR19].)
        out = topk.top_k_limited_domain(con, "t", 5, 6, epsilon=1000.0, delta=1e-5)
        at_k = topk.top_k_limited_domain(con, "t", 5, 5, epsilon=1000.0, delta=1e-5)
        inf = topk.top_k_limited_domain(con, "t", 5, math.inf, epsilon=1000.0, delta=1e-5, max_items=100)
    finally:
        con.close()
    assert out.column("item").to_pylist() == [f"i{j:02d}" for j in range(5)]
    assert at_k.column("item").to_pylist() == [f"i{j:02d}" for j in range(4)]
    assert inf.column("item").to_pylist() == [f"i{j:02d}" for j in range(5)]


def test_limited_domain_only_outputs_items_of_the_true_top_k_bar():
    con = seeded(15)
    try:
        load(con, nested_rows())
        seen = set()
        for _ in range(20):
            seen |= {r[0] for r in con.execute(
                "SELECT item FROM dp_top_k_limited_domain('t', 3, 4, epsilon := 5.0, delta := 1e-5)").fetchall()}
    finally:
        con.close()
    assert seen <= {"i00", "i01", "i02", "i03"}


def test_limited_domain_releases_nothing_when_counts_are_below_the_threshold():
    # 10 users, each with one distinct item: every count is 1, far below h_bot.
    con = seeded(16)
    try:
        load(con, [(u, f"s{u}") for u in range(10)])
        assert con.execute("SELECT * FROM dp_top_k_limited_domain('t', 3, 3, epsilon := 1.0, delta := 1e-5)").fetchall() == []
    finally:
        con.close()
