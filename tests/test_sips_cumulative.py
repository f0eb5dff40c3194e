"""DP-SIPS with the cumulative release rule (dpsql/cumulative.py, docs/proofs/sips_cumulative.md).

Three ways: the calibration from its formulas (scipy, not the module's helpers), the property the
proof needs on random neighbouring datasets (the engine's round weights), and release frequencies of
the whole macro against a numpy reference of the rule with fixed seeds.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql import calibration, cumulative
from dpsql.registration import source_of
from dpsql.validation import DPParameterError

from conftest import seeded
from test_adaptive import load, sets_of, zipf_rows


def _analytic_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon) of the Gaussian mechanism with mu = sensitivity / sigma (Balle & Wang 2018)."""
    return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)


def _threshold(sigma: float, delta_novel: float, max_items: int) -> float:
    t = np.arange(1, max_items + 1)
    return float(np.max(1 / np.sqrt(t) + sigma * stats.norm.isf(-np.expm1(np.log1p(-delta_novel) / t))))


@pytest.mark.parametrize("epsilon, delta, split", [(1.0, 1e-5, None), (3.0, math.exp(-10), None),
                                                   (0.5, 1e-6, [0.2, 0.3, 0.5])])
def test_calibration_from_the_formulas(epsilon, delta, split):
    kw = {} if split is None else {"split": split}
    rounds = cumulative.sips_cumulative_calibration(epsilon, delta, 100, **kw)
    f = np.array(split or [2.0 ** k for k in range(6)])
    f = f / f.sum()
    assert [r.share for r in rounds] == pytest.approx(list(f), rel=1e-12)
    assert [r.cumulative_share for r in rounds] == pytest.approx(list(np.cumsum(f)), rel=1e-12)
    # the rounds compose to one Gaussian mechanism of mu = 1/s whose delta(epsilon) is delta/2
    mu = math.sqrt(sum(1 / r.sigma ** 2 for r in rounds))
    assert _analytic_delta(epsilon, mu) <= delta / 2 * (1 + 1e-9)
    assert _analytic_delta(epsilon, mu * 1.0001) > delta / 2
    s = 1 / mu
    for r, fr, big_f in zip(rounds, f, np.cumsum(f)):
        assert r.sigma == pytest.approx(s / math.sqrt(fr), rel=1e-9)
        assert r.mean_sigma == pytest.approx(s / math.sqrt(big_f), rel=1e-9)
        assert r.delta_novel == pytest.approx(fr * delta / 2, rel=1e-12)
        assert r.threshold == pytest.approx(_threshold(r.mean_sigma, fr * delta / 2, 100), rel=1e-9)
    acc = cumulative.sips_cumulative_accounting(epsilon, delta, 100, **kw)
    assert acc.accountant == "gaussian" and acc.delta <= delta and acc.event_delta == pytest.approx(delta / 2)


def test_reference_numbers_of_the_proof_note():
    rounds = cumulative.sips_cumulative_calibration(1.0, 1e-5, 100)
    assert (rounds[0].sigma, rounds[0].mean_sigma, rounds[0].threshold) == pytest.approx(
        (30.829412, 30.829412, 186.16279), abs=5e-5)
    assert (rounds[-1].sigma, rounds[-1].mean_sigma, rounds[-1].threshold) == pytest.approx(
        (5.449922, 3.884141, 21.26278), abs=5e-5)


def test_one_round_is_basic():
    [r] = cumulative.sips_cumulative_calibration(1.0, 1e-5, 100, [1.0])
    basic = calibration.weighted_gaussian_calibration(1.0, 1e-5, 100)
    assert (r.sigma, r.mean_sigma) == pytest.approx((basic.scale, basic.scale), rel=1e-9)
    assert r.threshold == pytest.approx(basic.threshold, rel=1e-9)


def test_the_last_round_has_the_whole_budget_in_its_mean():
    c = dpsql.calibrate("sips_cumulative", 1.0, 1e-5, 100)
    basic = calibration.weighted_gaussian_calibration(1.0, 1e-5, 100)
    assert c.scale == pytest.approx(basic.scale, rel=1e-9)  # s/sqrt(F_R) with F_R = 1
    assert basic.threshold < c.threshold < basic.threshold + basic.scale  # a sixth of delta/2 for the novel items
    assert len(c.rounds) == 6 and c.accounting.accountant == "gaussian"


def test_sql_calibration_row_is_the_python_calibration():
    con = dpsql.connect()
    try:
        [(row,)] = con.execute("SELECT dp__sips_cumulative_calibration(1.0, 1e-5, 100, [0.2, 0.3, 0.5], 'u', 'i')").fetchall()
    finally:
        con.close()
    rounds = cumulative.sips_cumulative_calibration(1.0, 1e-5, 100, [0.2, 0.3, 0.5])
    acc = cumulative.sips_cumulative_accounting(1.0, 1e-5, 100, [0.2, 0.3, 0.5])
    assert row["sigma"] == [r.sigma for r in rounds] and row["rho"] == [r.threshold for r in rounds]
    assert row["share"] == [r.share for r in rounds]
    assert row["cumulative_share"] == [r.cumulative_share for r in rounds]
    assert (row["accountant"], row["total_epsilon"], row["total_delta"]) == ("gaussian", acc.epsilon, acc.delta)


def test_split_limits():
    assert len(cumulative.sips_cumulative_calibration(1.0, 1e-5, 10, [1 / 8] * 8)) == 8
    with pytest.raises(DPParameterError, match="between 1 and 8"):
        cumulative.sips_cumulative_calibration(1.0, 1e-5, 10, [1 / 9] * 9)
    with pytest.raises(DPParameterError, match="sum to 1"):
        cumulative.sips_cumulative_calibration(1.0, 1e-5, 10, [0.5, 0.6])


@pytest.mark.parametrize("sql, message", [
    ("FROM dp_set_union_sips_cumulative('t', epsilon := 1.0, delta := 1e-5, split := [0.1, 0.1, 0.1, 0.1, 0.1, "
     "0.1, 0.1, 0.1, 0.2])", "between 1 and 8"),
    ("FROM dp_set_union_sips_cumulative('t', epsilon := 1.0, delta := 1e-5, split := [0.7, 0.2])", "sum to 1"),
    ("FROM dp_set_union_sips_cumulative('t', epsilon := 0.0, delta := 1e-5)", "epsilon"),
])
def test_bad_parameters_are_refused_before_the_charge(sql, message):
    con = dpsql.connect()
    try:
        load(con, [(u, f"i{u % 3}") for u in range(30)])
        with pytest.raises(Exception, match=message):
            con.execute(sql).fetchall()
        assert con.execute("SELECT count(*) FROM dp_releases()").fetchall() == [(0,)]
    finally:
        con.close()


# ---------------------------------------------------------------------------
# The proof's property on random neighbours, with the engine's round macro
# ---------------------------------------------------------------------------

_NO_RELEASE = ("CREATE OR REPLACE TABLE p AS SELECT [{f}] AS share, [{F}] AS cumulative_share, [1e-12] AS sigma, "
               "[1e300] AS rho")


def _running_sums(con, kept: list, prev: dict, share: float, cumulative_share: float) -> dict:
    """One round of the engine's macro on ``kept`` rows with (almost) no noise and no release:
    item -> running sum z."""
    load(con, kept, name="k")
    staged = pa.table({"item": pa.array(list(prev), pa.string()),  # noqa: F841
                       "z": pa.array(list(prev.values()), pa.float64())})
    con.execute("CREATE OR REPLACE TABLE z AS SELECT item, z, false AS passed FROM staged")
    con.execute(_NO_RELEASE.format(f=share, F=cumulative_share))
    rows = con.execute("SELECT item, z, passed FROM dp__sips_cumulative_round('k', 'z', 'p', 1)").fetchall()
    assert not any(r[2] for r in rows)
    return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("seed", range(12))
def test_round_weights_of_neighbours_and_the_running_mean_of_novel_items(seed):
    rng = random.Random(seed)
    rows = zipf_rows(rng, n_users=rng.randint(5, 60), n_items=40, max_deg=15)
    common = sorted({i for _, i in rows})
    t = rng.randint(1, 6)
    mine = rng.sample(common, rng.randint(0, min(8, len(common)))) + [f"novel{j}" for j in range(t)]
    rows_v = rows + [(-1, i) for i in mine]
    split = [rng.uniform(0.1, 1.0) for _ in range(3)]
    split = [x / sum(split) for x in split]
    con = seeded(seed)
    try:
        removed: set = set()
        z, z_v, big_f = {}, {}, 0.0
        for f in split:
            # the earlier rounds released some common items (never a novel one: the lemma's run)
            removed |= set(rng.sample(common, rng.randint(0, len(common) // 4)))
            kept = [r for r in rows if r[1] not in removed]
            kept_v = [r for r in rows_v if r[1] not in removed]
            big_f += f
            before, before_v = dict(z), dict(z_v)
            z = _running_sums(con, kept, {i: x for i, x in z.items() if i not in removed}, f, big_f)
            z_v = _running_sums(con, kept_v, {i: x for i, x in z_v.items() if i not in removed}, f, big_f)
            # this round's weights: l2 distance <= 1, new coordinates counted
            w = {i: (x - before.get(i, 0.0)) / f for i, x in z.items()}
            w_v = {i: (x - before_v.get(i, 0.0)) / f for i, x in z_v.items()}
            assert set(w) <= set(w_v)
            assert sum((w_v[i] - w.get(i, 0.0)) ** 2 for i in w_v) <= 1 + 1e-9
            # every novel item's running mean is <= 1/sqrt(t)
            for j in range(t):
                assert z_v[f"novel{j}"] / big_f <= 1 / math.sqrt(t) + 1e-9
    finally:
        con.close()


# ---------------------------------------------------------------------------
# Releases against a numpy reference of the rule (release frequencies)
# ---------------------------------------------------------------------------

def _layered_rows(seed=5):
    """Users of degree <= 10 (no cap at max_items 10): popular items (released early), middle items
    (released in a middle round or by the running mean), rare items."""
    rng = random.Random(seed)
    rows = []
    for u in range(600):
        items = {f"p{rng.randint(0, 1)}"} if rng.random() < 0.6 else set()
        items |= {f"m{rng.randint(0, 9)}" for _ in range(rng.randint(1, 2))}
        items |= {f"q{rng.randint(0, 39)}" for _ in range(rng.randint(1, 3))}
        rows += [(u, i) for i in sorted(items)]
    return rows


def _reference(sets: dict, rounds, rng) -> set:
    released: set = set()
    z: dict = {}
    for r in rounds:
        w: dict = {}
        for s in sets.values():
            rest = [i for i in s if i not in released]
            for i in rest:
                w[i] = w.get(i, 0.0) + 1 / math.sqrt(len(rest))
        for i, x in w.items():
            z[i] = z.get(i, 0.0) + r.share * (x + rng.normal(0, r.sigma))
            if z[i] >= r.cumulative_share * r.threshold:
                released.add(i)
    return released


def test_release_frequencies_match_the_reference():
    rows = _layered_rows()
    sets = sets_of(rows)
    eps, runs, ref_runs = 1.0, 60, 3000  # epsilon 1: 35 of the 52 items are released in 5-95 % of runs
    rounds = cumulative.sips_cumulative_calibration(eps, 1e-5, 10)
    rng = np.random.default_rng(7)
    ref: dict = {}
    for _ in range(ref_runs):
        for i in _reference(sets, rounds, rng):
            ref[i] = ref.get(i, 0) + 1
    got: dict = {}
    for k in range(runs):
        con = seeded(1000 + k)
        try:
            load(con, rows)
            out = [r[0] for r in con.execute(
                f"SELECT * FROM dp_set_union_sips_cumulative('t', epsilon := {eps}, delta := 1e-5, max_items := 10)")
                .fetchall()]
        finally:
            con.close()
        assert out == sorted(out)
        for i in out:
            got[i] = got.get(i, 0) + 1
    items = sorted({i for s in sets.values() for i in s})
    p_ref = np.array([ref.get(i, 0) / ref_runs for i in items])
    p_got = np.array([got.get(i, 0) / runs for i in items])
    informative = (p_ref > 0.05) & (p_ref < 0.95)
    assert informative.sum() >= 5  # the test looks at items the rule is unsure about
    # per item: 4.5 standard errors of the engine's frequency (51 items: a false alarm ~ 3e-4)
    se = np.sqrt(np.maximum(p_ref * (1 - p_ref), 1e-4) / runs + p_ref * (1 - p_ref) / ref_runs)
    assert np.all(np.abs(p_got - p_ref) <= 4.5 * se + 1e-12), list(zip(items, p_got, p_ref))
    # the expected number of released items, 4 standard errors
    n_ref, n_got = p_ref.sum(), p_got.sum()
    assert abs(n_got - n_ref) <= 4 * math.sqrt(np.sum(p_ref * (1 - p_ref)) / runs) + 0.05


def test_cumulative_rule_releases_more_than_per_round_sips_on_the_same_data():
    """Issue 17's claim on a synthetic table (the real datasets: benchmarks/README.md): seeded runs, the
    two methods with the same seeds; the cumulative rule must release more in total."""
    rows = zipf_rows(random.Random(3), n_users=3000, n_items=3000, max_deg=30, s=0.9)
    totals = {"sips": 0, "sips_cumulative": 0}
    for k in range(4):
        for m in totals:
            con = seeded(500 + k)
            try:
                load(con, rows)
                totals[m] += con.execute(f"SELECT count(*) FROM dp_set_union_{m}('t', epsilon := 1.0, delta := 1e-5)")\
                    .fetchall()[0][0]
            finally:
                con.close()
    assert totals["sips_cumulative"] > totals["sips"], totals


@pytest.mark.filterwarnings("ignore::dpsql.validation.WeakPrivacyWarning")
def test_unused_rounds_draw_no_noise_and_one_salt_per_query():
    rows = zipf_rows(random.Random(4), n_users=200, n_items=300, max_deg=30)
    con = seeded(11)
    try:
        load(con, rows)
        src = source_of(con)
        n_items = con.execute("SELECT count(DISTINCT item) FROM t").fetchall()[0][0]
        before = src.samples_drawn
        con.execute("FROM dp_set_union_sips_cumulative('t', epsilon := 1e4, delta := 1e-5, split := [1.0])").fetchall()
        assert src.samples_drawn - before == 1 + n_items  # one salt, one draw per item: Basic
        before = src.samples_drawn
        out = con.execute("FROM dp_set_union_sips_cumulative('t', epsilon := 1.0, delta := 1e-5)").fetchall()
        drawn = src.samples_drawn - before
        # six rounds: every item not released yet is measured again, none twice in a round
        assert 1 + n_items < drawn <= 1 + 6 * n_items and len(out) < n_items
    finally:
        con.close()
