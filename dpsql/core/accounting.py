"""Tight privacy accounting of multi-round releases (MAD2R, DP-SIPS, the two steps of top-k).

Each round of these methods is a Gaussian mechanism (or, in top-k's selection step, an exponential
mechanism) plus a *delta event*: the probability that an item only the added user holds is released.
The proof notes of these methods (docs/proofs/) show that the whole release is then
``(epsilon, delta_M(epsilon) + sum_r delta_novel_r)``-DP, where ``delta_M`` is the privacy curve of
the *composed* mechanisms, so the rounds can be composed tightly instead of adding their
``(epsilon_r, delta_r)``:

* Gaussian rounds with l2 sensitivity 1 and standard deviations ``sigma_r``, composed adaptively,
  are exactly one Gaussian mechanism with ``mu = sqrt(sum_r 1/sigma_r^2)`` ([GDP] Cor. 3.3); its
  curve is the analytic Gaussian one [BW18, Thm 8] (``dpsql.core.calibration``, checked against
  dp-accounting's in the tests). Accountant ``"gaussian"``.
* A Gaussian round is ``1/(2 sigma^2)``-zCDP, an exponential mechanism with range bounded by
  ``eps0`` is ``eps0^2/8``-zCDP [CR21, Lemma 3.4]; zCDP adds up, and dp-accounting's RDP accountant
  converts the sum to ``(epsilon, delta)`` [CKS20, Prop. 12]. Accountant ``"zcdp"``.

Papers: [GDP] Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022; [BW18] Balle & Wang,
ICML 2018; [CR21] Cesar & Rogers, "Bounding, Concentrating, and Truncating: Unifying Privacy Loss
Composition for Data Analytics", ALT 2021; [CKS20] Canonne, Kamath & Steinke, "The Discrete
Gaussian for Differential Privacy", NeurIPS 2020.

dp-accounting imports scipy.stats (about a second), so it is imported on first use of the zCDP
accountant only.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

from dpsql.core import calibration
from dpsql.core.calibration import Accounting
from dpsql.core.validation import derived_budget

__all__ = ["GAUSSIAN", "ZCDP", "BASIC", "FLOAT_MARGIN", "RDP_ORDERS", "zcdp_budget", "gaussian_mu", "composed_gaussian_sigma",
           "gaussian_rounds_sigmas", "account_gaussian_rounds", "zcdp_delta", "zcdp_epsilon", "account_zcdp"]

GAUSSIAN = "gaussian"
ZCDP = "zcdp"
BASIC = "basic"

# The accountants' own arithmetic (dp-accounting evaluates Phi(a) - e^eps Phi(b) without log space)
# may read a delta that meets the target exactly as 1e-13 above it; calibrating the mechanisms' part
# to (1 - FLOAT_MARGIN) of its share keeps every accountant's total at or below the charged delta.
FLOAT_MARGIN = 1e-9


def gaussian_mu(sigmas: Sequence[float]) -> float:
    """``mu = sqrt(sum_r 1/sigma_r^2)``: the composed Gaussian of rounds with l2 sensitivity 1 ([GDP] Cor. 3.3)."""
    return math.sqrt(math.fsum(1.0 / (s * s) for s in sigmas))


def composed_gaussian_sigma(sigmas: Sequence[float]) -> float:
    """``1/mu``: the standard deviation of the one Gaussian mechanism equal to the composed rounds."""
    return 1.0 / gaussian_mu(sigmas)


def gaussian_rounds_sigmas(epsilon: float, delta_mechanism: float, fractions: Sequence[float]) -> tuple[float, ...]:
    """Per-round sigmas ``sigma_r = s / sqrt(w_r)`` whose composition is ``(epsilon, delta_mechanism)``-DP.

    ``w_r = f_r / sum(f)`` (the split, normalised): round r gets the share ``w_r`` of ``mu^2``
    (its share of the zCDP budget ``mu^2/2``), so ``sum_r 1/sigma_r^2 = 1/s^2`` and the composition
    is the Gaussian mechanism of standard deviation ``s = gaussian_sigma(epsilon, (1 - FLOAT_MARGIN)
    delta_mechanism)`` [BW18].
    """
    total = math.fsum(fractions)
    with derived_budget():  # delta_mechanism is a share of a checked delta
        s = calibration.gaussian_sigma(epsilon, (1.0 - FLOAT_MARGIN) * delta_mechanism)
    return tuple(s / math.sqrt(f / total) for f in fractions)


def account_gaussian_rounds(sigmas: Sequence[float], delta_events: float, epsilon: float,
                            delta: float) -> Accounting:
    """Total privacy loss of Gaussian rounds (l2 sensitivity 1) plus delta events: the analytic Gaussian accountant.

    ``delta(epsilon) = delta_gauss(1/mu, epsilon) + delta_events`` and ``epsilon(delta)`` = the
    Gaussian epsilon of ``1/mu`` at ``delta - delta_events``, both exact [BW18, Thm 8] in log space
    (``calibration.gaussian_delta`` / ``gaussian_epsilon``; the tests check them against
    dp-accounting's analytic Gaussian and PLD accountants). No dp-accounting import on this path: it
    would cost the multi-round set-union methods (MAD2R, DP-SIPS) a second per process.
    """
    s = composed_gaussian_sigma(sigmas)
    with derived_budget():  # shares of a checked budget
        mechanism_delta = calibration.gaussian_delta(s, epsilon)
        total_epsilon = calibration.gaussian_epsilon(s, delta - delta_events)
    return Accounting(GAUSSIAN, total_epsilon, mechanism_delta + delta_events, mechanism_delta, delta_events)


# Renyi orders of the RDP accountant. Its default grid jumps from 64 to 128, 256, ...; the best order
# of a rho-zCDP curve at (epsilon, delta) lies near epsilon/(2 rho), beyond 64 at small epsilon, and
# the gap cost up to half of delta there: a dense grid up to 1e5 costs a millisecond per conversion.
RDP_ORDERS: tuple[float, ...] = tuple(
    [1.0 + i / 100.0 for i in range(2, 100)] + [2.0 * 1.01 ** i for i in range(0, 1000) if 2.0 * 1.01 ** i <= 1e5])


def _rdp_accountant(rho: float):
    from dp_accounting import ZCDpEvent
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
    accountant.compose(ZCDpEvent(rho))
    return accountant


def zcdp_delta(rho: float, epsilon: float) -> float:
    """Smallest delta at epsilon of a rho-zCDP mechanism by dp-accounting's RDP accountant ([CKS20] Prop. 12).

    1 (no guarantee, always true) where the accountant's arithmetic fails: at rho so small that
    ``exp(-rho * alpha)`` rounds to 1 it raises ValueError; callers then use basic composition.
    """
    try:
        return float(_rdp_accountant(rho).get_delta(epsilon))
    except ValueError:
        return 1.0


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest epsilon at delta of a rho-zCDP mechanism by dp-accounting's RDP accountant ([CKS20] Prop. 12)."""
    return float(_rdp_accountant(rho).get_epsilon(delta))


@lru_cache(maxsize=256)  # ~45 conversions of a millisecond each; top-k's k does not enter
def zcdp_budget(epsilon: float, delta_mechanism: float) -> float:
    """Largest rho (to 1e-12 relative) with ``zcdp_delta(rho, epsilon) <= delta_mechanism`` (bisection).

    ``zcdp_delta`` increases with rho; the returned rho always meets the target.
    """
    target = (1.0 - FLOAT_MARGIN) * delta_mechanism
    lo, hi = 0.0, epsilon  # rho = epsilon is never (epsilon, delta < 1/2)-DP
    while zcdp_delta(hi, epsilon) <= target:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:  # float resolution (a tiny epsilon allows rho below the smallest double)
            break
        if zcdp_delta(mid, epsilon) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def account_zcdp(rho: float, delta_events: float, epsilon: float, delta: float) -> Accounting:
    """Total privacy loss of rho-zCDP rounds plus delta events (dp-accounting's RDP accountant)."""
    mechanism_delta = zcdp_delta(rho, epsilon)
    total_epsilon = zcdp_epsilon(rho, delta - delta_events)
    return Accounting(ZCDP, total_epsilon, mechanism_delta + delta_events, mechanism_delta, delta_events)
