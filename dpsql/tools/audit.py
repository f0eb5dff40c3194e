"""Empirical privacy audit: a statistical LOWER bound on the epsilon each mechanism realises.

An audit cannot prove privacy; it can refute a claim. For neighbouring datasets D, D' and an
event S on the output, (epsilon, delta)-DP implies P[M(D') in S] <= e^epsilon P[M(D) in S] + delta,
so with a one-sided Clopper-Pearson lower bound p_hi_low of P[M(D') in S] and an upper bound
p_lo_up of P[M(D) in S]

    epsilon >= ln((p_hi_low - delta) / p_lo_up)

holds with probability >= ``confidence`` (Bonferroni: each bound at level (1 - confidence)/2;
the event is chosen on separate pilot runs, so only these two bounds are tested). Both
directions (adding and removing the user or element) are tried.

**Fast seeded path (replicas).** The user-level weight-and-threshold mechanisms treat disjoint
(users, items) blocks independently: every item's noise is its own draw, a user's weights and
cap depend only on that user's items, and every aggregate is per item or per user. So R disjoint
copies of a small pair (user ids and items offset by the copy index) stacked in ONE table and
released by the real macro ONCE on a seeded connection give R independent Bernoulli trials of
every event on one copy's audited items. Per kind of case (``AuditCase.kind``, declared by each
mechanism: :data:`CASE_KINDS`):

* ``threshold``, ``mad_min``, ``boost`` (the one-shot and adaptive set-union methods) and the top-k
  domain step: per-item Gaussian/Laplace draws, per-user weights (an adaptive method's user
  weights read only the user's own items' biases; removed and dropped items are per item, the cap
  reads the user's own items), per-item thresholds: blocks are independent.
* ``policy`` and ``greedy`` (the sequential policies) visit users sequentially in a salted hash
  order, which interleaves the copies. A user only moves the weights of its own items, so a copy's
  weights depend on the relative order of its own users only; the datasets used here (users holding
  one item, weights at least 1 below the cutoff Gamma) give the same weights in every order, so the
  weights are deterministic and the copies exactly independent.
* ``dp_top_k``: with k = every item of the table, the released set is the (epsilon/2, delta/2)
  domain (the Gumbel step only ranks it), audited against (epsilon/2, delta/2).
* ``dp_group_by`` (``group_by_count``, ``group_by_median``): its aggregate step over a public domain; an
  item counts as released when its noisy count (row count) reaches n + 1 (n + max_rows), or its median
  is the lowest grid point (post-processing of the release): Laplace, Gaussian, rows and the median.
* ``dp_weighted_sample`` and ``dp_sbh_histogram`` are ELEMENT level: one draw per key, so each
  key is a copy; D has a key of frequency i, D' of frequency i + 1.

**Whole outputs (:class:`OutputCase`).** A release is everything a user observes, not only which
items it holds. Replicas see one copy's items inside a larger output, so they cannot see the
row order or the number of rows of a release. A whole-output case therefore runs the real
macro once per trial over one whole table D or D' (fresh salt and noise per query, so the
trials are independent) and its events are on the complete ordered output: the first row is
x, the rows are in sorted order, >= k / <= k rows, the output is exactly s, row r is in it, and
their complements; the pilot picks among them. Cases: the row-order attack (2000 users hold
A..E, the added user holds only E and is stored first) on every set-union method (a
sequential policy with 2 threads, as in the attack), ``dp_top_k`` (rows in its DP rank order)
and the ``dp_set_union`` dispatcher; the spelling of a released item (``spelling_*``: values equal under
a collation, the added user's spelling stored first); the number of rows (``rows_*``, a function of
the released set, audited anyway); candidate sets of ``dp_max_coverage`` / ``dp_set_cover`` (an
element that is a set's only element, removed); a private choice of method (``choice_*``: the choice's
statistic 0 on D and -1 on D', where the two candidates release an item A with very different
probabilities).
:func:`check_refusal` checks that a non-constant epsilon is refused before the charge.

Broken variants (kinds ``broken_sigma``: a Gaussian release with sigma/4, ``broken_mad_min``: MAD's
printed min{0, .}, ``broken_order``: a release without its ORDER BY, ``broken_coverage``: candidate
sets taken from the private rows), declared beside the release they break, are built on the audit's
own connection from the shipped SQL text with one substitution each (the shipped macros are not
changed); the audit must report a lower bound above their claimed epsilon.

Seeded connections are NOT private: this module is for testing the implementation only.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union, cast

import duckdb
import numpy as np
import pyarrow as pa
from scipy.special import betaincinv

import dpsql
from dpsql.core.errors import DpsqlError
from dpsql.union import adaptive
from dpsql.core import registry as mechanisms, release, sqltext
from dpsql.core.mechanism import AuditCase, Mechanism as DeclaredMechanism
from dpsql import pws
from dpsql.core.validation import DPParameterError, check_delta, check_epsilon, derived_budget

__all__ = ["AuditResult", "CASE_KINDS", "MECHANISMS", "OutputCase", "RefusalResult", "ReplicaCase", "VOLATILE_SPLIT",
           "audit", "audit_all", "cases", "check_refusal", "declared_case",
           "clopper_pearson", "epsilon_lower_bound", "to_markdown"]


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds, each holding with probability >= 1 - alpha.

    lower = Beta^{-1}(alpha; k, n - k + 1) (0 if k = 0), upper = Beta^{-1}(1 - alpha; k + 1, n - k)
    (1 if k = n) (Clopper & Pearson 1934).
    """
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise DPParameterError(f"trials must be a whole number >= 1 (got {trials!r})")
    if isinstance(successes, bool) or not isinstance(successes, (int, np.integer)) or not 0 <= successes <= trials:
        raise DPParameterError(f"successes must be a whole number in 0..trials (got {successes!r})")
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise DPParameterError(f"alpha must be a number with 0 < alpha < 1 (got {alpha!r})")
    k, n = int(successes), int(trials)
    lower = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, alpha))
    upper = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1.0 - alpha))
    return lower, upper


def epsilon_lower_bound(hits_hi: int, hits_lo: int, runs: int, delta: float, confidence: float) -> float:
    """ln((p_hi_low - delta) / p_lo_up), or 0 when p_hi_low <= delta; holds w.p. >= confidence.

    hits_hi / hits_lo: how often the event occurred on the dataset where it is likelier / less
    likely, out of ``runs`` trials each; each bound at level (1 - confidence) / 2 (Bonferroni).
    """
    confidence = _check_confidence(confidence)
    alpha = (1.0 - confidence) / 2.0
    p_hi_low, _ = clopper_pearson(hits_hi, runs, alpha)
    _, p_lo_up = clopper_pearson(hits_lo, runs, alpha)
    if p_hi_low <= delta:
        return 0.0
    return max(0.0, math.log((p_hi_low - delta) / p_lo_up))


def _check_confidence(confidence: object) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) \
            or not 0.0 < float(confidence) < 1.0:
        raise DPParameterError(f"confidence must be a number with 0 < confidence < 1 (got {confidence!r}), "
                               f"e.g. confidence := 0.95")
    return float(confidence)


def _check_runs(runs: object, name: str = "runs", least: int = 20) -> int:
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < least:
        raise DPParameterError(f"{name} must be a whole number >= {least} (got {runs!r}); "
                               f"the bounds of fewer trials are vacuous")
    return int(runs)


def _check_power(runs: int, epsilon: float, delta: float, confidence: float) -> None:
    """Refuse ``runs`` too few to ever refute ``epsilon``: even a certain event on one dataset that
    never occurs on the other (``runs`` vs 0 hits) would give a bound <= epsilon."""
    if epsilon_lower_bound(runs, 0, runs, delta, confidence) > epsilon:
        return
    need = runs
    while epsilon_lower_bound(need, 0, need, delta, confidence) <= epsilon:
        need *= 2
    raise DPParameterError(f"runs = {runs} is too few to refute epsilon = {epsilon:g} at confidence {confidence:g} "
                           f"(the largest possible bound is {epsilon_lower_bound(runs, 0, runs, delta, confidence):.2f});"
                           f" use runs >= {need}")


# --------------------------------------------------------------------------------------------
# Neighbouring pairs and their replicas
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """One small neighbouring pair. User level: ``base`` rows (user, item) are D, D' adds the rows
    ``added`` of ONE new user. Element level: ``base`` rows (key, frequency) are D and D' adds one
    element to each key in ``added``. Items/keys/users are small local ids; ``audited`` are the
    items whose number released is the per-copy statistic."""

    base: tuple[tuple[int, int], ...]
    added: tuple[tuple[int, int], ...]
    audited: tuple[int, ...]
    label: str


def _single_item_pairs(n_values: Sequence[int], t: int) -> list[Pair]:
    """n base users each holding items 0..t-1; the added user holds the same t items."""
    pairs = []
    for n in n_values:
        base = tuple((u, i) for u in range(n) for i in range(t))
        added = tuple((n, i) for i in range(t))
        pairs.append(Pair(base, added, tuple(range(t)), f"{n} users hold the {t} item(s) the added user holds"))
    return pairs


def _grid(threshold: float, scale: float, unit: float, zs: Sequence[float]) -> list[int]:
    """Base user counts n with base weight n*unit near threshold - unit + z*scale (dedup, >= 0)."""
    out = []
    for z in zs:
        n = max(0, int(round((threshold - unit + z * scale) / unit)))
        if n not in out:
            out.append(n)
    return out


_ZS = (-4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)


def _mad_min_pair(n: int, d_max: int = 4) -> Pair:
    """User B (id 0) holds x = 0 and y = 1..d_max-1; n users of degree 1 hold each y; the added
    user holds only x. Only B adapts through x, so with the correct r(i) = max{0, .} the y weights
    do not move (r(x) = 0 in both datasets); with min{0, .} r(x) goes from 1 - d_max tau to
    1 - tau/(1 + 1/d_max) and B reroutes alpha * (change)/d_max^2 more to every y."""
    base = [(0, i) for i in range(d_max)]
    uid = 1
    for y in range(1, d_max):
        for _ in range(n):
            base.append((uid, y))
            uid += 1
    return Pair(tuple(base), ((uid, 0),), tuple(range(1, d_max)),
                f"B holds x and {d_max - 1} y; {n} degree-1 users per y; added user holds x")


def _mad_min_pairs(tau: float, rho: float) -> list[Pair]:
    """:func:`_mad_min_pair` at max_adaptive_degree 4 (each y moves by ~0.15 tau ~ 1.1 sigma at
    (1, 1e-5), an ell_2 shift of ~7.5 against the sensitivity 1), n around rho and tau."""
    return [_mad_min_pair(n) for n in sorted({max(1, int(round(v)))
                                              for v in (rho - 4, rho, tau - 2, tau, tau + 2, tau + 6)})]


def _element_pairs(freqs: Sequence[int]) -> list[Pair]:
    return [Pair(((0, i),), ((0, 1),), (0,), f"key of frequency {i} vs {i + 1}") for i in freqs]


def _stack(pair: Pair, copies: int, user_level: bool) -> tuple[pa.Table, pa.Table, int]:
    """D and D' of ``copies`` disjoint copies of ``pair``; item id = copy * n_items + local item."""
    if user_level:
        n_users = max(u for u, _ in pair.base + pair.added) + 1
        n_items = max(i for _, i in pair.base + pair.added) + 1
        base = np.array(pair.base, dtype=np.int64).reshape(-1, 2)
        full = np.array(pair.base + pair.added, dtype=np.int64)
        offs = np.arange(copies, dtype=np.int64)

        def table(rows: np.ndarray) -> pa.Table:
            users = (offs[:, None] * n_users + rows[None, :, 0]).ravel()
            items = (offs[:, None] * n_items + rows[None, :, 1]).ravel()
            return pa.table({"user_id": users, "item": items})

        return table(base), table(full), n_items
    # element level: (key, frequency); D' adds one element to the listed keys
    n_items = max(k for k, _ in pair.base) + 1
    freq = np.zeros(n_items, dtype=np.int64)
    for k, f in pair.base:
        freq[k] += f
    freq2 = freq.copy()
    for k, f in pair.added:
        freq2[k] += f
    offs = np.arange(copies, dtype=np.int64)
    keys = (offs[:, None] * n_items + np.arange(n_items)[None, :]).ravel()

    def etable(f: np.ndarray) -> pa.Table:
        return pa.table({"item": keys, "n": np.tile(f, copies)})

    return etable(freq), etable(freq2), n_items


def _merge(pairs: Sequence[Pair], user_level: bool) -> tuple[Pair, list[tuple[int, ...]]]:
    """Several pairs side by side (disjoint ids) as one pair, and each one's audited items.

    D' of the merged pair adds one user per part; the parts are independent blocks, so each
    part's statistic has exactly the distribution it has on its own pair (used for the pilot).
    """
    base, added, audited = [], [], []
    u_off = i_off = 0
    for p in pairs:
        rows = p.base + p.added
        if user_level:
            base += [(u + u_off, i + i_off) for u, i in p.base]
            added += [(u + u_off, i + i_off) for u, i in p.added]
            u_off += max(u for u, _ in rows) + 1
        else:
            base += [(k + i_off, f) for k, f in p.base]
            added += [(k + i_off, f) for k, f in p.added]
        audited.append(tuple(i + i_off for i in p.audited))
        i_off += max(i for _, i in rows) + 1 if user_level else max(k for k, _ in rows) + 1
    merged = Pair(tuple(base), tuple(added), tuple(a for part in audited for a in part), "merged")
    return merged, audited


def _released_counts(items: np.ndarray, audited: Sequence[int], n_items: int, copies: int) -> np.ndarray:
    """Per copy, how many of the ``audited`` local items were released."""
    items = np.asarray(items, dtype=np.int64)
    hit = np.isin(items % n_items, np.array(audited, dtype=np.int64))
    return np.bincount(items[hit] // n_items, minlength=copies)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplicaCase:
    """An audited release: SQL over table ``{tbl}``, its claimed (epsilon, delta) and the pairs."""

    name: str
    sql: Callable[[float, float], str]
    claim: Callable[[float, float], tuple[float, float]]
    pairs: Callable[[float, float], list[Pair]]
    user_level: bool = True
    setup: Optional[Callable[[object], None]] = None
    broken: bool = False
    note: str = ""


def _substitute(statement: str, old: str, new: str) -> str:
    if statement.count(old) != 1:
        raise DpsqlError(f"dpsql.tools.audit: expected exactly one {old!r} in the shipped macro "
                           f"(found {statement.count(old)}); update the audit variant")
    return statement.replace(old, new)


def _variant(shipped: str, name: str, body: Sequence[tuple[str, str]] = ()) -> str:
    """The statement creating macro ``name``: the shipped macro ``shipped`` (its header, generated for a
    mechanism's body, and its body) with the substitutions ``body`` in its body."""
    try:
        macro = sqltext.macro(shipped)
    except sqltext.SqlTextError:
        raise DpsqlError(f"dpsql.tools.audit: macro {shipped} not found in the shipped SQL; update the audit "
                         f"variant") from None
    text = macro.body
    for old, new in body:
        text = _substitute(text, old, new)
    return macro.renamed(name, text).sql


def _broken_release(con, name: str, macro: str, body: Sequence[tuple[str, str]] = (),
                    wrapper: Sequence[tuple[str, str]] = ()) -> None:
    """Mechanism ``name``'s release registered as ``macro``: its shipped body with the substitutions
    ``body``, inside its generated wrapper with the substitutions ``wrapper``."""
    declared = mechanisms.all_mechanisms()[name]
    variant = dataclasses.replace(declared, macro=macro)
    con.execute(_variant(release.body_macro(declared), release.body_macro(variant), body))
    text = release.wrapper_sql(variant)
    for old, new in wrapper:
        text = _substitute(text, old, new)
    con.execute(text)


def _register_broken_sigma(con, name: str) -> None:
    """Gaussian release ``name`` with noise sigma/4 (threshold unchanged): a wrong calibration."""
    _broken_release(con, name, "dp__audit_broken_sigma",
                    body=[("dp_gaussian_noise(scale)", "dp_gaussian_noise(scale / 4.0)")])


def _register_broken_mad(con, name: str) -> None:
    """MAD release ``name`` with the printed r(i) = min{0, (w_init - tau)/w_init} of Alg. 3 line 6 (the erratum)."""
    stage = _variant("dp__mad_stage", "dp__audit_min_mad_stage", [
        ("SELECT item, (w_init - tau) / w_init AS r", "SELECT item, least(0.0, (w_init - tau) / w_init) AS r"),
        # every item with w_init > 0 now has r <= 0 (r = 0 if w_init = 0, as in the proof note of MAD)
        ("WHERE w_init > tau)", "WHERE w_init > 0)")])
    weights = _variant("dp__mad_weights", "dp__audit_min_mad_weights",
                       [("FROM dp__mad_stage(", "FROM dp__audit_min_mad_stage(")])
    for statement in (stage, weights):
        con.execute(statement)
    _broken_release(con, name, "dp__audit_min_mad", body=[("FROM dp__mad_stage(", "FROM dp__audit_min_mad_stage(")])


def _calibrate(mech: DeclaredMechanism, epsilon: float, delta: float, max_items: int):
    """``mech``'s declared calibration at (epsilon, delta, max_items): its noise ``scale`` and ``threshold``
    (as :func:`dpsql.calibrate` for a set-union method; the audit's values are shares of checked ones)."""
    assert mech.calibrate is not None, mech.name
    with derived_budget():
        return mech.calibrate(epsilon, delta, max_items)


def _threshold_pairs(mech: DeclaredMechanism, max_items: int, t: int, unit: float):
    def pairs(epsilon: float, delta: float) -> list[Pair]:
        cal = _calibrate(mech, epsilon, delta, max_items)
        return _single_item_pairs(_grid(cal.threshold, cal.scale, unit, _ZS), t)
    return pairs


def _set_union_sql(macro: str, max_items: Optional[int], extra: str = "") -> Callable[[float, float], str]:
    cap = "" if max_items is None else f", max_items := {max_items}"
    return lambda e, d: f"SELECT item FROM {macro}('{{tbl}}', epsilon := {e!r}, delta := {d!r}{cap}{extra})"


def _same(e: float, d: float) -> tuple[float, float]:
    return e, d


def _mad_min_pair_fn(epsilon: float, delta: float) -> list[Pair]:
    r = adaptive.mad_round(epsilon, delta, 100, 4)
    return _mad_min_pairs(r.tau, r.rho)


def _pws_pairs(epsilon: float, delta: float) -> list[Pair]:
    pi = pws.key_probabilities(epsilon, delta, 200)
    # frequencies whose reporting probability is between 1e-4 and 0.999 (the informative range)
    return _element_pairs([int(i) for i in range(1, len(pi) - 1) if 1e-4 <= pi[i] <= 0.999][:12])


def _sbh_pairs(epsilon: float, delta: float) -> list[Pair]:
    threshold = pws.sbh_threshold(epsilon, delta)
    return _element_pairs(_grid(threshold, 1.0 / epsilon, 1.0, _ZS))


def _boost_pairs(mech: DeclaredMechanism):
    """The cumulative rule's dropping and cap: n users hold item 0; the added user holds it and three
    items of its own, which the early rounds drop, so its weight on item 0 grows from 1/2 to
    min(1/sqrt(1), 2/sqrt(4)) = 1, the largest the cap allows (sensitivity 1 on item 0)."""
    def pairs(epsilon: float, delta: float) -> list[Pair]:
        cal = _calibrate(mech, epsilon, delta, 100)
        out = []
        for n in _grid(cal.threshold, cal.scale, 1.0, _ZS):
            base = tuple((u, 0) for u in range(n))
            added = tuple((n, i) for i in range(4))
            out.append(Pair(base, added, (0, 1, 2, 3),
                            f"{n} users hold item 0; the added user holds it and 3 items of its own"))
        return out
    return pairs


def _greedy_pairs(mech: DeclaredMechanism, alpha: float):
    def pairs(epsilon: float, delta: float) -> list[Pair]:
        cal = _calibrate(mech, epsilon, delta, 1)
        # Gamma = max(rho + alpha/epsilon, 1): keep base weights <= Gamma - 1 (order-invariant fills)
        gamma = max(cal.threshold + alpha / epsilon, 1.0)
        return _single_item_pairs([n for n in _grid(cal.threshold, cal.scale, 1.0, _ZS) if n <= gamma - 1], 1)
    return pairs


def _policy_pairs(mech: DeclaredMechanism):
    def pairs(epsilon: float, delta: float) -> list[Pair]:
        cal = _calibrate(mech, epsilon, delta, 100)
        gamma = cal.threshold + 5.0 * cal.scale   # alpha = 5 (the default): Gamma = rho + alpha * scale
        return _single_item_pairs([n for n in _grid(cal.threshold, cal.scale, 1.0, _ZS) if n <= gamma - 1], 1)
    return pairs


def _top_k_pairs(domain: DeclaredMechanism):
    """Pairs for the domain step: ``domain`` (the default domain method) at (epsilon/2, delta/2)."""
    def pairs(epsilon: float, delta: float) -> list[Pair]:
        cal = _calibrate(domain, epsilon / 2, delta / 2, 100)
        return _single_item_pairs(_grid(cal.threshold, cal.scale, 1.0, _ZS), 1)
    return pairs


def _declared(name: str) -> DeclaredMechanism:
    return mechanisms.all_mechanisms()[name]


def _broken_sigma_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    """The audit's own instrument: ``mech`` (a one-shot Gaussian release) with sigma/4 (:func:`_register_broken_sigma`)."""
    return ReplicaCase(name or "broken_sigma", _set_union_sql("dp__audit_broken_sigma", 100), _same,
                       _threshold_pairs(mech, 100, 1, 1.0), setup=lambda con: _register_broken_sigma(con, mech.name),
                       broken=True, note=note or f"BROKEN: {mech.name} with sigma/4")


def _broken_mad_min_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    """The audit's own instrument: ``mech`` (MAD) with the printed min{0, .} (:func:`_register_broken_mad`)."""
    return ReplicaCase(name or "broken_mad_min", _set_union_sql("dp__audit_min_mad", 100, ", max_adaptive_degree := 4"),
                       _same, _mad_min_pair_fn, setup=lambda con: _register_broken_mad(con, mech.name), broken=True,
                       note=note or "BROKEN: MAD with r(i) = min{0, .}, max_adaptive_degree 4")


# --------------------------------------------------------------------------------------------
# Whole-output cases: one release of the real macro per trial
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OutputPair:
    """Neighbouring tables D (``d0``) and D' (``d1``), rows stored in the given order (the order
    is part of the attack: an added row stored first must not move the release's first row)."""

    d0: pa.Table
    d1: pa.Table
    label: str


@dataclass(frozen=True)
class OutputCase:
    """An audited release whose trials are whole runs of ``sql`` over one table: the events are on
    the complete ordered output (its first row, whether it is sorted, its number of rows, the exact
    output, a row being in it). ``threads``: DuckDB threads of the audit connection."""

    name: str
    sql: Callable[[float, float], str]
    claim: Callable[[float, float], tuple[float, float]]
    pairs: Callable[[float, float], list[OutputPair]]
    setup: Optional[Callable[[object], None]] = None
    broken: bool = False
    note: str = ""
    threads: int = 1


# Items A..E under names too long for DuckDB's compressed keys: a GROUP BY over one-letter strings
# (packed into small integers) comes out in key order, hiding the hash-table order whose leak the
# broken case must show; the shipped macros sort either way.
_ORDER_ITEMS = tuple(f"order audit item {c}" for c in "ABCDE")
_ORDER_USERS = 2000


def _order_pairs(epsilon: float, delta: float) -> list[OutputPair]:
    """D: 2000 users each holding A..E (every item far above any threshold); D' adds, as the FIRST
    stored row, one user holding only E. Which items are released hardly depends on that user
    (weights capped at Gamma by the policies can miss an item, equally often on D and D'), so the
    difference to look for is in the order of the rows."""
    d0 = pa.table({"user_id": np.repeat(np.arange(_ORDER_USERS, dtype=np.int64), len(_ORDER_ITEMS)),
                   "item": list(_ORDER_ITEMS) * _ORDER_USERS})
    d1 = pa.concat_tables([pa.table({"user_id": np.array([-1], dtype=np.int64), "item": [_ORDER_ITEMS[-1]]}), d0])
    return [OutputPair(d0, d1, f"{_ORDER_USERS} users hold A..E; the added user holds E, stored first")]


_ROWS_T = 4


def _row_count_pairs(mech: DeclaredMechanism):
    """n users each holding items 0..3, D' adds (stored first) a user holding the same 4 items; n
    puts each item's weight n/2 (weighted Gaussian, 1/sqrt(4) per user) near rho - 1/2 + z sigma."""
    def pairs(epsilon: float, delta: float) -> list[OutputPair]:
        cal = _calibrate(mech, epsilon, delta, 100)
        out = []
        for n in _grid(cal.threshold, cal.scale, 1.0 / math.sqrt(_ROWS_T), (-1.0, 0.0, 1.0)):
            d0 = pa.table({"user_id": np.repeat(np.arange(n, dtype=np.int64), _ROWS_T),
                           "item": np.tile(np.arange(_ROWS_T, dtype=np.int64), n)})
            d1 = pa.concat_tables([pa.table({"user_id": np.full(_ROWS_T, -1, dtype=np.int64),
                                             "item": np.arange(_ROWS_T, dtype=np.int64)}), d0])
            out.append(OutputPair(d0, d1, f"{n} users hold the {_ROWS_T} items the added user holds"))
        return out
    return pairs


def _choice_pairs(mech: DeclaredMechanism, choice_share: float, degree_bound: int):
    """A private choice between candidates (its calibration's ``greedy`` candidate, ``choice_epsilon``):
    w users hold only item A, w = ceil(rho + 2 b) of the greedy candidate (it releases A with probability
    1 - e^-2/2 ~ 0.93, the default candidate's higher threshold rarely), and w users hold the
    degree_bound + 3 items H0.. each: the statistic is 0 on D; D' adds (stored first) one more user of the H
    items, -1. Which candidate runs, so whether A is released, moves with the choice's noise alone."""
    def pairs(epsilon: float, delta: float) -> list[OutputPair]:
        calibrate = mech.calibrate
        assert calibrate is not None  # a mechanism with a choice declares its calibration
        with derived_budget():
            cal = calibrate(epsilon, delta, 100, choice_share=choice_share, degree_bound=degree_bound)
        w = math.ceil(cal.greedy.threshold + 2.0 * cal.greedy.scale)
        k = degree_bound + 3
        light = pa.table({"user_id": np.arange(w, dtype=np.int64), "item": ["choice audit item A"] * w})
        heavy = pa.table({"user_id": np.repeat(np.arange(w, 2 * w, dtype=np.int64), k),
                          "item": [f"choice audit item H{j}" for j in range(k)] * w})
        d0 = pa.concat_tables([light, heavy])
        d1 = pa.concat_tables([pa.table({"user_id": np.full(k, -1, dtype=np.int64),
                                         "item": [f"choice audit item H{j}" for j in range(k)]}), d0])
        return [OutputPair(d0, d1, f"{w} users hold only A, {w} hold {k} items each (statistic 0); the added "
                                   f"user holds the {k} items (statistic -1)")]
    return pairs


def _coverage_pairs(epsilon: float, delta: float) -> list[OutputPair]:
    """The record (element) 3 is the only element of set B: D holds it, D' does not."""
    d0 = pa.table({"set_id": ["A", "A", "B"], "element": np.array([1, 2, 3], dtype=np.int64)})
    d1 = d0.slice(0, 2)
    return [OutputPair(d0, d1, "sets A = {1, 2}, B = {3}; D' removes element 3")]


_SPELLING_USERS = 300


def _spelling_pairs(epsilon: float, delta: float) -> list[OutputPair]:
    """D: 300 users hold 'cafe'; D' adds, as the FIRST stored row, one user holding 'café'. Read under an
    accent-blind collation, the two spellings compare equal: a release that kept whichever row's spelling
    it met first would show 'café' on D' only (the attack on item identity)."""
    d0 = pa.table({"user_id": np.arange(_SPELLING_USERS, dtype=np.int64), "item": ["cafe"] * _SPELLING_USERS})
    d1 = pa.concat_tables([pa.table({"user_id": np.array([-1], dtype=np.int64), "item": ["café"]}), d0])
    return [OutputPair(d0, d1, f"{_SPELLING_USERS} users hold 'cafe'; the added user holds 'café' "
                               "(equal under NOACCENT), stored first")]


def _spelling_sql(macro: str) -> Callable[[float, float], str]:
    # The table read through a CTE that gives the items an accent-blind collation.
    return lambda e, d: (f"WITH dp__audit_noaccent AS (SELECT user_id, item COLLATE NOACCENT AS item FROM {{tbl}}) "
                         f"SELECT item FROM {macro}('dp__audit_noaccent', epsilon := {e!r}, delta := {d!r})")


def _register_unsorted(con, name: str) -> None:
    """Release ``name`` whose output keeps the engine's hash order (its wrapper without ORDER BY ALL):
    a row-order leak."""
    _broken_release(con, name, "dp__audit_unsorted", wrapper=[("\nORDER BY ALL;", ";")])


_CANDIDATES = "dp__audit_candidates"


def _create_candidates(con) -> None:
    """The public candidate sets A and B of :func:`_coverage_pairs` (the same table for D and D')."""
    con.execute(f"CREATE OR REPLACE TABLE {_CANDIDATES} AS SELECT unnest(['A', 'B']) AS set_id")


def _register_private_candidates(con, name: str) -> None:
    """Coverage release ``name`` whose candidate sets are the set ids of the PRIVATE rows (the attack): a
    set whose only element is removed leaves the output's support."""
    _create_candidates(con)
    _broken_release(con, name, "dp__audit_private_candidates",
                    body=[("FROM dp__candidate_sets(candidates_tbl,", "FROM dp__candidate_sets(tbl,")])


def _coverage_sql(macro: str, k: Optional[int]) -> Callable[[float, float], str]:
    k_arg = "" if k is None else f", {k}"
    columns = "rank" if k is not None else "position"
    return lambda e, d: (f"SELECT {columns}, set_id FROM {macro}('{{tbl}}', '{_CANDIDATES}'{k_arg}, "
                         f"epsilon := {e!r})")


def _pure(e: float, d: float) -> tuple[float, float]:
    return e, 0.0


def _own_output_cases() -> list[OutputCase]:
    """The audit's own whole-output cases: the ``dp_set_union`` dispatcher (generated, not a declaration)."""
    return [
        OutputCase("order_set_union", lambda e, d: f"SELECT item FROM dp_set_union('{{tbl}}', epsilon := {e!r}, "
                                                   f"delta := {d!r})",
                   _same, _order_pairs, note="row order through the dispatcher (default method)"),
        OutputCase("spelling_set_union", _spelling_sql("dp_set_union"), _same, _spelling_pairs,
                   note="item spelling through the dispatcher (default method)"),
    ]


def _broken_order_case(mech: DeclaredMechanism, name: str, note: str) -> OutputCase:
    """The audit's own instrument: ``mech`` without its ORDER BY (:func:`_register_unsorted`)."""
    return OutputCase(name or "broken_order", _set_union_sql("dp__audit_unsorted", 100), _same, _order_pairs,
                      setup=lambda con: _register_unsorted(con, mech.name), broken=True,
                      note=note or f"BROKEN: {mech.name} without ORDER BY")


def _broken_coverage_case(mech: DeclaredMechanism, name: str, note: str) -> OutputCase:
    """The audit's own instrument: ``mech`` with candidate sets from the private rows
    (:func:`_register_private_candidates`)."""
    return OutputCase(name or "broken_coverage", _coverage_sql("dp__audit_private_candidates", 5), _pure,
                      _coverage_pairs, setup=lambda con: _register_private_candidates(con, mech.name), broken=True,
                      note=note or "BROKEN: max coverage with candidate sets from the private rows")


# -- the kinds of case a declaration names (Mechanism.audit: AuditCase.kind) ---------------------------
# Each builds the case from the declaration, the case's name ("" = the kind's default) and note, and the
# declared options.

def _threshold_case(mech: DeclaredMechanism, name: str, note: str, max_items: int, t: int) -> ReplicaCase:
    """Replicas: n users hold the t items the added user holds, n around the threshold (max_items := cap);
    ``mech.calibrate(epsilon, delta, max_items)`` gives the scale and threshold."""
    return ReplicaCase(name or mech.name, _set_union_sql(mech.macro, max_items), _same,
                       _threshold_pairs(mech, max_items, t, 1.0), note=note)


def _mad_min_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    """Replicas of MAD's rerouting dataset at max_adaptive_degree 4 (:func:`_mad_min_pair`)."""
    return ReplicaCase(name or f"{mech.name}_adaptive", _set_union_sql(mech.macro, 100, ", max_adaptive_degree := 4"),
                       _same, _mad_min_pair_fn, note=note)


def _boost_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    return ReplicaCase(name or f"{mech.name}_boost", _set_union_sql(mech.macro, 100), _same, _boost_pairs(mech),
                       note=note)


def _policy_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    return ReplicaCase(name or mech.name, _set_union_sql(mech.macro, 100), _same, _policy_pairs(mech), note=note)


def _greedy_case(mech: DeclaredMechanism, name: str, note: str, alpha: float) -> ReplicaCase:
    return ReplicaCase(name or mech.name, _set_union_sql(mech.macro, None, f", alpha := {alpha}"), _same,
                       _greedy_pairs(mech, alpha), note=note)


def _top_k_domain_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    """Replicas of ``dp_top_k`` with k = every item: the released set is the (epsilon/2, delta/2) domain of the
    default domain method (the Gumbel step only ranks it)."""
    domain = _declared(mech.param("domain_method").default)
    return ReplicaCase(name or f"{mech.name}_domain",
                       lambda e, d: (f"SELECT item FROM {mech.macro}('{{tbl}}', {{n_items}}, "
                                     f"epsilon := {e!r}, delta := {d!r}, max_items := 100)"),
                       lambda e, d: (e / 2, d / 2), _top_k_pairs(domain), note=note)


def _group_by_count_case(mech: DeclaredMechanism, name: str, note: str, aggregate: str = "count") -> ReplicaCase:
    """Replicas of a public-domain GROUP BY's count (or row count) at max_groups 2: 3 users hold 2 public groups,
    the added user both; a group counts as released when its noisy count is >= n + 1 = 4. ``mech``:
    ``dp_group_by_public`` (Laplace, (epsilon, 0)) or ``dp_group_by`` with ``items_tbl`` (its default noise,
    Gaussian, at (epsilon, delta)). ``aggregate`` 'rows': the added user has 3 rows per group (the view
    ``dp__audit_rows``), max_rows 3, and a group counts when its noisy row count is >= 3 + 3."""
    def rows_view(con) -> None:  # the added user (local id 3 of 4) has three rows of each of its groups
        con.execute("CREATE TABLE IF NOT EXISTS dp__audit_data (user_id BIGINT, item BIGINT)")
        con.execute("CREATE OR REPLACE VIEW dp__audit_rows AS SELECT user_id, item FROM dp__audit_data "
                    "UNION ALL SELECT user_id, item FROM dp__audit_data, range(2) WHERE user_id % 4 = 3")

    table, extra, cut = "{tbl}", "", 4
    setup: Optional[Callable[[object], None]] = None
    if aggregate == "rows":
        table, extra, cut, setup = "dp__audit_rows", ", aggregates := ['rows'], max_rows := 3", 6, rows_view
    public = "delta" not in mech.param_names
    column = "rows" if aggregate == "rows" else "count"

    def sql(e: float, d: float) -> str:
        call = (f"{mech.macro}('{table}', '{{tbl}}', epsilon := {e!r}" if public
                else f"{mech.macro}('{table}', epsilon := {e!r}, delta := {d!r}, items_tbl := '{{tbl}}'")
        return f"SELECT item FROM {call}, max_items := 2{extra}) WHERE \"{column}\" >= {cut}"

    return ReplicaCase(name or f"{mech.name}_{aggregate}", sql, _pure if public else _same,
                       lambda e, d: _single_item_pairs([3], 2), setup=setup, note=note)


def _group_by_median_case(mech: DeclaredMechanism, name: str, note: str, users: int = 20) -> ReplicaCase:
    """Replicas of a public-domain GROUP BY's median at max_groups 2, Laplace: ``users`` users hold 2 public groups
    with value 0, the added user both with value 10 (the view ``dp__audit_median``); a group counts as released
    when its median over [0, 10] is 0. With 20 users the grid point 0 has utility 0 (others -20) without the
    added user and -1 (others -19, -20) with it: the likeliest point, whose probability moves most."""
    def setup(con) -> None:  # local user `users` of users + 1 is the added one
        con.execute("CREATE TABLE IF NOT EXISTS dp__audit_data (user_id BIGINT, item BIGINT)")
        con.execute(f"CREATE OR REPLACE VIEW dp__audit_median AS SELECT user_id, item, "
                    f"CASE WHEN user_id % {users + 1} = {users} THEN 10.0 ELSE 0.0 END AS v FROM dp__audit_data")
    return ReplicaCase(name or f"{mech.name}_median",
                       lambda e, d: (f"SELECT item FROM {mech.macro}('dp__audit_median', '{{tbl}}', epsilon := {e!r}, "
                                     f"max_items := 2, aggregates := ['median'], value_col := 'v', lower := 0, "
                                     f"upper := 10) WHERE median = 0"),
                       _pure, lambda e, d: _single_item_pairs([users], 2), setup=setup, note=note)


def _group_by_selection_case(mech: DeclaredMechanism, name: str, note: str, selection: str,
                              max_groups: int) -> ReplicaCase:
    """Replicas of one of dp_group_by's own selection rules (``selection``, as the declaration's AuditCase passes
    it; the rules of :mod:`dpsql.groupby.selection`) at ``max_groups`` L0: n users hold the L0 groups the added
    user holds; the statistic is how many of them are released. Which rule it is, the calibration says: a coin
    per group (``selection_group_epsilon`` set): n where the keep probability is in [1e-4, 0.999], claim the
    selection's ``(epsilon split, delta split)`` (the released set is a function of the selection alone); a
    threshold on the noisy count (``selection_threshold`` set): n around the threshold, claim the release's
    (epsilon, delta) (its set is a function of the noisy counts)."""
    from dpsql.groupby import calibration as gbc, selection as rules

    def cal(e: float, d: float):
        with derived_budget():
            return gbc.group_by_calibration(e, d, max_groups, selection=selection, max_groups=max_groups)

    def claim(e: float, d: float) -> tuple[float, float]:
        c = cal(e, d)
        return (c.selection_epsilon, c.selection_delta) if c.selection_group_epsilon is not None else (e, d)

    def pairs(e: float, d: float) -> list[Pair]:
        c = cal(e, d)
        if c.selection_group_epsilon is not None:
            assert c.selection_group_delta is not None
            p = rules.keep_probabilities(c.selection_group_epsilon, c.selection_group_delta)
            ns = [n - 1 for n in range(1, len(p)) if 1e-4 <= p[n] <= 0.999]
            ns = [ns[i] for i in sorted({round(j * (len(ns) - 1) / 11) for j in range(12)})]  # <= 12, spread
        else:
            assert c.selection_threshold is not None and c.count_scale is not None
            ns = _grid(c.selection_threshold, c.count_scale, 1.0, _ZS)
        return _single_item_pairs(ns, max_groups)

    return ReplicaCase(name or f"{mech.name}_{selection}",
                       lambda e, d: (f"SELECT item FROM {mech.macro}('{{tbl}}', epsilon := {e!r}, delta := {d!r}, "
                                     f"max_items := {max_groups}, max_groups := {max_groups}, "
                                     f"selection := '{selection}')"),
                       claim, pairs, note=note)


def _element_sql(macro: str) -> Callable[[float, float], str]:
    return lambda e, d: (f"SELECT key AS item FROM {macro}('{{tbl}}', {e!r}, {d!r}, "
                         f"key_col := 'item', freq_col := 'n')")


def _element_sample_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    """Element level, one key a copy: a key of frequency i vs i + 1, i where PWS reports with probability
    in [1e-4, 0.999]."""
    return ReplicaCase(name or mech.name, _element_sql(mech.macro), _same, _pws_pairs, user_level=False, note=note)


def _element_histogram_case(mech: DeclaredMechanism, name: str, note: str) -> ReplicaCase:
    """Element level, one key a copy: frequencies around the stability-based histogram's threshold."""
    return ReplicaCase(name or mech.name, _element_sql(mech.macro), _same, _sbh_pairs, user_level=False, note=note)


def _order_case(mech: DeclaredMechanism, name: str, note: str, max_items: Optional[int] = None,
                threads: int = 1) -> OutputCase:
    """Whole outputs of the row-order attack (:func:`_order_pairs`) on a set-union release."""
    return OutputCase(name or f"order_{mech.name}", _set_union_sql(mech.macro, max_items), _same, _order_pairs,
                      note=note, threads=threads)


def _order_ranked_case(mech: DeclaredMechanism, name: str, note: str, k: int) -> OutputCase:
    """Whole outputs of the row-order attack on a ranked release of k rows (rank, item)."""
    return OutputCase(name or f"order_{mech.name}",
                      lambda e, d: f"SELECT rank, item FROM {mech.macro}('{{tbl}}', {k}, epsilon := {e!r}, "
                                   f"delta := {d!r})",
                      _same, _order_pairs, note=note)


def _rows_case(mech: DeclaredMechanism, name: str, note: str) -> OutputCase:
    """Whole outputs: the number of rows (n users hold 4 items, n around the threshold)."""
    return OutputCase(name or f"rows_{mech.name}", _set_union_sql(mech.macro, 100), _same, _row_count_pairs(mech),
                      note=note)


def _spelling_case(mech: DeclaredMechanism, name: str, note: str) -> OutputCase:
    return OutputCase(name or f"spelling_{mech.name}", _spelling_sql(mech.macro), _same, _spelling_pairs, note=note)


def _choice_case(mech: DeclaredMechanism, name: str, note: str, choice_share: float,
                 degree_bound: int = 5) -> OutputCase:
    """Whole outputs of a release that privately chooses its method (:func:`_choice_pairs`)."""
    return OutputCase(name or f"choice_{mech.name}",
                      _set_union_sql(mech.macro, 100, f", choice_share := {choice_share!r}, "
                                                      f"degree_bound := {degree_bound!r}"),
                      _same, _choice_pairs(mech, choice_share, degree_bound), note=note)


def _coverage_case(mech: DeclaredMechanism, name: str, note: str, k: Optional[int] = None) -> OutputCase:
    """Whole outputs of a record-level release over public candidate sets (``k`` sets, or a cover)."""
    return OutputCase(name or f"coverage_{mech.name}", _coverage_sql(mech.macro, k), _pure, _coverage_pairs,
                      setup=_create_candidates, note=note)


# The kinds a declaration may name (AuditCase.kind).
CASE_KINDS: dict[str, Callable[..., Union[ReplicaCase, OutputCase]]] = {
    "threshold": _threshold_case, "mad_min": _mad_min_case, "boost": _boost_case, "policy": _policy_case,
    "greedy": _greedy_case, "top_k_domain": _top_k_domain_case, "group_by_count": _group_by_count_case,
    "group_by_median": _group_by_median_case, "group_by_selection": _group_by_selection_case,
    "element_sample": _element_sample_case, "element_histogram": _element_histogram_case,
    "order": _order_case, "order_ranked": _order_ranked_case, "rows": _rows_case, "spelling": _spelling_case,
    "coverage": _coverage_case, "choice": _choice_case,
    # the audit's own instruments (broken variants it must refute), declared beside the release they break
    "broken_sigma": _broken_sigma_case, "broken_mad_min": _broken_mad_min_case, "broken_order": _broken_order_case,
    "broken_coverage": _broken_coverage_case,
}


def declared_case(mech: DeclaredMechanism, spec: AuditCase) -> Union[ReplicaCase, OutputCase]:
    """The audit case ``spec`` of the declaration ``mech``."""
    if spec.kind not in CASE_KINDS:
        raise DpsqlError(f"dpsql.tools.audit: {mech.name} declares an audit case of unknown kind {spec.kind!r}; "
                         f"the kinds are {', '.join(CASE_KINDS)}")
    return CASE_KINDS[spec.kind](mech, spec.name, spec.note, **dict(spec.options))


def cases() -> dict[str, Union[ReplicaCase, OutputCase]]:
    """Every audit case, derived from the registry: the replica cases the declarations name (in the
    registry's order; the broken ones last), then the whole-output cases the declarations name, the
    audit's own (the dispatcher's) and the broken ones."""
    declared = [declared_case(m, spec) for m in mechanisms.all_mechanisms().values() for spec in m.audit]
    replica = [c for c in declared if isinstance(c, ReplicaCase)]
    output = [c for c in declared if isinstance(c, OutputCase)]
    ordered = ([c for c in replica if not c.broken] + [c for c in replica if c.broken]
               + [c for c in output if not c.broken] + _own_output_cases() + [c for c in output if c.broken])
    out: dict[str, Union[ReplicaCase, OutputCase]] = {}
    for case in ordered:
        if case.name in out:
            raise DpsqlError(f"dpsql.tools.audit: two audit cases are named {case.name!r}; name one (AuditCase.name)")
        out[case.name] = case
    return out


class _Cases(Mapping[str, Union[ReplicaCase, OutputCase]]):
    """:func:`cases` as a mapping, read afresh at each use (a family added to the registry is audited)."""

    def __getitem__(self, name: str) -> Union[ReplicaCase, OutputCase]:
        return cases()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(cases())

    def __len__(self) -> int:
        return len(cases())

    def __contains__(self, name: object) -> bool:
        return name in cases()


# Every case by name: what :func:`audit`, :func:`check_refusal` and :func:`audit_all` run.
MECHANISMS: Mapping[str, Union[ReplicaCase, OutputCase]] = _Cases()


# --------------------------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditResult:
    """One audit: the claim, the lower bound at ``confidence``, and the event that gave it.

    ``p_hat`` = (empirical P of the event on the dataset where it is likelier, on the other one);
    ``p_bounds`` = (Clopper-Pearson lower bound of the first, upper bound of the second).
    """

    mechanism: str
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    runs: int
    event: str
    p_hat: tuple[float, float]
    p_bounds: tuple[float, float]
    confidence: float
    dataset: str
    seconds: float = field(default=0.0, compare=False)

    @property
    def refuted(self) -> bool:
        """True iff the audit shows, at ``confidence``, that the claim does not hold."""
        return self.epsilon_lower_bound > self.claimed_epsilon


def _events(t: int) -> list[tuple[str, Callable[[np.ndarray], np.ndarray]]]:
    """Events on a copy's number c of audited items released: c >= k and c <= k."""
    # The ignores: mypy cannot infer a lambda with a default argument (k, bound per event) against its type.
    out: list[tuple[str, Callable[[np.ndarray], np.ndarray]]] = [
        (f">= {k} of {t} released", (lambda c, k=k: c >= k)) for k in range(1, t + 1)]  # type: ignore[misc]
    out += [(f"<= {k} of {t} released", (lambda c, k=k: c <= k)) for k in range(0, t)]  # type: ignore[misc]
    return out


def _load(con, data: pa.Table) -> None:
    """``data`` as the table dp__audit_data, rows stored in their order (DuckDB's preserve_insertion_order)."""
    con.execute("DROP TABLE IF EXISTS dp__audit_data")
    con.register("dp__audit_arrow", data)
    con.execute("CREATE TABLE dp__audit_data AS SELECT * FROM dp__audit_arrow")
    con.unregister("dp__audit_arrow")


def _run(con, mechanism: ReplicaCase, epsilon: float, delta: float, pairs: Sequence[Pair], copies: int
         ) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each pair, the per-copy released counts on D and on D' (one SQL call per dataset)."""
    merged, audited = _merge(pairs, mechanism.user_level)
    d0, d1, n_items = _stack(merged, copies, mechanism.user_level)
    counts = []
    for data in (d0, d1):
        _load(con, data)
        sql = mechanism.sql(epsilon, delta).replace("{tbl}", "dp__audit_data")
        sql = sql.replace("{n_items}", str(n_items * copies))
        items = con.sql(sql).to_arrow_table().column("item").to_numpy()
        counts.append([_released_counts(items, a, n_items, copies) for a in audited])
    return list(zip(counts[0], counts[1]))


def _best(c0: np.ndarray, c1: np.ndarray, t: int, runs: int, delta: float, confidence: float
          ) -> tuple[float, str, Callable, bool]:
    """The event of :func:`_events` and direction with the largest predicted bound at ``runs`` trials."""
    return _best_of([(name, ev, int(np.sum(ev(c0))), int(np.sum(ev(c1)))) for name, ev in _events(t)],
                    len(c0), runs, delta, confidence)


def _best_of(hits: Sequence[tuple[str, Callable, int, int]], n: int, runs: int, delta: float, confidence: float
             ) -> tuple[float, str, Callable, bool]:
    """Of events ``(name, predicate, hits on D, hits on D')`` seen in ``n`` pilot trials, the one and
    the direction with the largest predicted bound at ``runs`` trials.

    The prediction plugs pessimistic pilot estimates (one-sided Clopper-Pearson at ~1 standard
    deviation, alpha = 0.16) into :func:`epsilon_lower_bound`: events seen only a few times in
    the pilot are not favoured by their noise. Ties (typically all 0) go to the largest difference
    of pilot hits, so the report names the event that differed most.
    """
    best: tuple[float, str, Optional[Callable], bool] = (-1.0, "", None, True)
    key = (-1.0, -1)
    for name, ev, k0, k1 in hits:
        for forward, (hi, lo) in ((True, (k1, k0)), (False, (k0, k1))):
            p_hi = clopper_pearson(hi, n, 0.16)[0]
            p_lo = clopper_pearson(lo, n, 0.16)[1]
            b = epsilon_lower_bound(int(round(p_hi * runs)), min(runs, int(round(p_lo * runs))), runs, delta,
                                    confidence)
            if (b, hi - lo) > key:
                best, key = (b, name, ev, forward), (b, hi - lo)
    # the first event replaces the placeholder (every bound is >= 0 > -1): ev is set when hits is not empty
    return cast(tuple[float, str, Callable, bool], best)


def _audit_replicas(con, mech: ReplicaCase, epsilon: float, delta: float, runs: int, pilot_runs: int,
                    confidence: float) -> tuple[Pair, str, int, int, bool]:
    """Pilot over every candidate pair's copies, then ``runs`` fresh copies of the chosen pair:
    (pair, event name, hits on D, hits on D', forward)."""
    _, claimed_delta = mech.claim(epsilon, delta)
    choice: tuple[float, Optional[Pair], str, Optional[Callable], bool] = (-1.0, None, "", None, True)
    candidates = mech.pairs(epsilon, delta)
    for pair, (c0, c1) in zip(candidates, _run(con, mech, epsilon, delta, candidates, pilot_runs)):
        b, name, ev, forward = _best(c0, c1, len(pair.audited), runs, claimed_delta, confidence)
        if b > choice[0]:
            choice = (b, pair, name, ev, forward)
    # the first candidate replaces the placeholder (every bound is >= 0 > -1): pair and ev are set
    _, pair, name, ev, forward = cast(tuple[float, Pair, str, Callable, bool], choice)
    ((c0, c1),) = _run(con, mech, epsilon, delta, [pair], runs)
    return pair, name, int(np.sum(ev(c0))), int(np.sum(ev(c1))), forward


def _row_key(row: tuple) -> tuple:
    """Sort key of an output row as DuckDB's ORDER BY ... ASC orders it (NULLs last)."""
    return tuple((v is None, v) for v in row)


def _show(value: object, width: int = 48) -> str:
    """Short printable form of a row or an output; long ones end with a digest so they stay distinct."""
    text = repr(value[0]) if isinstance(value, tuple) and len(value) == 1 else repr(value)
    if len(text) <= width:
        return text
    return f"{text[:width - 12]}...#{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _output_events(outputs: Sequence[tuple], most_common: int = 20
                   ) -> list[tuple[str, Callable[[tuple], bool]]]:
    """Events on one whole ordered output (a tuple of row tuples), from the outputs of a pilot.

    The first row is x (or there are no rows); the rows are in sorted order; >= k / <= k rows; the
    output is exactly s (the ``most_common`` outputs of the pilot); row r is in the output (the
    ``most_common`` rows). Each but the counts also as its complement.
    """
    firsts: dict[tuple, int] = {}
    exact: dict[tuple, int] = {}
    rows: dict[tuple, int] = {}
    sizes = set()
    for o in outputs:
        firsts[o[:1]] = firsts.get(o[:1], 0) + 1
        exact[o] = exact.get(o, 0) + 1
        for r in set(o):
            rows[r] = rows.get(r, 0) + 1
        sizes.add(len(o))
    base: list[tuple[str, Callable[[tuple], bool]]] = [
        ("rows in sorted order", lambda o: list(o) == sorted(o, key=_row_key))]
    # __getitem__, not get: the same count for every key, typed as a sort key (get may return None)
    # The ignores: mypy cannot infer a lambda with a default argument (bound per event) against its type.
    for f in sorted(firsts, key=firsts.__getitem__, reverse=True):
        base.append((f"first row {_show(f[0])}" if f else "no rows", lambda o, f=f: o[:1] == f))  # type: ignore[misc]
    for s in sorted(exact, key=exact.__getitem__, reverse=True)[:most_common]:
        base.append((f"output = {_show(s)}", lambda o, s=s: o == s))  # type: ignore[misc]
    for r in sorted(rows, key=rows.__getitem__, reverse=True)[:most_common]:
        base.append((f"row {_show(r)} in the output", lambda o, r=r: r in o))  # type: ignore[misc]
    events = base + [(f"NOT ({name})", lambda o, p=p: not p(o)) for name, p in base]
    top = max(sizes)
    events += [(f">= {k} rows", lambda o, k=k: len(o) >= k) for k in range(1, top + 1)]
    events += [(f"<= {k} rows", lambda o, k=k: len(o) <= k) for k in range(0, top)]
    return events


def _run_outputs(con, case: OutputCase, epsilon: float, delta: float, pair: OutputPair, trials: int
                 ) -> tuple[list[tuple], list[tuple]]:
    """``trials`` whole releases on D and on D': each output as the tuple of its rows, in order.

    Every release is a fresh query on the same connection, so it draws a fresh salt and fresh
    noise: the trials are independent.
    """
    sql = case.sql(epsilon, delta).replace("{tbl}", "dp__audit_data")
    out = []
    for data in (pair.d0, pair.d1):
        _load(con, data)
        out.append([tuple(con.sql(sql).fetchall()) for _ in range(trials)])
    return out[0], out[1]


def _audit_outputs(con, case: OutputCase, epsilon: float, delta: float, runs: int, pilot_runs: int,
                   confidence: float) -> tuple[OutputPair, str, int, int, bool]:
    """Pilot (choose pair, event, direction), then ``runs`` fresh releases per dataset of the chosen
    pair: (pair, event name, hits on D, hits on D', forward)."""
    _, claimed_delta = case.claim(epsilon, delta)
    choice: tuple[float, Optional[OutputPair], str, Optional[Callable], bool] = (-1.0, None, "", None, True)
    for pair in case.pairs(epsilon, delta):
        o0, o1 = _run_outputs(con, case, epsilon, delta, pair, pilot_runs)
        hits = [(name, ev, sum(map(ev, o0)), sum(map(ev, o1))) for name, ev in _output_events(o0 + o1)]
        b, name, ev, forward = _best_of(hits, pilot_runs, runs, claimed_delta, confidence)
        if b > choice[0]:
            choice = (b, pair, name, ev, forward)
    # the first pair replaces the placeholder (every bound is >= 0 > -1): pair and ev are set
    _, pair, name, ev, forward = cast(tuple[float, OutputPair, str, Callable, bool], choice)
    o0, o1 = _run_outputs(con, case, epsilon, delta, pair, runs)
    return pair, name, sum(map(ev, o0)), sum(map(ev, o1)), forward


def audit(mechanism: str, epsilon: float = 1.0, delta: float = 1e-5, runs: int = 20_000,
          confidence: float = 0.95, seed: int = 0, pilot_runs: Optional[int] = None) -> AuditResult:
    """Audit one mechanism of :data:`MECHANISMS` at (epsilon, delta).

    Pilot: ``pilot_runs`` trials (default runs/10, at least 250) of every candidate pair choose the
    pair, the event and the direction; then ``runs`` fresh trials of the chosen pair give the
    Clopper-Pearson bound. A trial is one copy of a replicated pair (:class:`ReplicaCase`) or one
    whole release (:class:`OutputCase`). Uses a seeded (NOT private) connection.
    """
    if not isinstance(mechanism, str) or mechanism not in MECHANISMS:
        raise DPParameterError(f"mechanism must be one of {', '.join(MECHANISMS)} (got {mechanism!r})")
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    runs = _check_runs(runs)
    confidence = _check_confidence(confidence)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DPParameterError(f"seed must be an integer (got {seed!r})")
    pilot_runs = max(250, runs // 10) if pilot_runs is None else _check_runs(pilot_runs, "pilot_runs")
    mech = MECHANISMS[mechanism]
    claimed_eps, claimed_delta = mech.claim(epsilon, delta)
    _check_power(runs, claimed_eps, claimed_delta, confidence)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the seeded connection's NOT-private warning
        con = dpsql.connect(seed=int(seed))
    try:
        con.execute("SET enable_progress_bar = false")
        if isinstance(mech, OutputCase) and mech.threads != 1:
            con.execute(f"SET threads = {int(mech.threads)}")
        if mech.setup is not None:
            mech.setup(con)
        pair: Union[Pair, OutputPair]
        if isinstance(mech, OutputCase):
            pair, name, k0, k1, forward = _audit_outputs(con, mech, epsilon, delta, runs, pilot_runs, confidence)
        else:
            pair, name, k0, k1, forward = _audit_replicas(con, mech, epsilon, delta, runs, pilot_runs, confidence)
    finally:
        con.close()
    hi, lo = (k1, k0) if forward else (k0, k1)
    alpha = (1.0 - confidence) / 2.0
    bound = epsilon_lower_bound(hi, lo, runs, claimed_delta, confidence)
    direction = "P[D'] vs P[D]" if forward else "P[D] vs P[D']"
    return AuditResult(
        mechanism=mechanism, claimed_epsilon=claimed_eps, delta=claimed_delta, epsilon_lower_bound=bound,
        runs=runs, event=f"{name}, {direction}", p_hat=(hi / runs, lo / runs),
        p_bounds=(clopper_pearson(hi, runs, alpha)[0], clopper_pearson(lo, runs, alpha)[1]),
        confidence=confidence, dataset=pair.label, seconds=time.perf_counter() - started)


_VOLATILE = "CASE WHEN random() < 0.5 THEN 0.01 ELSE 1000 END"
# The attack on a LIST parameter: a split that flips between two lists at each use (a sequence drives it).
VOLATILE_SPLIT = "CASE WHEN nextval('dp__audit_flip') % 2 = 0 THEN [1e-6::DOUBLE, 1 - 1e-6] ELSE [1 - 1e-6::DOUBLE, 1e-6] END"
# an epsilon whose literal occurs once in each case's SQL, so the refusal check can replace it
_PROBE_EPSILON = 0.8125


@dataclass(frozen=True)
class RefusalResult:
    """Whether a release refused a non-constant parameter: ``refused`` iff it raised the binder's refusal
    of a non-constant parameter (or a ``dpsql:`` error naming it) and charged nothing (``charges``: ledger
    rows the attempt added)."""

    mechanism: str
    expression: str
    refused: bool
    charges: int
    message: str
    parameter: str = "epsilon"


def check_refusal(mechanism: str, expression: str = _VOLATILE, seed: int = 0,
                  parameter: str = "epsilon") -> RefusalResult:
    """Run ``mechanism``'s release on its first dataset D with ``parameter := expression``.

    A table macro substitutes the expression at every use of the parameter, so a non-constant one
    could take one value in the charge and another in the threshold (e.g. :data:`VOLATILE_SPLIT` for a
    LIST parameter such as ``split``); the release must refuse it before reading data or charging
    (sql/00_core/00_release.sql). Nothing to audit statistically: this checks the refusal.
    """
    if not isinstance(mechanism, str) or mechanism not in MECHANISMS:
        raise DPParameterError(f"mechanism must be one of {', '.join(MECHANISMS)} (got {mechanism!r})")
    if not isinstance(expression, str) or not expression.strip():
        raise DPParameterError(f"expression must be a non-empty SQL expression (got {expression!r})")
    if not isinstance(parameter, str) or not parameter.isidentifier():
        raise DPParameterError(f"parameter must be a parameter name (got {parameter!r})")
    mech = MECHANISMS[mechanism]
    delta = 1e-5
    probe = repr(_PROBE_EPSILON)
    sql = _substitute(mech.sql(_PROBE_EPSILON, delta), probe,
                      f"({expression})" if parameter == "epsilon" else f"{probe}, {parameter} := ({expression})")
    if isinstance(mech, OutputCase):
        data, n_items = mech.pairs(_PROBE_EPSILON, delta)[0].d0, 1
    else:
        data, _, n_items = _stack(mech.pairs(_PROBE_EPSILON, delta)[0], 1, mech.user_level)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the seeded connection's NOT-private warning
        con = dpsql.connect(seed=int(seed))
    try:
        if mech.setup is not None:
            mech.setup(con)
        _load(con, data)
        con.execute("CREATE SEQUENCE IF NOT EXISTS dp__audit_flip")
        sql = sql.replace("{tbl}", "dp__audit_data").replace("{n_items}", str(n_items))
        count = "SELECT count(*) FROM dp_releases()"
        before = con.sql(count).fetchall()[0][0]
        try:
            con.sql(sql).fetchall()
            message = ""
        except duckdb.Error as exc:
            message = str(exc)
        charges = con.sql(count).fetchall()[0][0] - before
    finally:
        con.close()
    bound = "must be a constant expression" in message  # the binder's refusal (sql/00_core/00_release.sql)
    refused = (bound or ("dpsql:" in message and parameter in message)) and charges == 0
    return RefusalResult(mechanism, expression, refused, int(charges), message, parameter)


def audit_all(epsilon: float = 1.0, delta: float = 1e-5, runs: int = 20_000, confidence: float = 0.95,
              seed: int = 0, mechanisms: Optional[Sequence[str]] = None) -> list[AuditResult]:
    """:func:`audit` of every mechanism (or of ``mechanisms``), seeds seed, seed + 1, ..."""
    names = list(MECHANISMS) if mechanisms is None else list(mechanisms)
    return [audit(m, epsilon, delta, runs, confidence, seed + j) for j, m in enumerate(names)]


def to_markdown(results: Sequence[AuditResult]) -> str:
    """The audit table: mechanism, claim, lower bound, runs, event, dataset."""
    lines = ["| mechanism | claimed ε (δ) | audited lower bound on ε | runs | p̂ (likelier, other) | event | dataset | s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        flag = " **REFUTED**" if r.refuted else ""
        note = MECHANISMS[r.mechanism].note if r.mechanism in MECHANISMS else ""
        name = f"`{r.mechanism}`" + (f" ({note})" if note else "")
        lines.append(f"| {name} | {r.claimed_epsilon:g} ({r.delta:g}) | {r.epsilon_lower_bound:.3f}{flag} | "
                     f"{r.runs:,} | {r.p_hat[0]:.4f}, {r.p_hat[1]:.4f} | {r.event} | {r.dataset} | "
                     f"{r.seconds:.1f} |")
    return "\n".join(lines)
