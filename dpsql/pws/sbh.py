"""Stability-based histogram (SbH, [PWS] App. E) and sampled-SbH: the ``sbh_histogram`` mechanism.

Mechanism (``dp_sbh_histogram``, sql/70_pws/pws.sql). Each key's frequency ``w`` plus granular discrete
Laplace noise ``g DLap(1/(epsilon g))`` on the grid ``g`` (a power of two ``<= 1``); the key is released
with its noisy frequency iff that is ``>= T``, the smallest grid point with
``P[1 + g DLap >= T] <= delta/2``. With ``tau`` the released pairs are then sampled with ``q`` evaluated at
the noisy frequency.

Privacy (element level: neighbours differ in one row, so one key's frequency by one). For a key present
in both datasets the frequency moves by ``1/g`` grid steps: the pmf ratio is at most
``exp(g (1/g) epsilon) = e^epsilon``. A new key (frequency 1) is released with probability
``<= delta/2`` (the threshold). Keys are independent, so the release is (epsilon, delta)-DP; the sampling
after the noise is post-processing. The released numbers are exact multiples of ``g`` (no floating-point
leak, Mironov 2012). Full argument: ``docs/proofs/sbh_histogram.md``.

The formulas ``sbh_report_probability``, ``sbh_expectation``, ``sbh_mse`` are the paper's continuous
analysis; the release uses the discrete Laplace tail on the grid.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Optional, cast

import numpy as np

from dpsql.core.calibration import check_granularity, choose_granularity, discrete_laplace_threshold
from dpsql.core.noise import MAX_SCALE_STEPS
from dpsql.pws.params import check_pws_parameters
from dpsql.core.validation import DPParameterError, check_delta, check_epsilon


# The released SbH counts carry granular noise only (sql/70_pws/pws.sql, dp_sbh_histogram). Textbook floating-point
# Laplace noise is not offered: which doubles ``w + Lap`` can produce depends on ``w`` (Mironov 2012), so its low
# bits tell a frequency 5 from a 6. The formulas below (threshold, phi, moments) are the paper's continuous
# analysis; the release uses the discrete Laplace tail on the grid (calibration.discrete_laplace_threshold).
SBH_NOISE_MODES = ("granular",)


def check_sbh_noise(noise: object) -> str:
    """``noise`` of ``dp_sbh_histogram``: only ``'granular'`` (grid-snapped discrete Laplace)."""
    if noise == "continuous":
        raise DPParameterError(
            "noise := 'continuous' was removed: floating-point Laplace noise leaks the true frequency through the "
            "low-order bits of the released numbers (Mironov 2012); use noise := 'granular' (the default)")
    if noise not in SBH_NOISE_MODES:
        raise DPParameterError(f"noise must be 'granular' (got {noise!r}); leave it out for the default")
    return str(noise)  # equal to 'granular' here


def sbh_granularity(epsilon: object, delta: object, tau: object = None, scheme: object = "ppswor",
                    power: object = 1.0, noise: object = "granular", granularity: object = None) -> float:
    """Every parameter of ``dp_sbh_histogram`` validated; returns the grid ``g`` of its noise.

    ``g``: ``granularity`` (a power of two ``<= 1``, so integer frequencies are on the grid), or the largest
    power of two ``<= (1/epsilon)/2^16``, at most 1. The scale ``1/epsilon`` must be at most
    ``MAX_SCALE_STEPS`` grid steps (the sampler's limit): checked here, before the charge, so that the noise
    draw cannot fail after it.
    """
    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    check_sbh_noise(noise)
    scale = 1.0 / epsilon
    g = choose_granularity(scale, cast(Optional[float], granularity), 1.0)  # checked by choose_granularity
    if scale / g > MAX_SCALE_STEPS:
        raise DPParameterError(
            f"granularity {g!r} is too fine for the noise scale 1/epsilon = {scale!r}: (1/epsilon) / granularity "
            f"must be <= 2^32; pass granularity >= (1/epsilon) / 2^32 or leave it NULL")
    return g


def sbh_calibration(epsilon: object, delta: object, tau: object = None, scheme: object = "ppswor",
                    power: object = 1.0, noise: object = "granular", granularity: object = None) -> dict:
    """The calibration of ``dp_sbh_histogram``: noise ``scale = 1/epsilon``, its grid and the release threshold.

    ``threshold`` is the smallest grid point ``T`` with ``P[1 + g DLap(scale/g) >= T] <= delta/2``
    (:func:`dpsql.core.calibration.discrete_laplace_threshold`): a new key passes with probability ``<= delta/2``.
    """
    g = sbh_granularity(epsilon, delta, tau, scheme, power, noise, granularity)
    # epsilon and delta are numbers here: sbh_granularity validated them
    scale = 1.0 / float(cast(float, epsilon))
    return {"scale": scale, "granularity": g,
            "threshold": discrete_laplace_threshold(scale, g, float(cast(float, delta)) / 2, 1.0)}


# |frequency| and |noise| below 2^52 grid steps: their sum has < 2^53 steps, so the double sum is exact.
_EXACT_STEPS = 2.0 ** 52


def sbh_noisy_values(freqs, noise, granularity: float) -> np.ndarray:
    """The double nearest to ``frequency + noise`` (exact value, noise a multiple of ``g = 2^-k <= 1``).

    Exact (a multiple of g) while the frequency and the noise are below ``2^52 g``; a larger frequency gets
    the correctly rounded exact sum, computed in integers: a function of the exact noisy count alone, hence
    post-processing, never an error that depends on the data, and still a multiple of ``g`` (a double that
    large has an ulp >= g, a power of two).
    """
    g = check_granularity(granularity)
    w = np.asarray(freqs, dtype=np.int64)
    z = np.asarray(noise, dtype=np.float64)
    limit = _EXACT_STEPS * g
    out = w.astype(np.float64) + z
    big = np.nonzero((w >= limit) | (np.abs(z) >= limit))[0]
    for k in big.tolist():  # Fraction -> float rounds correctly (integer true division)
        out[k] = float(Fraction(int(w[k])) + Fraction(float(z[k])))
    return out


def sbh_threshold(epsilon: float, delta: float) -> float:
    """``T = 1 + ln(1/delta)/eps``: a new key (count 1) passes ``1 + Lap(1/eps) >= T`` w.p. ``delta/2``.

    The paper's continuous threshold, for the analysis; ``dp_sbh_histogram`` releases with the discrete
    Laplace threshold on its grid (close to this one on the default grid)."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    return 1.0 + math.log(1.0 / delta) / epsilon


def sbh_report_probability(i, epsilon: float, delta: float, tau: Optional[float] = None,
                           scheme: str = "ppswor") -> np.ndarray:
    """``phi_i``: probability that (sampled-)SbH reports a key of frequency ``i`` ([PWS] eqs. 41, 43; f(w) = w).

    No sampling: ``delta e^{eps(i-1)}/2`` (i < T), ``1 - e^{-eps(i-1)}/(2 delta)`` (i >= T).
    """
    epsilon, delta, tau, scheme, _ = check_pws_parameters(epsilon, delta, tau, scheme, 1.0)
    T = sbh_threshold(epsilon, delta)
    i = np.asarray(i, dtype=np.float64)
    e = epsilon
    if tau is None:
        # clip the exponents: np.where evaluates both branches (no overflow warnings far from T)
        return np.where(i < T, 0.5 * np.exp(-e * np.maximum(T - i, 0.0)), 1.0 - 0.5 * np.exp(-e * np.maximum(i - T, 0.0)))
    if scheme == "ppswor":
        lo = np.exp(-e * (T - np.minimum(i, T))) * (1 - e * math.exp(-T * tau) / (e + tau)) / 2
        d = np.maximum(i - T, 0.0)
        if abs(e - tau) > 1e-12:
            mid = e * (np.exp(-e * d - tau * T) - np.exp(-tau * i)) / (2 * (e - tau))
        else:
            mid = -e * d * np.exp(-e * i) / 2
        hi = 1 - np.exp(-e * d) / 2 - e * np.exp(-i * tau) / (2 * (e + tau)) + mid
        return np.where(i <= T, lo, hi)
    b = 1.0 / tau
    if T >= b:
        return sbh_report_probability(i, epsilon, delta)
    r1 = (tau / 2) * ((T + 1 / e) * np.exp((i - T) * e) - np.exp((i - b) * e) / e)
    r2 = tau * (i - np.exp(e * (i - b)) / (2 * e) - (T - 1 / e) * np.exp(e * (T - i)) / 2)
    r3 = 1 - (tau / (2 * e)) * np.exp(e * (b - i)) - (tau / 2) * (T - 1 / e) * np.exp(e * (T - i))
    return np.where(i <= T, r1, np.where(i < b, r2, r3))


def sbh_expectation(i, epsilon: float, delta: float) -> np.ndarray:
    """``E_i`` of the SbH estimate ``a = w*`` of ``g(i) = i`` (independent of sampling; [PWS] eq. 39)."""
    T, e = sbh_threshold(epsilon, delta), float(epsilon)
    i = np.asarray(i, dtype=np.float64)
    return np.where(i <= T, np.exp(-e * (T - i)) * (T + 1 / e) / 2, i - np.exp(-e * (i - T)) * (T - 1 / e) / 2)


def sbh_mse(i, epsilon: float, delta: float) -> np.ndarray:
    """``MSE_i`` of SbH, no sampling, ``g(i) = i`` ([PWS] eq. 42)."""
    T, e = sbh_threshold(epsilon, delta), float(epsilon)
    i = np.asarray(i, dtype=np.float64)
    lo = i ** 2 + np.exp(-e * (T - i)) * (T ** 2 / 2 - i * T - (i - T) / e + 1 / e ** 2)
    hi = 2 / e ** 2 - np.exp(-e * (i - T)) * (T ** 2 / 2 - i * T + (i - T) / e + 1 / e ** 2)
    return np.where(i <= T, lo, hi)


def sbh_moments_numeric(i: float, epsilon: float, delta: float, g: Callable[[float], float] = lambda x: x,
                        q: Callable[[float], float] = lambda x: 1.0) -> dict[str, float]:
    """``phi_i``, ``E_i``, ``MSE_i`` of sampled-SbH by numerical integration over the noisy count (App. E).

    ``phi = int_T^inf q(j) Lap(j-i) dj``, ``E = int_T^inf g(j) Lap(j-i) dj``,
    ``MSE = g(i)^2 - 2 g(i) E + int_T^inf g(j)^2/q(j) Lap(j-i) dj``.
    """
    from scipy import integrate

    T, e = sbh_threshold(epsilon, delta), float(epsilon)
    lap = lambda j: 0.5 * e * math.exp(-e * abs(j - i))  # noqa: E731
    def integral(f):
        # split at the density's kink j = i when it lies inside [T, inf)
        if i > T:
            return (integrate.quad(lambda j: f(j) * lap(j), T, i, limit=400)[0]
                    + integrate.quad(lambda j: f(j) * lap(j), i, np.inf, limit=400)[0])
        return integrate.quad(lambda j: f(j) * lap(j), T, np.inf, limit=400)[0]

    phi = integral(q)
    E = integral(g)
    mse = g(i) ** 2 - 2 * g(i) * E + integral(lambda j: g(j) ** 2 / q(j))
    return {"phi": phi, "E": E, "mse": mse}

