"""MAD, MAD2R and DP-SIPS ([MAD] Chen et al.): calibration, proof conditions, UserWeights,
sensitivity of the pre-noise weights on random neighbouring datasets, the SQL against a numpy
reference, and the release macros end to end (docs/proofs/reference_checks.md A5-A7, B6-B11, F2)."""
from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import special, stats

import dpsql
from dpsql.union import adaptive
from dpsql.core import calibration
from dpsql.union import basic as union_basic
from dpsql import union
from dpsql.core.registration import source_of
from dpsql.core.validation import DPParameterError, derived_budget

from conftest import LockstepPair, seeded

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def load(con, rows, name="t", item_type="VARCHAR", with_bias=False):
    """Create ``name`` from (user, item[, b]) tuples through Arrow (executemany is slow)."""
    cols = {"u": pa.array([r[0] for r in rows], type=pa.int64()),
            "i": pa.array([str(r[1]) for r in rows], type=pa.string())}
    select = f"u AS user_id, i::{item_type} AS item"
    if with_bias:
        cols["b"] = pa.array([float(r[2]) for r in rows], type=pa.float64())
        select += ", b"
    staged = pa.table(cols) if rows else pa.table({k: pa.array([], v.type) for k, v in cols.items()})  # noqa: F841
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {select} FROM staged")


def zipf_rows(rng: random.Random, n_users=None, n_items=120, max_deg=60, s=1.1, prefix="i"):
    """The random dataset of the sensitivity checks: Zipf-like item popularity, degrees 1..max_deg, 1..80 users; distinct pairs."""
    n_users = rng.randint(1, 80) if n_users is None else n_users
    cum = list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(n_items)))
    rows = []
    for u in range(n_users):
        deg = min(rng.randint(1, max_deg), n_items)
        items = list(dict.fromkeys(rng.choices(range(n_items), cum_weights=cum, k=3 * deg)))[:deg]
        rows += [(u, f"{prefix}{k}") for k in sorted(items)]
    return rows


def sets_of(rows):
    out: dict = {}
    for r in rows:
        out.setdefault(r[0], []).append(r[1])
    return out


def mad_arrays(users, items, n_items, tau, d_max, b=None, b_min=1.0, b_max=1.0, *, alpha=None,
               excess=np.maximum):
    """[MAD] Alg. 3 in numpy on distinct (user, item) pairs given as integer codes (no cap here).

    ``b`` holds one bias per item code (None: unbiased). ``excess`` is the outer function of line 6
    (``np.maximum`` per the erratum; the printed ``np.minimum`` is a broken variant) and ``alpha``
    overrides the reroute discount (broken variant). Returns per-item arrays w, w_init, w_trunc,
    w_reroute, basic and the per-user excess e.
    """
    n_users = int(users.max()) + 1 if len(users) else 0
    if alpha is None:
        alpha = adaptive.reroute_discount(d_max, b_min)
    d = np.bincount(users, minlength=n_users).astype(float)
    adapt = (d >= math.ceil(1.0 / b_min ** 2)) & (d <= d_max)
    init_share = np.where(adapt[users], 1.0 / d[users], 0.0)
    w_init = np.bincount(items, weights=init_share, minlength=n_items)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(w_init > 0, excess(0.0, (w_init - tau) / w_init), 0.0)
    w_trunc = np.minimum(w_init, tau)
    e = np.where(adapt, np.bincount(users, weights=r[items], minlength=n_users) / np.maximum(d, 1), 0.0)
    w_reroute = np.bincount(items, weights=alpha * e[users] / d_max, minlength=n_items)
    basic_share = 1.0 / np.sqrt(d[users])
    uw = basic_share
    if b is not None:
        order = np.argsort(users, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(np.bincount(users, minlength=n_users))])
        uw = np.empty(len(users))
        uw[order] = adaptive.user_weights_batch(b[items][order], offsets, b_min, b_max)
    w = w_trunc + w_reroute + np.bincount(items, weights=uw - init_share, minlength=n_items)
    basic = np.bincount(items, weights=basic_share, minlength=n_items)
    return {"w": w, "w_init": w_init, "w_trunc": w_trunc, "w_reroute": w_reroute, "basic": basic, "e": e}


def mad_reference(sets: dict, tau: float, d_max: float, bias: dict | None = None, b_min: float = 1.0,
                  b_max: float = 1.0, **broken) -> dict:
    """:func:`mad_arrays` on a user -> items dict; per-item results as dicts keyed by item."""
    codes: dict = {}
    users, items = [], []
    user_keys = sorted(sets, key=str)
    for k, u in enumerate(user_keys):
        for i in sets[u]:
            users.append(k)
            items.append(codes.setdefault(i, len(codes)))
    names = list(codes)
    b = None if bias is None else np.array([bias.get(i, 1.0) for i in names])
    res = mad_arrays(np.array(users, dtype=np.int64), np.array(items, dtype=np.int64), len(names), tau, d_max,
                     b, b_min, b_max, **broken)
    out = {key: dict(zip(names, res[key].tolist())) for key in ("w", "w_init", "w_trunc", "w_reroute", "basic")}
    out["e"] = dict(zip(user_keys, res["e"].tolist()))
    return out


def l2_change(w: dict, w2: dict) -> float:
    """Def. 3.1: l2 distance over the items of the larger dataset (missing coordinates = 0)."""
    return math.sqrt(sum((w2.get(k, 0.0) - w.get(k, 0.0)) ** 2 for k in set(w) | set(w2)))


def novel_ratio(w2: dict, novel: set, b_max: float) -> float:
    """max novel weight / (b_max / sqrt(t)) (Def. 3.2); 0 when there is no novel item."""
    if not novel:
        return 0.0
    return max(w2[i] for i in novel) / (b_max / math.sqrt(len(novel)))


def random_neighbours(rng: random.Random, max_new_deg=60):
    """(D, D + v): v holds some items of D and t >= 0 novel ones."""
    base = zipf_rows(rng)
    existing = sorted({i for _, i in base})
    deg = rng.randint(1, max_new_deg)
    t = rng.randint(0, deg) if rng.random() < 0.7 else 0
    old = rng.sample(existing, min(deg - t, len(existing)))
    new_items = old + [f"novel{k}" for k in range(t)]
    return base, base + [(10 ** 6, i) for i in new_items], {f"novel{k}" for k in range(t)}


def neighbour_arrays(rng: np.random.Generator, n_items=120, s=1.1, max_deg=60):
    """Fast numpy version of :func:`random_neighbours` for the 1000-pair reference tests: (users,
    items) of D, the rows of the added user (its id is n_users), the number of item codes of D + v
    (novel items get the codes after D's) and the novel codes.

    Each user's items are a sample of ``deg`` items without replacement with probabilities ``p``
    drawn one after the other (the law of ``rng.choice(n_items, deg, replace=False, p=p)``), for all
    users at once by the Gumbel-top-k trick: the ``deg`` items with the largest ``log p + Gumbel``."""
    n_users = int(rng.integers(1, 81))
    p = 1.0 / np.arange(1, n_items + 1) ** s
    p /= p.sum()
    degs = np.minimum(rng.integers(1, max_deg + 1, n_users), n_items)
    order = np.argsort(-(np.log(p) + rng.gumbel(size=(n_users, n_items))), axis=1)
    users = np.repeat(np.arange(n_users), degs)
    items = order[np.arange(n_items) < degs[:, None]]  # row by row: user u's first degs[u] items
    present = np.unique(items)
    deg = int(rng.integers(1, max_deg + 1))
    t = int(rng.integers(0, deg + 1)) if rng.random() < 0.7 else 0
    old = rng.choice(present, size=min(deg - t, len(present)), replace=False)
    novel = np.arange(n_items, n_items + t)
    new_items = np.concatenate([old, novel]).astype(np.int64)
    return users, items, new_items, n_items + t, novel


def weights_of(con, sql):
    return {r[0]: r[1] for r in con.execute(sql).fetchall()}


def capped_sets(con, table="t", max_items=100):
    rows = con.execute(f"SELECT user_id, item FROM dp__capped_user_items('{table}', max_items := {max_items})").fetchall()
    return sets_of(rows)


# ---------------------------------------------------------------------------
# Calibration (docs/proofs/reference_checks.md A5-A7) and the conditions of the proofs (B9)
# ---------------------------------------------------------------------------

def test_mad_calibration_is_basic_plus_adaptive_threshold():
    r = adaptive.mad_calibration(1.0, 1e-5, 100)
    basic = union_basic.weighted_gaussian_calibration(1.0, 1e-5, 100)
    assert (r.sigma, r.rho) == (basic.scale, basic.threshold)
    assert r.tau == pytest.approx(28.55803, abs=5e-6)
    assert r.tau == r.rho + 2 * r.sigma
    assert r.alpha == pytest.approx(0.929289, abs=5e-7)
    assert (r.min_adaptive_degree, r.max_adaptive_degree, r.b_min, r.b_max) == (1, 50, 1.0, 1.0)


@pytest.mark.parametrize("d_max, b_min, alpha", [(50, 1.0, 0.929289), (50, 0.5, 0.429289), (3, 1.0, 0.711325),
                                                 (4, 1.0, 0.75)])
def test_reroute_discount(d_max, b_min, alpha):
    assert adaptive.reroute_discount(d_max, b_min) == pytest.approx(alpha, abs=5e-7)


def analytic_gaussian_delta(mu: float, eps: float) -> float:
    """[BW18] Thm 8 / [GDP] Cor. 2.13 with scipy: delta(eps) of the Gaussian mechanism of sensitivity/sigma = mu."""
    # log space (scipy's log_ndtr): deltas down to 1e-15 keep their relative precision
    la = special.log_ndtr(-eps / mu + mu / 2)
    lb = eps + special.log_ndtr(-eps / mu - mu / 2)
    return math.exp(la) * -math.expm1(lb - la)


def tight_sigmas(eps: float, delta: float, split) -> list[float]:
    """Per-round sigmas recomputed from the math: the composed Gaussian mu = sqrt(sum 1/sigma_r^2) has
    delta(eps) = delta/2 and round r gets the share f_r of mu^2 (docs/proofs/mad2r.md, section 4)."""
    from scipy.optimize import brentq
    mu = brentq(lambda m: analytic_gaussian_delta(m, eps) - delta / 2, 1e-3, 50, xtol=1e-14, rtol=1e-14)
    return [1 / (mu * math.sqrt(f)) for f in split]


def test_mad2r_calibration_splits_epsilon_and_delta():
    # The rounds compose tightly (one Gaussian mechanism plus delta/2 of novel items), so the
    # sigmas are no longer sigma(f_r eps, f_r delta/2) (37.867164, 4.303919: additive composition).
    c = adaptive.mad2r_calibration(1.0, 1e-5, 100)
    r1, r2 = c.round1, c.round2
    assert (r1.epsilon, r2.epsilon) == pytest.approx((0.1, 0.9))
    assert (r1.delta, r2.delta) == pytest.approx((1e-6, 9e-6))
    assert [r1.sigma, r2.sigma] == pytest.approx(tight_sigmas(1.0, 1e-5, (0.1, 0.9)), rel=1e-8)
    assert r1.sigma == pytest.approx(12.282732, abs=5e-6)
    assert r1.rho == pytest.approx(70.48900, abs=5e-5)
    assert r1.tau == pytest.approx(95.05447, abs=5e-5)
    assert r2.sigma == pytest.approx(4.094244, abs=5e-6)
    assert r2.rho == pytest.approx(22.08716, abs=5e-5)   # h(t) = b_max/sqrt(t), b_max = 2
    assert r2.tau == pytest.approx(30.27565, abs=5e-5)
    assert r1.tau == pytest.approx(r1.rho + 2 * r1.sigma) and r2.tau == pytest.approx(r2.rho + 2 * r2.sigma)
    assert (r1.b_min, r1.b_max, r1.min_adaptive_degree) == (1.0, 1.0, 1)
    assert (r2.b_min, r2.b_max, r2.min_adaptive_degree) == (0.5, 2.0, 4)
    assert r2.alpha == pytest.approx(0.429289, abs=5e-7)
    assert (c.lower_offset, c.upper_offset) == pytest.approx((r1.sigma, 3 * r1.sigma))
    # Each round's novel items have weight <= b_max/sqrt(t): every t meets its f_r delta/2 budget.
    for r, b_max in ((r1, 1), (r2, 2)):
        for t in range(1, 101):
            p = 1 - stats.norm.cdf((r.rho - b_max / math.sqrt(t)) / r.sigma) ** t
            assert p <= r.delta / 2 * (1 + 1e-9)
    a = c.accounting
    assert a.accountant == "gaussian"
    assert a.event_delta == pytest.approx(5e-6, rel=1e-12)
    mu = math.sqrt(r1.sigma ** -2 + r2.sigma ** -2)
    assert a.mechanism_delta == pytest.approx(analytic_gaussian_delta(mu, 1.0), rel=1e-8)
    assert a.delta <= 1e-5 and a.epsilon <= 1.0
    assert a.delta == pytest.approx(1e-5, rel=1e-8) and a.epsilon == pytest.approx(1.0, rel=1e-8)


@pytest.mark.parametrize("eps, delta", [(1.0, 1e-5), (3.0, math.exp(-10)), (0.1, 1e-10), (20.0, 1e-15)])
@pytest.mark.parametrize("split", [(0.1, 0.9), (0.5, 0.5), (0.05, 0.15, 0.8), (0.2,) * 5])
def test_tight_rounds_have_less_noise_and_compose_to_the_charged_budget(eps, delta, split):
    rounds = adaptive.sips_calibration(eps, delta, 100, split)
    acc = adaptive.sips_accounting(eps, delta, 100, split)
    sigmas = [r.scale for r in rounds]
    assert sigmas == pytest.approx(tight_sigmas(eps, delta, split), rel=1e-7)
    for f, r in zip(split, rounds):
        with derived_budget():  # the additive calibration of the same split (f delta may be < 1e-15)
            additive = union_basic.weighted_gaussian_calibration(f * eps, f * delta, 100)
            assert r.threshold == calibration.gaussian_threshold(r.scale, f * delta / 2, 100)
        assert r.scale < additive.scale and r.threshold < additive.threshold
    # The accountant's total (dp-accounting, analytic Gaussian of mu) is within the charge.
    assert acc.delta <= delta and acc.epsilon <= eps
    assert acc.event_delta == pytest.approx(delta / 2, rel=1e-9)
    mu = math.sqrt(sum(s ** -2 for s in sigmas))
    assert acc.mechanism_delta == pytest.approx(analytic_gaussian_delta(mu, eps), rel=1e-6, abs=1e-20)
    m2 = adaptive.mad2r_calibration(eps, delta, 100, split) if len(split) == 2 else None
    if m2 is not None:
        assert (m2.round1.sigma, m2.round2.sigma) == tuple(sigmas)
        assert m2.accounting.delta <= delta and m2.accounting.epsilon <= eps


def test_composed_rounds_checked_with_the_pld_accountant():
    """dp-accounting's PLD accountant (pessimistic discretisation) composes the rounds to the same curve."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    for eps, delta, split in [(1.0, 1e-5, (0.1, 0.9)), (3.0, math.exp(-10), (0.05, 0.15, 0.8))]:
        rounds = adaptive.sips_calibration(eps, delta, 100, split)
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        for r in rounds:
            acc.compose(dp_accounting.GaussianDpEvent(r.scale))
        pld_delta = acc.get_delta(eps)
        # an upper bound on the exact curve, within the discretisation error
        assert delta / 2 * (1 - 1e-8) <= pld_delta <= delta / 2 * (1 + 1e-5)


def test_sips_calibration():
    rounds = adaptive.sips_calibration(1.0, 1e-5, 100, [0.05, 0.15, 0.8])
    assert [r.scale for r in rounds] == pytest.approx(tight_sigmas(1.0, 1e-5, (0.05, 0.15, 0.8)), rel=1e-8)
    assert [r.scale for r in rounds] == pytest.approx([17.37041, 10.02881, 4.34260], abs=5e-5)
    assert [r.threshold for r in rounds] == pytest.approx([101.6678, 56.8787, 23.4073], abs=5e-4)
    assert [r.epsilon for r in rounds] == pytest.approx([0.05, 0.15, 0.8])
    assert [r.delta for r in rounds] == pytest.approx([5e-7, 1.5e-6, 8e-6])


def test_max_adaptive_degree_is_capped_by_max_items():
    assert adaptive.mad_calibration(1.0, 1e-5, 10).max_adaptive_degree == 10
    assert adaptive.mad_calibration(1.0, 1e-5, 1).max_adaptive_degree == 2
    assert adaptive.mad_calibration(1.0, 1e-5, 3, 3).alpha == pytest.approx(0.711325, abs=5e-7)
    # docs/proofs/reference_checks.md F2: Delta0 = d_max = 3, beta = 2 -> tau = 26.4035.
    assert adaptive.mad_calibration(1.0, 1e-5, 3, 3).tau == pytest.approx(26.4035, abs=5e-5)


def test_registry_and_sql_report_the_rounds(con):
    cal = union.calibrate("mad2r", epsilon=1.0, delta=1e-5, max_items=100)
    assert [r.epsilon for r in cal.rounds] == pytest.approx([0.1, 0.9])
    assert (cal.scale, cal.threshold) == (cal.rounds[1].scale, cal.rounds[1].threshold)
    assert cal.rounds[0].adaptive_threshold == pytest.approx(95.05447, abs=5e-5)
    assert cal.accounting == adaptive.mad2r_calibration(1.0, 1e-5, 100).accounting
    mad = union.calibrate("mad", epsilon=1.0, delta=1e-5, max_items=100)
    assert mad.rounds[0].adaptive_threshold == pytest.approx(28.55803, abs=5e-6)
    assert len(union.calibrate("sips", epsilon=1.0, delta=1e-5, max_items=100).rounds) == 2
    [(mad, m2, sips)] = con.execute(
        "SELECT dp__mad_calibration(1.0, 1e-5, 100, 50, 2, 'u', 'i'), "
        "dp__mad2r_calibration(1.0, 1e-5, 100, [0.1, 0.9], 50, 2, 0.5, 2.0, 1.0, 3.0, 'u', 'i'), "
        "dp__sips_calibration(1.0, 1e-5, 100, [0.05, 0.15, 0.8], 'u', 'i')").fetchall()
    assert mad["tau"] == pytest.approx(28.55803, abs=5e-6)
    assert (m2["rho1"], m2["rho2"], m2["tau2"]) == pytest.approx((70.48900, 22.08716, 30.27565), abs=5e-5)
    assert sips["sigma"] == pytest.approx([17.37041, 10.02881, 4.34260], abs=5e-5)
    acc = adaptive.sips_accounting(1.0, 1e-5, 100, [0.05, 0.15, 0.8])
    assert (sips["accountant"], sips["total_epsilon"], sips["total_delta"]) == ("gaussian", acc.epsilon, acc.delta)
    assert m2["accountant"] == "gaussian" and m2["total_epsilon"] <= 1.0 and m2["total_delta"] <= 1e-5


BAD_CALIBRATION = [
    (dict(split=[0.1, 0.8]), "sum to 1"),
    (dict(split=[0.5, 0.5 + 2e-9]), "sum to 1"),
    (dict(split=[1.1, -0.1]), "> 0"),
    (dict(split=[1.0, 0.0]), "> 0"),
    (dict(split=[1.0]), "exactly 2"),
    (dict(split=[0.2, 0.3, 0.5]), "exactly 2"),
    (dict(split=None), "split"),
    (dict(split="0.1,0.9"), "list"),
    (dict(b_min=0.4), "b_min"),
    (dict(b_min=1.2), "b_min"),
    (dict(b_max=0.9), "b_max"),
    (dict(b_max=math.inf), "b_max"),
    (dict(beta=-1.0), "beta"),
    (dict(beta=math.nan), "beta"),
    (dict(max_adaptive_degree=1), "max_adaptive_degree"),
    (dict(max_adaptive_degree=2.5), "max_adaptive_degree"),
    (dict(max_adaptive_degree=None), "max_adaptive_degree"),
    (dict(c_lb=-1.0), "c_lb"),
    (dict(c_ub=math.inf), "c_ub"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(delta=1.0), "delta"),
]


@pytest.mark.parametrize("kwargs, msg", BAD_CALIBRATION)
def test_bad_parameters_are_refused_with_the_parameter_named(kwargs, msg):
    args = dict(epsilon=1.0, delta=1e-5, max_items=100)
    args.update(kwargs)
    with pytest.raises(DPParameterError, match=msg):
        adaptive.mad2r_calibration(**args)


def test_sips_split_limits():
    assert len(adaptive.sips_calibration(1.0, 1e-5, 10, [0.2] * 5)) == 5
    assert len(adaptive.sips_calibration(1.0, 1e-5, 10, [1.0])) == 1
    with pytest.raises(DPParameterError, match="between 1 and 5"):
        adaptive.sips_calibration(1.0, 1e-5, 10, [1 / 6] * 6)
    with pytest.raises(DPParameterError, match="between 1 and 5"):
        adaptive.sips_calibration(1.0, 1e-5, 10, [])


def test_proof_conditions_are_asserted():
    adaptive.check_mad_conditions(1.0, 4, 1.0, 1.0, 1.0)
    adaptive.check_mad_conditions(1.0, 3, adaptive.reroute_discount(3), 1.0, 1.0)  # 2a/sqrt(3) = 0.82 <= 1
    with pytest.raises(DPParameterError, match="tau >= 1"):
        adaptive.check_mad_conditions(0.99, 50, 0.9, 1.0, 1.0)
    with pytest.raises(DPParameterError, match=r"2\*alpha/sqrt"):
        adaptive.check_mad_conditions(1.0, 3, 1.0, 1.0, 1.0)     # 2/sqrt(3) = 1.15 > b_max = 1
    with pytest.raises(DPParameterError, match="> 1"):
        adaptive.check_mad_conditions(1.0, 1, 0.5, 1.0, 1.0)
    with pytest.raises(DPParameterError, match="b_min"):
        adaptive.check_mad_conditions(1.0, 50, 0.4, 0.45, 1.0)


BAD_SQL = [
    ("dp_set_union_mad('t', epsilon := 1.0, delta := 1e-5, beta := -3)", "beta"),
    ("dp_set_union_mad('t', epsilon := 1.0, delta := 1e-5, max_adaptive_degree := 1)", "max_adaptive_degree"),
    ("dp_set_union_mad('t', epsilon := 0, delta := 1e-5)", "epsilon"),
    ("dp_set_union_mad('t', epsilon := 1.0, delta := 1e-5, user_col := 'item')", "different columns"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, split := [0.1, 0.8])", "sum to 1"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, split := [0.5, 0.3, 0.2])", "exactly 2"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, split := NULL)", "split"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, split := [0.5, NULL])", "split"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, b_min := 0.3)", "b_min"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, b_max := 0.5)", "b_max"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, c_ub := -1)", "c_ub"),
    ("dp_set_union_mad2r('t', epsilon := 1.0, delta := 1)", "delta"),
    ("dp_set_union_sips('t', epsilon := 1.0, delta := 1e-5, split := [0.1, 0.1, 0.1, 0.1, 0.1, 0.5])", "between 1 and 5"),
    ("dp_set_union_sips('t', epsilon := 1.0, delta := 1e-5, split := [0.7, 0.2])", "sum to 1"),
    ("dp_set_union_sips('t', epsilon := 1.0, delta := 1e-5, max_items := 0)", "max_items"),
    ("dp__mad_weights('t', 0.5)", "tau >= 1"),
    ("dp__mad_biased_weights('tb', 2.0, b_min := 0.2)", "b_min"),
]


@pytest.mark.parametrize("call, msg", BAD_SQL)
@pytest.mark.parametrize("empty", [False, True])
def test_bad_sql_input_fails_clearly(con, call, msg, empty):
    rows = [] if empty else [(u, f"x{u % 7}") for u in range(300)]
    load(con, rows)
    load(con, [(r[0], r[1], 0.5) for r in rows], name="tb", with_bias=True)
    with pytest.raises(Exception, match=msg):
        con.execute(f"SELECT * FROM {call}").fetchall()


# ---------------------------------------------------------------------------
# UserWeights (docs/proofs/reference_checks.md B8)
# ---------------------------------------------------------------------------

def _random_biases(rng: np.random.Generator, d: int) -> np.ndarray:
    b = np.ones(d)
    mask = rng.random(d) < rng.random()
    b[mask] = rng.random(int(mask.sum()))
    return b


@pytest.mark.parametrize("b_max", [1.0, 1.2, 2.0, 5.0, math.inf])
def test_user_weights_properties(b_max):
    rng = np.random.default_rng(int(b_max * 10) if math.isfinite(b_max) else 99)
    for _ in range(4000):
        d = int(rng.integers(1, 60))
        b = _random_biases(rng, d)
        b_min = float(rng.uniform(0.5, 1.0))
        w, iterations = adaptive._user_weights(b, b_min, b_max)
        sq = math.sqrt(d)
        assert np.all(w > 0)                                       # support = S_u
        assert np.all(w >= b_min / sq - 1e-15) and np.all(w <= b_max / sq + 1e-15)
        assert abs(float(np.sum(w ** 2)) - 1.0) <= 1e-9            # Lemma 5.4: ||w|| <= 1 (here = 1)
        assert iterations <= d
        biased = b < 1
        assert np.all(w[biased] >= np.maximum(b_min, b[biased]) / sq - 1e-15)  # weights only grow
    for d in range(1, 120):
        assert np.array_equal(adaptive.user_weights(np.ones(d), 0.5, b_max), np.full(d, 1.0 / math.sqrt(d)))


def test_user_weights_batch_equals_reference():
    rng = np.random.default_rng(3)
    for b_max in (1.0, 1.2, 2.0, 5.0, math.inf):
        lengths = rng.integers(0, 40, 300)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        b = np.concatenate([_random_biases(rng, int(n)) for n in lengths])
        b_min = rng.uniform(0.5, 1.0, len(lengths))
        got = adaptive.user_weights_batch(b, offsets, b_min, b_max)
        for u in range(len(lengths)):
            sl = slice(offsets[u], offsets[u + 1])
            np.testing.assert_allclose(got[sl], adaptive.user_weights(b[sl], b_min[u], b_max), rtol=1e-12, atol=0)


def _user_weight_rows_reference(rows, b_min, b_max):
    out = {}
    for u, items in sets_of(rows).items():
        bs = [b for (uu, i, b) in rows if uu == u]
        for (i, w) in zip(items, adaptive.user_weights(bs, b_min, b_max)):
            out[(u, i)] = w
    return out


@pytest.mark.parametrize("b_min, b_max", [(0.5, 2.0), (0.6, 5.0), (1.0, 1.0), (0.5, 1.2), (0.7, 1.0), (0.9, 1.1)])
def test_sql_user_weights_equal_reference(con, b_min, b_max):
    # b_min * b_max >= 1 takes the closed form in SQL, < 1 the vectorised UDF: both must match Alg. 2.
    rng = random.Random(int(b_min * 100 + b_max * 10))
    rows = []
    for u in range(300):
        for k in rng.sample(range(80), rng.randint(1, 40)):
            rows.append((u, f"x{k}", 1.0 if rng.random() < 0.5 else rng.random()))
    load(con, rows, name="r", with_bias=True)
    got = {(u, i): (d, w) for u, i, d, w in con.execute(
        f"SELECT user_id, item, d, uw FROM dp__user_weight_rows('r', {b_min}, {b_max})").fetchall()}
    ref = _user_weight_rows_reference(rows, b_min, b_max)
    assert set(got) == set(ref)
    degree = Counter(u for u, _, _ in rows)
    for key, w in ref.items():
        assert got[key][0] == degree[key[0]]
        assert got[key][1] == pytest.approx(w, rel=1e-12)


def test_user_weights_udf_equals_reference(con):
    lists = [[1.0, 0.3, 0.9], [0.2] * 7, [1.0] * 5, [0.55, 1.0]]
    got = con.execute("SELECT dp__user_weights(b, 0.5, 1.1) FROM (SELECT unnest(?) AS b)", [lists]).fetchall()
    for (w,), b in zip(got, lists):
        np.testing.assert_allclose(w, adaptive.user_weights(b, 0.5, 1.1), rtol=1e-12)


# ---------------------------------------------------------------------------
# Sensitivity on random neighbouring datasets (docs/proofs/reference_checks.md B6), on the numpy reference
# ---------------------------------------------------------------------------

def _max_sensitivity(n_pairs, biased, seed, **broken):
    rng = np.random.default_rng(seed)
    worst_l2, worst_novel = 0.0, 0.0
    for _ in range(n_pairs):
        users, items, new_items, n_codes, novel = neighbour_arrays(rng)
        d_max = int(rng.choice([4, 5, 10, 50]))
        tau = float(rng.choice([1.0, 1.5, 3.0, 10.0]))
        if biased:
            b_min, b_max = 0.5, 2.0
            b = np.where(rng.random(n_codes) < 0.5, rng.random(n_codes), 1.0)
        else:
            b_min = b_max = 1.0
            b = None
        users2 = np.concatenate([users, np.full(len(new_items), users.max() + 1)])
        items2 = np.concatenate([items, new_items])
        w = mad_arrays(users, items, n_codes, tau, d_max, b, b_min, b_max, **broken)["w"]
        w2 = mad_arrays(users2, items2, n_codes, tau, d_max, b, b_min, b_max, **broken)["w"]
        worst_l2 = max(worst_l2, float(np.linalg.norm(w2 - w)))  # absent items weigh 0 in both
        if len(novel):
            worst_novel = max(worst_novel, float(w2[novel].max()) / (b_max / math.sqrt(len(novel))))
    return worst_l2, worst_novel


@pytest.mark.parametrize("biased", [False, True])
def test_mad_sensitivity_on_random_neighbours(biased):
    l2, novel = _max_sensitivity(1000, biased, seed=17 + biased)
    assert l2 <= 1 + 1e-9, l2
    assert novel <= 1 + 1e-9, novel
    assert l2 > 0.999  # attained by fully novel users: the bound is tight
    if not biased:
        assert novel > 0.999  # a fully novel user of degree t puts exactly 1/sqrt(t) on each item


def test_power_check_wrong_alpha_breaks_the_bound():
    l2, novel = _max_sensitivity(1000, False, seed=23, alpha=3.0)
    assert max(l2, novel) > 1 + 1e-3, (l2, novel)
    # A targeted pair: n users of degree 3 share one heavy item (plus two own light items each);
    # the added user does the same. Its excess and everybody's larger excess are rerouted.
    n, k, tau, d_max = 1000, 3, 1.0, 4
    users = np.repeat(np.arange(n + 1), k)
    items = np.concatenate([[0, 1 + 2 * u, 2 + 2 * u] for u in range(n + 1)])
    n_codes = 2 * (n + 1) + 1
    for alpha, ok in ((None, True), (3.0, False)):
        w = mad_arrays(users[:-k], items[:-k], n_codes, tau, d_max, alpha=alpha)["w"]
        w2 = mad_arrays(users, items, n_codes, tau, d_max, alpha=alpha)["w"]
        l2 = float(np.linalg.norm(w2 - w))
        assert (l2 <= 1 + 1e-9) if ok else (l2 > 1.2), (alpha, l2)


def test_power_check_printed_min_breaks_the_bound():
    l2, _ = _max_sensitivity(300, False, seed=29, excess=np.minimum)
    assert l2 > 5, l2


def test_mad_structure_on_the_reference():
    rng = random.Random(31)
    for _ in range(200):
        d_rows, d2_rows, _ = random_neighbours(rng)
        tau = rng.choice([1.0, 1.5, 3.0, 10.0])
        d_max = rng.choice([4, 5, 10, 50])
        a = mad_reference(sets_of(d_rows), tau, d_max)
        b = mad_reference(sets_of(d2_rows), tau, d_max)
        # The excess returned to the users is exactly the truncated weight.
        assert sum(a["e"].values()) == pytest.approx(sum(a["w_init"][i] - a["w_trunc"][i] for i in a["w"]), abs=1e-9)
        # Prop. 5.5: adding a user never lowers an initial, truncated or rerouted weight.
        for key in ("w_init", "w_trunc", "w_reroute"):
            assert all(b[key][i] >= a[key][i] - 1e-12 for i in a[key])
        # Thm 6.1: items at or below tau only gain weight over Basic; the others keep >= tau.
        for i, w in a["w"].items():
            if a["w_init"][i] <= tau:
                assert w >= a["basic"][i] - 1e-12
            else:
                assert w >= tau - 1e-12
        # tau = infinity (or d_max below every degree): MAD is Basic.
        inf = mad_reference(sets_of(d_rows), math.inf, d_max)
        assert max(abs(inf["w"][i] - inf["basic"][i]) for i in inf["w"]) < 1e-12


# ---------------------------------------------------------------------------
# The SQL weights: equal to the reference on the same capped data; sensitivity in SQL
# ---------------------------------------------------------------------------

def _pair_of_connections(seed, rows_a, rows_b=None, **kw):
    a, b = seeded(seed), seeded(seed)  # same seed -> same secret salt -> same cap
    load(a, rows_a, **kw)
    load(b, rows_a if rows_b is None else rows_b, **kw)
    return a, b


@pytest.fixture(scope="module")
def lockstep():
    pair = LockstepPair(31415)
    yield pair
    pair.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), max_items=st.integers(2, 60), d_max=st.sampled_from([2, 3, 4, 10, 50]),
       tau=st.sampled_from([1.0, 2.0, 5.0, 30.0]))
def test_sql_mad_weights_equal_reference_on_the_same_capped_data(lockstep, seed, max_items, d_max, tau):
    rows = zipf_rows(random.Random(seed), n_users=random.Random(seed).randint(1, 120))
    a, b = lockstep.get()  # the next query on each draws the same salt -> the same cap
    load(a, rows)
    load(b, rows)
    capped = capped_sets(a, max_items=max_items)
    got = {r[0]: r[1:] for r in b.execute(
        f"SELECT item, w, w_init, w_trunc, w_reroute FROM dp__mad_weights('t', {tau}, "
        f"max_adaptive_degree := {d_max}, max_items := {max_items})").fetchall()}
    ref = mad_reference(capped, tau, min(d_max, max_items) if min(d_max, max_items) >= 2 else 2)
    assert set(got) == set(ref["w"])
    for i, (w, w_init, w_trunc, w_reroute) in got.items():
        assert w == pytest.approx(ref["w"][i], rel=1e-9, abs=1e-12)
        assert w_init == pytest.approx(ref["w_init"][i], rel=1e-9, abs=1e-12)
        assert w_trunc == pytest.approx(ref["w_trunc"][i], rel=1e-9, abs=1e-12)
        assert w_reroute == pytest.approx(ref["w_reroute"][i], rel=1e-9, abs=1e-12)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10 ** 6), d_max=st.sampled_from([4, 5, 10, 50]), tau=st.sampled_from([1.0, 3.0, 20.0]),
       b_min=st.sampled_from([0.5, 0.8, 1.0]), b_max=st.sampled_from([1.0, 1.5, 2.0]))
def test_sql_biased_mad_weights_equal_reference(con, seed, d_max, tau, b_min, b_max):
    rng = random.Random(seed)
    rows = zipf_rows(rng)
    bias = {i: rng.random() for i in sorted({i for _, i in rows}) if rng.random() < 0.5}
    load(con, [(u, i, bias.get(i, 1.0)) for u, i in rows], name="tb", with_bias=True)
    got = weights_of(con, f"SELECT item, w FROM dp__mad_biased_weights('tb', {tau}, {d_max}, {b_min}, {b_max})")
    ref = mad_reference(sets_of(rows), tau, d_max, bias, b_min, b_max)["w"]
    assert set(got) == set(ref)
    for i, w in got.items():
        assert w == pytest.approx(ref[i], rel=1e-9, abs=1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), d_max=st.sampled_from([4, 10, 50]), tau=st.sampled_from([1.0, 1.5, 3.0, 10.0]))
def test_sql_mad_and_round_two_weights_on_neighbours(lockstep, seed, d_max, tau):
    rng = random.Random(seed)
    d_rows, d2_rows, novel = random_neighbours(rng)
    a, b = lockstep.get()  # the next query on each draws the same salt -> the same cap
    load(a, d_rows)
    load(b, d2_rows)
    sql = f"SELECT item, w FROM dp__mad_weights('t', {tau}, max_adaptive_degree := {d_max}, max_items := 100)"
    w, w2 = weights_of(a, sql), weights_of(b, sql)
    assert l2_change(w, w2) <= 1 + 1e-9
    assert novel_ratio(w2, novel, 1.0) <= 1 + 1e-9
    # Round two of MAD2R: biased MAD, same biases on the old items, any biases on the novel ones.
    bias = {i: rng.random() for i in sorted({i for _, i in d2_rows}) if rng.random() < 0.5}
    load(a, [(u, i, bias.get(i, 1.0)) for u, i in d_rows], name="tb", with_bias=True)
    load(b, [(u, i, bias.get(i, 1.0)) for u, i in d2_rows], name="tb", with_bias=True)
    sql = f"SELECT item, w FROM dp__mad_biased_weights('tb', {tau}, {d_max}, 0.5, 2.0)"
    w, w2 = weights_of(a, sql), weights_of(b, sql)
    assert l2_change(w, w2) <= 1 + 1e-9
    assert novel_ratio(w2, novel, 2.0) <= 1 + 1e-9


def test_sql_mad_with_infinite_tau_is_basic_and_dominates_basic():
    rows = zipf_rows(random.Random(5), n_users=300, n_items=60, max_deg=40)
    a, b = _pair_of_connections(77, rows)
    c, d = _pair_of_connections(78, rows)
    try:
        basic = weights_of(a, "SELECT item, w FROM dp__set_union_weights('t', 'inverse_sqrt', max_items := 20)")
        inf = weights_of(b, "SELECT item, w FROM dp__mad_weights('t', 'inf'::DOUBLE, max_items := 20)")
        basic2 = weights_of(c, "SELECT item, w FROM dp__set_union_weights('t', 'inverse_sqrt', max_items := 20)")
        mad = {r[0]: r[1:] for r in d.execute(
            "SELECT item, w, w_init FROM dp__mad_weights('t', 8.0, max_items := 20)").fetchall()}
    finally:
        for x in (a, b, c, d):
            x.close()
    assert set(inf) == set(basic)
    assert max(abs(inf[i] - basic[i]) for i in basic) < 1e-12
    truncated = [i for i, (_, w_init) in mad.items() if w_init > 8.0]
    assert truncated and len(truncated) < len(mad)
    for i, (w, w_init) in mad.items():
        assert w >= (basic2[i] - 1e-12 if w_init <= 8.0 else 8.0 - 1e-12)
    assert sum(mad[i][0] > basic2[i] + 1e-9 for i in mad if mad[i][1] <= 8.0) > 0  # rerouted weight arrived


# ---------------------------------------------------------------------------
# Releases
# ---------------------------------------------------------------------------

MACROS = ["mad", "mad2r", "sips", "sips_cumulative"]


def released(con, method, table="t", **params):
    def lit(v):
        return "[" + ", ".join(map(str, v)) + "]" if isinstance(v, (list, tuple)) else repr(v)
    params = {"epsilon": 1.0, "delta": 1e-5, **params}
    args = "".join(f", {k} := {lit(v)}" for k, v in params.items())
    return [r[0] for r in con.execute(f"SELECT * FROM dp_set_union_{method}('{table}'{args})").fetchall()]


@pytest.mark.parametrize("method", MACROS)
def test_soundness_and_output_shape(method):
    rows = zipf_rows(random.Random(11), n_users=400, n_items=30, max_deg=25)
    rows += [(u, f"rare{u}") for u in range(400)]
    a, b = _pair_of_connections(3, rows)
    try:
        cap_items = {i for s in capped_sets(a, max_items=5).values() for i in s}
        rel = b.sql(f"SELECT * FROM dp_set_union_{method}('t', epsilon := 50.0, delta := 1e-5, max_items := 5)")
        assert rel.columns == ["item"] and str(rel.types[0]) == "VARCHAR"
        out = [r[0] for r in rel.fetchall()]
    finally:
        a.close()
        b.close()
    assert len(out) == len(set(out)) > 0
    assert set(out) <= cap_items


@pytest.mark.parametrize("method", MACROS)
def test_empty_input_and_input_type(con, method):
    load(con, [])
    assert released(con, method) == []
    load(con, [(u, "7") for u in range(400)], item_type="BIGINT")
    rel = con.sql(f"SELECT * FROM dp_set_union_{method}('t', epsilon := 50.0, delta := 1e-5)")
    assert str(rel.types[0]) == "BIGINT" and rel.fetchall() == [(7,)]


def test_one_salt_per_query_and_one_noise_draw_per_item_and_round(seeded_con, monkeypatch):
    # The cap is the only use of the salt: one salt per query means every round sees the same cap.
    rows = zipf_rows(random.Random(4), n_users=200, n_items=300, max_deg=30)
    load(seeded_con, rows)
    src = source_of(seeded_con)
    salts = []
    draw_salt = src.salt
    monkeypatch.setattr(src, "salt", lambda: salts.append(1) or draw_salt())
    n_items = seeded_con.execute("SELECT count(DISTINCT item) FROM t").fetchall()[0][0]  # no user is capped

    def draws(sql):
        before, salts_before = src.samples_drawn, len(salts)
        out = seeded_con.execute(sql).fetchall()
        assert len(salts) - salts_before == 1, sql
        return src.samples_drawn - before, out

    for method in MACROS:
        n, _ = draws(f"SELECT * FROM dp_set_union_{method}('t', epsilon := 1.0, delta := 1e-5)")
        assert n >= 1 + n_items
    n, _ = draws("SELECT * FROM dp_set_union_mad('t', epsilon := 1e4, delta := 1e-5)")
    assert n == 1 + n_items
    # At epsilon = 1e4 every item MAD2R's first round does not release has an upper bound
    # (about 1.2) below rho2 (about 2.03): the second round has no item and draws no noise.
    n, _ = draws("SELECT * FROM dp_set_union_mad2r('t', epsilon := 1e4, delta := 1e-5)")
    assert n == 1 + n_items
    # ... unless c_ub is huge: then every item not released in round 1 gets a round-2 draw.
    n, out = draws("SELECT * FROM dp_set_union_mad2r('t', epsilon := 1e4, delta := 1e-5, c_ub := 1e9)")
    assert 1 + n_items < n < 1 + 2 * n_items
    # DP-SIPS with one round is Basic: no draw for the four pruned rounds.
    n, out = draws("SELECT * FROM dp_set_union_sips('t', epsilon := 1e4, delta := 1e-5, split := [1.0])")
    assert n == 1 + n_items
    n, out = draws("SELECT * FROM dp_set_union_sips('t', epsilon := 1e4, delta := 1e-5, split := [0.2, 0.2, 0.2, 0.2, 0.2])")
    assert 1 + n_items < n <= 1 + 5 * n_items


@pytest.mark.parametrize("method", MACROS)
def test_dispatcher_runs_only_the_chosen_method(method):
    rows = zipf_rows(random.Random(8), n_users=300, n_items=80, max_deg=30)
    a, b = _pair_of_connections(12, rows)
    try:
        da, db = source_of(a).samples_drawn, source_of(b).samples_drawn
        via = sorted(r[0] for r in a.execute(f"SELECT * FROM dp_set_union('t', method := '{method}', epsilon := 1.0, delta := 1e-5)").fetchall())
        direct = sorted(released(b, method))
        assert source_of(a).samples_drawn - da == source_of(b).samples_drawn - db
    finally:
        a.close()
        b.close()
    assert via == direct  # same seed, same plan: the same draws in the same order


def test_default_method_is_the_registry_default_and_the_dispatcher_default():
    rows = zipf_rows(random.Random(9), n_users=300, n_items=80, max_deg=30)
    a, b = _pair_of_connections(13, rows)
    try:
        via = sorted(r[0] for r in a.execute("SELECT * FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall())
        direct = sorted(r[0] for r in b.execute(
            f"SELECT * FROM {dpsql.METHODS[union.DEFAULT_METHOD].macro}('t', epsilon := 1.0, delta := 1e-5)").fetchall())
        assert source_of(a).samples_drawn == source_of(b).samples_drawn
    finally:
        a.close()
        b.close()
    assert via == direct
    assert union.DEFAULT_METHOD == "sips_cumulative"


# ---------------------------------------------------------------------------
# Releases against a numpy reference of the whole mechanism (release frequencies)
# ---------------------------------------------------------------------------

def _layered_rows(seed=2):
    """Users of degree <= 10 (no cap at max_items 10) holding popular items (released in MAD2R's
    first round), middle items (round-two material, biased: w1 between rho2 + sigma1 and rho1 at
    epsilon 8) and rare items."""
    rng = random.Random(seed)
    rows = []
    for u in range(1500):
        items = {f"p{rng.randint(0, 1)}"} if rng.random() < 0.6 else set()
        items |= {f"m{rng.randint(0, 9)}" for _ in range(rng.randint(1, 2))}
        items |= {f"q{rng.randint(0, 59)}" for _ in range(rng.randint(1, 3))}
        items |= {f"r{rng.randint(0, 199)}" for _ in range(rng.randint(0, 4))}
        rows += [(u, i) for i in sorted(items)]
    return rows


def _coded(sets):
    """The (user, item) pairs of ``sets`` as the integer codes :func:`mad_reference` gives them (users in
    the order of their ``str``, items in the order they first appear) and the item of each code."""
    codes: dict = {}
    users, items = [], []
    for k, u in enumerate(sorted(sets, key=str)):
        for i in sets[u]:
            users.append(k)
            items.append(codes.setdefault(i, len(codes)))
    return np.array(users, dtype=np.int64), np.array(items, dtype=np.int64), list(codes)


def _reference_release(coded, method, eps, delta, rng, **kw):
    """One release of ``method`` by the numpy reference on ``coded`` (:func:`_coded`): a boolean mask
    over the item codes.

    A later round runs :func:`mad_arrays` on the rows of the items still in play, every item keeping
    its code: a user left without rows adds nothing (as if dropped), an item without rows gets no
    weight and is not a candidate. Every item of ``coded`` has rows, so the items in play are exactly
    the ones that have rows in that round."""
    users, items, names = coded
    n = len(names)

    def weights(rows, *args, key="w"):
        return mad_arrays(users[rows], items[rows], n, *args)[key]

    everything = np.ones(len(users), dtype=bool)
    if method == "mad":
        c = adaptive.mad_calibration(eps, delta, 10)
        return weights(everything, c.tau, c.max_adaptive_degree) + rng.normal(0, c.sigma, n) >= c.rho
    if method == "sips":
        out = np.zeros(n, dtype=bool)
        for r in adaptive.sips_calibration(eps, delta, 10, kw["split"]):
            rest = ~out  # the items no round has released yet
            w = weights(rest[items], math.inf, 2, key="basic")
            out |= rest & (w + rng.normal(0, r.scale, n) >= r.threshold)
        return out
    c = adaptive.mad2r_calibration(eps, delta, 10)
    r1, r2 = c.round1, c.round2
    noisy = weights(everything, r1.tau, r1.max_adaptive_degree) + rng.normal(0, r1.sigma, n)
    u1 = noisy >= r1.rho
    keep = ~u1 & (noisy + c.upper_offset >= r2.rho)
    lower = noisy - c.lower_offset
    bias = np.ones(n)
    bias[lower > r2.rho] = r2.rho / lower[lower > r2.rho]
    if not keep.any():
        return u1
    w2 = weights(keep[items], r2.tau, r2.max_adaptive_degree, bias, r2.b_min, r2.b_max)
    return u1 | (keep & (w2 + rng.normal(0, r2.sigma, n) >= r2.rho))


@pytest.mark.slow
@pytest.mark.parametrize("method, eps, kw", [("mad", 8.0, {}), ("mad2r", 8.0, {}),
                                              ("sips", 8.0, {"split": [0.3, 0.7]})])
def test_release_frequencies_match_the_reference(method, eps, kw):
    rows = _layered_rows()
    sets = sets_of(rows)
    runs, sims = 100, 400
    con = seeded(500 + MACROS.index(method))
    try:
        load(con, rows)
        hits = Counter()
        for _ in range(runs):
            hits.update(released(con, method, epsilon=eps, max_items=10, **kw))
    finally:
        con.close()
    if method == "mad":  # one round: each item is released independently with Phi((w - rho)/sigma)
        c = adaptive.mad_calibration(eps, 1e-5, 10)
        w = mad_reference(sets, c.tau, c.max_adaptive_degree)["w"]
        ref_p = {i: float(stats.norm.sf((c.rho - x) / c.sigma)) for i, x in w.items()}
        sims = math.inf
    else:
        rng = np.random.default_rng(4)
        coded = _coded(sets)
        ref_hits = np.zeros(len(coded[2]), dtype=np.int64)
        for _ in range(sims):
            ref_hits += _reference_release(coded, method, eps, 1e-5, rng, **kw)
        ref = Counter(dict(zip(coded[2], ref_hits.tolist())))
        ref_p = {i: ref[i] / sims for i in {i for _, i in rows}}
    checked = 0
    for item, p in ref_p.items():
        q = hits[item] / runs
        # binomial standard error of the difference, with a smoothed pooled p so that p = 0 or 1
        # in one of the samples does not make the tolerance vanish
        if math.isinf(sims):  # exact p
            pooled = (p * runs + 1) / (runs + 2)
            sd = math.sqrt(pooled * (1 - pooled) / runs)
        else:
            pooled = (hits[item] + ref[item] + 1) / (runs + sims + 2)
            sd = math.sqrt(pooled * (1 - pooled) * (1 / runs + 1 / sims))
        assert abs(q - p) <= 5 * sd, (item, p, q)
        checked += 0.05 < p < 0.95
    assert checked >= 3  # the test has items whose release is genuinely random


# ---------------------------------------------------------------------------
# [MAD] Sec. 6.2: one heavy item and m light ones (docs/proofs/reference_checks.md F2)
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_section_6_2_instance_mad_releases_far_more_than_basic():
    n, m = 15000, 1000
    rng = np.random.default_rng(62)
    rows = []
    for u in range(n):
        a, b = rng.choice(m, 2, replace=False)
        rows += [(u, "heavy"), (u, f"light{a}"), (u, f"light{b}")]
    con = seeded(62)
    try:
        load(con, rows)
        counts = {}
        for label, sql in (("basic", "dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5)"),
                           ("mad", "dp_set_union_mad('t', epsilon := 1.0, delta := 1e-5, max_adaptive_degree := 3)")):
            counts[label] = np.mean([con.execute(f"SELECT count(*) FROM {sql}").fetchall()[0][0] for _ in range(5)])
    finally:
        con.close()
    # docs/proofs/reference_checks.md F2 (Delta0 = 100): Basic about 243, MAD(d_max = 3) about 431.
    assert counts["mad"] >= 1.3 * counts["basic"], counts


# ---------------------------------------------------------------------------
# The command line reports every round's calibration
# ---------------------------------------------------------------------------

def test_cli_json_lists_the_rounds(tmp_path):
    import io
    import json

    import pyarrow.parquet as pq

    from dpsql.frontends import cli

    rows = zipf_rows(random.Random(3), n_users=200, n_items=40, max_deg=20)
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"user_id": [r[0] for r in rows], "item": [r[1] for r in rows]}), path)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["set-union", str(path), "--method", "mad2r", "--epsilon", "1", "--delta", "1e-5",
                     "--max-items", "100", "--json", "--seed", "1"], out=out, err=err)
    assert code == 0, err.getvalue()
    doc = json.loads(out.getvalue())
    assert doc["method"] == "mad2r"
    rounds = doc["calibration_rounds"]
    assert [r["epsilon"] for r in rounds] == pytest.approx([0.1, 0.9])
    assert [r["delta"] for r in rounds] == pytest.approx([1e-6, 9e-6])
    assert rounds[1]["threshold"] == pytest.approx(22.08716, abs=5e-5) == doc["calibration"]["threshold"]
    assert rounds[0]["adaptive_threshold"] == pytest.approx(95.05447, abs=5e-5)
    accounting = doc["accounting"]  # the rounds compose as one Gaussian within the charged budget
    assert accounting["accountant"] == "gaussian"
    assert accounting["epsilon"] <= 1.0 and accounting["delta"] <= 1e-5
    assert accounting["mechanism_delta"] + accounting["event_delta"] == pytest.approx(accounting["delta"])
    assert set(doc["items"]) <= {r[1] for r in rows}
