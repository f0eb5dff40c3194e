"""dp_group_by's own selection rules: the truncated geometric coin and post-aggregation thresholding.

Privacy unit: user-level add/remove. Proof notes: ``docs/proofs/truncated_geometric.md`` and
``docs/proofs/post_threshold.md``. Both read the count ``n(x)`` of users holding group ``x`` after each user
keeps at most ``L0 = max_groups`` of its groups (a salted hash of its own rows), so adding one user moves at
most ``L0`` counts, each by exactly 1 (a group held by no one else goes from absent to ``n = 1``).

**truncated_geometric** ([DVGM22], the optimal rule for one group per user): group ``x`` is kept with
probability ``p(n(x))``, one independent coin per group. For ``(e0, d0) = (eps_s / L0, delta_s / L0)`` (basic
composition over the ``L0`` groups a user moves) the largest ``(e0, d0)``-DP keep probabilities are

    pi(0) = 0,  pi(n) = min(e^e0 pi(n-1) + d0,  1 - e^-e0 (1 - pi(n-1) - d0),  1)

with the closed form (``c = d0 / (e^e0 - 1)``, ``pi* = (1 - d0) / (1 + e^e0)``, ``m`` the last ``n`` whose
predecessor is ``<= pi*``)::

    pi(n) = c (e^(n e0) - 1)                                  n <= m     (geometric growth)
    pi(n) = min(1, 1 + c - e^(-(n - m) e0) (1 - pi(m) + c))   n > m      (the gap to 1 + c shrinks by e^-e0)

:func:`keep_numerators` runs the recursion in integer arithmetic, rounding every step towards privacy and
snapping it down to the grid ``2^-53``: each ``p(n) = K_n / 2^53`` meets both constraints EXACTLY (for the
double ``d0`` the user passed and any ``e^e0`` within ``2^-50`` of ``math.exp``). :func:`keep` draws
``U = k / 2^53`` (``NoiseSource.uniform``: numpy's double is the top 53 bits of a ChaCha20 word, ``k``
uniform on ``0 .. 2^53 - 1``) and keeps iff ``U < p(n)``: probability ``K_n / 2^53`` exactly.

**post_threshold** (post-aggregation thresholding): the count measurement itself, ``n(x) + Z`` over every
group of the data (``Z`` the count's noise: ``N_Z(0, s^2)`` or ``g DLap(b/g)``), is released for the groups
where it is ``>= tau``; :func:`count_threshold` gives the least ``tau = 1 + g m`` (``m`` whole) with
``1 - (1 - P[Z >= g m])^L0 <= delta_e``: the probability that any of the ``<= L0`` groups only the added user
holds (count 1) is released.

[DVGM22] Desfontaines, Voss, Gipson & Mandayam, Differentially private partition selection, PoPETs 2022.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pyarrow as pa
from scipy.special import ndtri

from dpsql.core.validation import DPParameterError

__all__ = ["TRUNCATED_GEOMETRIC", "POST_THRESHOLD", "SELECTIONS", "GRID_BITS", "MAX_TABLE",
           "release_probability", "keep_numerators", "keep_probabilities", "keep", "keep_with",
           "discrete_gaussian_tail", "discrete_laplace_tail", "count_threshold", "novel_release_probability"]

TRUNCATED_GEOMETRIC = "truncated_geometric"
POST_THRESHOLD = "post_threshold"
# dp_group_by's own selection rules (beside the set-union methods of dpsql.union)
SELECTIONS = (TRUNCATED_GEOMETRIC, POST_THRESHOLD)

GRID_BITS = 53  # the coin's grid: p(n) = K_n / 2^53, the resolution of NoiseSource.uniform
_WORK_BITS = GRID_BITS + 64  # the recursion's fixed point: 64 guard bits below the coin's grid
# The longest table (n up to where p reaches 1): ~ (ln(1/d0) + 2) / e0 entries; beyond it e0 is refused.
MAX_TABLE = 2_000_000


# --------------------------------------------------------------------------
# truncated geometric
# --------------------------------------------------------------------------

def release_probability(n: int, epsilon: float, delta: float) -> float:
    """The ideal ``pi(n)`` at ``(epsilon, delta)`` per group, by the closed form (module docstring), in floats.

    For documentation and comparison: the coin uses :func:`keep_probabilities` (never above this, and within
    ``~2^-53 / delta`` of it relatively)."""
    if n <= 0:
        return 0.0
    a = math.exp(epsilon)
    c = delta / math.expm1(epsilon)
    star = (1.0 - delta) / (1.0 + a)
    # m: the last n whose predecessor is <= pi*: pi(m - 1) = c (e^((m-1) e0) - 1) <= pi*
    m = 1 + math.floor(math.log1p(star / c) / epsilon)
    if n <= m:
        return min(1.0, c * math.expm1(n * epsilon))
    pm = c * math.expm1(m * epsilon)
    return min(1.0, 1.0 + c - math.exp(-(n - m) * epsilon) * (1.0 - pm + c))


@lru_cache(maxsize=64)
def keep_numerators(epsilon: float, delta: float) -> tuple[int, ...]:
    """``K_0 = 0, K_1, ..., K_N = 2^53``: the keep probabilities ``K_n / 2^53`` of ``(epsilon, delta)``-DP
    (per group), the optimal recursion rounded towards privacy (module docstring); ``p(n) = 1`` for ``n >= N``.

    Work unit ``2^-W`` (``W = 117``): ``d = floor(delta 2^W)``, ``a = floor(e^epsilon (1 - 2^-50) 2^W)`` (a lower
    bound of ``e^epsilon 2^W``), ``k`` the last value (a multiple of ``2^(W-53)``)::

        first  = floor(a k / 2^W) + d                     <= e^eps p + delta
        second = 2^W - ceil((2^W - k - d) 2^W / a)        <= 2^W (1 - e^-eps (1 - p - delta))
        k'     = min(first, second, 2^W) rounded down to a multiple of 2^(W-53)

    ``a >= 2^W`` makes both ``>= k``: the table increases.
    """
    if not (epsilon > 0.0 and math.isfinite(epsilon)) or not 0.0 < delta < 1.0:
        raise DPParameterError(f"the truncated geometric selection needs epsilon > 0 and 0 < delta < 1 per group "
                               f"(got {epsilon!r}, {delta!r})")
    w, shift = _WORK_BITS, _WORK_BITS - GRID_BITS
    one = 1 << w
    d = math.floor(Fraction(delta) * one)
    a = math.floor(Fraction(math.exp(epsilon)) * (1 - Fraction(1, 1 << 50)) * one)
    if a < one or d == 0:
        raise DPParameterError(f"epsilon per group {epsilon!r} or delta per group {delta!r} is too small for the "
                               f"truncated geometric selection; pass a larger epsilon, delta or split, or a smaller "
                               f"max_groups")
    out = [0]
    k = 0
    while k < one:
        if len(out) > MAX_TABLE:
            raise DPParameterError(f"epsilon per group {epsilon!r} is too small for the truncated geometric "
                                   f"selection (its keep probability would need more than {MAX_TABLE} users to "
                                   f"reach 1); pass a larger epsilon or split, or a smaller max_groups")
        first = ((a * k) >> w) + d
        rest = one - k - d
        second = one if rest <= 0 else one - (-((-rest * one) // a))  # ceil division
        k = (min(first, second, one) >> shift) << shift
        out.append(k >> shift)
    return tuple(out)


@lru_cache(maxsize=64)
def keep_probabilities(epsilon: float, delta: float) -> np.ndarray:
    """:func:`keep_numerators` as exact doubles ``K_n / 2^53`` (read-only)."""
    p = np.array(keep_numerators(epsilon, delta), dtype=np.float64) / float(1 << GRID_BITS)
    p.setflags(write=False)
    return p


def keep(uniform: np.ndarray, counts: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The coins: ``uniform[i] < p(counts[i])`` (``p(n) = 1`` past the table, ``0`` for ``n <= 0``).

    ``uniform`` must be multiples of ``2^-53`` in ``[0, 1)`` (``NoiseSource.uniform``); then the keep
    probability is exactly ``p(n)``."""
    return keep_with(keep_probabilities(epsilon, delta), uniform, counts)


def keep_with(table: np.ndarray, uniform: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`keep` with the table ``p`` (:func:`keep_probabilities`) given: ``uniform[i] < p(counts[i])``.

    For tasks that get the table computed once elsewhere (the Spark backend's coin: numpy only)."""
    idx = np.clip(np.asarray(counts, dtype=np.int64), 0, len(table) - 1)
    return np.asarray(uniform) < table[idx]


def keep_udf(source: object):
    """Arrow body of ``dp__group_by_keep(n, epsilon, delta)``: one coin per row from ``source`` (a
    :class:`dpsql.core.noise.NoiseSource`); ``epsilon`` and ``delta`` (per group) are one constant each."""

    def udf(n: pa.Array, epsilon: pa.Array, delta: pa.Array) -> pa.Array:
        if n.null_count or epsilon.null_count or delta.null_count:
            raise DPParameterError("dp__group_by_keep: n, epsilon and delta must not be NULL")
        eps, dlt = np.unique(epsilon.to_numpy(zero_copy_only=False)), np.unique(delta.to_numpy(zero_copy_only=False))
        if len(n) == 0:
            return pa.array([], type=pa.bool_())
        if len(eps) != 1 or len(dlt) != 1:
            raise DPParameterError("dp__group_by_keep: epsilon and delta must be constants")
        counts = n.to_numpy(zero_copy_only=False)
        u = source.uniform(len(counts))  # type: ignore[attr-defined]
        return pa.array(keep(u, counts, float(eps[0]), float(dlt[0])), type=pa.bool_())

    udf.__name__ = "dp__group_by_keep"
    return udf


# --------------------------------------------------------------------------
# post-aggregation thresholding
# --------------------------------------------------------------------------

_EXACT_MAX_SIGMA = 2.0 ** 12  # up to this sigma the discrete Gaussian's tail is summed term by term


def discrete_gaussian_tail(sigma: float, m: int) -> float:
    """``P[Z >= m]`` for ``Z ~ N_Z(0, sigma^2)``, ``m >= 0`` whole.

    ``sigma <= 2^12``: the sums of ``exp(-z^2 / (2 sigma^2))`` over ``|z| <= 40 sigma + 1`` (the mass beyond is
    below ``e^-800``, 0 in doubles). Above: the bound ``1 - Phi((m - 1)/sigma)`` for ``m >= 1``
    (``sum_{z >= m} <= int_(m-1)^inf`` for a decreasing integrand, and the normaliser ``>= sigma sqrt(2 pi)``
    by Poisson summation), 1 for ``m = 0``."""
    return float(_gaussian_tails(sigma, m + 1)[m]) if sigma <= _EXACT_MAX_SIGMA else _gaussian_tail_bound(sigma, m)


def _gaussian_tail_bound(sigma: float, m: int) -> float:
    if m <= 0:
        return 1.0
    return 0.5 * math.erfc((m - 1) / (sigma * math.sqrt(2.0)))


def _gaussian_tails(sigma: float, at_least: int = 0) -> np.ndarray:
    """``P[Z >= m]`` for ``m = 0 .. R`` (``R = max(ceil(40 sigma) + 1, at_least)``), exact sums."""
    r = max(math.ceil(40.0 * sigma) + 1, at_least)
    z = np.arange(r + 1, dtype=np.float64)
    w = np.exp(-z * z / (2.0 * sigma * sigma))
    tail = np.cumsum(w[::-1])[::-1]  # sum_{z >= m}, added from the smallest terms up
    norm = 2.0 * tail[0] - w[0]
    return tail / norm


def discrete_laplace_tail(t: float, m: int) -> float:
    """``P[D >= m] = alpha^m / (1 + alpha)`` for ``D ~ DLap(t)`` (pmf ``prop. to alpha^|z|``, ``alpha = e^(-1/t)``),
    ``m >= 0`` whole."""
    alpha = math.exp(-1.0 / t)
    return math.exp(-m / t) / (1.0 + alpha)


def novel_release_probability(tail: float, max_groups: int) -> float:
    """``1 - (1 - tail)^L0``: the probability that some of ``L0`` independent count-1 groups is released."""
    return -math.expm1(max_groups * math.log1p(-tail)) if tail < 1.0 else 1.0


# The margin below delta_e that absorbs the float error of the sums (relative ~1e-12 at most).
_MARGIN = 1e-9


def count_threshold(gaussian: bool, scale: float, granularity: float, max_groups: int, delta_e: float) -> float:
    """The least ``tau = 1 + g m`` (``m >= 0`` whole) with ``1 - (1 - P[Z >= g m])^L0 <= (1 - 10^-9) delta_e``.

    A group only the added user holds has count 1 and is released iff ``1 + Z >= tau``, i.e. ``Z >= g m``.
    ``gaussian``: ``Z = N_Z(0, scale^2)`` (``g = 1``); else ``Z = g DLap(scale/g)``."""
    target = (1.0 - _MARGIN) * delta_e

    def ok(tail: float) -> bool:
        return novel_release_probability(tail, max_groups) <= target

    if gaussian:
        if scale <= _EXACT_MAX_SIGMA:
            tails = _gaussian_tails(scale)  # decreasing in m, so is the novel-release probability
            with np.errstate(divide="ignore"):
                novel = -np.expm1(max_groups * np.log1p(-tails))
            hits = np.nonzero(novel <= target)[0]
            if not len(hits):
                raise DPParameterError("delta is too small for post_threshold at this noise; pass a larger delta")
            m = int(hits[0])
        else:
            per_group = -math.expm1(math.log1p(-target) / max_groups)
            m = max(1, math.ceil(1.0 + scale * float(-ndtri(per_group))))
            while m > 1 and ok(_gaussian_tail_bound(scale, m - 1)):
                m -= 1
            while not ok(_gaussian_tail_bound(scale, m)):
                m += 1
        return 1.0 + float(m)
    t = scale / granularity
    alpha = math.exp(-1.0 / t)
    # alpha^m / (1 + alpha) <= per-group target: m >= t ln(1 / (target (1 + alpha)))
    per_group = -math.expm1(math.log1p(-target) / max_groups)
    m = max(0, math.ceil(t * math.log(1.0 / (per_group * (1.0 + alpha)))))
    while m > 0 and ok(discrete_laplace_tail(t, m - 1)):
        m -= 1
    while not ok(discrete_laplace_tail(t, m)):
        m += 1
    return 1.0 + granularity * m
