"""Unknown-domain top-k, k-hitting set, and the limited-domain top-k baseline.

Sources: [MM] Dick, Joseph & Raman, "Missing Mass for Differentially Private
Domain Discovery" (Alg. 2-4, Lemma B.1, Sec. 5.2); [DR19] Durfee & Rogers,
"Practical Differentially Private Top-k Selection with Pay-what-you-get
Composition", NeurIPS 2019 (arXiv:1905.04273), Alg. 1 and Thm 1; [GJK+22]
Gillenwater et al., "A Joint Exponential Mechanism for Differentially Private
Top-k", ICML 2022, Lemma 4.2 (= [MM] Lemma B.1).

Privacy unit: user-level add/remove (one user with an arbitrary item set).

``dp_top_k`` ([MM] Alg. 2 with Alg. 3). Privacy argument (docs/proofs/top_k.md):

1. the domain ``D`` is the release of a set-union method (any of
   :data:`dpsql.union.METHODS`) at ``(epsilon/2, delta/2)``;
2. given ``D`` (public from here on), the peeling exponential mechanism ranks
   ``D`` by the *uncapped* user counts ``N(x)``. Adding a user raises every
   ``N(x)`` by 0 or 1 (monotone, sensitivity 1), so each of the k peeling
   steps is the exponential mechanism ``exp(eps0 * N(x))``, which is
   eps0-DP with range bounded by eps0, hence ``eps0^2/8``-zCDP. The k steps are
   run as one-shot Gumbel top-k: adding ``Gumbel(1/eps0)`` to every count and
   keeping the k largest has exactly the distribution of k-fold peeling;
3. composition: with a Gaussian domain (:data:`GAUSSIAN_DOMAIN_METHODS`, a
   ``1/(2 sigma_D^2)``-zCDP mechanism plus ``delta/4`` of novel items) the zCDP of
   both steps adds up and the RDP accountant converts it to ``(epsilon, delta)``
   (:func:`tight_peeling_epsilon`); or basic composition of ``(epsilon/2, delta/2)``
   twice with eps0 from :func:`peeling_epsilon` (Lemma B.1). The larger eps0 is used.

When ``|D| < k`` all of ``D`` is output in noisy order (fewer than k rows; the
privacy argument only needs "at most k" steps).

``dp_hitting_set`` ([MM] Alg. 2 with Alg. 4, user peeling). Step 1 as above.
Then ``min(k, |D|)`` rounds, each an exponential mechanism with fresh
``Gumbel(1/eps0)`` noise on ``H_j(x)`` = number of not-yet-hit users holding
``x``; adding a user changes each ``H_j`` by 0 or 1 in the same direction, so
each round is eps0-DP with bounded range, composed with the domain as for ``dp_top_k``. The
number of rounds depends only on ``k`` and the (already released) ``|D|``:
stopping when no user is left would make it data-dependent.

``dp_top_k_limited_domain`` ([DR19] Alg. 1, "limited domain"): see
:func:`limited_domain_calibration`.

Only ``(rank, item)`` leaves a macro; noisy counts never do.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import duckdb
import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, DOUBLE, VARCHAR

from dpsql.core.errors import InputError, ParameterError, engine_errors
from dpsql.core import accounting, calibration, release
from dpsql import union
from dpsql.core.calibration import Accounting
from dpsql.core.mechanism import (REQUIRED, AuditCase, Mechanism, Param, column_param, delta_param, epsilon_param,
                             max_items_param, tbl_param, user_item_example, with_role)
from dpsql.core.udf import Udf, scalar
from dpsql.core.inputs import accepts_tables
from dpsql.core.validation import (
    DELTA_MIN,
    EPSILON_MIN,
    K_LIMIT,
    DPParameterError,
    check_column_pair,
    check_k,
    check_delta,
    check_epsilon,
    check_max_items,
    derived_budget,
    user_budget,
)

__all__ = ["K_LIMIT", "check_k", "peeling_epsilon", "TopKCalibration", "top_k_calibration", "GAUSSIAN_DOMAIN_METHODS",
           "tight_peeling_epsilon",
           "limited_domain_composed_epsilon", "limited_domain_epsilon", "LimitedDomainCalibration",
           "limited_domain_calibration", "user_peeling", "top_k", "hitting_set", "top_k_limited_domain", "udfs",
           "MECHANISMS"]

# The set-union method that discovers the domain by default: the one declaring the role "top_k_domain"
# ([MM] uses WGM); the SQL macros' headers are generated with the same default.
DEFAULT_DOMAIN_METHOD = with_role(union.METHODS.values(), "top_k_domain")

# --------------------------------------------------------------------------
# Calibration (pure)
# --------------------------------------------------------------------------

@user_budget
def peeling_epsilon(epsilon: float, delta: float, k: int) -> float:
    """Per-step epsilon of k-fold peeling EM that is (epsilon, delta)-DP ([MM] Lemma B.1 = [GJK+22] Lemma 4.2).

    ``eps0 = max{ epsilon/k, sqrt((8 ln(1/delta) + 8 epsilon)/k) - sqrt(8 ln(1/delta)/k) }``.
    The first term is basic composition; the second comes from: an eps0-DP
    exponential mechanism has range bounded by eps0, hence is eps0^2/8-zCDP;
    k of them are k eps0^2/8-zCDP; rho-zCDP implies
    ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP. The Gumbel scale is ``1/eps0``.
    """
    epsilon, delta, k = check_epsilon(epsilon), check_delta(delta), check_k(k)
    log_term = 8.0 * math.log(1.0 / delta)
    return max(epsilon / k, math.sqrt((log_term + 8.0 * epsilon) / k) - math.sqrt(log_term / k))


@dataclass(frozen=True)
class TopKCalibration:
    """Budget split of dp_top_k / dp_hitting_set: (domain) + (selection), composed to (epsilon, delta) by ``accounting``."""

    k: int
    domain_method: str
    domain_epsilon: float
    domain_delta: float
    select_epsilon: float
    select_delta: float
    step_epsilon: float  # eps0 of the k selection steps
    gumbel_scale: float  # 1/eps0
    accounting: Accounting


# Domain methods whose release is a Gaussian mechanism (or Gaussian rounds composing to one) of
# mu = 1/gaussian_sigma(eps_D, delta_D/2) plus novel items released with probability <= delta_D/2
# (their proof notes, "Calibration"), as declared (Mechanism.gaussian_domain).
GAUSSIAN_DOMAIN_METHODS = frozenset(n for n, m in union.METHODS.items() if m.gaussian_domain)


def tight_peeling_epsilon(epsilon: float, delta: float, k: int, domain_epsilon: float,
                          domain_delta: float) -> tuple[float, Accounting]:
    """eps0 of the k selection steps composed with a Gaussian domain step by zCDP (docs/proofs/top_k.md).

    The domain (``sigma_D = gaussian_sigma(domain_epsilon, domain_delta/2)``, novel items
    ``domain_delta/2``) is ``rho_D = 1/(2 sigma_D^2)``-zCDP; k exponential mechanisms of range eps0
    are ``k eps0^2/8``-zCDP; ``rho_max`` = the largest rho the RDP accountant converts to
    ``(epsilon, delta - domain_delta/2)``; ``eps0 = sqrt(8 (rho_max - rho_D)/k)`` (0 if negative).
    """
    events = domain_delta / 2.0
    sigma_d = calibration.gaussian_sigma(domain_epsilon, events)
    rho_d = 1.0 / (2.0 * sigma_d * sigma_d)
    rho_s = accounting.zcdp_budget(epsilon, delta - events) - rho_d
    eps0 = math.sqrt(8.0 * rho_s / k) if rho_s > 0 else 0.0
    return eps0, accounting.account_zcdp(rho_d + k * eps0 * eps0 / 8.0, events, epsilon, delta)


@lru_cache(maxsize=256)
def _top_k_calibration(k: int, epsilon: float, delta: float, max_items: int, method: str) -> TopKCalibration:
    half_eps, half_delta = epsilon / 2.0, delta / 2.0
    with derived_budget():  # the halves are shares of the checked epsilon and delta
        union.calibrate(method, half_eps, half_delta, max_items)  # validates the domain step too
        eps0 = peeling_epsilon(half_eps, half_delta, k)
        # basic composition: each step's delta includes its events
        acc = Accounting(accounting.BASIC, epsilon, delta, delta, 0.0)
        if method in GAUSSIAN_DOMAIN_METHODS:
            # Both calibrations are valid; which one is used depends on public parameters only.
            tight_eps0, tight = tight_peeling_epsilon(epsilon, delta, k, half_eps, half_delta)
            if tight_eps0 > eps0:
                eps0, acc = tight_eps0, tight
    return TopKCalibration(k, method, half_eps, half_delta, half_eps, half_delta, eps0, 1.0 / eps0, acc)


def top_k_calibration(k: object, epsilon: object, delta: object, max_items: object,
                      domain_method: object = DEFAULT_DOMAIN_METHOD) -> TopKCalibration:
    """Validate the parameters of dp_top_k / dp_hitting_set and split the budget half/half ([MM] Alg. 2)."""
    if not isinstance(domain_method, str) or domain_method not in union.METHODS:
        raise DPParameterError(f"domain_method must be one of {', '.join(sorted(union.METHODS))} "
                               f"(got {domain_method!r})")
    k, epsilon, delta, max_items = check_k(k), check_epsilon(epsilon), check_delta(delta), check_max_items(max_items)
    # dp_top_k runs its domain step as the macro dp_set_union(epsilon/2, delta/2), which checks its own
    # parameters against the documented minima; refuse here, naming the user's values, instead.
    if epsilon / 2.0 < EPSILON_MIN:
        raise DPParameterError(f"epsilon must be >= {2 * EPSILON_MIN:g} for top-k and hitting set (got {epsilon!r}): "
                               f"half of it goes to the domain step, whose epsilon must be >= {EPSILON_MIN:g}")
    if delta / 2.0 < DELTA_MIN:
        raise DPParameterError(f"delta must be >= {2 * DELTA_MIN:g} for top-k and hitting set (got {delta!r}): "
                               f"half of it goes to the domain step, whose delta must be >= {DELTA_MIN:g}")
    return _top_k_calibration(k, epsilon, delta, max_items, domain_method)


@user_budget
def limited_domain_composed_epsilon(step_epsilon: float, delta_prime: float, k: int) -> float:
    """Total epsilon of k limited-domain steps of per-step ``step_epsilon`` ([DR19] Thm 1).

    ``min{ k e, k e (e^e - 1)/(e^e + 1) + e sqrt(2 k ln(1/delta')),
    k e^2/2 + e sqrt(k ln(1/delta') / 2) }`` with ``e = step_epsilon``
    (``(e^e - 1)/(e^e + 1)`` is evaluated as ``tanh(e/2)``, which cannot overflow); the
    total delta is ``delta' + delta_step`` (see :func:`limited_domain_calibration`).
    """
    e, delta_prime, k = check_epsilon(step_epsilon), check_delta(delta_prime, "delta_prime"), check_k(k)
    log_term = math.log(1.0 / delta_prime)
    return min(k * e,
               k * e * math.tanh(e / 2.0) + e * math.sqrt(2.0 * k * log_term),
               k * e * e / 2.0 + e * math.sqrt(0.5 * k * log_term))


@user_budget
def limited_domain_epsilon(epsilon: float, delta_prime: float, k: int) -> float:
    """Largest per-step epsilon whose k-fold [DR19] Thm 1 composition is <= epsilon (bisection, 200 steps).

    The composed epsilon is continuous and increasing in the step epsilon, and
    equals ``k e`` for small ``e``, so the answer lies in ``[epsilon/k, epsilon]``.
    """
    epsilon, delta_prime, k = check_epsilon(epsilon), check_delta(delta_prime, "delta_prime"), check_k(k)
    lo, hi = epsilon / k, epsilon
    if limited_domain_composed_epsilon(hi, delta_prime, k) <= epsilon:
        return hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if limited_domain_composed_epsilon(mid, delta_prime, k) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo  # lo always satisfies the target


@dataclass(frozen=True)
class LimitedDomainCalibration:
    """Calibration of [DR19] Alg. 1: per-step epsilon/delta and the threshold offset.

    The threshold is ``h_bot = h_(k_bar+1) + offset`` (``h_(k_bar+1) = 0`` when
    fewer than ``k_bar + 1`` items exist); every one of the top ``k_bar`` counts
    and ``h_bot`` get independent ``Gumbel(gumbel_scale)`` noise.
    ``k_bar`` and ``max_items`` are ``math.inf`` when unbounded.
    """

    k: int
    k_bar: float
    max_items: float
    step_epsilon: float
    step_delta: float
    delta_prime: float
    gumbel_scale: float
    offset: float


def _check_k_bar(k_bar: object, k: int) -> float:
    if k_bar is None:
        raise DPParameterError("k_bar must not be NULL; pass a whole number >= k, or 'infinity' (then max_items "
                               "is required)")
    if isinstance(k_bar, numbers.Real) and not isinstance(k_bar, bool) and float(k_bar) == math.inf:
        return math.inf
    value = check_k(k_bar, "k_bar")
    if value < k:
        raise DPParameterError(f"k_bar must be >= k (got k_bar = {value}, k = {k}); the mechanism looks at the "
                               f"true top k_bar items and releases at most k of them")
    return float(value)


@lru_cache(maxsize=256)
def _limited_domain_calibration(k: int, k_bar: float, epsilon: float, delta: float,
                                max_items: float) -> LimitedDomainCalibration:
    delta_prime = delta / 2.0
    step_delta = delta - delta_prime
    step_eps = limited_domain_epsilon(epsilon, delta_prime, k)
    offset = 1.0 + math.log(min(max_items, k_bar) / step_delta) / step_eps
    return LimitedDomainCalibration(k, k_bar, max_items, step_eps, step_delta, delta_prime, 1.0 / step_eps, offset)


def limited_domain_calibration(k: object, k_bar: object, epsilon: object, delta: object,
                               max_items: object = None) -> LimitedDomainCalibration:
    """Validate and calibrate the Durfee-Rogers limited-domain top-k ([DR19] Alg. 1, Thm 1).

    Alg. 1: take the true top ``k_bar`` items by user count (each user capped
    to ``max_items`` distinct items, or uncapped when ``max_items`` is None);
    ``h_bot = h_(k_bar+1) + 1 + ln(min(max_items, k_bar)/delta_step)/eps_step``;
    add ``Gumbel(1/eps_step)`` to the ``k_bar`` counts and to ``h_bot``; output
    the items in noisy order while they beat noisy ``h_bot``, at most k.
    Privacy ([DR19] Thm 1): ``(eps*, delta_step + delta')``-DP with ``eps*``
    from :func:`limited_domain_composed_epsilon`; like the reference code of
    [MM] Sec. 5.2 we take ``delta' = delta_step = delta/2`` and the largest
    ``eps_step`` with ``eps* <= epsilon``. ``k_bar = inf`` (all items) needs a
    finite ``max_items`` ([MM] Sec. 5.2 uses 100, as [DR19] Sec. 3 recommends).
    """
    k = check_k(k)
    k_bar_value = _check_k_bar(k_bar, k)
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    if max_items is None or (isinstance(max_items, float) and max_items == math.inf):
        cap = math.inf
    else:
        cap = float(check_max_items(max_items))
    if math.isinf(k_bar_value) and math.isinf(cap):
        raise DPParameterError("k_bar = infinity needs a finite max_items (the per-user cap), e.g. max_items := 100; "
                               "otherwise the threshold is infinite and nothing can be released")
    with derived_budget():  # delta' = delta_step = delta/2 are shares of the checked delta
        return _limited_domain_calibration(k, k_bar_value, epsilon, delta, cap)


# --------------------------------------------------------------------------
# User peeling (sequential; [MM] Alg. 4)
# --------------------------------------------------------------------------

def user_peeling(flat_items: np.ndarray, offsets: np.ndarray, n_items: int, k: int,
                 gumbel: Callable[[int], np.ndarray]) -> np.ndarray:
    """Run ``min(k, n_items)`` rounds of user peeling; return the dense item ids in selection order.

    User ``u`` holds the distinct dense item ids ``flat_items[offsets[u]:offsets[u+1]]``
    (all in ``0..n_items-1``). Each round draws ``gumbel(r)`` for the ``r``
    remaining items (fresh noise), selects the item maximising
    ``H(x) + noise`` where ``H(x)`` counts the not-yet-hit users holding x,
    removes it, and removes the users it hits. Never stops early.
    """
    flat = np.asarray(flat_items, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n_users = len(offsets) - 1
    rounds = min(int(k), int(n_items))
    if flat.size and (flat.min() < 0 or flat.max() >= n_items):
        raise ParameterError("user_peeling: item ids must lie in 0..n_items-1")
    counts = np.bincount(flat, minlength=n_items).astype(np.int64)
    lengths = np.diff(offsets)
    holder = np.repeat(np.arange(n_users, dtype=np.int64), lengths)
    by_item = holder[np.argsort(flat, kind="stable")]  # users grouped by item (CSR by item)
    item_ptr = np.zeros(n_items + 1, dtype=np.int64)
    np.cumsum(counts, out=item_ptr[1:])
    alive = np.ones(n_users, dtype=bool)
    remaining = np.ones(n_items, dtype=bool)
    chosen = np.empty(rounds, dtype=np.int64)
    for j in range(rounds):
        candidates = np.flatnonzero(remaining)
        noisy = counts[candidates] + np.asarray(gumbel(len(candidates)), dtype=np.float64)
        x = candidates[int(np.argmax(noisy))]
        chosen[j] = x
        remaining[x] = False
        hit = by_item[item_ptr[x]:item_ptr[x + 1]]
        hit = hit[alive[hit]]
        if hit.size:
            alive[hit] = False
            starts, lens = offsets[hit], lengths[hit]
            # Positions of every item of every newly hit user, without a Python loop.
            pos = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
            counts -= np.bincount(flat[pos], minlength=n_items)
    return chosen


def _list_parts(value: pa.ListScalar) -> tuple[np.ndarray, np.ndarray]:
    """(flat item ids, offsets) of one LIST(LIST(BIGINT)) value; NULL or empty -> no users."""
    if not value.is_valid or value.values is None:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    users = value.values  # one list of item ids per user
    if users.null_count:
        raise InputError("dp__user_peeling: a user's item list is NULL")
    offsets = np.asarray(users.offsets, dtype=np.int64)
    flat = users.flatten()
    if flat.null_count:
        raise InputError("dp__user_peeling: an item id is NULL")
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.int64), offsets - offsets[0]


# --------------------------------------------------------------------------
# UDFs
# --------------------------------------------------------------------------

def udfs(source) -> list[Udf]:
    """Calibration UDFs (pure, folded at plan time) and the user-peeling UDF (draws noise: side effects)."""

    def top_k_cal(k, epsilon, delta, max_items, domain_method, user_col, item_col):
        check_column_pair(user_col, item_col)
        cal = top_k_calibration(k, epsilon, delta, max_items, domain_method)
        return {"k": cal.k, "gumbel_scale": cal.gumbel_scale, "accountant": cal.accounting.accountant,
                "total_epsilon": cal.accounting.epsilon, "total_delta": cal.accounting.delta}

    def limited_cal(k, k_bar, epsilon, delta, max_items, user_col, item_col):
        check_column_pair(user_col, item_col)
        cal = limited_domain_calibration(k, k_bar, epsilon, delta, max_items)
        return {"k": cal.k, "k_bar": cal.k_bar, "max_items": cal.max_items,
                "gumbel_scale": cal.gumbel_scale, "offset": cal.offset}

    def domain_share(name, value):
        # dp_top_k / dp_hitting_set pass dp__top_k_share('delta', delta) to their domain step, so the
        # user's value is checked (against top-k's own minimum) before the step sees its half.
        if name == "epsilon":
            value = check_epsilon(value)
            minimum = EPSILON_MIN
        else:
            value = check_delta(value)
            minimum = DELTA_MIN
        if value / 2.0 < minimum:
            raise DPParameterError(f"{name} must be >= {2 * minimum:g} for top-k and hitting set (got {value!r}): "
                                   f"half of it goes to the domain step, whose {name} must be >= {minimum:g}")
        return value / 2.0

    def peeling_eps(epsilon, delta, k):
        return peeling_epsilon(epsilon, delta, k)

    def limited_eps(epsilon, delta_prime, k):
        return limited_domain_epsilon(epsilon, delta_prime, k)

    def peel(lists: pa.Array, n_items: pa.Array, k: pa.Array, scale: pa.Array) -> pa.Array:
        out = []
        for value, m, kk, lam in zip(lists, n_items.to_pylist(), k.to_pylist(), scale.to_pylist()):
            if m is None or kk is None or lam is None:
                raise ParameterError("dp__user_peeling: n_items, k and scale must not be NULL")
            flat, offsets = _list_parts(value)

            def gumbel(n: int, lam: float = lam) -> np.ndarray:
                return source.gumbel(np.full(n, lam))

            chosen = user_peeling(flat, offsets, int(m), int(kk), gumbel)
            out.append(chosen.tolist())
        return pa.array(out, type=pa.list_(pa.int64()))

    d = DOUBLE
    top_k_type = duckdb.struct_type({"k": BIGINT, "gumbel_scale": DOUBLE, "accountant": VARCHAR,
                                     "total_epsilon": DOUBLE, "total_delta": DOUBLE})
    limited_type = duckdb.struct_type({"k": BIGINT, "k_bar": DOUBLE, "max_items": DOUBLE,
                                       "gumbel_scale": DOUBLE, "offset": DOUBLE})
    return [
        Udf("dp__top_k_calibration", scalar(top_k_cal), (d, d, d, d, VARCHAR, VARCHAR, VARCHAR), top_k_type),
        Udf("dp__limited_domain_calibration", scalar(limited_cal), (d, d, d, d, d, VARCHAR, VARCHAR), limited_type),
        Udf("dp__peeling_epsilon", scalar(peeling_eps), (d, d, d), d),
        Udf("dp__top_k_share", scalar(domain_share), (VARCHAR, d), d),
        Udf("dp__limited_domain_epsilon", scalar(limited_eps), (d, d, d), d),
        Udf("dp__user_peeling", peel, (duckdb.list_type(duckdb.list_type(BIGINT)), BIGINT, BIGINT, DOUBLE),
            duckdb.list_type(BIGINT), side_effects=True),
    ]


# --------------------------------------------------------------------------
# Python API
# --------------------------------------------------------------------------


def _release(con: duckdb.DuckDBPyConnection, macro: str, **given: object) -> pa.Table:
    """Validate ``given`` by ``macro``'s declaration, then run the macro once: its ``(rank, item)`` rows.

    Every parameter is checked once, here, by the declaration; the macro's release check calibrates (and
    raises the calibration's dpsql error, e.g. an epsilon too small to halve, before anything is read).
    """
    union._check_registered(con, macro)
    mech = next(m for m in MECHANISMS if m.macro == macro)
    values = mech.validate(**given)
    union._check_columns(con, values["tbl"], values["user_col"], values["item_col"])
    return release.run(con, f"SELECT rank, item FROM {release.call_sql(mech, values)} ORDER BY rank")


@accepts_tables("table")
def top_k(con: duckdb.DuckDBPyConnection, table: str, k: int, *, epsilon: float, delta: float,
          max_items: int = 100, domain_method: str = DEFAULT_DOMAIN_METHOD, user_col: str = "user_id",
          item_col: str = "item") -> pa.Table:
    """Unknown-domain top-k (``dp_top_k``): an Arrow table ``(rank, item)`` of at most k rows.

    ``table``: a table or view name or a file path DuckDB can read, as for the SQL macros, or the data
    itself (a DataFrame, an Arrow table, a relation of ``con``: :mod:`dpsql.core.inputs`).
    """
    return _release(con, "dp_top_k", tbl=table, k=k, epsilon=epsilon, delta=delta, max_items=max_items,
                    domain_method=domain_method, user_col=user_col, item_col=item_col)


@accepts_tables("table")
def hitting_set(con: duckdb.DuckDBPyConnection, table: str, k: int, *, epsilon: float, delta: float,
                max_items: int = 100, domain_method: str = DEFAULT_DOMAIN_METHOD, user_col: str = "user_id",
                item_col: str = "item") -> pa.Table:
    """Unknown-domain k-hitting set (``dp_hitting_set``): an Arrow table ``(rank, item)``."""
    return _release(con, "dp_hitting_set", tbl=table, k=k, epsilon=epsilon, delta=delta, max_items=max_items,
                    domain_method=domain_method, user_col=user_col, item_col=item_col)


@accepts_tables("table")
def top_k_limited_domain(con: duckdb.DuckDBPyConnection, table: str, k: int, k_bar: float, *,
                         epsilon: float, delta: float, max_items: Optional[int] = None,
                         user_col: str = "user_id", item_col: str = "item") -> pa.Table:
    """Durfee-Rogers limited-domain top-k (``dp_top_k_limited_domain``): ``(rank, item)``, at most k rows.

    ``max_items=None`` (or infinity): no cap (the macro's NULL)."""
    if isinstance(max_items, float) and max_items == math.inf:
        max_items = None
    return _release(con, "dp_top_k_limited_domain", tbl=table, k=k, k_bar=k_bar, epsilon=epsilon, delta=delta,
                    max_items=max_items, user_col=user_col, item_col=item_col)


# -- declarations (dpsql.core.mechanism) ------------------------------------------------------------------

def _k_param() -> Param:
    return Param("k", "DOUBLE", REQUIRED, check_k, "number of items to release")


def _domain_method_param() -> Param:
    return Param("domain_method", "VARCHAR", DEFAULT_DOMAIN_METHOD, union.check_method,
                 "set-union method of the domain step")


_TOP_K_EXAMPLE = user_item_example(order_by=("rank",), k="3", domain_method=f"'{DEFAULT_DOMAIN_METHOD}'")

MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="top_k", family="top_k", macro="dp_top_k", unit="user",
        params=(tbl_param(), _k_param(), epsilon_param(), delta_param(), max_items_param(), _domain_method_param(),
                column_param("user_col", "user_id"), column_param("item_col", "item")),
        description="unknown-domain top-k: a set-union domain at (epsilon/2, delta/2), then k peeling "
                    "exponential mechanisms over it",
        proof="top_k", calibrate=top_k_calibration, rounds=2, sql="95_topk/topk.sql", example=_TOP_K_EXAMPLE,
        audit=(AuditCase("top_k_domain", note="k = all items: the domain step at (eps/2, delta/2)"),
               # the rows are in the DP (Gumbel) rank order: the first row may depend on the data up to epsilon
               AuditCase("order_ranked", options=(("k", 5),), note="k = 5: rank order"))),
    Mechanism(
        name="hitting_set", family="top_k", macro="dp_hitting_set", unit="user",
        params=(tbl_param(), _k_param(), epsilon_param(), delta_param(), max_items_param(), _domain_method_param(),
                column_param("user_col", "user_id"), column_param("item_col", "item")),
        description="unknown-domain k-hitting set: greedy picks of the item held by most not-yet-hit users",
        proof="hitting_set", calibrate=top_k_calibration, rounds=2, sql="95_topk/topk.sql", example=_TOP_K_EXAMPLE),
    Mechanism(
        name="top_k_limited_domain", family="top_k", macro="dp_top_k_limited_domain", unit="user",
        params=(tbl_param(), _k_param(),
                Param("k_bar", "DOUBLE", REQUIRED, None, "size of the limited domain (top k_bar counts)"),
                epsilon_param(), delta_param(), max_items_param(None),
                column_param("user_col", "user_id"), column_param("item_col", "item")),
        description="Durfee-Rogers limited-domain top-k over the k_bar largest counts",
        proof="top_k_limited_domain", calibrate=limited_domain_calibration, rounds=1, sql="95_topk/topk.sql",
        example=user_item_example(order_by=("rank",), k="3", k_bar="5")),
)
