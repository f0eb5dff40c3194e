"""Estimators of ``sum_x L(x) g(w_x)`` from a sample with frequency tokens ([PWS] Sec. 5.1, App. C, D).

Post-processing of the private sample: no privacy cost. Numbers: double precision except the unbiased
estimator and its error analysis, whose triangular solve loses all accuracy (coefficients of order 1e27
by i = 60 at (1, 1e-3)); ``exact=True`` runs them in :class:`fractions.Fraction`. Fractions (stdlib)
rather than mpmath (not a declared dependency): the table entries are doubles, i.e. dyadic rationals, so
the solve is exact, not merely more precise, and needs no precision choice.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Callable, Optional, Sequence, Union

import numpy as np

from dpsql.pws.keys import L_value
from dpsql.pws.params import MAX_UNBIASED_TOKEN, _check_estimator, _g_fn
from dpsql.pws.tokens import FrequencyTable, frequency_table
from dpsql.core.validation import DPParameterError


def _rows_for_tokens(table: FrequencyTable, n_tokens: int, num) -> tuple[dict, int]:
    """Rows (as ``num``) whose band reaches a token ``<= n_tokens``: ``{i: (lo, [values])}``."""
    rows = {}
    i = 1
    while table.steady or i <= table.m:
        lo, v = table.row(i)
        if lo > n_tokens and i > n_tokens:
            break
        rows[i] = (lo, [num(float(x)) for x in v])
        i += 1
    return rows, i - 1


def estimator_coefficients(table: FrequencyTable, g: Union[str, Callable] = "identity", estimator: str = "ml",
                           n_tokens: int = 0, exact: bool = False) -> list:
    """Per-token estimates ``a_0..a_n`` (``a_0 = 0``: unreported keys estimate 0) of [PWS] Sec. 5.1.

    * ``unbiased``: ``a_i = (g(i) - sum_{j<i} pi_{i,j} a_j) / pi_{i,i}`` (triangular solve; signed, huge);
    * ``ml``: ``a_j = g(i)/pi_i`` with ``i = argmax_h pi_{h,j}`` (ties: the smallest h);
    * ``biased_down``: ``a_j = min_{i: pi_{i,j}>0} (g(i) - sum_{h<j} a_h pi_{i,h}) / sum_{h>=j} pi_{i,h}``.

    ``exact=True`` computes with :class:`fractions.Fraction` (entries are converted exactly) and returns Fractions.
    """
    estimator = _check_estimator(estimator)
    gf = _g_fn(g)
    num = Fraction if exact else float
    n = int(n_tokens)
    rows, last = _rows_for_tokens(table, n, num)
    pis = table.keys.reporting(np.arange(last + 2))
    a = [num(0)] * (n + 1)
    if estimator == "unbiased":
        for i in range(1, n + 1):
            lo, v = rows[i]
            acc = num(gf(i))
            for k, p in enumerate(v[:-1]):
                acc -= p * a[lo + k]
            a[i] = acc / v[-1]
        return a
    if estimator == "ml":
        best = [(num(-1), 0)] * (n + 1)
        for i in sorted(rows):
            lo, v = rows[i]
            for k, p in enumerate(v):
                j = lo + k
                if j <= n and p > best[j][0]:  # strict: ties keep the smallest i
                    best[j] = (p, i)
        for j in range(1, n + 1):
            i = best[j][1]
            a[j] = num(gf(i)) / num(float(pis[i])) if i else num(0)
        return a
    # biased-down: running numerators g(i) - sum_{h<j} a_h pi_{i,h} and suffix masses per row.
    numer = {i: num(gf(i)) for i in rows}
    suffix = {}
    for i, (lo, v) in rows.items():
        s, acc = [num(0)] * len(v), num(0)
        for k in range(len(v) - 1, -1, -1):
            acc += v[k]
            s[k] = acc
        suffix[i] = s
    for j in range(1, n + 1):
        cands = []
        for i in range(j, last + 1):
            lo, v = rows[i]
            if lo <= j and v[j - lo] > 0:
                cands.append(numer[i] / suffix[i][j - lo])
            if lo > j:
                break
        a[j] = min(cands) if cands else num(0)
        for i in range(j, last + 1):
            lo, v = rows[i]
            if lo > j:
                break
            numer[i] -= a[j] * v[j - lo]
    return a


def estimator_moments(table: FrequencyTable, a: Sequence, g: Union[str, Callable] = "identity",
                      n: Optional[int] = None) -> dict[str, np.ndarray]:
    """Per frequency ``i = 1..n``: ``E_i``, ``Bias_i``, ``MSE_i``, ``Var_i`` of per-token estimates ``a`` ([PWS] Sec. 5.1).

    ``E_i = sum_j pi_{i,j} a_j``, ``MSE_i = (1 - pi_i) g(i)^2 + sum_j pi_{i,j} (a_j - g(i))^2``,
    ``Var_i = MSE_i - Bias_i^2``. With Fraction ``a`` the sums are exact (then rounded to double).
    """
    gf = _g_fn(g)
    n = len(a) - 1 if n is None else int(n)
    exact = isinstance(a[1], Fraction) if len(a) > 1 else False
    num = Fraction if exact else float
    pis = table.keys.reporting(np.arange(n + 1))
    out = {k: np.zeros(n + 1) for k in ("E", "bias", "mse", "var")}
    for i in range(1, n + 1):
        lo, v = table.row(i)
        gi = num(gf(i))
        E = num(0)
        mse = (num(1) - num(float(pis[i]))) * gi * gi
        for k, p in enumerate(v):
            p = num(float(p))
            E += p * a[lo + k]
            mse += p * (a[lo + k] - gi) ** 2
        bias = E - gi
        out["E"][i], out["bias"][i], out["mse"][i], out["var"][i] = (float(E), float(bias), float(mse),
                                                                     float(mse - bias * bias))
    return out


def sum_estimate_error(freqs: Sequence[int], moments: dict, g: Union[str, Callable] = "identity",
                       weights: Optional[Sequence[float]] = None) -> dict[str, float]:
    """Bias, variance and NRMSE of ``sum_x L(x) a_{j_x}`` for keys of frequencies ``freqs`` ([PWS] eq. 13)."""
    gf = _g_fn(g)
    w = np.asarray(freqs, dtype=np.int64)
    L = np.ones(len(w)) if weights is None else np.asarray(weights, dtype=np.float64)
    s = float(np.sum(L * np.array([gf(int(x)) for x in w], dtype=np.float64)))
    bias = float(np.sum(L * moments["bias"][w]))
    var = float(np.sum(L ** 2 * moments["var"][w]))
    return {"s": s, "bias": bias, "var": var, "nrmse": math.sqrt(var + bias ** 2) / s if s else math.inf}



@lru_cache(maxsize=32)
def _coefficients(epsilon, delta, tau, scheme, power, g, estimator, n_tokens) -> np.ndarray:
    """Per-token estimates as doubles (the unbiased solve runs exactly, then rounds)."""
    n_tokens = max(1, n_tokens)
    if estimator == "unbiased" and n_tokens > MAX_UNBIASED_TOKEN:
        raise DPParameterError(
            f"estimator := 'unbiased' supports tokens up to {MAX_UNBIASED_TOKEN} (the sample has token {n_tokens}): "
            f"its exact triangular solve grows without bound and its coefficients explode; use 'ml' or 'biased_down'")
    table = frequency_table(epsilon, delta, tau, scheme, power, n=n_tokens)
    if not table.steady and table.m < n_tokens:
        raise DPParameterError(f"token {n_tokens} is beyond the pi_(i,j) table")
    # ML needs rows above n_tokens; extend the table when it is not steady.
    need = n_tokens + 4 * math.ceil(L_value(epsilon, delta)) + 8
    if not table.steady and table.m < need:
        table = frequency_table(epsilon, delta, tau, scheme, power, n=need)
    a = estimator_coefficients(table, g, estimator, n_tokens, exact=(estimator == "unbiased"))
    return np.array([float(x) for x in a], dtype=np.float64)

