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

All functions validate their arguments and raise :class:`ValueError` with a
message naming the parameter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

# scipy.special only: scipy.stats takes most of a second to import, on every CLI call.
from scipy.special import log_ndtr, ndtri

from dpsql.validation import (
    check_delta,
    check_epsilon,
    check_max_items,
    check_positive,
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
    check_positive("sigma", sigma)
    check_epsilon(epsilon)
    check_positive("sensitivity", sensitivity)
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
    check_epsilon(epsilon)
    check_delta(delta)
    check_positive("sensitivity", sensitivity)
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, epsilon) > delta:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if gaussian_delta(mid, epsilon) > delta:
            lo = mid
        else:
            hi = mid
    return sensitivity * hi


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
                       h: NoveltyBound = inv_sqrt) -> float:
    """``rho = max_{t=1..max_items} h(t) + sigma * PhiInv((1 - delta_novel)^(1/t))``.

    [DPSU] Thm 5.1 / [MAD] Alg. 1 line 2 (where ``delta_novel = delta/2``): a
    new user creates ``t <= max_items`` novel items, each of weight ``<= h(t)``;
    at this rho, ``Pr[some novel item passes] = 1 - Phi((rho - h(t))/sigma)^t
    <= delta_novel`` for every t, with equality at the maximising t. Every t is
    evaluated (the argmax is not always an endpoint).
    """
    check_positive("sigma", sigma)
    check_delta(delta_novel, name="delta_novel")
    check_max_items(max_items)
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
# Per-mechanism calibration of the set-union family
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class RoundCalibration:
    """One round of a multi-round (or adaptive) release: its share of the budget and its calibration.

    ``adaptive_threshold`` is MAD's truncation level tau (None for Basic rounds).
    """

    epsilon: float
    delta: float
    scale: float
    threshold: float
    adaptive_threshold: Optional[float] = None


@dataclass(frozen=True)
class SetUnionCalibration:
    """Noise and threshold of one weight-and-threshold release.

    ``noise`` is ``"gaussian"`` (``scale`` = standard deviation) or
    ``"laplace"`` (``scale`` = b); an item is released when
    ``weight + noise > threshold``. Adaptive and multi-round methods
    (``dpsql.adaptive``) also list their ``rounds``; ``scale`` and
    ``threshold`` are then those of the last round.
    """

    noise: str
    scale: float
    threshold: float
    rounds: tuple[RoundCalibration, ...] = ()


def _checked(epsilon: float, delta: float, max_items: int) -> tuple[float, float, int]:
    return check_epsilon(epsilon), check_delta(delta), check_max_items(max_items)


def weighted_gaussian_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Weighted Gaussian = WGM [MM Alg. 1] = Basic [MAD App. A] ([DPSU] Thm 5.1).

    Each capped user adds ``1/sqrt(|W'|)`` to its items (l2 sensitivity 1);
    ``sigma = sigma(eps, delta/2)``, ``rho`` = :func:`gaussian_threshold` with
    ``delta_novel = delta/2`` and ``h(t) = 1/sqrt(t)``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    sigma = gaussian_sigma(epsilon, delta / 2.0)
    return SetUnionCalibration("gaussian", sigma, gaussian_threshold(sigma, delta / 2.0, max_items, inv_sqrt))


def weighted_laplace_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Weighted Laplace ([DPSU] App. B, Thm 4.1 threshold).

    Each capped user adds ``1/|W'|`` (l1 sensitivity 1); noise ``Lap(1/eps)``;
    ``rho`` = :func:`laplace_threshold` with the whole delta and ``h(t) = 1/t``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    scale = 1.0 / epsilon
    return SetUnionCalibration("laplace", scale, laplace_threshold(scale, delta, max_items, inv))


def count_gaussian_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Count Gaussian, the baseline of [DPSU] Sec. 1.1 (threshold derived, see spec Sec. 2.2).

    Each capped user adds 1 to each of its ``<= max_items`` items: l2
    sensitivity ``sqrt(max_items)``, so ``sigma_c = sqrt(max_items) sigma(eps,
    delta/2)``; a novel item has count 1, so ``h(t) = 1`` and
    ``rho = 1 + sigma_c PhiInv((1 - delta/2)^(1/max_items))``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    sigma_c = math.sqrt(max_items) * gaussian_sigma(epsilon, delta / 2.0)
    return SetUnionCalibration("gaussian", sigma_c, gaussian_threshold(sigma_c, delta / 2.0, max_items, one))


def count_laplace_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Count Laplace, the baseline of [DPSU] Sec. 1.1 (threshold derived, see spec Sec. 2.2).

    l1 sensitivity ``max_items``: noise ``Lap(max_items/eps)``; novel counts are 1:
    ``rho = 1 + (max_items/eps) ln(1 / (2 (1 - (1 - delta)^(1/max_items))))``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    scale = max_items / epsilon
    return SetUnionCalibration("laplace", scale, laplace_threshold(scale, delta, max_items, one))
