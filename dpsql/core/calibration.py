"""Pure calibration formulas: noise scales and release thresholds.

Every function here is deterministic, cheap, and documented with the formula it
computes and the paper it comes from. Papers are cited by their short names:

* [BW18]  Balle & Wang, "Improving the Gaussian Mechanism for Differential
  Privacy: Analytical Calibration and Optimal Denoising", ICML 2018.
* [DPSU]  Gopi et al., "Differentially Private Set Union", ICML 2020.
* [MAD]   Chen et al., "Scalable Private Partition Selection via Adaptive
  Weighting".
* [MM]    Dick, Joseph & Raman, "Missing Mass for Differentially Private Domain
  Discovery".

Conventions (kept distinct on purpose): ``Lap(b)`` has density
``exp(-|x|/b) / (2b)``; ``N(0, sigma^2)`` is parameterised by its standard
deviation. ``delta_novel`` below is the probability budget of the event "some
item that only the new user holds is released"; set-union mechanisms spend
``delta/2`` on it in the Gaussian case (the other half goes to the Gaussian
mechanism itself) and the whole ``delta`` in the Laplace case (the Laplace
histogram is pure epsilon-DP).

All functions validate their arguments and raise :class:`~dpsql.core.errors.ParameterError`
(a :class:`ValueError`) with a message naming the parameter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
# scipy.special only: scipy.stats takes most of a second to import, on every CLI call.
from scipy.special import log_ndtr, ndtr, ndtri

from dpsql.core.validation import (
    DPParameterError,
    check_delta,
    check_epsilon,
    check_max_items,
    check_positive,
    user_budget,
)

NoveltyBound = Callable[[int], float]


def inv_sqrt(t: int) -> float:
    """h(t) = 1/sqrt(t): novel-item weight bound of Weighted Gaussian / Basic / WGM."""
    return 1.0 / math.sqrt(t)


def inv(t: int) -> float:
    """h(t) = 1/t: novel-item weight bound of Weighted Laplace ([DPSU] Thm 4.1, B.1)."""
    return 1.0 / t


def one(t: int) -> float:
    """h(t) = 1: novel-item count of a plain histogram ([DPSU] Thm A.1, A.2)."""
    return 1.0


# --------------------------------------------------------------------------
# Analytic Gaussian mechanism [BW18, Theorem 8]
# --------------------------------------------------------------------------

def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact delta of the Gaussian mechanism N(0, sigma^2) at epsilon [BW18, Thm 8].

    ``delta(sigma) = Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D)``
    with ``D`` the l2 sensitivity. Evaluated in log space
    (``exp(la) * -expm1(lb - la)`` with ``la``, ``lb`` the logs of the two
    terms) so that deltas down to 1e-300 keep their relative precision.
    """
    return _gaussian_delta(check_positive("sigma", sigma), check_epsilon(epsilon),
                           check_positive("sensitivity", sensitivity))


def _gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    # gaussian_delta on checked values: the bisection of gaussian_sigma calls it ~100 times
    a = sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    b = -sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    la = float(log_ndtr(a))
    lb = epsilon + float(log_ndtr(b))
    if lb >= la:  # cannot happen mathematically; guards rounding at tiny sigma
        return 0.0
    return math.exp(la) * -math.expm1(lb - la)


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest sigma whose Gaussian mechanism is (epsilon, delta)-DP [BW18, Alg. 1].

    ``gaussian_delta`` is strictly decreasing in sigma, so we double an upper
    bracket until ``delta(hi) <= delta`` and bisect 200 times, returning the
    upper end (the returned sigma always satisfies the target). Scale
    equivariant: ``gaussian_sigma(e, d, D) == D * gaussian_sigma(e, d, 1)``.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    lo, hi = 0.0, 1.0
    while _gaussian_delta(hi, epsilon, 1.0) > delta:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _gaussian_delta(mid, epsilon, 1.0) > delta:
            lo = mid
        else:
            hi = mid
    return sensitivity * hi


def gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest epsilon (to 1e-12 relative) at which ``N(0, sigma^2)`` is (epsilon, delta)-DP [BW18, Thm 8].

    ``gaussian_delta`` decreases in epsilon: bisection, returning the upper end (it always meets
    delta); 0 when the mechanism is (0, delta)-DP already.
    """
    sigma, delta = check_positive("sigma", sigma), check_delta(delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    s = sigma / sensitivity

    def d(e: float) -> float:  # _gaussian_delta at epsilon 0 is Phi(1/(2s)) - Phi(-1/(2s)), no check needed
        return _gaussian_delta(s, e, 1.0) if e > 0 else float(ndtr(0.5 / s) - ndtr(-0.5 / s))

    if d(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while d(hi) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if d(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The textbook bound ``D sqrt(2 ln(1.25/delta)) / eps`` (valid for eps < 1); for comparison only."""
    check_epsilon(epsilon)
    check_delta(delta)
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


# --------------------------------------------------------------------------
# Release thresholds for "novel" items ([DPSU] Thm 4.1 / 5.1, [MAD] Alg. 1)
# --------------------------------------------------------------------------

def _one_minus_root(delta_novel: float, t: int) -> float:
    """``1 - (1 - delta_novel)^(1/t)`` without cancellation."""
    return -math.expm1(math.log1p(-delta_novel) / t)


def gaussian_threshold(sigma: float, delta_novel: float, max_items: int,
                       h: NoveltyBound = inv_sqrt, *, union_bound: bool = False) -> float:
    """``rho = max_{t=1..max_items} h(t) + sigma * PhiInv((1 - delta_novel)^(1/t))``.

    [DPSU] Thm 5.1 / [MAD] Alg. 1 line 2 (where ``delta_novel = delta/2``): a
    new user creates ``t <= max_items`` novel items, each of weight ``<= h(t)``;
    at this rho, ``Pr[some novel item passes] = 1 - Phi((rho - h(t))/sigma)^t
    <= delta_novel`` for every t, with equality at the maximising t. Every t is
    evaluated (the argmax is not always an endpoint).

    ``union_bound=True``: ``rho = max_t h(t) + sigma * PhiInv(1 - delta_novel/t)``, for
    novel items whose noises are not independent given their weights (a union bound over
    the t items: ``t (1 - Phi((rho - h(t))/sigma)) <= delta_novel``). Never below the
    product form: ``1 - (1 - x)^(1/t) >= x/t``.
    """
    check_positive("sigma", sigma)
    check_delta(delta_novel, name="delta_novel")
    check_max_items(max_items)
    if union_bound:
        return max(h(t) + sigma * -float(ndtri(delta_novel / t)) for t in range(1, int(max_items) + 1))
    return max(h(t) + sigma * -float(ndtri(_one_minus_root(delta_novel, t)))
               for t in range(1, int(max_items) + 1))


def laplace_threshold(scale: float, delta_novel: float, max_items: int,
                      h: NoveltyBound = inv) -> float:
    """``rho = max_{t=1..max_items} h(t) + scale * ln(1 / (2 (1 - (1 - delta_novel)^(1/t))))``.

    [DPSU] Thm 4.1 (Laplace): ``Pr[Lap(b) > x] = exp(-x/b)/2`` for ``x >= 0``,
    and the t novel items get independent noise, so at this rho
    ``1 - (1 - exp(-(rho - h(t))/b)/2)^t <= delta_novel`` for every t.
    """
    check_positive("scale", scale)
    check_delta(delta_novel, name="delta_novel")
    check_max_items(max_items)
    return max(h(t) + scale * math.log(1.0 / (2.0 * _one_minus_root(delta_novel, t)))
               for t in range(1, int(max_items) + 1))


# --------------------------------------------------------------------------
# What a calibration returns (the families compute them: e.g. dpsql.union.basic)
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class RoundCalibration:
    """One round of a multi-round (or adaptive) release: its share of the budget and its calibration.

    In a multi-round release ``epsilon``/``delta`` are the round's nominal share (split fraction times
    the total); the rounds are composed by a privacy accountant, not by adding these shares.

    ``adaptive_threshold`` is MAD's truncation level tau (None for Basic rounds).
    """

    epsilon: float
    delta: float
    scale: float
    threshold: float
    adaptive_threshold: Optional[float] = None


@dataclass(frozen=True)
class Accounting:
    """Total privacy loss of a multi-round release, as computed by a privacy accountant (``dpsql.core.accounting``).

    ``accountant``: ``"gaussian"`` (rounds composed exactly as one Gaussian mechanism), ``"zcdp"``
    (zCDP added up, converted by the RDP accountant) or ``"basic"`` (rounds' budgets added).
    ``delta`` is the total delta at the charged epsilon, ``mechanism_delta + event_delta``;
    ``epsilon`` is the total epsilon at the charged delta. Both are <= the charged values.
    """

    accountant: str
    epsilon: float
    delta: float
    mechanism_delta: float  # the accountant's delta of the composed noise mechanisms at the charged epsilon
    event_delta: float  # sum of the rounds' failure probabilities (novel items released)


@dataclass(frozen=True)
class SetUnionCalibration:
    """Noise and threshold of one weight-and-threshold release.

    ``noise`` is ``"gaussian"`` (``scale`` = standard deviation) or
    ``"laplace"`` (``scale`` = b); an item is released when
    ``weight + noise > threshold``. Adaptive and multi-round methods
    (``dpsql.union.adaptive``) also list their ``rounds``; ``scale`` and
    ``threshold`` are then those of the last round.
    """

    noise: str
    scale: float
    threshold: float
    rounds: tuple[RoundCalibration, ...] = ()
    accounting: Optional[Accounting] = None  # multi-round methods: the accountant's total


# --------------------------------------------------------------------------
# Granular ("snapped") noise: grids, sensitivity after rounding, discrete
# Laplace and discrete Gaussian calibration
# --------------------------------------------------------------------------
#
# [CKS20] Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential
#         Privacy", NeurIPS 2020.
# [Mir12] Mironov, "On Significance of the Least Significant Bits for
#         Differential Privacy", CCS 2012 (floating-point attack on textbook Laplace).
#
# Granular noise releases ``round_g(q(x)) + g * Z`` with ``g = 2^-k`` and ``Z`` an
# integer (discrete Laplace or discrete Gaussian in grid units). Every output is
# an exact multiple of ``g`` whatever the input, so the set of possible outputs
# no longer depends on the data ([Mir12]'s attack reads exactly that), and the
# privacy loss is the ratio of two integer pmfs, computed here without borrowing
# the continuous calibration.

# Default grid: the largest power of two <= scale / 2^GRID_BITS, i.e. the noise
# spans 2^16 .. 2^17 grid steps per unit of scale. Fine enough that rounding
# costs a relative 2^-16 of the scale at most (off-grid values), coarse enough
# that the exact discrete Gaussian calibration sums O(2^17 * 10) terms and the
# samplers' floating-point steps stay far below a grid step.
GRID_BITS = 16


def _largest_power_of_two_at_most(x: float) -> float:
    m, e = math.frexp(x)  # x = m 2^e, 0.5 <= m < 1
    return math.ldexp(1.0, e - 1)


def check_granularity(granularity: object, name: str = "granularity") -> float:
    """A grid step ``g = 2^-k``: finite, > 0 and an exact power of two (any integer k)."""
    g = check_positive(name, granularity)
    if math.frexp(g)[0] != 0.5:
        raise DPParameterError(
            f"{name} must be a power of two such as 1, 0.5, 2^-10 (got {granularity!r}); "
            f"rounding to a power-of-two grid is exact in floating point")
    return g


def default_granularity(scale: float, bits: int = GRID_BITS) -> float:
    """``g = 2^floor(log2(scale)) / 2^bits``: the largest power of two ``<= scale / 2^bits``."""
    scale = check_positive("scale", scale)
    return math.ldexp(_largest_power_of_two_at_most(scale), -int(bits))


def choose_granularity(scale: float, granularity: Optional[float] = None,
                       max_granularity: Optional[float] = None) -> float:
    """The grid a granular mechanism uses: ``granularity`` if given (checked), else :func:`default_granularity`.

    ``max_granularity`` (a power of two) caps the grid, e.g. 1 for integer counts, which
    must stay on the grid: an explicit ``granularity`` above it is an error.
    """
    if granularity is None:
        g = default_granularity(scale)
        return g if max_granularity is None else min(g, check_granularity(max_granularity, "max_granularity"))
    g = check_granularity(granularity)
    if max_granularity is not None and g > max_granularity:
        raise DPParameterError(
            f"granularity must be <= {max_granularity!r} here (got {granularity!r}) so that the "
            f"exact values stay on the grid; pass e.g. granularity := 1 or leave it NULL")
    return g


def grid_sensitivity(sensitivity: float, granularity: float, coordinates: int = 1,
                     on_grid: bool = False) -> int:
    """l1 sensitivity, in grid steps, of a query rounded to the nearest multiple of ``g``.

    Two rounded values are multiples of ``g``. On the grid already (e.g. integer
    counts with ``g <= 1``) rounding moves nothing: the distance is a multiple of
    ``g`` that is ``<= sensitivity``, i.e. ``floor(sensitivity / g)`` steps.
    Otherwise each of the ``coordinates`` values that differ moves by ``<= g/2``,
    so each rounded difference is ``<= |d_i| + g`` and the total is
    ``<= floor(sensitivity / g) + coordinates`` steps. At least 1 step.
    """
    s = check_positive("sensitivity", sensitivity)
    g = check_granularity(granularity)
    if isinstance(coordinates, bool) or int(coordinates) != coordinates or coordinates < 1:
        raise DPParameterError(f"coordinates must be a whole number >= 1 (got {coordinates!r})")
    steps = math.floor(s / g * (1.0 + 1e-12))  # 1e-12: an exact multiple must not lose a step to rounding
    steps = int(steps) if on_grid else int(steps) + int(coordinates)
    return max(1, steps)


def rounded_sensitivity(sensitivity: float, granularity: float, coordinates: int = 1,
                        on_grid: bool = False) -> float:
    """``g * grid_sensitivity(...)``: the sensitivity after rounding, in value units (<= sensitivity + coordinates g)."""
    return check_granularity(granularity) * grid_sensitivity(sensitivity, granularity, coordinates, on_grid)


def discrete_laplace_scale(epsilon: float, sensitivity: float = 1.0, granularity: Optional[float] = None,
                           coordinates: int = 1, on_grid: bool = False) -> float:
    """Scale ``b`` of granular Laplace noise ``g DLap(b/g)`` that is exactly epsilon-DP.

    ``DLap(t)`` has pmf ``prop. to exp(-|z|/t)`` on the integers; in value units
    ``P[g z] prop. to exp(-g|z|/b)``. Shifting a grid vector by ``D`` steps in l1
    (``D`` = :func:`grid_sensitivity`) changes the pmf by at most ``exp(g D / b)``, so
    ``b = g D / epsilon`` gives epsilon-DP exactly (the geometric mechanism,
    Ghosh, Roughgarden & Sundararajan 2009; [CKS20] Sec. 2). ``granularity=None``
    uses :func:`default_granularity` of the continuous scale ``sensitivity/epsilon``.
    """
    epsilon = check_epsilon(epsilon)
    sensitivity = check_positive("sensitivity", sensitivity)
    g = choose_granularity(sensitivity / epsilon, granularity)
    return rounded_sensitivity(sensitivity, g, coordinates, on_grid) / epsilon


def discrete_laplace_log_tail(m: int, scale: float, granularity: float) -> float:
    """``ln P[Z >= m]`` for ``Z ~ DLap(t)``, ``t = scale/g``, ``alpha = exp(-1/t)`` (m an integer).

    pmf ``(1-alpha)/(1+alpha) alpha^|z|``, so ``P[Z >= m] = alpha^m / (1+alpha)`` for
    ``m >= 1`` and ``1 - alpha^(1-m)/(1+alpha)`` for ``m <= 0`` (symmetry).
    """
    t = check_positive("scale", scale) / check_granularity(granularity)
    m = int(m)
    log_alpha = -1.0 / t
    log_1p_alpha = math.log1p(math.exp(log_alpha))
    if m >= 1:
        return m * log_alpha - log_1p_alpha
    return math.log1p(-math.exp((1 - m) * log_alpha - log_1p_alpha))


def discrete_laplace_threshold(scale: float, granularity: float, delta_novel: float, base: float = 1.0) -> float:
    """Smallest grid point ``rho = base + g m`` with ``P[base + g Z >= rho] <= delta_novel``, ``Z ~ DLap(scale/g)``.

    ``m = ceil(t (ln(1/delta_novel) - ln(1+alpha)))`` by the tail of
    :func:`discrete_laplace_log_tail` (then corrected by one step if floating
    point rounded it). A novel key of exact value ``base`` (on the grid) passes
    ``noisy >= rho`` with probability ``<= delta_novel``. As ``g -> 0`` this tends
    to the continuous ``base + scale ln(1/(2 delta_novel))``.
    """
    g = check_granularity(granularity)
    scale = check_positive("scale", scale)
    delta_novel = check_delta(delta_novel, name="delta_novel")
    t = scale / g
    target = math.log(delta_novel)
    m = max(1, math.ceil(t * (-target - math.log1p(math.exp(-1.0 / t)))))
    while discrete_laplace_log_tail(m, scale, g) > target:
        m += 1
    while m > 1 and discrete_laplace_log_tail(m - 1, scale, g) <= target:
        m -= 1
    return base + g * m


def _discrete_gaussian_log_norm(s: float) -> float:
    """``ln sum_z exp(-z^2 / (2 s^2))``: Poisson summation ``s sqrt(2 pi) (1 + 2 sum_j exp(-2 pi^2 s^2 j^2))`` for s >= 1."""
    if s >= 1.0:
        theta = 1.0 + 2.0 * sum(math.exp(-2.0 * math.pi ** 2 * s * s * j * j) for j in range(1, 4))
        return math.log(s * math.sqrt(2.0 * math.pi) * theta)
    z = np.arange(-40, 41, dtype=np.float64)
    return float(np.log(np.sum(np.exp(-z * z / (2.0 * s * s)))))


def _discrete_gaussian_delta_steps(s: float, epsilon: float, shift: int) -> float:
    """Exact delta(epsilon) of ``q + N_Z(0, s^2)`` for an integer shift ``shift`` [CKS20, Thm 7].

    ``delta = sum_{y > eps s^2/D + D/2} p(y - D) - e^eps p(y)`` (the terms are the
    positive part of the pmf difference, privacy loss ``(2yD - D^2)/(2 s^2)``),
    summed term by term in chunks (no cancellation) until the remaining tail is
    negligible; the tail beyond the last term is bounded by
    ``p(k) / (1 - exp(-k/s^2))`` for ``k = last + 1 > 0`` and added (an upper bound).
    """
    D = int(shift)
    y0 = math.floor(epsilon * s * s / D + D / 2.0) + 1
    log_norm = _discrete_gaussian_log_norm(s)
    two_s2 = 2.0 * s * s
    chunk = 1 << 16
    total = 0.0
    start = y0
    while True:
        y = np.arange(start, start + chunk, dtype=np.float64)
        z = y - D
        log_p = -z * z / two_s2 - log_norm
        loss = (2.0 * y * D - D * D) / two_s2
        total += float(np.sum(np.exp(log_p) * -np.expm1(epsilon - loss)))
        k = start + chunk - D  # first z not summed yet
        if k > 0:
            log_rest = -k * k / two_s2 - log_norm - math.log(-math.expm1(-k / (s * s)))
            rest = math.exp(log_rest) if log_rest > -745 else 0.0
            if rest <= 1e-13 * total or rest == 0.0:
                return min(1.0, total + rest)
        start += chunk


def discrete_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0, granularity: float = 1.0,
                            on_grid: bool = False) -> float:
    """Exact delta(epsilon) of granular Gaussian noise ``g N_Z(0, (sigma/g)^2)`` on ONE rounded value [CKS20, Thm 7].

    The rounded value moves by ``D = grid_sensitivity(sensitivity, g, 1, on_grid)``
    steps at most; [CKS20] Thm 7 shows the shift ``D`` is the worst case. Computed
    by :func:`_discrete_gaussian_delta_steps` (an upper bound tight to ~1e-13 relative).
    One-dimensional: for vectors use [CKS20] Thm 15, which this does not implement.
    """
    sigma = check_positive("sigma", sigma)
    epsilon = check_epsilon(epsilon)
    g = check_granularity(granularity)
    D = grid_sensitivity(sensitivity, g, 1, on_grid)
    return _discrete_gaussian_delta_steps(sigma / g, epsilon, D)


# The exact sum costs O(sigma/g) per evaluation; refuse grids that would make it slow.
MAX_GAUSSIAN_STEPS = 2.0 ** 22


def discrete_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0,
                            granularity: Optional[float] = None, on_grid: bool = False) -> float:
    """Smallest sigma (to ~1e-7 relative) of granular Gaussian noise on one rounded value that is (epsilon, delta)-DP.

    Starts from the analytic continuous sigma [BW18] for the rounded sensitivity
    ``g D`` and checks it with the exact :func:`discrete_gaussian_delta`; then
    brackets and bisects on sigma so that the returned value meets the target
    exactly (``discrete_gaussian_delta(sigma) <= delta``, close to it).
    ``granularity=None`` uses :func:`default_granularity` of the continuous sigma.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    g = choose_granularity(gaussian_sigma(epsilon, delta, sensitivity), granularity)
    D = grid_sensitivity(sensitivity, g, 1, on_grid)
    s0 = gaussian_sigma(epsilon, delta, float(D))  # continuous sigma in grid steps
    if s0 > MAX_GAUSSIAN_STEPS:
        raise DPParameterError(
            f"granularity {g!r} is too fine for sigma ~ {s0 * g:.6g} (more than 2^22 grid steps per sigma); "
            f"pass granularity >= sigma / 2^22 or leave it NULL")
    f = lambda s: _discrete_gaussian_delta_steps(s, epsilon, D)  # noqa: E731
    d0 = f(s0)
    if d0 <= delta and d0 >= delta * (1.0 - 1e-4):
        return s0 * g
    # bracket [lo, hi] with f(lo) > delta >= f(hi); f decreases in s
    step = 1e-6 * s0
    if d0 > delta:
        lo, hi = s0, s0 + step
        while f(hi) > delta:
            lo, hi, step = hi, hi + 4 * step, 4 * step
    else:
        lo, hi = max(s0 - step, 0.5 * s0), s0
        while f(lo) <= delta:
            lo, hi, step = max(lo - 4 * step, 0.5 * lo), lo, 4 * step
    while hi - lo > 1e-7 * hi:
        mid = 0.5 * (lo + hi)
        if f(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi * g
