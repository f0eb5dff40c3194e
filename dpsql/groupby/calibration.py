"""Calibration of private GROUP BY (pure): contribution bounds, budget split, noise and interval half-widths.

Privacy unit: user-level add/remove. Proof note: ``docs/proofs/group_by.md`` (the numbers of its §4 are
this module's). Notation: ``L0 = max_groups`` (groups a user contributes to the aggregates; default
``max_items``), ``C = max_rows`` (rows per user per group counted by 'rows'), ``M = max(|lower|, |upper|)``,
``c = (lower + upper)/2`` and ``R = (upper - lower)/2``.

**Measurements.** Each aggregate is computed from these noisy vectors over the released groups
(:func:`measurements`):

==========  ==============================================  ====================  =====================
name        per group x                                     needed by             bound per user, group
==========  ==============================================  ====================  =====================
count       users kept in x                                 count, mean, var, sd  1
rows        sum over them of min(rows of x, C)              rows                  C
sum         sum of clamp(total, lower, upper)               sum, mean, var, sd    M
sumsq       sum of (clamp(total) - c)^2                     variance, stddev      R^2
median      exponential mechanism over K + 1 grid points    median                utility 1
==========  ==============================================  ====================  =====================

A user keeps at most ``max_groups`` groups, and holds at most all ``|S|`` released ones, so each vector
moves in at most ``L0 = min(max_groups, |S|)`` coordinates (``|S|`` once the selection has released it:
public, so the aggregates' noise may depend on it; before, ``L0 = max_groups``), each by at most its bound
``B`` (in grid steps: :func:`dpsql.core.calibration.grid_sensitivity`): l1 ``L0 B``, l2 ``sqrt(L0) B``.

**Gaussian noise** (``noise = 'gaussian'``, the default with a delta). Every measurement is a
multivariate discrete Gaussian ``g N_Z(0, s^2 I)`` on its grid ``g`` (1 for the integer counts), which
is ``D^2 / (2 s^2)``-zCDP for an l2 shift of ``D`` grid steps ([CKS20] Thm 14). The aggregates share a
zCDP budget ``rho_a`` equally: ``rho_m = rho_a / k`` for ``k`` measurements, ``s = D / sqrt(2 rho_m)``.
The median's exponential mechanism at ``eps0`` per group is ``eps0^2/8``-zCDP [CR21, Lemma 3.4], ``L0``
groups ``L0 eps0^2 / 8``: ``eps0 = sqrt(8 rho_m / L0)``. ``rho_a`` comes from the accountant:

* a selection with a Gaussian form (:func:`selection_zcdp`: a Gaussian mechanism of ``rho_s`` plus novel
  items released with probability ``<= delta_e``) runs at ``(eps split, delta)`` and
  ``rho_a = rho_max - rho_s``, ``rho_max`` the largest rho that dp-accounting's RDP accountant converts
  to ``(eps, delta - delta_e)``: accountant ``'zcdp'``;
* any other selection runs at ``(eps split, delta split)`` and ``rho_a`` is the largest rho converting to
  ``(eps (1 - split), delta (1 - split))``: basic composition, accountant ``'basic'``;
* a public list of groups (no selection): ``rho_a`` converts to ``(eps, delta)``: accountant ``'zcdp'``;
* the truncated geometric coin (``selection = TRUNCATED_GEOMETRIC``, the selection rules of
  :mod:`dpsql.groupby.selection`): the basic branch above, its coins at ``(eps split, delta split) / max_groups``
  per group;
* post-aggregation thresholding (``selection = POST_THRESHOLD``): no selection budget; ``delta_e = delta split``
  for the threshold event, ``rho_a = zcdp_budget(eps, delta - delta_e)``, the count always measured, every
  measurement at ``L0 = max_groups`` (the count selects, so nothing is calibrated after the selection), and the
  threshold ``selection_threshold`` of :func:`dpsql.groupby.selection.count_threshold`: accountant ``'zcdp'``.

**Laplace noise** (``noise = 'laplace'``, the default without a delta). Pure DP as before: the selection
runs at ``(eps split, delta)``, the measurements share ``eps (1 - split)`` (``eps`` for a public list
and for post-aggregation thresholding, whose threshold event then has the whole ``delta``) equally, each is granular
Laplace ``g DLap(b/g)`` with ``b`` = the rounded l1 sensitivity over its share ([GRS09]), and the median's
mechanism gets ``eps0 = eps_m / L0``.

**Half-widths** (public parameters only): :func:`laplace_ci`, :func:`gaussian_ci` and :func:`median_ci`;
the derived aggregates' from their measurements' at a union-bound level (the mean at ``(1 + conf)/2``
each, the variance at ``1 - (1 - conf)/3`` each).

Papers: [CKS20] Canonne, Kamath & Steinke, NeurIPS 2020; [CR21] Cesar & Rogers, ALT 2021; [GRS09] Ghosh,
Roughgarden & Sundararajan, STOC 2009; [MT07] McSherry & Talwar, FOCS 2007.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional, Sequence

from scipy.special import ndtri

from dpsql import union
from dpsql.core import accounting, calibration
from dpsql.core.calibration import Accounting, choose_granularity, default_granularity, discrete_laplace_scale
from dpsql.core.validation import (EPSILON_MIN, DPParameterError, check_delta, check_epsilon, check_identifier,
                                   check_max_items, derived_budget)
from dpsql.groupby import selection as rules
from dpsql.groupby.selection import POST_THRESHOLD, SELECTIONS, TRUNCATED_GEOMETRIC

__all__ = ["AGGREGATES", "NOISES", "MEASUREMENTS", "MEDIAN_BINS", "DEFAULT_SPLIT", "DEFAULT_CONFIDENCE",
           "PRE_THRESHOLD_METHODS", "Measurement", "GroupByCalibration", "group_by_calibration", "check_aggregates",
           "check_noise", "check_max_groups", "check_max_rows", "check_group_cols", "check_selection_share",
           "check_confidence", "check_pre_threshold", "measurements", "laplace_ci", "gaussian_ci", "median_ci",
           "selection_zcdp", "check_selection", "SELECTIONS", "TRUNCATED_GEOMETRIC", "POST_THRESHOLD",
           "TRUNCATED_GEOMETRIC_MAX_CAP", "default_selection", "PER_SETTING"]

AGGREGATES = ("count", "rows", "sum", "mean", "variance", "stddev", "median")
NOISES = ("gaussian", "laplace")
# The noisy vectors the aggregates are computed from, in the order the SQL and the budget list them.
MEASUREMENTS = ("count", "rows", "sum", "sumsq", "median")
# The median's candidates: K + 1 = 257 evenly spaced points from lower to upper (resolution (upper -
# lower)/256). Its interval grows with ln(K + 1) only; the SQL ranks groups x (K + 1) rows.
MEDIAN_BINS = 256
# Half of epsilon selects, half measures (docs/proofs/group_by.md, "Decisions").
DEFAULT_SPLIT = 0.5
DEFAULT_CONFIDENCE = 0.95

# The selections whose pre-threshold has a proof (docs/proofs/group_by.md §8): one-shot weighting, each
# user's weight per item <= 1 -- the methods that declare a weighting (Mechanism.weighting).
PRE_THRESHOLD_METHODS = tuple(n for n, m in union.METHODS.items() if m.weighting is not None)


# --------------------------------------------------------------------------
# Half-widths
# --------------------------------------------------------------------------

def laplace_ci(scale: float, granularity: float, confidence: float) -> float:
    """Half-width ``g m`` of the narrowest symmetric interval holding ``g DLap(scale/g)`` w.p. ``>= confidence``.

    ``DLap(t)``, ``alpha = exp(-1/t)``: ``P[|Z| > m] = 2 alpha^(m+1) / (1 + alpha)``; ``m`` is the
    smallest integer ``>= 0`` with that ``<= 1 - confidence``. As ``g -> 0``: ``scale ln(1/(1-confidence))``.
    """
    t = scale / granularity
    log_alpha = -1.0 / t
    log_c = math.log1p(math.exp(log_alpha)) - math.log(2.0)
    target = math.log1p(-confidence)

    def log_tail(m: int) -> float:  # ln P[|Z| > m]
        return math.log(2.0) + (m + 1) * log_alpha - math.log1p(math.exp(log_alpha))

    m = max(0, math.ceil((target + log_c) / log_alpha) - 1)
    while log_tail(m) > target:
        m += 1
    while m > 0 and log_tail(m - 1) <= target:
        m -= 1
    return granularity * m


def gaussian_ci(sigma: float, granularity: float, confidence: float) -> float:
    """Half-width ``g m``, ``m = ceil((sigma/g) z)``, ``z = PhiInv((1 + confidence)/2)``: it covers
    ``g N_Z(0, (sigma/g)^2)`` with probability ``>= confidence``.

    For ``Z ~ N_Z(0, s^2)`` and an integer ``m >= 0``: ``P[Z > m] = sum_{z > m} e^(-z^2/(2s^2)) / N_s``
    with ``sum_{z > m} e^(-z^2/(2s^2)) <= int_m^inf e^(-x^2/(2s^2)) dx`` (a decreasing integrand) and
    ``N_s = s sqrt(2 pi) sum_k e^(-2 pi^2 s^2 k^2) >= s sqrt(2 pi)`` (Poisson summation), so
    ``P[|Z| > m] <= 2 (1 - Phi(m/s)) <= 1 - confidence``. The same sum is ``>= int_(m+1)^inf``, so the
    smallest valid ``m`` is at most one step below this one.
    """
    s = sigma / granularity
    z = float(ndtri(0.5 + confidence / 2.0))
    return granularity * math.ceil(s * z)


def median_ci(epsilon0: float, candidates: int, confidence: float) -> float:
    """Utility gap ``(2/eps0) ln(candidates / (1 - confidence))`` of the exponential mechanism [MT07].

    The mechanism picks ``c`` with probability ``prop. to exp(eps0 u(c) / 2)``, ``u(c) = -|B(c) - A(c)|``
    (users below minus users above ``c``); a candidate with ``u <= OPT - (2/eps0)(ln n + t)`` is picked with
    probability ``<= n e^(-OPT eps0/2 - ln n - t) / e^(-OPT eps0/2) = e^-t``; ``t = ln(1/(1 - confidence))``.
    """
    return 2.0 / epsilon0 * math.log(candidates / (1.0 - confidence))


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------

def check_aggregates(aggregates: object) -> tuple[str, ...]:
    """A non-empty list of distinct names among :data:`AGGREGATES` (returned in that order)."""
    if isinstance(aggregates, str) or not isinstance(aggregates, (list, tuple)) or not aggregates:
        raise DPParameterError(f"aggregates must be a non-empty list of {', '.join(AGGREGATES)}, e.g. "
                               f"aggregates := ['count', 'sum', 'mean'] (got {aggregates!r})")
    for a in aggregates:
        if a not in AGGREGATES:
            raise DPParameterError(f"aggregates: {a!r} is not one of {', '.join(AGGREGATES)}")
    if len(set(aggregates)) != len(aggregates):
        raise DPParameterError(f"aggregates must not repeat a name (got {list(aggregates)!r})")
    return tuple(a for a in AGGREGATES if a in aggregates)


def check_selection(selection: object) -> str:
    """A set-union method (:data:`dpsql.union.METHODS`) or one of dp_group_by's own rules (:data:`SELECTIONS`,
    the selection rules of :mod:`dpsql.groupby.selection`)."""
    if isinstance(selection, str) and selection in SELECTIONS:
        return selection
    if not isinstance(selection, str) or selection not in union.METHODS:
        raise DPParameterError(f"selection must be one of {', '.join(SELECTIONS)}, or a set-union method (its "
                               f"method must be one of {', '.join(sorted(union.METHODS))}) (got {selection!r})")
    return selection


# dp_group_by's selection when none is passed (``selection := NULL``, the declaration's default): the
# truncated geometric coin when every user's selection cap is at most this, else the set-union default.
# Measured (benchmarks/README.md, "The default selection per setting"): with max_items = max_groups = 1 the
# coin released more groups than sips_cumulative on every (dataset, setting) pair measured; at 2 and above,
# and with max_items left above max_groups, sips_cumulative released more.
TRUNCATED_GEOMETRIC_MAX_CAP = 1


def default_selection(max_items: int, max_groups: Optional[int]) -> str:
    """The selection ``dp_group_by`` runs when ``selection`` is NULL: a function of public bounds only.

    A set-union selection caps each user at ``max_items`` groups, the coin at ``max_groups`` (NULL:
    ``max_items``); the coin is chosen when both caps are at most :data:`TRUNCATED_GEOMETRIC_MAX_CAP`
    (``max_items = 1`` and ``max_groups`` NULL or 1: each user in one group), otherwise
    :data:`dpsql.union.DEFAULT_METHOD`."""
    cap = max_items if max_groups is None else max_groups
    if max(max_items, cap) <= TRUNCATED_GEOMETRIC_MAX_CAP:
        return TRUNCATED_GEOMETRIC
    return union.DEFAULT_METHOD


def check_noise(noise: object) -> str:
    """``'gaussian'`` or ``'laplace'``."""
    if not isinstance(noise, str) or noise not in NOISES:
        raise DPParameterError(f"noise must be 'gaussian' or 'laplace' (got {noise!r}); gaussian needs a delta, "
                               f"laplace is pure epsilon-DP")
    return noise


def _check_whole(name: str, value: object, hint: str) -> int:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(float(value)) or float(value) != int(value) or not 1 <= value <= 100_000:
        raise DPParameterError(f"{name} must be a whole number between 1 and 100000 (got {value!r}); {hint}")
    return int(value)


def check_max_groups(max_groups: object) -> Optional[int]:
    """A whole number >= 1, or None (the aggregates then cap users at ``max_items`` groups)."""
    if max_groups is None:
        return None
    return _check_whole("max_groups", max_groups, "it is how many groups a user contributes to the aggregates "
                                                  "(NULL: max_items)")


def check_max_rows(max_rows: object) -> int:
    """A whole number >= 1: rows per user per group counted by 'rows'."""
    return _check_whole("max_rows", max_rows, "it is how many of a user's rows in a group 'rows' counts")


def check_group_cols(group_cols: object) -> Optional[tuple[str, ...]]:
    """None, or a non-empty list of distinct column names (compared case-insensitively, as the macros do)."""
    if group_cols is None:
        return None
    if isinstance(group_cols, str) or not isinstance(group_cols, (list, tuple)) or not group_cols:
        raise DPParameterError(f"group_cols must be a non-empty list of column names, e.g. group_cols := "
                               f"['country', 'day'] (got {group_cols!r}); leave it out to group by item_col")
    names = tuple(check_identifier("group_cols", c) for c in group_cols)
    if len({n.lower() for n in names}) != len(names):
        raise DPParameterError(f"group_cols must not repeat a column (got {list(names)!r})")
    for n in names:
        if n.lower() in _RESERVED_NAMES:
            raise DPParameterError(f"group_cols: a group column may not be named {n!r} (an output column of "
                                   f"dp_group_by has that name); rename it in a view first")
    return names


# The names of dp_group_by's aggregate columns (and the internal join key): no group column may take one.
_RESERVED_NAMES = frozenset({"dp__key"} | {a + suffix for a in AGGREGATES for suffix in ("", "_scale", "_ci")})


def _check_fraction(name: str, value: object, hint: str) -> float:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (0.0 < float(value) < 1.0):
        raise DPParameterError(f"{name} must be a number strictly between 0 and 1 (got {value!r}); {hint}")
    return float(value)


def check_selection_share(split: object) -> float:
    return _check_fraction("split", split, f"it is the share of epsilon spent on selection, e.g. {DEFAULT_SPLIT}")


def check_confidence(confidence: object) -> float:
    return _check_fraction("confidence", confidence, "it is the coverage of the reported intervals, e.g. 0.95")


def check_pre_threshold(pre_threshold: object) -> int:
    """A whole number >= 1 (1: no pre-threshold)."""
    if pre_threshold is None or isinstance(pre_threshold, bool) or not isinstance(pre_threshold, (int, float)) \
            or not math.isfinite(float(pre_threshold)) or float(pre_threshold) != int(pre_threshold) \
            or pre_threshold < 1:
        raise DPParameterError(f"pre_threshold must be a whole number >= 1 (got {pre_threshold!r}); it is the "
                               f"least number of users an item needs to be selected (1: no pre-threshold)")
    return int(pre_threshold)


_VALUE_AGGREGATES = ("sum", "mean", "variance", "stddev", "median")


def _check_bounds(needs_values: bool, value_col: object, lower: object, upper: object
                  ) -> tuple[Optional[float], Optional[float]]:
    if not needs_values:
        for name, v in (("value_col", value_col), ("lower", lower), ("upper", upper)):
            if v is not None:
                raise DPParameterError(f"{name} is used only by the sum, mean, variance, stddev and median "
                                       f"aggregates; add one of them to aggregates or leave {name} out")
        return None, None
    if value_col is None:
        raise DPParameterError("sum, mean, variance, stddev and median need value_col := '<column of numbers>'")
    check_identifier("value_col", value_col)
    bounds = []
    for name, v in (("lower", lower), ("upper", upper)):
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise DPParameterError(f"{name} must be a finite number (got {v!r}): the value aggregates clamp each "
                                   f"user's total per group to [lower, upper]; choose them from public knowledge, "
                                   f"never from the data")
        bounds.append(float(v))
    lo, hi = bounds
    if lo > hi:
        raise DPParameterError(f"lower must be <= upper (got lower = {lo!r}, upper = {hi!r})")
    if max(abs(lo), abs(hi)) == 0.0:
        raise DPParameterError("lower and upper must not both be 0 (every clamped value would be 0)")
    return lo, hi


def measurements(aggregates: Sequence[str]) -> tuple[str, ...]:
    """The measurements (:data:`MEASUREMENTS`) that ``aggregates`` are computed from."""
    aggs = set(aggregates)
    need = {"count": bool(aggs & {"count", "mean", "variance", "stddev"}), "rows": "rows" in aggs,
            "sum": bool(aggs & {"sum", "mean", "variance", "stddev"}), "sumsq": bool(aggs & {"variance", "stddev"}),
            "median": "median" in aggs}
    return tuple(m for m in MEASUREMENTS if need[m])


# --------------------------------------------------------------------------
# The selection's zCDP form
# --------------------------------------------------------------------------

def _gaussian_sigma_below(epsilon: float, delta: float) -> float:
    """The largest sigma found (bisection, 1e-12 relative) with ``gaussian_delta(sigma, epsilon) >= delta``:
    a lower bound of the sigma whose analytic Gaussian curve has ``delta`` at ``epsilon``."""
    lo, hi = 0.0, 1.0
    while calibration.gaussian_delta(hi, epsilon) > delta:
        lo, hi = hi, 2.0 * hi
    if lo == 0.0:  # find a lower end whose delta is above the target
        lo = hi / 2.0
        while calibration.gaussian_delta(lo, epsilon) <= delta:
            hi, lo = lo, lo / 2.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if calibration.gaussian_delta(mid, epsilon) >= delta:
            lo = mid
        else:
            hi = mid
    return lo


@lru_cache(maxsize=256)  # pure; its bisections cost milliseconds, and a release calibrates twice (below)
def selection_zcdp(method: str, epsilon: float, delta: float, max_items: int) -> Optional[tuple[float, float]]:
    """``(rho_s, delta_e)`` if ``method`` at ``(epsilon, delta)`` is a Gaussian mechanism of ``rho_s``-zCDP plus
    novel items released with probability ``<= delta_e`` (docs/proofs/group_by.md §9); else None.

    * a method whose calibration composes its rounds by the ``'gaussian'`` accountant (one Gaussian
      mechanism, ``calibration.Accounting``): sigma from its ``mechanism_delta`` at ``epsilon``
      (:func:`_gaussian_sigma_below`, never above the true one), ``delta_e`` its ``event_delta``;
    * a declared Gaussian domain method (``Mechanism.gaussian_domain``): ``sigma = gaussian_sigma(epsilon,
      delta/2)`` per unit of sensitivity, ``delta_e = delta/2``;

    ``rho_s = 1/(2 sigma^2)``. Laplace, the policies' basic rounds and GreedyUpdate: None.
    """
    with derived_budget():
        cal = union.calibrate(method, epsilon, delta, max_items)
        acc = cal.accounting
        if acc is not None and acc.accountant == accounting.GAUSSIAN:
            sigma = _gaussian_sigma_below(epsilon, acc.mechanism_delta)
            return 1.0 / (2.0 * sigma * sigma), acc.event_delta
        if union.METHODS[method].gaussian_domain and cal.noise == "gaussian":
            sigma = calibration.gaussian_sigma(epsilon, delta / 2.0)
            return 1.0 / (2.0 * sigma * sigma), delta / 2.0
    return None


# --------------------------------------------------------------------------
# The calibration
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    """One noisy vector: its per-group bound (value units; the median's: utility 1), grid, noise and half-widths.

    ``steps``: the per-group bound in grid steps (``B``); ``epsilon`` (Laplace) or ``rho`` (Gaussian): its
    share; ``scale``: Laplace ``b`` or Gaussian sigma (value units), for the median the Gumbel scale
    ``2/eps0``; ``ci`` at ``confidence``; ``ci_mean`` / ``ci_variance`` at the mean's and the variance's
    union-bound levels (None where not needed).
    """

    name: str
    bound: float
    granularity: Optional[float]
    steps: Optional[int]
    epsilon: Optional[float]
    rho: Optional[float]
    scale: float
    ci: float
    ci_mean: Optional[float] = None
    ci_variance: Optional[float] = None
    epsilon0: Optional[float] = None  # median: the exponential mechanism's epsilon per group


@dataclass(frozen=True)
class GroupByCalibration:
    """Budget split, contribution bounds, noise and intervals of dp_group_by / dp_group_by_public.

    ``selection`` is None for a public list of groups. The flat ``count_*`` / ``sum_*`` fields are those of
    the count and sum measurements (None when not made); ``measures`` lists every measurement made.
    ``accounting``: how the selection and the aggregates compose to the charged ``(epsilon, delta)``.
    """

    aggregates: tuple[str, ...]
    selection: Optional[str]
    selection_epsilon: float
    selection_delta: float
    aggregate_epsilon: float
    confidence: float
    lower: Optional[float]
    upper: Optional[float]
    noise: str = "laplace"
    max_groups: int = 100  # L0 of the noise: min(the cap, released_groups)
    max_rows: int = 1
    released_groups: Optional[int] = None  # the number of groups released (public after the selection), if known
    aggregate_delta: float = 0.0
    aggregate_rho: Optional[float] = None
    accounting: Optional[Accounting] = None
    measures: tuple[Measurement, ...] = ()
    count_epsilon: Optional[float] = None
    count_granularity: Optional[float] = None
    count_scale: Optional[float] = None
    count_ci: Optional[float] = None
    sum_epsilon: Optional[float] = None
    sum_bound: Optional[float] = None
    sum_granularity: Optional[float] = None
    sum_scale: Optional[float] = None
    sum_ci: Optional[float] = None
    mean_count_ci: Optional[float] = None
    mean_sum_ci: Optional[float] = None
    pre_threshold: int = 1
    # the truncated geometric coin: the cap of its counts (max_groups) and its (epsilon, delta) per group
    selection_cap: Optional[int] = None
    selection_group_epsilon: Optional[float] = None
    selection_group_delta: Optional[float] = None
    # post-aggregation thresholding: a group is released iff its noisy count is >= this
    selection_threshold: Optional[float] = None

    def measure(self, name: str) -> Optional[Measurement]:
        """The measurement ``name`` (:data:`MEASUREMENTS`), or None if the aggregates do not need it."""
        return next((m for m in self.measures if m.name == name), None)


def _union_levels(confidence: float) -> tuple[float, float]:
    """The per-measurement levels of the mean (2 intervals) and the variance (3): union bounds."""
    return 1.0 - (1.0 - confidence) / 2.0, 1.0 - (1.0 - confidence) / 3.0


def _per_group_bound(name: str, max_rows: int, lower: Optional[float], upper: Optional[float]) -> float:
    if name == "count" or name == "median":
        return 1.0
    if name == "rows":
        return float(max_rows)
    assert lower is not None and upper is not None
    if name == "sum":
        return max(abs(lower), abs(upper))
    half = (upper - lower) / 2.0
    return half * half  # sumsq: (clamped total - centre)^2 in [0, R^2]


def _laplace_measure(name: str, eps_m: float, l0: int, bound: float, levels: dict[str, float]) -> Measurement:
    if name == "median":
        eps0 = eps_m / l0
        return Measurement(name, 1.0, None, None, eps_m, None, 2.0 / eps0,
                           median_ci(eps0, MEDIAN_BINS + 1, levels["ci"]), epsilon0=eps0)
    if name in ("count", "rows"):
        # integers: a grid g <= 1 keeps them on it (no rounding: l1 = L0 * bound exactly)
        g = choose_granularity(l0 * bound / eps_m, None, 1.0)
        b = discrete_laplace_scale(eps_m, l0 * bound, g, coordinates=l0, on_grid=True)
        steps = int(bound)
    else:
        g = default_granularity(l0 * bound / eps_m)
        b = discrete_laplace_scale(eps_m, l0 * bound, g, coordinates=l0, on_grid=False)
        steps = calibration.grid_sensitivity(bound, g)
    cis = {k: laplace_ci(b, g, v) for k, v in levels.items()}
    return Measurement(name, bound, g, steps, eps_m, None, b, cis["ci"], cis.get("mean"), cis.get("variance"))


_MAX_STEPS = 2.0 ** 32


def _gaussian_measure(name: str, rho_m: float, l0: int, bound: float, levels: dict[str, float]) -> Measurement:
    if name == "median":
        eps0 = math.sqrt(8.0 * rho_m / l0)
        return Measurement(name, 1.0, None, None, None, rho_m, 2.0 / eps0,
                           median_ci(eps0, MEDIAN_BINS + 1, levels["ci"]), epsilon0=eps0)
    if name in ("count", "rows"):
        g, steps = 1.0, int(bound)  # integer counts on the integer grid: integer noise, integer output
    else:
        g = default_granularity(math.sqrt(l0) * bound / math.sqrt(2.0 * rho_m))
        steps = calibration.grid_sensitivity(bound, g)  # |rounded cell| <= floor(bound/g) + 1 steps
    # l2 shift sqrt(L0) * steps grid steps; rho_m = D^2 / (2 s^2)
    s = math.sqrt(l0) * steps / math.sqrt(2.0 * rho_m)
    if s > _MAX_STEPS:  # the sampler's limit (dpsql.core.noise.MAX_SCALE_STEPS): refused before anything runs
        raise DPParameterError(f"epsilon is too small for the {name} (its noise would exceed 2^32 grid steps); "
                               f"pass a larger epsilon")
    sigma = g * s
    cis = {k: gaussian_ci(sigma, g, v) for k, v in levels.items()}
    return Measurement(name, bound, g, steps, None, rho_m, sigma, cis["ci"], cis.get("mean"), cis.get("variance"))


def _levels(name: str, aggregates: tuple[str, ...], confidence: float) -> dict[str, float]:
    mean_level, variance_level = _union_levels(confidence)
    levels = {"ci": confidence}
    if "mean" in aggregates and name in ("count", "sum"):
        levels["mean"] = mean_level
    if {"variance", "stddev"} & set(aggregates) and name in ("count", "sum", "sumsq"):
        levels["variance"] = variance_level
    return levels


def _check_selection_budget(selection: str, epsilon: float, delta: float, max_items: int, max_groups: int) -> None:
    """The selection's own checks at its ``(epsilon, delta)``: a set-union method's calibration, or the truncated
    geometric table at ``(epsilon, delta) / max_groups`` per group (refused if it cannot be built)."""
    if selection == TRUNCATED_GEOMETRIC:
        rules.keep_numerators(epsilon / max_groups, delta / max_groups)
    else:
        union.calibrate(selection, epsilon, delta, max_items)


# The accountant's conversions (dp-accounting's RDP accountant: about 10 ms a call) depend on the budget only,
# not on the number of groups released; dp_group_by calibrates again once that number is known (dp__cal), so
# they are memoised: a release that selects a number of groups not seen before pays only for its measurements.
_account_zcdp = lru_cache(maxsize=256)(accounting.account_zcdp)


@lru_cache(maxsize=256)
def _calibration(aggregates: tuple[str, ...], epsilon: float, delta: Optional[float], max_items: int,
                 lower: Optional[float], upper: Optional[float], selection: Optional[str], split: float,
                 confidence: float, pre_threshold: int, noise: str, max_groups: int,
                 max_rows: int, groups: Optional[int] = None) -> GroupByCalibration:
    # a user contributes to at most min(cap, |S|) of the |S| released groups; with POST_THRESHOLD the count noise
    # decides S, so it (and with it every measurement) is calibrated before S: L0 = the cap
    post = selection == POST_THRESHOLD
    l0 = max_groups if groups is None or post else max(1, min(max_groups, groups))
    needed = measurements(aggregates)
    if post and "count" not in needed:  # the count selects: measured (and paid for) even if not released
        needed = ("count",) + needed
    k = len(needed)
    acc: Optional[Accounting] = None
    rho_a: Optional[float] = None
    agg_delta = 0.0
    own: dict[str, Any] = {}
    with derived_budget():
        if post:
            # no selection budget: every epsilon to the aggregates; the threshold event gets delta * split
            # (Gaussian; the whole delta with Laplace counts, which use none)
            assert delta is not None
            sel_eps, agg_eps = 0.0, epsilon
            if noise == "gaussian":
                sel_delta = delta * split
                agg_delta = delta - sel_delta
                rho_a = accounting.zcdp_budget(epsilon, agg_delta)
                acc = _account_zcdp(rho_a, sel_delta, epsilon, delta)
            else:
                sel_delta = delta
                acc = Accounting(accounting.BASIC, epsilon, delta, 0.0, sel_delta)
        elif selection is None:
            sel_eps, sel_delta, agg_eps = 0.0, 0.0, epsilon
            if noise == "gaussian":
                assert delta is not None
                agg_delta = delta
                rho_a = accounting.zcdp_budget(epsilon, delta)
                acc = _account_zcdp(rho_a, 0.0, epsilon, delta)
        else:
            assert delta is not None
            sel_eps, agg_eps = epsilon * split, epsilon * (1.0 - split)
            if noise == "laplace":
                sel_delta = delta
                _check_selection_budget(selection, sel_eps, sel_delta, max_items, max_groups)
            else:
                form = None if selection in SELECTIONS else selection_zcdp(selection, sel_eps, delta, max_items)
                if form is not None:
                    rho_s, events = form
                    sel_delta = delta
                    rho_a = accounting.zcdp_budget(epsilon, delta - events) - rho_s
                    if not rho_a > 0.0:
                        raise DPParameterError(
                            f"split is too large for Gaussian aggregates after selection := '{selection}' (got "
                            f"{split!r}): the selection alone uses the whole budget under zCDP; pass a smaller "
                            f"split, e.g. {DEFAULT_SPLIT}, or noise := 'laplace'")
                    acc = _account_zcdp(rho_s + rho_a, events, epsilon, delta)
                    agg_delta = delta - events
                else:
                    sel_delta = delta * split
                    _check_selection_budget(selection, sel_eps, sel_delta, max_items, max_groups)
                    agg_delta = delta * (1.0 - split)
                    rho_a = accounting.zcdp_budget(agg_eps, agg_delta)
                    acc = Accounting(accounting.BASIC, epsilon, delta, agg_delta, sel_delta)
        if acc is None:  # Laplace: basic composition of (sel_eps, sel_delta) and (agg_eps, 0)
            acc = Accounting(accounting.BASIC, epsilon, float(delta or 0.0), 0.0, sel_delta)
        measures = []
        for name in needed:
            bound = _per_group_bound(name, max_rows, lower, upper)
            levels = _levels(name, aggregates, confidence)
            if noise == "laplace":
                measures.append(_laplace_measure(name, agg_eps / k, l0, bound, levels))
            else:
                assert rho_a is not None
                measures.append(_gaussian_measure(name, rho_a / k, l0, bound, levels))
    by = {m.name: m for m in measures}
    if selection == TRUNCATED_GEOMETRIC:
        own.update(selection_cap=max_groups, selection_group_epsilon=sel_eps / max_groups,
                   selection_group_delta=sel_delta / max_groups)
    elif post:
        count = by["count"]
        assert count.granularity is not None
        own.update(selection_cap=max_groups,
                   selection_threshold=rules.count_threshold(noise == "gaussian", count.scale, count.granularity,
                                                             max_groups, sel_delta))
    out: dict[str, Any] = {}
    if "count" in by:
        m = by["count"]
        out.update(count_epsilon=m.epsilon, count_granularity=m.granularity, count_scale=m.scale, count_ci=m.ci,
                   mean_count_ci=m.ci_mean)
    if "sum" in by:
        m = by["sum"]
        out.update(sum_epsilon=m.epsilon, sum_bound=m.bound, sum_granularity=m.granularity, sum_scale=m.scale,
                   sum_ci=m.ci, mean_sum_ci=m.ci_mean)
    return GroupByCalibration(aggregates, selection, sel_eps, sel_delta, agg_eps, confidence, lower, upper,
                              noise=noise, max_groups=l0, max_rows=max_rows, released_groups=groups,
                              aggregate_delta=agg_delta,
                              aggregate_rho=rho_a, accounting=acc, measures=tuple(measures),
                              pre_threshold=pre_threshold, **own, **out)


class _PerSetting:
    """The type of :data:`PER_SETTING`."""

    def __repr__(self) -> str:
        return "PER_SETTING"


# group_by_calibration's ``selection`` when left out (dp_group_by's ``selection := NULL``): resolved by
# :func:`default_selection` of the checked ``max_items`` and ``max_groups`` (None there means a public list of
# groups, no selection).
PER_SETTING = _PerSetting()


def group_by_calibration(epsilon: object, delta: object, max_items: object = 100,
                         aggregates: Sequence[str] = ("count",), value_col: object = None, lower: object = None,
                         upper: object = None, selection: object = PER_SETTING,
                         split: object = DEFAULT_SPLIT, confidence: object = DEFAULT_CONFIDENCE,
                         pre_threshold: object = 1, noise: object = None, max_groups: object = None,
                         max_rows: object = 1, groups: Optional[int] = None) -> GroupByCalibration:
    """Validate the parameters of dp_group_by and split the budget (``selection=None``: a public list of groups;
    :data:`PER_SETTING`, the default: the rule :func:`default_selection` names for ``max_items`` and ``max_groups``,
    which the calibration records as its ``selection``).

    ``noise`` None: ``'gaussian'`` when a ``delta`` is given (always for a selection), else ``'laplace'``;
    Gaussian noise needs a delta. ``max_groups`` None: ``max_items``. ``groups``: the number of groups the
    selection released (or the public list holds), once known: no user contributes to more than that many,
    so the noise is calibrated to ``L0 = min(max_groups, groups)`` (the budget is the same; None: the cap,
    the bound before the selection). See the module docstring for the math; ``pre_threshold > 1`` needs a
    selection of :data:`PRE_THRESHOLD_METHODS` (not a public list).
    """
    aggs = check_aggregates(aggregates)
    epsilon = check_epsilon(epsilon)
    if selection is None:
        delta_value: Optional[float] = None if delta is None else check_delta(delta)
        split_value = 1.0
    else:
        selection = selection if isinstance(selection, _PerSetting) else check_selection(selection)
        delta_value = check_delta(delta)
        split_value = check_selection_share(split)
    max_items = check_max_items(max_items)
    noise_value = ("gaussian" if delta_value is not None else "laplace") if noise is None else check_noise(noise)
    if noise_value == "gaussian" and delta_value is None:
        raise DPParameterError("noise := 'gaussian' needs delta := <a small number, e.g. 1e-5>; or pass "
                               "noise := 'laplace' for (epsilon, 0)-DP")
    cap = check_max_groups(max_groups)
    if isinstance(selection, _PerSetting):  # the one place the default is resolved: public bounds only
        selection = default_selection(max_items, cap)
    rows = check_max_rows(max_rows)
    if rows != 1 and "rows" not in aggs:
        raise DPParameterError("max_rows is used only by the 'rows' aggregate; add 'rows' to aggregates or leave "
                               "max_rows out")
    conf = check_confidence(confidence)
    lo, hi = _check_bounds(bool(set(aggs) & set(_VALUE_AGGREGATES)), value_col, lower, upper)
    pre = check_pre_threshold(pre_threshold)
    if pre > 1 and selection not in PRE_THRESHOLD_METHODS:
        where = "a public list of items needs no selection" if selection is None else f"selection is {selection!r}"
        raise DPParameterError(f"pre_threshold > 1 needs selection := one of {', '.join(PRE_THRESHOLD_METHODS)} "
                               f"({where}); the adaptive and sequential methods have no proof for it")
    if selection is not None and selection != POST_THRESHOLD:  # it spends no epsilon on selection
        for part, share in (("selection", epsilon * split_value), ("aggregates", epsilon * (1.0 - split_value))):
            if share < EPSILON_MIN:
                raise DPParameterError(f"epsilon * split is too small for the {part} (got {share!r}); pass a larger "
                                       f"epsilon or a split nearer 0.5")
    if groups is not None and (isinstance(groups, bool) or int(groups) != groups or groups < 0):
        raise DPParameterError(f"groups must be a whole number >= 0 (got {groups!r})")
    return _calibration(aggs, epsilon, delta_value, max_items, lo, hi, selection,
                        split_value if selection is not None else 0.0, conf, pre, noise_value,
                        max_items if cap is None else cap, rows, None if groups is None else int(groups))
