"""Threshold sampling and key reporting probabilities ([PWS] Alg. 1, Alg. 3, Lemmas 3.2-3.4).

A threshold sample includes a key of frequency ``i`` with probability ``q_i`` (``1 - exp(-tau i^p)``
ppswor, ``min(1, tau i^p)`` priority, ``1`` without sampling). Keys only, the private sample reports it
with probability ``pi_i = min{q_i, e^eps pi_{i-1} + delta, 1 + e^-eps (pi_{i-1} + delta - 1)}``
(``pi_0 = 0``): the largest probabilities that keep the (epsilon, delta) constraints between adjacent
frequencies and ``pi_i <= q_i`` (see :mod:`dpsql.pws.sanitizer` for the privacy argument).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from dpsql.pws.params import (MAX_KEY_CHECK, check_power, check_pws_epsilon, check_pws_parameters, check_scheme,
                              check_tau)
from dpsql.core.validation import DPParameterError, check_delta, check_epsilon


def L_value(epsilon: float, delta: float) -> float:
    """``L(eps, delta) = (1/eps) ln((e^eps - 1 + 2 delta) / (delta (e^eps + 1)))`` ([PWS] eq. 4)."""
    epsilon, delta = check_pws_epsilon(epsilon), check_delta(delta)
    return (math.log(math.expm1(epsilon) + 2 * delta) - math.log(delta) - math.log1p(math.exp(epsilon))) / epsilon


def sampling_probabilities(freqs, tau: Optional[float] = None, scheme: str = "ppswor",
                           power: float = 1.0) -> np.ndarray:
    """``q_i`` of threshold sampling ([PWS] eq. 2): ``1 - exp(-tau i^p)`` (ppswor), ``min(1, tau i^p)`` (priority).

    ``tau=None`` means no sampling (``q_i = 1``); always ``q_0 = 0``.
    """
    tau, scheme, power = check_tau(tau), check_scheme(scheme), check_power(power)
    w = np.asarray(freqs, dtype=np.float64)
    pos = w > 0
    if tau is None:
        return pos.astype(np.float64)
    with np.errstate(over="ignore"):  # i^power = inf for a huge power: q = 1, which is right
        x = tau * np.power(np.where(pos, w, 1.0), power)
    q = -np.expm1(-x) if scheme == "ppswor" else np.minimum(1.0, x)
    return np.where(pos, q, 0.0)


def _first_q_one(tau: Optional[float], scheme: str, power: float) -> Optional[int]:
    """Smallest i with q_i == 1.0 in double precision (None if q stays below 1)."""
    if tau is None:
        return 1
    if power == 0:
        return 1 if sampling_probabilities([1], tau, scheme, power)[0] == 1.0 else None
    x_star = 54 * math.log(2) if scheme == "ppswor" else 1.0
    # in logs: (x_star / tau) ** (1 / power) overflows a double for a small power
    log_guess = (math.log(x_star) - math.log(tau)) / power
    if log_guess > math.log(1e15):
        return None
    guess = math.exp(log_guess)
    i = max(1, int(guess) - 2)
    q = lambda k: sampling_probabilities([k], tau, scheme, power)[0]  # noqa: E731
    while q(i) < 1.0:
        i += 1
    while i > 1 and q(i - 1) == 1.0:
        i -= 1
    return i


def key_probabilities_recursion(epsilon: float, delta: float, q: Sequence[float]) -> np.ndarray:
    """[PWS] Alg. 3 on an explicit ``q`` (``q[0]`` is ignored, ``pi_0 = 0``); returns ``pi[0..len(q)-1]``.

    ``pi_i = min{q_i, e^eps pi_{i-1} + delta, 1 + e^-eps (pi_{i-1} + delta - 1)}`` (ERRATUM: the update
    is garbled in the paper; it is the min of constraints (14), (17), (18) of App. A).
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    ee, em = math.exp(epsilon), math.exp(-epsilon)
    out = np.zeros(len(q))
    prev = 0.0
    for i in range(1, len(q)):
        prev = min(float(q[i]), ee * prev + delta, 1.0 + em * (prev + delta - 1.0))
        out[i] = prev
    return out


def optimal_key_probabilities(epsilon: float, delta: float, n: int) -> np.ndarray:
    """``pi*_0..pi*_n`` for ``q = 1`` in closed form ([PWS] Lemma 3.2, extended to non-integral L).

    Rising piece ``delta (e^{eps i} - 1)/(e^eps - 1)`` while constraint (17) binds, then the falling
    piece of constraint (18): ``1 - pi_i = e^{-eps(i-k)} (1 - pi_k) - delta e^-eps (1 - e^{-eps(i-k)})/(1 - e^-eps)``
    from the last rising position ``k``, capped at 1. For integral ``L`` this is Lemma 3.2
    (``k = L``: ``1 - delta (e^{eps(2L+1-i)} - 1)/(e^eps - 1)``).
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    i = np.arange(n + 1, dtype=np.float64)
    em = math.exp(-epsilon)
    # (17) binds at i iff rise_i <= 1 + e^-eps (rise_{i-1} + delta - 1); positions with (17) precede (18) (Lemma A.1).
    k = 0
    while True:
        nxt = delta * math.expm1(epsilon * (k + 1)) / math.expm1(epsilon)
        cur = delta * math.expm1(epsilon * k) / math.expm1(epsilon)
        if nxt <= 1.0 + em * (cur + delta - 1.0) and nxt <= 1.0:
            k += 1
        else:
            break
    pk = delta * math.expm1(epsilon * k) / math.expm1(epsilon)
    rise = delta * np.expm1(epsilon * np.minimum(i, k)) / math.expm1(epsilon)
    d = np.maximum(i - k, 0.0)
    fall = 1.0 - (np.exp(-epsilon * d) * (1.0 - pk) + delta * em * np.expm1(-epsilon * d) / (1.0 - em))
    out = np.where(i <= k, rise, np.minimum(1.0, fall))
    out[0] = 0.0
    return out


def lemma_3_2(epsilon: float, delta: float, n: int) -> np.ndarray:
    """[PWS] Lemma 3.2 exactly as printed (valid when L is an integer)."""
    L = round(L_value(epsilon, delta))
    i = np.arange(n + 1, dtype=np.float64)
    a = delta * np.expm1(epsilon * i) / math.expm1(epsilon)
    b = 1.0 - delta * np.expm1(epsilon * (2 * L + 1 - i)) / math.expm1(epsilon)
    return np.where(i <= L, a, np.where(i <= 2 * L, b, 1.0))


def ppswor_two_piece(epsilon: float, delta: float, tau: float, n: int) -> tuple[np.ndarray, int]:
    """[PWS] Lemma 3.4 (ppswor, f(i) = i): ``pi_i = pi*_i`` for ``i < l``, ``q_i`` for ``i >= l``,
    ``l = min{i : pi*_i >= q_i}``. Returns ``(pi[0..n], l)``. Not valid for priority sampling."""
    q = sampling_probabilities(np.arange(n + 1), tau, "ppswor", 1.0)
    star = optimal_key_probabilities(epsilon, delta, n)
    hit = np.nonzero((star[1:] >= q[1:]))[0]
    ell = int(hit[0]) + 1 if len(hit) else n + 1
    idx = np.arange(n + 1)
    return np.where(idx < ell, star, q), ell


@dataclass(frozen=True)
class KeyTable:
    """Key reporting probabilities: ``pi[0..m]`` explicit, ``pi_i = q_i`` for every ``i > m`` (verified)."""

    epsilon: float
    delta: float
    tau: Optional[float]
    scheme: str
    power: float
    pi: np.ndarray

    @property
    def m(self) -> int:
        return len(self.pi) - 1

    def q(self, freqs) -> np.ndarray:
        return sampling_probabilities(freqs, self.tau, self.scheme, self.power)

    def reporting(self, freqs) -> np.ndarray:
        """``pi_w`` for each frequency ``w`` (0 for ``w <= 0``)."""
        w = np.asarray(freqs, dtype=np.int64)
        out = self.pi[np.clip(w, 0, self.m)]
        beyond = np.nonzero(w > self.m)[0]
        if len(beyond):  # q only where the table does not reach (few keys: the heavy tail)
            out[beyond] = self.q(w[beyond])
        return out  # w < 0 reads pi_0 = 0


@lru_cache(maxsize=64)
def key_table(epsilon: float, delta: float, tau: Optional[float] = None, scheme: str = "ppswor",
              power: float = 1.0, n: int = 1) -> KeyTable:
    """Alg. 3 for threshold sampling, valid for every frequency ``<= n``.

    Runs the recursion until ``pi_i = q_i``, then checks with whole vectors of q
    (up to ``n`` or the first ``q_i = 1``) whether the recursion would keep
    ``pi = q``; if it would not (priority sampling can fall behind again), resumes there.
    """
    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    n = max(1, int(n))
    ee, em = math.exp(epsilon), math.exp(-epsilon)
    q1 = _first_q_one(tau, scheme, power)
    end = n if q1 is None else min(n, q1)
    if power == 0 or tau is None:
        end = min(end, 2)  # q is constant for i >= 1: one step of the check suffices
    if end > MAX_KEY_CHECK:
        # end can be the data's largest frequency: the message names only the parameters
        raise DPParameterError(f"tau={tau} with power={power} needs q beyond frequency {MAX_KEY_CHECK}; "
                               f"use a larger tau")
    pis = [0.0]
    prev, i = 0.0, 1
    chunk = 4096
    while i <= n:
        qs = sampling_probabilities(np.arange(i, min(n, i + chunk - 1) + 1), tau, scheme, power)
        settled = False
        for qi in qs.tolist():
            prev = min(qi, ee * prev + delta, 1.0 + em * (prev + delta - 1.0))
            pis.append(prev)
            i += 1
            if prev == qi:
                settled = True
                break
        if not settled:
            continue
        # pi_{i-1} = q_{i-1}: find the first h >= i where q_h exceeds one of the DP bounds from q_{h-1}.
        h = i
        fail = None
        while h <= end:
            hi = min(end, h + (1 << 20))
            qq = sampling_probabilities(np.arange(h - 1, hi + 1), tau, scheme, power)
            ok = (qq[1:] <= ee * qq[:-1] + delta) & (qq[1:] <= 1.0 + em * (qq[:-1] + delta - 1.0))
            bad = np.nonzero(~ok)[0]
            if len(bad):
                fail = h + int(bad[0])
                break
            h = hi + 1
        if fail is None:
            break  # pi = q from here on (beyond q's first 1.0 both bounds hold trivially)
        pis.extend(sampling_probabilities(np.arange(i, fail), tau, scheme, power).tolist())
        prev, i = pis[-1], fail
    return KeyTable(epsilon, delta, tau, scheme, power, np.asarray(pis))


def key_probabilities(epsilon: float, delta: float, n: int, tau: Optional[float] = None, scheme: str = "ppswor",
                      power: float = 1.0) -> np.ndarray:
    """``pi_0..pi_n`` of [PWS] Alg. 3 for threshold sampling (tau None: ``pi*``, the private histogram)."""
    return key_table(*check_pws_parameters(epsilon, delta, tau, scheme, power), n=n).reporting(np.arange(n + 1))

