"""Sequential policies: calibration, sensitivity on random neighbours (docs/proofs/reference_checks.md B2-B5),
kernels, macros."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.union import policy
from dpsql.core.calibration import SetUnionCalibration
from dpsql.core.noise import NoiseSource
from dpsql.core.registration import source_of
from dpsql.core.validation import DPParameterError

from conftest import seeded

L1, L2, GREEDY = policy.L1_DESCENT, policy.L2_DESCENT, policy.GREEDY_FILL
TOL = 1e-9
N_BASE_ITEMS = 150
N_NOVEL = 10


# ---------------------------------------------------------------------------
# Calibration (docs/proofs/reference_checks.md A4)
# ---------------------------------------------------------------------------

def test_cutoffs_of_the_dpsu_setting():
    eps, delta = 3.0, math.exp(-10)
    assert policy.policy_cutoff("policy_gaussian", eps, delta, 100, 5) == pytest.approx(13.4876, rel=1e-4)
    assert policy.policy_cutoff("policy_laplace", eps, delta, 100, 5) == pytest.approx(6.3140, rel=1e-4)
    assert policy.policy_gaussian_calibration(eps, delta, 100).threshold == pytest.approx(6.8237, rel=1e-4)
    assert policy.policy_laplace_calibration(eps, delta, 100).threshold == pytest.approx(4.6473, rel=1e-4)


def test_greedy_update_calibration():
    # rho = max(1, ln((e^eps - 1) / (2 delta)) / eps): the windowed release's threshold (policy.py, point 5).
    cal = policy.greedy_update_calibration(1.0, 1e-5)
    assert cal.noise == "laplace" and cal.scale == 1.0
    assert cal.threshold == pytest.approx(11.361103139023, rel=1e-12)
    assert cal.threshold == pytest.approx(math.log((math.e - 1) / 2e-5), rel=1e-12)
    assert policy.greedy_update_calibration(0.1, 1e-6).threshold == pytest.approx(108.70194916360, rel=1e-12)
    assert policy.greedy_update_calibration(3.0, math.exp(-10)).threshold == pytest.approx(4.0852612128325, rel=1e-12)
    # Floor: 1 - e^-eps <= 2 delta gives rho = 1 exactly (the window must start at rho - 1 >= 0).
    assert policy.greedy_update_calibration(0.5, 0.4).threshold == 1.0
    # The defining property: a weight-1 item that is absent from the neighbour is released w.p. exactly delta.
    for eps, delta in [(1.0, 1e-5), (0.1, 1e-6), (3.0, math.exp(-10)), (20.0, 1e-9)]:
        rho = policy.greedy_update_threshold(eps, delta)
        assert laplace_window(1.0, rho, eps) == pytest.approx(delta, rel=1e-9)
    assert policy.policy_cutoff("greedy_update", 1.0, 1e-5, 100, 3) == pytest.approx(cal.threshold + 3, rel=1e-12)
    assert policy.policy_cutoff("greedy_update", 1e6, 0.4, 1, 1e-9) >= 1.0
    with pytest.raises(DPParameterError, match="delta"):
        policy.greedy_update_threshold(1.0, 0.0)


def test_cutoff_in_sql_matches_python(seeded_con):
    [(g,)] = seeded_con.execute("SELECT dp__policy_cutoff('policy_gaussian', 3, exp(-10), 100, 5)").fetchall()
    assert g == policy.policy_cutoff("policy_gaussian", 3, math.exp(-10), 100, 5)


@pytest.mark.parametrize("alpha", [0, -1, float("nan"), float("inf"), None, "x", True])
def test_alpha_is_validated(alpha):
    with pytest.raises(DPParameterError, match="alpha"):
        policy.check_alpha(alpha)


@pytest.mark.parametrize("passes", [0, -1, 1.5, float("nan"), None, "two", policy.MAX_PASSES + 1, True])
def test_passes_is_validated(passes):
    with pytest.raises(DPParameterError, match="passes"):
        policy.check_passes(passes)


# ---------------------------------------------------------------------------
# Random neighbours (random neighbouring datasets)
# ---------------------------------------------------------------------------

def random_users(rng, max_items=30):
    """1..80 users, degrees 1..60 capped uniformly to max_items, Zipf-like item popularity."""
    log_p = -1.1 * np.log(np.arange(1, N_BASE_ITEMS + 1))
    users = []
    for _ in range(int(rng.integers(1, 81))):
        d = int(rng.integers(1, 61))
        # Weighted sample without replacement (Gumbel top-d), in random order, capped.
        items = np.argsort(-(log_p + rng.gumbel(size=N_BASE_ITEMS)))[:d]
        users.append(rng.permutation(items)[:max_items])
    return users


def new_user(rng, max_items=30):
    """A user with some existing items and t >= 0 novel ones, capped; returns (items, novel kept)."""
    d_old, t = int(rng.integers(0, 25)), int(rng.integers(0, N_NOVEL + 1))
    if d_old + t == 0:
        d_old = 1
    items = np.concatenate([rng.choice(N_BASE_ITEMS, size=d_old, replace=False),
                            N_BASE_ITEMS + np.arange(t)]).astype(np.int64)
    items = rng.permutation(items)[:max_items]
    return items, items[items >= N_BASE_ITEMS]


def csr(users):
    indptr = np.zeros(len(users) + 1, np.int64)
    np.cumsum([len(u) for u in users], out=indptr[1:])
    indices = np.concatenate(users).astype(np.int64) if users else np.zeros(0, np.int64)
    return indptr, indices


def hist(kind, users, gamma, passes=1, kernel="python", initial=None):
    indptr, indices = csr(users)
    return policy.run_policy(kind, indptr, indices, N_BASE_ITEMS + N_NOVEL, gamma, passes,
                             kernel=kernel, initial=initial)


def neighbours(seed, kind, passes, gamma_range, pairs=1000, per_dataset=5):
    """Yield (H(D), H(D+v), novel items of v, gamma) for random neighbours, v at a random position.

    Each random dataset D serves ``per_dataset`` random new users (H(D) is computed once).
    """
    rng = np.random.default_rng(seed)
    for _ in range(pairs // per_dataset):
        users = random_users(rng)
        gamma = float(rng.uniform(*gamma_range))
        h = hist(kind, users, gamma, passes)
        for _ in range(per_dataset):
            v, novel = new_user(rng)
            pos = int(rng.integers(0, len(users) + 1))
            yield h, hist(kind, users[:pos] + [v] + users[pos:], gamma, passes), novel, gamma


@pytest.mark.parametrize("passes", [1, 2])
def test_l1_descent_sensitivity_on_random_neighbours(passes):
    worst = 0.0
    for h, h2, novel, gamma in neighbours(11 + passes, L1, passes, (0.5, 6.0)):
        diff = h2 - h
        worst = max(worst, np.abs(diff).sum())
        assert np.abs(diff).sum() <= 1 + TOL
        assert np.all(diff >= -TOL)  # coordinate-wise monotone
        assert h2.max() <= gamma and h.max() <= gamma
        if len(novel):
            assert np.all(h2[novel] == h2[novel[0]])  # identical weight
            assert h2[novel[0]] <= 1 / len(novel) + TOL
    assert worst > 0.99  # the bound is attained (fully novel users), so the check can fail


@pytest.mark.parametrize("passes", [1, 2])
def test_l2_descent_sensitivity_on_random_neighbours(passes):
    worst = 0.0
    for h, h2, novel, gamma in neighbours(21 + passes, L2, passes, (0.5, 8.0)):
        dist = np.linalg.norm(h2 - h)
        worst = max(worst, dist)
        assert dist <= 1 + TOL
        assert h2.max() <= gamma and h.max() <= gamma
        if len(novel):
            assert np.all(h2[novel] == h2[novel[0]])
            assert h2[novel[0]] <= 1 / math.sqrt(len(novel)) + TOL
    assert worst > 0.99


def test_greedy_update_sensitivity_on_random_neighbours():
    for h, h2, novel, gamma in neighbours(31, GREEDY, 1, (1.0, 6.0)):
        diff = h2 - h
        assert np.abs(diff).sum() <= 1 + TOL
        assert np.all(diff >= -TOL)
        assert h2.max() <= gamma
        assert np.count_nonzero(h2[novel]) <= 1 and h2[novel].max(initial=0) <= 1 + TOL


def test_greedy_update_sensitivity_on_random_neighbours_in_one_global_order():
    # The macro's fill order: every list sorted by one order of the items (a random permutation here,
    # as the keyed hash), v's list by the same order. Users then fill the same items and cascades are
    # more frequent; Lemma 1 of docs/proofs/greedy_update.md still holds.
    rng = np.random.default_rng(37)
    worst, cascades = 0.0, 0
    for _ in range(200):
        rank = rng.permutation(N_BASE_ITEMS + N_NOVEL)
        users = [u[np.argsort(rank[u], kind="stable")] for u in random_users(rng)]
        gamma = float(rng.uniform(1.0, 6.0))
        h = hist(GREEDY, users, gamma)
        for _ in range(5):
            v, novel = new_user(rng)
            v = v[np.argsort(rank[v], kind="stable")]
            pos = int(rng.integers(0, len(users) + 1))
            h2 = hist(GREEDY, users[:pos] + [v] + users[pos:], gamma)
            diff = h2 - h
            assert np.abs(diff).sum() <= 1 + TOL
            assert np.all(diff >= -TOL)
            assert h2.max() <= gamma
            assert np.count_nonzero(h2[novel]) <= 1
            worst = max(worst, np.abs(diff).sum())
            cascades += int(np.count_nonzero((h == 0) & (h2 > 0)) > np.count_nonzero(h2[novel]))
    assert worst > 0.99 and cascades > 0  # the bound is attained and zero-weight union items do turn positive


# ---------------------------------------------------------------------------
# GreedyUpdate's windowed release (policy.py point 5; docs/proofs/greedy_update.md)
# ---------------------------------------------------------------------------

def laplace_tail(x, eps):
    """P[Lap(1/eps) > x]."""
    return 0.5 * math.exp(-eps * x) if x >= 0 else 1.0 - 0.5 * math.exp(eps * x)


def laplace_window(w, rho, eps):
    """q(w) = P[rho - w < Lap(1/eps) <= rho]: the windowed release probability of weight w."""
    if w <= rho:  # both ends >= 0: closed form without cancellation
        return 0.5 * math.exp(-eps * rho) * math.expm1(eps * w)
    return laplace_tail(rho - w, eps) - laplace_tail(rho, eps)


def bernoulli_delta(p, p2, eps):
    """The smallest delta with Bern(p), Bern(p2) (eps, delta)-indistinguishable both ways."""
    e = math.exp(eps)
    return max(0.0, p2 - e * p, p - e * p2, (1 - p2) - e * (1 - p), (1 - p) - e * (1 - p2))


def head_tail_neighbours(seed, pairs=1000, n_head=8, n_tail=200):
    """Random neighbours where GreedyUpdate cascades: each user holds 1-3 of a few popular items (filled
    first) then 1-3 rare ones, so a freed budget can spill onto rare items of weight 0."""
    rng = np.random.default_rng(seed)
    n = n_head + n_tail

    def user():
        return np.concatenate([rng.choice(n_head, int(rng.integers(1, 4)), replace=False),
                               n_head + rng.choice(n_tail, int(rng.integers(1, 4)), replace=False)])

    for _ in range(pairs):
        gamma = float(rng.choice([1.25, 1.5, 1.75, 2.5])) if rng.random() < 0.5 else float(rng.uniform(1.0, 4.0))
        users = [user() for _ in range(int(rng.integers(5, 40)))]
        pos = int(rng.integers(0, len(users) + 1))
        with_v = users[:pos] + [user()] + users[pos:]
        yield (policy.run_policy(GREEDY, *csr(users), n, gamma, kernel="python"),
               policy.run_policy(GREEDY, *csr(with_v), n, gamma, kernel="python"))


def test_greedy_update_windowed_release_is_private_on_random_neighbours():
    # The proof's quantity: with d_i = |H'_i - H_i|, sum_i d_i <= 1 and each item's release coins
    # (eps d_i, delta_i)-close with sum_i delta_i <= delta. Checked exactly (per-item Bernoulli
    # hockey-stick) on neighbours built to cascade, where the old support rule exceeds delta.
    settings = [(1.0, 1e-5), (0.1, 1e-6), (4.0, 1e-3)]
    cascades = old_rule_violations = 0
    worst = 0.0
    for h, h2 in head_tail_neighbours(101):
        d = h2 - h
        assert np.abs(d).sum() <= 1 + TOL and np.all(d >= -TOL)
        changed = np.flatnonzero(d != 0)
        turned_positive = np.flatnonzero((h == 0) & (h2 > 0))
        cascades += len(turned_positive) >= 2
        for eps, delta in settings:
            rho = policy.greedy_update_threshold(eps, delta)
            total = sum(bernoulli_delta(laplace_window(h[i], rho, eps), laplace_window(h2[i], rho, eps),
                                        eps * abs(d[i])) for i in changed)
            worst = max(worst, total / delta)
            assert total <= delta * (1 + 1e-9), (eps, delta, total / delta)
            # The old rule: support only, rho = 1 + ln(1/(2 delta))/eps; items turned positive act as novel.
            old_rho = 1 + math.log(1 / (2 * delta)) / eps
            old_rule_violations += sum(laplace_tail(old_rho - h2[i], eps) for i in turned_positive) > 1.01 * delta
    # The data exercise the finding (several zero-weight items turned positive) and the old rule fails on it.
    assert cascades >= 10 and old_rule_violations >= 10, (cascades, old_rule_violations)
    assert worst > 0.5  # the bound is approached, so the check can fail


def cascade(t, gamma_int=4):
    """Neighbours where the added user v turns t zero-weight union items positive (1/t each); t a power of 2.

    Items: per j, a_j and c_j1..c_j(t-1) preloaded to Gamma - 1/t by ``gamma_int`` single-item users,
    and z_j held only by y_j = [a_j, c_j1, .., c_j(t-1), z_j]. Without v, y_j spends its 1 on a_j and
    the c's; v = [a_1, .., a_t] fills every a_j first, so each y_j spills 1/t onto z_j.
    """
    gamma = gamma_int + 1.0 / t
    a = lambda j: j * (t + 1)  # noqa: E731
    z = lambda j: j * (t + 1) + t  # noqa: E731
    pre = [np.array([a(j) + k]) for j in range(t) for k in range(t) for _ in range(gamma_int)]
    ys = [np.arange(a(j), z(j) + 1) for j in range(t)]
    v = np.array([a(j) for j in range(t)])
    n = t * (t + 1)
    h = policy.run_policy(GREEDY, *csr(pre + ys), n, gamma, kernel="python")
    h2 = policy.run_policy(GREEDY, *csr(pre + [v] + ys), n, gamma, kernel="python")
    return h, h2, np.array([z(j) for j in range(t)]), gamma


@pytest.mark.parametrize("t", [2, 16, 64])
def test_greedy_update_cascade_exact(t):
    h, h2, zs, gamma = cascade(t)
    assert np.all(h[zs] == 0) and np.all(h2[zs] == 1.0 / t)
    assert np.abs(h2 - h).sum() == 1.0
    for eps, delta in [(1.0, 1e-5), (0.1, 1e-6)]:
        rho = policy.greedy_update_threshold(eps, delta)
        new = 1 - math.prod(1 - laplace_window(h2[i], rho, eps) for i in zs)  # P_{D'}[some z released]; P_D = 0
        assert new <= delta
        old_rho = 1 + math.log(1 / (2 * delta)) / eps
        old = 1 - math.prod(1 - laplace_tail(old_rho - h2[i], eps) for i in zs)
        assert old > delta  # the finding: the support rule with the old rho is not (eps, delta)-DP
    # eps = 1, t = 64: about 23.9 delta under the old rule.
    if t == 64:
        assert old / delta > 20


def test_greedy_update_windowed_release_statistics():
    # Fixed seed; tolerance 5 binomial standard errors.
    eps, delta, t, blocks = 1.0, 0.05, 16, 20000
    h, h2, zs, gamma = cascade(t)
    cal = policy.greedy_update_calibration(eps, delta)
    weights = h2[zs]
    tiled = np.tile(weights, blocks)

    def event_rate(c, window):
        ids = policy.release(tiled, c, NoiseSource(seed=123), window=window)
        return len(np.unique(ids // t)) / blocks

    def se(p):
        return math.sqrt(p * (1 - p) / blocks)

    expected = 1 - math.prod(1 - laplace_window(w, cal.threshold, eps) for w in weights)
    got = event_rate(cal, True)
    assert abs(got - expected) <= 5 * se(expected), (got, expected)
    assert got + 5 * se(got) < delta  # P_D[event] = 0, so (eps, delta)-DP needs P_{D'}[event] <= delta
    # The old rule on the same draws: far above delta (measured 0.27 expected).
    old = SetUnionCalibration("laplace", 1 / eps, 1 + math.log(1 / (2 * delta)) / eps)
    old_expected = 1 - math.prod(1 - laplace_tail(old.threshold - w, eps) for w in weights)
    got_old = event_rate(old, False)
    assert abs(got_old - old_expected) <= 5 * se(old_expected) and got_old - 5 * se(got_old) > delta
    # Release frequency of single items, including weights far above rho (the window drops noise > rho).
    ws = np.array([0.3, 1.0, cal.threshold, cal.threshold + 3.0, 50.0])
    ids = policy.release(np.tile(ws, blocks), cal, NoiseSource(seed=7), window=True)
    freq = np.bincount(ids % len(ws), minlength=len(ws)) / blocks
    for w, f in zip(ws, freq):
        q = laplace_window(w, cal.threshold, eps)
        assert abs(f - q) <= 5 * se(q) + 1e-12, (w, f, q)


def test_windowed_release_follows_the_rule_draw_for_draw():
    h = np.array([0.0, 3.0, 0.5, 0.0, 12.0, 2.0, 7.0])
    cal = SetUnionCalibration("laplace", 2.0, 3.0)
    for seed in range(20):
        ids = policy.release(h, cal, NoiseSource(seed=seed), window=True)
        support = np.flatnonzero(h > 0)
        noise = NoiseSource(seed=seed).laplace(np.full(len(support), cal.scale))
        expected = support[(h[support] + noise > cal.threshold) & (noise <= cal.threshold)]
        np.testing.assert_array_equal(ids, expected)
    with pytest.raises(ValueError, match="Laplace"):
        policy.release(h, SetUnionCalibration("gaussian", 1.0, 3.0), NoiseSource(seed=1), window=True)


@pytest.mark.parametrize("kind,passes", [(L1, 1), (L2, 1), (L1, 2), (L2, 2), (GREEDY, 1)])
def test_support_is_the_union_except_for_greedy_update(kind, passes):
    # The support rule's premise (policy.py, point 3): l1/l2-descent give every item of every capped
    # user a positive weight, so only the added user's novel items can enter the support.
    # GreedyUpdate leaves union items at weight 0 (point 5), which is why it needs the windowed rule.
    rng = np.random.default_rng(111 + kind + passes)
    zero_union_items = 0
    for _ in range(200):
        users = random_users(rng)
        gamma = float(rng.uniform(1.0, 6.0))
        h = hist(kind, users, gamma, passes)
        union = np.unique(np.concatenate(users))
        zero_union_items += int(np.count_nonzero(h[union] == 0))
        assert np.all(h[np.setdiff1d(np.arange(len(h)), union)] == 0)
    assert (zero_union_items > 0) == (kind == GREEDY), zero_union_items


@pytest.mark.parametrize("kind,passes", [(L1, 1), (L2, 1), (GREEDY, 1), (L1, 3), (L2, 3)])
def test_one_user_step_moves_at_most_its_budget(kind, passes):
    rng = np.random.default_rng(41)
    norm = 2 if kind == L2 else 1
    for _ in range(500):
        gamma = float(rng.uniform(1.0, 5.0))
        start = rng.uniform(0, gamma, N_BASE_ITEMS + N_NOVEL) * (rng.random(N_BASE_ITEMS + N_NOVEL) < 0.7)
        user, _ = new_user(rng)
        after = hist(kind, [user], gamma, passes, initial=start)
        step = after - start
        assert np.all(step >= -TOL) and after.max() <= gamma
        assert np.count_nonzero(np.abs(step) > 0) <= len(user)  # only the user's items change
        assert np.linalg.norm(step, norm) <= 1 + TOL  # P passes of 1/P each


def test_l2_descent_contracts_arbitrary_pairs():
    rng = np.random.default_rng(51)
    for _ in range(1000):
        gamma = float(rng.uniform(0.5, 6.0))
        n = N_BASE_ITEMS + N_NOVEL
        h1 = rng.uniform(0, gamma, n) * (rng.random(n) < 0.6)
        h2 = np.clip(h1 + rng.normal(0, rng.uniform(0.01, 2.0), n) * (rng.random(n) < 0.3), 0, gamma)
        user, _ = new_user(rng)
        a, b = hist(L2, [user], gamma, initial=h1), hist(L2, [user], gamma, initial=h2)
        assert np.linalg.norm(a - b) <= np.linalg.norm(h1 - h2) + TOL


@pytest.mark.parametrize("kind", [L1, GREEDY])
def test_l1_policies_keep_the_invariant_set(kind):
    # [DPSU] Lemma 4.1: (G1 >= G2, ||G1 - G2||_1 <= 1) is preserved, and the distance does not grow.
    rng = np.random.default_rng(61 + kind)
    n = N_BASE_ITEMS + N_NOVEL
    for _ in range(1000):
        gamma = float(rng.uniform(1.0, 6.0))
        g2 = rng.uniform(0, gamma, n) * (rng.random(n) < 0.6)
        bump = rng.exponential(1, n) * (rng.random(n) < 0.2)
        bump *= rng.uniform(0, 1) / max(bump.sum(), 1e-12)
        g1 = np.minimum(g2 + bump, gamma)
        user, _ = new_user(rng)
        a, b = hist(kind, [user], gamma, initial=g1), hist(kind, [user], gamma, initial=g2)
        assert np.all(a >= b - TOL)
        assert np.abs(a - b).sum() <= np.abs(g1 - g2).sum() + TOL


# ---------------------------------------------------------------------------
# Negative control: the "L1" policy of the [MM] reference code and its idealisation MaxSum
# (l2 water-filling) are NOT l2-contractive, so the Gaussian calibration (l2 sensitivity 1) does not
# cover them (docs/proofs/policy_maxsum.md)
# ---------------------------------------------------------------------------

def maxsum_step(h, items, gamma):
    """MaxSum: increments d_i = min(c, gap_i) with sum d_i^2 = 1 (max sum d_i s.t. ||d||_2 <= 1, d <= gap)."""
    open_items = [i for i in items if h[i] < gamma]
    gaps = sorted(gamma - h[i] for i in open_items)
    budget, c = 1.0, math.inf
    for j, g in enumerate(gaps):
        if g * g * (len(gaps) - j) <= budget:
            budget -= g * g
        else:
            c = math.sqrt(budget / (len(gaps) - j))
            break
    for i in open_items:
        h[i] = min(h[i] + c, gamma)


def reference_l1_step(h, items, gamma):
    """The [MM] reference's "L1" step: items in one global order, squared gaps charged, the rest spread."""
    open_items = sorted(i for i in items if h[i] < gamma)
    budget, k = 1.0, len(open_items)
    for j, i in enumerate(open_items):
        g = gamma - h[i]
        if g * g * (k - j) < budget:
            h[i] = gamma
            budget -= g * g
        else:
            for x in open_items[j:]:
                h[x] += budget / math.sqrt(k - j)
            break


def run_steps(step, users, n, gamma, initial=None):
    h = np.zeros(n) if initial is None else np.array(initial, float)
    for items in users:
        step(h, items, gamma)
    return h


@pytest.mark.parametrize("step,ratio", [(maxsum_step, 1.2889), (reference_l1_step, 1.58)])
def test_maxsum_and_reference_l1_steps_expand_l2_distances(step, ratio):
    # Four items just below Gamma get filled and free budget for a fifth: moving the four 0.01 closer
    # to Gamma (l2 distance 0.02) moves the fifth by more than 0.02 (policy_maxsum.md section 2).
    gamma = 10.0
    g2 = np.array([gamma - 0.4] * 4 + [0.0])
    g1 = g2 + np.array([0.01] * 4 + [0.0])
    a, b = g1.copy(), g2.copy()
    step(a, range(5), gamma)
    step(b, range(5), gamma)
    assert np.all(a >= b)
    assert np.linalg.norm(a - b) / np.linalg.norm(g1 - g2) == pytest.approx(ratio, abs=1e-4)
    # l2-descent (Policy Gaussian) does not expand the same pair.
    h1 = policy.run_policy(L2, *csr([np.arange(5)]), 5, gamma, kernel="python", initial=g1)
    h2 = policy.run_policy(L2, *csr([np.arange(5)]), 5, gamma, kernel="python", initial=g2)
    assert np.linalg.norm(h1 - h2) <= np.linalg.norm(g1 - g2) + TOL


@pytest.mark.parametrize("step,gamma,before,v,after,dist", [
    (maxsum_step, 3.0, [[0, 1], [0, 1]], [0, 1, 2, 3, 4, 5], [[1], [1, 2], [0, 1, 2], [0, 1, 2]], 1.0502),
    (reference_l1_step, 1.5, [[2, 4, 5], [1, 2, 3, 4, 5], [1, 3], [0, 1, 2, 3, 4, 5]], [1, 2, 3, 4, 5, 7, 8],
     [[0, 1, 2, 3, 4, 5]], 1.3361)])
def test_maxsum_and_reference_l1_histograms_have_l2_sensitivity_above_one(step, gamma, before, v, after, dist):
    # Neighbouring datasets found by a random search over small instances (policy_maxsum.md section 2).
    n = 10
    h = run_steps(step, before + after, n, gamma)
    h2 = run_steps(step, before + [v] + after, n, gamma)
    assert np.linalg.norm(h2 - h) == pytest.approx(dist, abs=1e-4)
    # Policy Gaussian's l2-descent on the same neighbours stays within 1.
    a = policy.run_policy(L2, *csr([np.array(x) for x in before + [v] + after]), n, gamma, kernel="python")
    b = policy.run_policy(L2, *csr([np.array(x) for x in before + after]), n, gamma, kernel="python")
    assert np.linalg.norm(a - b) <= 1 + TOL


# ---------------------------------------------------------------------------
# Negative control: the greedy policy of [DPSU] App. C (Alg. 9), NOT private
# ---------------------------------------------------------------------------

def app_c_greedy(users, n, gamma, initial=None):
    """[DPSU] Alg. 9: fill the user's items in increasing order of their gap to gamma, budget 1."""
    h = np.zeros(n) if initial is None else np.array(initial, float)
    for items in users:
        budget = 1.0
        for i in sorted((i for i in items if h[i] < gamma), key=lambda i: gamma - h[i]):
            gap = gamma - h[i]
            if gap <= budget:
                h[i] = gamma
                budget -= gap
            else:
                h[i] += budget
                break
    return h


def test_app_c_greedy_policy_has_sensitivity_above_one():
    rng = np.random.default_rng(71)
    worst = 0.0
    for _ in range(300):
        users = random_users(rng)
        v, _ = new_user(rng)
        pos = int(rng.integers(0, len(users) + 1))
        gamma = float(rng.uniform(1.0, 6.0))
        n = N_BASE_ITEMS + N_NOVEL
        worst = max(worst, np.abs(app_c_greedy(users[:pos] + [v] + users[pos:], n, gamma)
                                  - app_c_greedy(users, n, gamma)).sum())
    assert worst > 2.0, worst


def test_app_c_two_item_example():
    # H[u1] < H[u2] < 1 + H[u1] before user i (who holds only u1); the N - i later users hold both.
    start, gamma, later = np.array([0.2, 0.5]), 10.0, 5
    with_i = [np.array([0])] + [np.array([0, 1])] * later
    without_i = [np.array([0, 1])] * later
    greedy = np.abs(app_c_greedy(with_i, 2, gamma, start) - app_c_greedy(without_i, 2, gamma, start)).sum()
    assert greedy == pytest.approx(2 * later + 1)  # grows with the number of later users
    for kind in (L1, GREEDY):
        a = policy.run_policy(kind, *csr(with_i), 2, gamma, kernel="python", initial=start)
        b = policy.run_policy(kind, *csr(without_i), 2, gamma, kernel="python", initial=start)
        assert np.abs(a - b).sum() <= 1 + TOL


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------

def larger_csr(seed, n_users=3000, n_items=2000):
    rng = np.random.default_rng(seed)
    users = []
    for _ in range(n_users):
        d = int(min(rng.zipf(1.6), 100))
        users.append(np.unique(np.minimum(rng.zipf(1.2, d), n_items) - 1))
    return csr(users), n_items


@pytest.mark.parametrize("kind", [L1, L2, GREEDY])
@pytest.mark.parametrize("passes", [1, 2])
def test_numba_and_python_kernels_agree_bit_for_bit(kind, passes):
    pytest.importorskip("numba")
    (indptr, indices), n = larger_csr(81 + kind)
    for gamma in (1.0, 3.3, 13.5):
        a = policy.run_policy(kind, indptr, indices, n, gamma, passes, kernel="python")
        b = policy.run_policy(kind, indptr, indices, n, gamma, passes, kernel="numba")
        np.testing.assert_array_equal(a, b)
        assert a.max() > 0


def test_kernel_without_numba_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(policy, "numba_available", lambda: False)
    monkeypatch.setattr(policy, "_NUMBA_KERNEL", None)
    with pytest.raises(ImportError, match="fast"):
        policy.run_policy(L1, np.array([0, 1]), np.array([0]), 1, 1.0, kernel="numba")
    h = policy.run_policy(L1, np.array([0, 1]), np.array([0]), 1, 1.0)  # auto falls back
    assert h.tolist() == [1.0]


def test_progress_reports_fractions_up_to_one(monkeypatch):
    monkeypatch.setattr(policy, "_CHUNK_ENTRIES", 1000)
    (indptr, indices), n = larger_csr(91)
    seen = []
    policy.run_policy(L2, indptr, indices, n, 5.0, 2, kernel="python", progress=seen.append)
    assert len(seen) > 4 and seen == sorted(seen) and seen[-1] == 1.0


def test_csr_from_keys_groups_users_in_order():
    keys = np.array([(2 << 32) | 7, (0 << 32) | 3, (2 << 32) | 1, (0 << 32) | 5])
    indptr, indices = policy.csr_from_keys(keys, keep_order=False)
    assert indptr.tolist() == [0, 2, 2, 4] and indices.tolist() == [3, 5, 1, 7]
    with pytest.raises(ValueError, match="grouped"):
        policy.csr_from_keys(keys, keep_order=True)


def test_csr_from_keys_in_blocks(monkeypatch):
    # The CSR is built in blocks of temporaries: a block boundary changes nothing, and a user split
    # across two blocks is still caught when the order must be kept.
    monkeypatch.setattr(policy, "_BLOCK", 3)
    rng = np.random.default_rng(3)
    users, items = rng.integers(0, 9, 40), rng.integers(0, 50, 40)
    keys = (users << 32) | items
    indptr, indices = policy.csr_from_keys(keys, keep_order=False)
    assert indptr.tolist() == [0] + np.cumsum(np.bincount(users)).tolist()
    assert indices.tolist() == [int(k) & 0xFFFFFFFF for k in sorted(keys.tolist())]
    grouped = keys[np.argsort(users, kind="stable")]
    indptr2, indices2 = policy.csr_from_keys(grouped, keep_order=True)
    assert indptr2.tolist() == indptr.tolist() and indices2.tolist() == (grouped & 0xFFFFFFFF).tolist()
    cut = int(np.searchsorted(grouped >> 32, 3))  # users 0-2 | 3..
    tail = grouped[cut:][:3]  # one block of later users, in order, then the earlier ones: each block is
    bad = np.concatenate([tail, grouped[:cut], grouped[cut + 3:]])  # ordered, the boundary is not
    assert cut >= 3 and (tail >> 32).tolist() == sorted((tail >> 32).tolist())
    with pytest.raises(ValueError, match="grouped"):
        policy.csr_from_keys(bad, keep_order=True)
    assert keys.tolist() == ((users << 32) | items).tolist()  # the input is not modified


@pytest.mark.parametrize("wide", [False, True])
def test_fill_order_sorts_users_then_most_repeated_then_id(wide, monkeypatch):
    monkeypatch.setattr(policy, "_BLOCK", 777)  # several blocks of temporaries
    # GreedyUpdate's fill order (user ordinal, multiplicity descending, item id), against Python's sort.
    # Narrow fields take the packed single sort; wide ones (ordinal, id and m needing > 63 bits) the
    # exact lexicographic one.
    rng = np.random.default_rng(7 + wide)
    n = 5000
    top_user, top_item, top_m = ((40, 2**32 - 1, 2**31) if wide else (40, 300, 6))  # (ordinals are dense)
    users = rng.integers(0, top_user, 60)
    pairs = {(int(rng.choice(users)), int(rng.integers(0, top_item))) for _ in range(n)}
    pairs.add((int(top_user), int(top_item)))  # the field widths are reached
    entries = [(u, i, 1 if rng.random() < 0.3 else int(rng.integers(2, top_m + 1))) for u, i in pairs]
    entries[0] = (entries[0][0], entries[0][1], top_m)
    rng.shuffle(entries)
    once = np.array([(u << 32) | i for u, i, m in entries if m == 1], np.int64)
    keys = np.array([(u << 32) | i for u, i, m in entries if m > 1], np.int64)
    mults = np.array([m for _, _, m in entries if m > 1], np.int64)
    want = sorted(entries, key=lambda e: (e[0], -e[2], e[1]))
    indptr, indices = policy.fill_order(once, keys, mults)
    assert indices.tolist() == [i for _, i, _ in want]
    counts = np.bincount([u for u, _, _ in want])
    assert indptr.tolist() == [0] + np.cumsum(counts).tolist()
    assert sum(m > 1 for _, _, m in entries) > n // 2  # multiplicities decide most of the order
    assert 0 < len(once) < n // 2
    with pytest.raises(ValueError, match="one multiplicity per repeated entry"):
        policy.fill_order(once, keys, mults[1:])
    # Only single or only repeated entries, and none.
    for part in (once, keys):
        m = np.ones(len(part), np.int64) if part is once else mults
        indptr, indices = policy.fill_order(part[:0], part, m) if part is keys else policy.fill_order(part, part[:0], m[:0])
        sub = sorted(((k >> 32, -int(mm), k & 0xFFFFFFFF) for k, mm in zip(part.tolist(), m.tolist())))
        assert indices.tolist() == [i for _, _, i in sub]
    empty = np.zeros(0, np.int64)
    assert [a.tolist() for a in policy.fill_order(empty, empty, empty)] == [[0], []]


def test_release_only_considers_the_support():
    h = np.array([0.0, 5.0, 0.0, 0.1])
    src = NoiseSource(seed=1)
    ids = policy.release(h, SetUnionCalibration("gaussian", 1e-9, 1.0), src)
    assert ids.tolist() == [1] and src.samples_drawn == 2


# ---------------------------------------------------------------------------
# Macros
# ---------------------------------------------------------------------------

POLICY_METHODS = list(policy.POLICIES)  # every sequential method


def load_random(con, seed=5, n_users=400, n_items=300):
    rng = np.random.default_rng(seed)
    users, items = [], []
    for u in range(n_users):
        d = int(rng.integers(1, 40))
        chosen = np.minimum(rng.zipf(1.3, d), n_items)
        users += [u] * d
        items += [f"w{i}" for i in chosen]
    staged = pa.table({"user_id": pa.array(users, pa.int64()), "item": pa.array(items)})  # noqa: F841
    con.execute("CREATE OR REPLACE TABLE t AS SELECT * FROM staged")
    return set(items)


@pytest.mark.parametrize("method", POLICY_METHODS)
def test_macros_release_only_input_items(method, seeded_con):
    universe = load_random(seeded_con)
    cap = {} if method == "greedy_update" else {"max_items": 10}  # greedy_update has no cap
    got = dpsql.set_union(seeded_con, "t", method, epsilon=1.0, delta=1e-5, **cap).column("item").to_pylist()
    assert got and set(got) <= universe and len(got) == len(set(got))


@pytest.mark.parametrize("method", POLICY_METHODS)
def test_macro_equals_a_direct_python_call(method, monkeypatch):
    seen: dict = {}
    real_run, real_release = policy.run_policy, policy.release

    def spy_run(kind, indptr, indices, n_items, gamma, passes=1, **kw):
        seen["args"] = (kind, indptr.copy(), indices.copy(), n_items, gamma, passes)
        return real_run(kind, indptr, indices, n_items, gamma, passes, **kw)

    def spy_release(h, cal, source, **kw):
        seen["drawn_before_noise"] = source.samples_drawn
        seen["cal"], seen["kw"] = cal, kw
        seen["ids"] = real_release(h, cal, source, **kw)
        return seen["ids"]

    monkeypatch.setattr(policy, "run_policy", spy_run)
    monkeypatch.setattr(policy, "release", spy_release)
    con = seeded(7)
    try:
        load_random(con, seed=6)
        [(n_users, n_pairs)] = con.execute("SELECT count(DISTINCT user_id), count(DISTINCT (user_id, item)) "
                                           "FROM t").fetchall()
        released = con.execute(f"SELECT item FROM dp_set_union_{method}('t', epsilon := 2, delta := 1e-5, "
                               + ("" if method == "greedy_update" else "max_items := 1000, passes := 2, ")
                               + "alpha := 4)").fetchall()
        before = seen["drawn_before_noise"]
    finally:
        con.close()
    kind, indptr, indices, n_items, gamma, passes = seen["args"]
    # The CSR the macro built is the (uncapped here) data: one row per user, each distinct pair once.
    assert len(indptr) - 1 == n_users and len(indices) == n_pairs
    assert kind == policy.POLICIES[method] and passes == (1 if method == "greedy_update" else 2)
    assert gamma == policy.policy_cutoff(method, 2.0, 1e-5, 1000, 4)
    # Replaying with the same seed: the salts, then the kernel and the release in Python.
    src = NoiseSource(seed=7)
    for _ in range(before):
        src.salt()
    h = real_run(kind, indptr, indices, n_items, gamma, passes, kernel="python")
    # GreedyUpdate is released with the windowed rule, the others with the support rule.
    assert seen["kw"] == {"window": method == "greedy_update"}
    ids = real_release(h, policy.calibrate(method, 2.0, 1e-5, 1000), src, **seen["kw"])
    np.testing.assert_array_equal(ids, seen["ids"])
    assert len(released) == len(ids) > 0


def test_salts_and_noise_draws(seeded_con):
    load_random(seeded_con)
    src = source_of(seeded_con)
    [(n_items,)] = seeded_con.execute("SELECT count(DISTINCT item) FROM t").fetchall()
    before = src.samples_drawn
    seeded_con.execute("SELECT * FROM dp_set_union_policy_gaussian('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert src.samples_drawn - before == 2 + n_items  # cap salt, order salt, one noise per item
    # GreedyUpdate: the order salt only (no cap), and noise only for the items that got weight.
    before = src.samples_drawn
    seeded_con.execute("SELECT * FROM dp_set_union_greedy_update('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert 1 < src.samples_drawn - before < 1 + n_items


def test_greedy_update_fills_the_most_repeated_item_first(seeded_con):
    rows = ["y", "x", "x", "x", "z", "z"]
    staged = pa.table({"user_id": pa.array([1] * 6 + [2] * 6, pa.int64()), "item": rows + rows})  # noqa: F841
    seeded_con.execute("CREATE TABLE g AS SELECT * FROM staged")
    # eps large: user 1 puts 1 on x, user 2 tops x up to Gamma > rho and gives the rest (< rho) to z.
    got = seeded_con.execute("SELECT item FROM dp_set_union_greedy_update('g', epsilon := 1000, delta := 1e-5, alpha := 10)"
                             ).fetchall()
    assert got == [("x",)]


def _greedy_lists(monkeypatch, seed, table):
    """The per-user item lists (dense ids, fill order) the greedy_update macro hands to the kernel."""
    seen = {}
    real_run = policy.run_policy

    def spy_run(kind, indptr, indices, *a, **kw):
        seen["lists"] = [indices[indptr[u]:indptr[u + 1]].tolist() for u in range(len(indptr) - 1)]
        return real_run(kind, indptr, indices, *a, **kw)

    monkeypatch.setattr(policy, "run_policy", spy_run)
    con = seeded(seed)
    try:
        load_random(con, seed=5)
        con.execute(f"CREATE TABLE {table} AS SELECT DISTINCT user_id, item FROM t")
        con.execute(f"SELECT * FROM dp_set_union_greedy_update('{table}', epsilon := 1.0, delta := 1e-5)").fetchall()
    finally:
        con.close()
    return seen["lists"]


def test_greedy_update_fills_in_one_global_item_order(monkeypatch):
    # Distinct pairs (all multiplicities 1): every user's fill order is the restriction of ONE order of
    # the items (docs/proofs/greedy_update.md section 5, "Fill order"), so any two items held by two
    # users come in the same relative order for both.
    for seed in (1, 2):
        lists = _greedy_lists(monkeypatch, seed, "d")
        rank: dict = {}
        pairs_checked = 0
        for items in lists:
            pos = {x: j for j, x in enumerate(items)}
            for x in items:
                for y in items:
                    if x < y:
                        before = pos[x] < pos[y]
                        pairs_checked += (x, y) in rank
                        assert rank.setdefault((x, y), before) == before
        assert pairs_checked > 1000  # the users share many items: the check has power
    # A fresh salt per release: the global order differs between two seeds.
    assert _greedy_lists(monkeypatch, 1, "d") != _greedy_lists(monkeypatch, 2, "d")


def test_greedy_update_releases_the_same_when_every_pair_repeats():
    # Every pair twice: all entries go to the kernel as {k, m} structs and the keys list is NULL
    # (list() FILTER of no rows); all m equal, so the fill order, the draws and the release are those
    # of the distinct table, whose entries all go as keys (the struct list NULL).
    got = []
    for rows in ("SELECT DISTINCT user_id, item FROM t",
                 "SELECT * FROM (SELECT DISTINCT user_id, item FROM t) CROSS JOIN range(2)"):
        con = seeded(8)
        try:
            load_random(con, seed=5)
            con.execute(f"CREATE TABLE g AS SELECT user_id, item FROM ({rows})")
            got.append(con.execute("SELECT item FROM dp_set_union_greedy_update('g', epsilon := 1.0, delta := 1e-5)"
                                   ).fetchall())
        finally:
            con.close()
    assert len(got[0]) > 5 and got[0] == got[1]


def test_greedy_update_visits_users_with_fewer_items_first(monkeypatch):
    # The user order is (number of distinct items, keyed hash): a function of each user's own rows.
    lengths = [len(items) for items in _greedy_lists(monkeypatch, 3, "d")]
    assert lengths == sorted(lengths) and len(set(lengths)) > 10


def _three_items(con):
    staged = pa.table({"user_id": pa.array([1, 1, 1, 2, 2, 2], pa.int64()), "item": ["x", "y", "z"] * 2})  # noqa: F841
    con.execute("CREATE TABLE g3 AS SELECT * FROM staged")


@pytest.mark.parametrize("order,col,first", [
    ([("z", 1)], None, "z"),                          # listed items first (membership only)
    ([("y", 1), ("z", 2)], None, None),               # two listed items: their keyed order decides
    ([("x", 3), ("y", 1), ("z", 2)], "r", "y"),      # ascending order_col
    ([("x", 1), ("y", 1.5), ("z", 1.2)], "r", "x")])
def test_greedy_update_fills_the_public_order_first(seeded_con, order, col, first):
    # eps large: user 1 puts 1 on its first item, user 2 tops it up to Gamma > rho and leaves the rest
    # (< rho) on its second item: only the first item of the fill order is released.
    _three_items(seeded_con)
    staged = pa.table({"item": [i for i, _ in order], "r": [float(r) for _, r in order]})  # noqa: F841
    seeded_con.execute("CREATE TABLE o AS SELECT * FROM staged")
    extra = ", order_tbl := 'o'" + (f", order_col := '{col}'" if col else "")
    got = seeded_con.execute("SELECT item FROM dp_set_union_greedy_update('g3', epsilon := 1000, delta := 1e-5, "
                             f"alpha := 10{extra})").fetchall()
    if first is None:
        assert got in ([("y",)], [("z",)])
    else:
        assert got == [(first,)]
    api = dpsql.set_union(seeded_con, "g3", "greedy_update", epsilon=1000, delta=1e-5, alpha=10, order_tbl="o",
                          order_col=col).column("item").to_pylist()
    assert len(api) == 1 and (first is None or api == [first])


@pytest.mark.parametrize("args,match", [
    ("order_tbl := 'o', order_col := 'nope'", "order_col := 'nope' is not a column of 'o'"),
    ("order_tbl := 'o', item_col := 'word'", "item_col := 'word' is not a column of"),
    ("order_col := 'r'", "order_col := 'r' needs order_tbl"),
])
def test_greedy_update_order_parameters_are_checked_before_the_charge(seeded_con, args, match):
    _three_items(seeded_con)
    seeded_con.execute("CREATE TABLE o AS SELECT 'x' AS item, 1.0 AS r")
    with pytest.raises(Exception, match=match):
        seeded_con.execute(f"SELECT * FROM dp_set_union_greedy_update('g3', epsilon := 1, delta := 1e-5, {args})"
                           ).fetchall()
    assert seeded_con.execute("SELECT count(*) FROM dp_releases()").fetchone()[0] == 0
    with pytest.raises(Exception, match="apply to greedy_update only"):
        seeded_con.execute("SELECT * FROM dp__policy_run('g3', 'policy_laplace', 1, 1e-5, 10, 5, 1, 'user_id', "
                           "'item', order_tbl := 'o')").fetchall()


def test_dispatcher_and_python_api_match_the_macro():
    results = []
    for how in ("macro", "dispatch", "api"):
        con = seeded(11)
        try:
            load_random(con)
            if how == "macro":
                rows = con.execute("SELECT item FROM dp_set_union_policy_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 20)").fetchall()
            elif how == "dispatch":
                rows = con.execute("SELECT item FROM dp_set_union('t', method := 'policy_gaussian', "
                                   "epsilon := 1.0, delta := 1e-5, max_items := 20)").fetchall()
            else:
                rows = [(i,) for i in dpsql.set_union(con, "t", "policy_gaussian", epsilon=1.0, delta=1e-5, max_items=20, alpha=5,
                                                      passes=1).column("item").to_pylist()]
            results.append(sorted(r[0] for r in rows))
        finally:
            con.close()
    assert results[0] == results[1] == results[2] and results[0]


def test_api_passes_alpha_and_passes_and_reports_progress(seeded_con):
    load_random(seeded_con)
    seen = []
    out = dpsql.set_union(seeded_con, "t", "policy_laplace", epsilon=1.0, delta=1e-5, max_items=20, alpha=2,
                          passes=3, progress=seen.append)
    assert out.num_rows >= 0 and seen[-1] == 100.0 and seen == sorted(seen)
    with pytest.raises(DPParameterError, match="passes does not apply"):
        dpsql.set_union(seeded_con, "t", "greedy_update", epsilon=1.0, delta=1e-5, passes=2)
    with pytest.raises(DPParameterError, match="alpha"):
        dpsql.set_union(seeded_con, "t", "policy_laplace", epsilon=1.0, delta=1e-5, alpha=-1)


@pytest.mark.parametrize("bad,match", [("alpha := 0", "alpha"), ("passes := 1.5", "passes"),
                                       ("passes := 0", "passes"), ("epsilon := 0", "epsilon"),
                                       ("delta := 1", "delta"), ("max_items := 0", "max_items")])
def test_macro_rejects_bad_parameters_even_on_empty_input(seeded_con, bad, match):
    seeded_con.execute("CREATE TABLE e (user_id BIGINT, item VARCHAR)")
    name, value = bad.split(" := ")
    args = ", ".join(f"{k} := {v}" for k, v in {"epsilon": "1.0", "delta": "1e-5", name: value}.items())
    with pytest.raises(Exception, match=match):
        seeded_con.execute(f"SELECT * FROM dp_set_union_policy_laplace('e', {args})").fetchall()


@pytest.mark.parametrize("method", POLICY_METHODS)
def test_empty_input_releases_nothing(seeded_con, method):
    seeded_con.execute("CREATE TABLE e (user_id BIGINT, item VARCHAR)")
    assert seeded_con.execute(f"SELECT * FROM dp_set_union_{method}('e', epsilon := 1.0, delta := 1e-5)").fetchall() == []


def test_null_items_are_an_error(seeded_con):
    seeded_con.execute("CREATE TABLE n AS SELECT 1::BIGINT AS user_id, NULL::VARCHAR AS item")
    for method in POLICY_METHODS:
        with pytest.raises(Exception, match="NULL"):
            seeded_con.execute(f"SELECT * FROM dp_set_union_{method}('n', epsilon := 1.0, delta := 1e-5)").fetchall()


def test_cli_passes_alpha_and_passes(tmp_path):
    import io
    import json

    import pyarrow.parquet as pq

    from dpsql.frontends.cli import main

    rng = np.random.default_rng(2)
    users = np.repeat(np.arange(300), 8)
    items = [f"w{int(i)}" for i in np.minimum(rng.zipf(1.3, len(users)), 200)]
    pq.write_table(pa.table({"user_id": users, "item": items}), tmp_path / "d.parquet")
    base = [str(tmp_path / "d.parquet"), "--epsilon", "1", "--delta", "1e-5", "--max-items", "10", "--seed", "1"]
    out, err = io.StringIO(), io.StringIO()
    rc = main(["set-union", *base, "--method", "policy_gaussian", "--alpha", "4", "--passes", "2", "--json"],
              out=out, err=err)
    assert rc == 0, err.getvalue()
    doc = json.loads(out.getvalue())
    assert doc["alpha"] == 4.0 and doc["passes"] == 2 and doc["n_released"] == len(doc["items"])
    err = io.StringIO()
    assert main(["set-union", *base, "--method", "weighted_gaussian", "--passes", "2"], out=io.StringIO(),
                err=err) == 2
    assert "passes" in err.getvalue()


def test_ids_map_back_to_the_right_items_with_several_threads(con):
    # Three items every user holds and one item per user. The popular items sit at Gamma = rho + 5 sigma
    # (each missed with probability Phi(-5) ~ 3e-7); each rare item gets weight 1 (the step goes
    # entirely to it once the popular ones are at Gamma), i.e. it passes like a novel item with t = 1,
    # with probability ~ delta/2 = 5e-6: about 0.2 of the 35,000 per run, and more than 5 with
    # probability < 1e-8. A dense-id mix-up between the engine's threads would release random items.
    con.execute("SET threads = 4")
    n_users = 35000  # 140k rows: more than one row group, so several threads scan
    items = [f"pop{k}" if k < 3 else f"rare{u}" for u in range(n_users) for k in range(4)]
    staged = pa.table({"user_id": np.repeat(np.arange(n_users), 4), "item": items})  # noqa: F841
    con.execute("CREATE TABLE many AS SELECT * FROM staged")
    got = {r[0] for r in con.execute("SELECT item FROM dp_set_union_policy_gaussian('many', epsilon := 5, delta := 1e-5)"
                                     ).fetchall()}
    popular = {"pop0", "pop1", "pop2"}
    assert popular <= got and len(got - popular) <= 5, got
