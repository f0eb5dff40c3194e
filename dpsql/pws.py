"""Private weighted sampling (PWS, Cohen et al. [PWS]): private samples, private histograms, estimates.

PRIVACY UNIT: ONE ELEMENT, NOT ONE USER. Every mechanism in this module is
(epsilon, delta)-DP with respect to adding or removing ONE ELEMENT (one row of an
event table), i.e. datasets whose key->frequency vectors satisfy
``||w - w'||_1 = 1``. A user who contributes many rows is NOT protected as a
whole; use the user-level mechanisms (:mod:`dpsql.union`) for that.

Data: keys ``x`` with frequencies ``w_x >= 1`` (a key's number of rows).
A threshold sample ([PWS] Alg. 1) includes a key of frequency ``i`` with
probability ``q_i`` (``q_i = 1 - exp(-tau i^p)`` ppswor, ``min(1, tau i^p)``
priority, ``q = 1`` without sampling). The sanitizers report a key of
frequency ``i`` overall (sampling and sanitizing together) with probability

* ``pi_i`` ([PWS] Alg. 3: ``pi_i = min{q_i, e^eps pi_{i-1} + delta,
  1 + e^-eps (pi_{i-1} + delta - 1)}``), keys only; or
* with a frequency token ``j in 1..i`` with probability ``pi_{i,j}``
  ([PWS] Alg. 4 / App. B construction), ``sum_j pi_{i,j} = pi_i``.

Privacy argument (element level). The release is a product over keys of
independent per-key outputs whose law depends only on that key's frequency.
Neighbours change one key's frequency by one (from ``i-1`` to ``i``; a new key
has ``i = 1`` and ``pi_0 = 0``: "absent" = "not reported"), so the release is
(epsilon, delta)-DP iff every adjacent pair of rows satisfies, for every set
``J`` of outputs, ``P_i(J) <= e^eps P_{i-1}(J) + delta`` and vice versa. For
keys only the outputs are {reported, not}: these are exactly the constraints
(17), (18) of [PWS] App. A that Alg. 3 keeps by construction (and (14),
``pi_i <= q_i``, makes it a sanitizer of the sample). For tokens the worst set
``J`` is ``{j : P_i(j) > e^eps P_{i-1}(j)}``, so the condition is
``sum_j (pi_{i,j} - e^eps pi_{i-1,j})_+ <= delta`` (and symmetric), which the
construction keeps via its prefix/suffix constraints ([PWS] Lemma 4.1;
checked row by row in the tests). Sampling and sanitizing are fused: one
uniform per key from the connection's noise source picks the output with the
overall probabilities ``pi``, which has the same law as sampling with ``q`` and
then sanitizing with ``p = pi / q`` ([PWS] Alg. 2), and keeps the sample's
randomness secret (a hash-coordinated sample whose salt is known is not).

Release path (``dpsql.release``): every macro checks that each parameter is a
constant and validates all of them, including the frequency range the tables
can serve (:func:`check_frequency_range`) and the SbH grid against its noise
scale (:func:`sbh_granularity`), before the ledger charge; rows come out sorted
by key; an error raised once the data is read names a column, never a value.
Released numbers (SbH) carry granular noise only: exact multiples of the grid.

Numbers: double precision everywhere except the unbiased estimator and its
error analysis, whose triangular solve loses all accuracy (coefficients of
order 1e27 by i = 60 at (1, 1e-3)); ``exact=True`` runs them in
:class:`fractions.Fraction`. Fractions (stdlib) rather than mpmath (not a
declared dependency): the table entries are doubles, i.e. dyadic rationals, so
the solve is exact, not merely more precise, and needs no precision choice.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Callable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR

from dpsql.calibration import check_granularity, choose_granularity
from dpsql.noise import MAX_SCALE_STEPS
from dpsql.udf import Udf, scalar
from dpsql.validation import (DPParameterError, check_delta, check_epsilon, check_positive, sql_string,
                              warn_weak_parameters)

__all__ = [
    "SCHEMES", "GS", "ESTIMATORS", "check_pws_parameters", "L_value", "sampling_probabilities",
    "key_probabilities", "key_probabilities_recursion", "optimal_key_probabilities", "ppswor_two_piece",
    "KeyTable", "key_table", "FrequencyTable", "frequency_table", "frequency_rows_reference",
    "optimal_frequency_probability", "estimator_coefficients", "estimator_moments", "sum_estimate_error",
    "sbh_threshold", "sbh_report_probability", "sbh_expectation", "sbh_mse", "sbh_moments_numeric",
    "sanitize_keys", "sanitize_tokens", "sanitizer_spec", "check_frequency_range", "check_sbh_noise",
    "sbh_granularity", "sbh_noisy_values", "udfs", "weighted_sample",
]

SCHEMES = ("ppswor", "priority")
GS = ("count", "identity")
ESTIMATORS = ("ml", "biased_down", "unbiased")

# Sanitizing with tokens needs the pi_{i,j} rows up to the largest frequency before the rows
# become shifts of each other; beyond these limits the call is refused rather than exhausting memory.
MAX_FREQUENCY_ROWS = 2_000_000
MAX_FREQUENCY_CELLS = 60_000_000
MAX_KEY_CHECK = 200_000_000
# Keys only: pi_w is looked up in one array up to this frequency (8 MB); beyond it q_w is evaluated per key.
MAX_PI_LOOKUP = 1 << 20
# The exact unbiased solve grows its numbers by ~53 bits per token (about 4 s at 300 tokens, 60 s at 800) and
# its coefficients grow geometrically (1e44 by token 200 at (0.5, 1e-3)): beyond this the estimator is useless.
MAX_UNBIASED_TOKEN = 300

# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


def check_scheme(scheme: object) -> str:
    if not isinstance(scheme, str) or scheme.lower() not in SCHEMES:
        raise DPParameterError(f"scheme must be one of {', '.join(SCHEMES)} (got {scheme!r})")
    return scheme.lower()


def check_tau(tau: object) -> Optional[float]:
    """tau: None/NULL (no sampling: q = 1) or a finite number > 0."""
    if tau is None:
        return None
    if isinstance(tau, float) and math.isnan(tau):
        raise DPParameterError("tau must be a finite number > 0 or NULL for no sampling (got nan)")
    try:
        return check_positive("tau", tau)
    except DPParameterError:
        raise DPParameterError(
            f"tau must be a finite number > 0 (the sampling threshold), or NULL for no sampling "
            f"(got {tau!r})") from None


def check_power(power: object) -> float:
    if power is None or isinstance(power, bool) or not isinstance(power, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(power)) or float(power) < 0:
        raise DPParameterError(f"power must be a finite number >= 0 (sampling weight f(i) = i^power), got {power!r}")
    return float(power)


def check_pws_parameters(epsilon: object, delta: object, tau: object = None, scheme: object = "ppswor",
                         power: object = 1.0) -> tuple[float, float, Optional[float], str, float]:
    """Validated ``(epsilon, delta, tau, scheme, power)`` (tau None = no sampling).

    epsilon <= 700: the probability tables evaluate e^epsilon, which overflows a double above ~709.
    """
    return (check_epsilon(epsilon, maximum=700.0), check_delta(delta), check_tau(tau), check_scheme(scheme),
            check_power(power))


def _check_g(g: object) -> str:
    if not isinstance(g, str) or g.lower() not in GS:
        raise DPParameterError(f"g must be one of {', '.join(GS)} (got {g!r})")
    return g.lower()


def _check_estimator(estimator: object) -> str:
    if not isinstance(estimator, str) or estimator.lower() not in ESTIMATORS:
        raise DPParameterError(f"estimator must be one of {', '.join(ESTIMATORS)} (got {estimator!r})")
    return estimator.lower()


def _g_fn(g: Union[str, Callable[[int], float]]) -> Callable[[int], float]:
    if callable(g):
        return g
    return (lambda i: 1 if i >= 1 else 0) if _check_g(g) == "count" else (lambda i: i)


# ---------------------------------------------------------------------------
# Sampling probabilities and key reporting probabilities (Alg. 1, Alg. 3, Lemmas 3.2-3.4)
# ---------------------------------------------------------------------------


def L_value(epsilon: float, delta: float) -> float:
    """``L(eps, delta) = (1/eps) ln((e^eps - 1 + 2 delta) / (delta (e^eps + 1)))`` ([PWS] eq. 4)."""
    epsilon, delta = check_epsilon(epsilon, maximum=700.0), check_delta(delta)  # e^epsilon: see check_pws_parameters
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


# ---------------------------------------------------------------------------
# Keys and frequency tokens (Alg. 4 / App. B)
# ---------------------------------------------------------------------------


def frequency_rows_reference(epsilon: float, delta: float, pi: Sequence[float]) -> list[list[float]]:
    """The App. B construction exactly as printed (prefix lower bounds), scalar and dense; tests only.

    Correct for ``q = 1`` but NOT differentially private for some sampled ``q`` (see :func:`_next_row`).

    Row ``i`` is ``[pi_{i,0}, ..., pi_{i,i}]`` with ``pi_{i,0} = 1 - pi_i``.
    """
    ee, em = math.exp(epsilon), math.exp(-epsilon)
    rows = [[1.0]]
    for i in range(1, len(pi)):
        prev = rows[-1] + [0.0]
        row = [0.0] * (i + 1)
        row[0] = 1.0 - pi[i]
        D = [0.0] * (i + 1)
        for j in range(1, i):
            D[j] = max(0.0, em * (sum(prev[:j + 1]) - delta) - (row[0] + sum(D[1:j])))
        R = pi[i] - sum(D[1:i])
        for j in range(i, 0, -1):
            U = ee * sum(prev[j:i]) + delta - sum(row[j + 1:])
            if R == 0:
                row[j] = D[j]
            elif U - D[j] <= R:
                row[j] = U
                R -= U - D[j]
            else:
                row[j] = D[j] + R
                R = 0.0
        rows.append(row)
    return rows


@dataclass
class FrequencyTable:
    """``pi_{i,j}`` rows in band form: row ``i`` holds ``pi_{i,lo_i}..pi_{i,i}`` (other ``j >= 1`` are 0).

    Rows beyond ``m`` exist only when ``steady``: then row ``i > m`` is row ``m`` shifted by ``i - m``.
    """

    keys: KeyTable
    lo: list = field(default_factory=list)
    vals: list = field(default_factory=list)
    steady: bool = False
    _cum: Optional[np.ndarray] = None
    _draw: Optional[tuple] = None

    @property
    def m(self) -> int:
        return len(self.vals) - 1

    def row(self, i: int) -> tuple[int, np.ndarray]:
        """``(lo, values)`` of row ``i``: ``pi_{i,lo+k} = values[k]``."""
        if i <= self.m:
            return self.lo[i], self.vals[i]
        if not self.steady:
            raise DPParameterError(f"a frequency is beyond the computed pi_(i,j) table (rows 0..{self.m})")
        return self.lo[self.m] + (i - self.m), self.vals[self.m]

    def entry(self, i: int, j: int) -> float:
        if j == 0:
            return 1.0 - float(self.keys.reporting([i])[0])
        lo, v = self.row(i)
        return float(v[j - lo]) if lo <= j < lo + len(v) else 0.0

    def draw_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cum, lo, width)`` for drawing tokens: :meth:`cumulative` padded with +inf to a power-of-two
        width (for a branch-free binary search), and per row the first token and the band width."""
        if self._draw is None:
            cum = self.cumulative()
            width = 1 << max(0, int(cum.shape[1] - 1).bit_length())
            padded = np.full((cum.shape[0], width), np.inf)
            padded[:, :cum.shape[1]] = cum
            self._draw = (padded, np.asarray(self.lo, dtype=np.int64),
                          np.array([len(v) for v in self.vals], dtype=np.int64))
        return self._draw

    def cumulative(self) -> np.ndarray:
        """Per row: ``[pi_{i,0}, pi_{i,0} + pi_{i,lo}, ...]``, padded with +inf (for drawing tokens)."""
        if self._cum is None:
            width = max(len(v) for v in self.vals) + 1
            cum = np.full((self.m + 1, width), np.inf)
            pis = self.keys.reporting(np.arange(self.m + 1))
            for i, v in enumerate(self.vals):
                cum[i, 0] = 1.0 - pis[i]
                cum[i, 1:len(v) + 1] = cum[i, 0] + np.cumsum(v)
            self._cum = cum
        return self._cum


def _next_row(prev_lo: int, prev_vals: np.ndarray, prev_pi: float, pi_i: float, i: int,
              ee: float, em: float, delta: float) -> tuple[int, np.ndarray]:
    """Row ``i`` of the App. B construction from row ``i-1`` (vectorised over the band)."""
    s = min(prev_lo, i)
    prev = np.zeros(i - s + 1)  # pi_{i-1,j} for j = s..i (pi_{i-1,i} = 0)
    prev[prev_lo - s:prev_lo - s + len(prev_vals)] = prev_vals
    p0_prev, p0 = 1.0 - prev_pi, 1.0 - pi_i
    # Lower bounds. ERRATUM: App. B bounds prefixes J = {0..j} (constraint (31)), which lets the slack of
    # token 0 lower the other tokens; but the binding set of the DP constraint is
    # J = {j : pi_{i-1,j} > e^eps pi_{i,j}}, which need not contain 0 (sampled q: eps=0.5, delta=1e-3,
    # ppswor tau=0.05 violates it by 0.024 from row 11 to 12). We enforce the set form directly:
    # sum_j (pi_{i-1,j} - e^eps pi_{i,j})_+ <= delta. Token 0 uses c_0 of the budget; the rest lowers the
    # lowest tokens first (those keep their minimum), D_j = e^-eps (pi_{i-1,j} - b_j), sum b_j = delta - c_0.
    # For q = 1 this coincides with App. B (Lemma 4.2 rows are reproduced exactly).
    budget = max(0.0, delta - max(0.0, p0_prev - ee * p0))
    before = np.concatenate(([0.0], np.cumsum(prev)[:-1]))
    b = np.clip(budget - before, 0.0, prev)
    D = em * (prev - b)
    D[-1] = 0.0
    R = pi_i - float(D.sum())
    # Right-to-left allocation (29): while the suffix bound is tight, U_i = delta and U_j = e^eps pi_{i-1,j}.
    U = ee * prev
    U[-1] = delta
    excess = (U - D)[::-1]
    cum = np.cumsum(excess)
    row = D.copy()[::-1]
    if R > 0:
        full = int(np.searchsorted(cum, R, side="right"))  # entries taking U entirely (cum <= R)
        row[:full] = U[::-1][:full]
        if full < len(row):
            row[full] = D[::-1][full] + (R - (cum[full - 1] if full else 0.0))
    row = row[::-1]
    nz = np.nonzero(row)[0]
    if len(nz) == 0:
        return i, np.zeros(0)
    return s + int(nz[0]), row[nz[0]:].copy()


@lru_cache(maxsize=16)
def frequency_table(epsilon: float, delta: float, tau: Optional[float] = None, scheme: str = "ppswor",
                    power: float = 1.0, n: int = 1) -> FrequencyTable:
    """``pi_{i,j}`` of [PWS] Alg. 4 (App. B construction) for every frequency ``<= n``.

    Stops early once the rows are shifts of each other (``pi = q = 1``: every later row repeats the shift).
    """
    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    n = max(1, int(n))
    q1 = _first_q_one(tau, scheme, power)
    keys = key_table(epsilon, delta, tau, scheme, power, n=n)
    table = FrequencyTable(keys, lo=[1], vals=[np.zeros(0)])
    ee, em = math.exp(epsilon), math.exp(-epsilon)
    limit = n if q1 is None else min(n, q1 + 4 * math.ceil(L_value(epsilon, delta)) + 8)
    if limit > MAX_FREQUENCY_ROWS:
        # limit can be the data's largest frequency (n): the message names only the parameters
        raise DPParameterError(
            f"with_frequencies at tau={tau}, power={power} needs pi_(i,j) rows beyond frequency {MAX_FREQUENCY_ROWS}; "
            f"use a larger tau or report keys only")
    pis = keys.reporting(np.arange(limit + 1))
    cells = 0
    for i in range(1, limit + 1):
        lo, v = _next_row(table.lo[-1], table.vals[-1], float(pis[i - 1]), float(pis[i]), i, ee, em, delta)
        table.lo.append(lo)
        table.vals.append(v)
        cells += len(v)
        if cells > MAX_FREQUENCY_CELLS:
            raise DPParameterError(f"with_frequencies at tau={tau}, power={power}: the pi_(i,j) table is too large "
                                   f"(more than {MAX_FREQUENCY_CELLS} entries); use a larger tau or report keys only")
        # Once pi = q = 1 the construction maps a row to its shift (up to rounding, ~1e-16): later rows are
        # shifts of this one, and the pair (row, shifted row) satisfies the DP inequalities like (row-1, row).
        if pis[i] == 1.0 and pis[i - 1] == 1.0 and lo == table.lo[-2] + 1 and len(v) == len(table.vals[-2]) \
                and np.max(np.abs(v - table.vals[-2])) <= 1e-14:
            table.steady = True
            table.lo.pop()
            table.vals.pop()
            break
    return table


def optimal_frequency_probability(epsilon: float, delta: float, i: int, j: int) -> float:
    """``pi*_{i,j}`` for ``q = 1`` and integral L: [PWS] Lemma 4.2 CORRECTED.

    ERRATUM (printed form off by one): ``pi*_{i,j} = pi*_{i-j+1} - pi*_{i-j}`` =
    ``delta e^{(i-j) eps}`` for ``i-j in [0, L]`` and ``delta e^{(2L-(i-j)) eps}`` for ``i-j in [L, 2L]``,
    non-zero for ``j >= max(1, i-2L)``.
    """
    L = round(L_value(epsilon, delta))
    k = i - j
    if j < 1 or k < 0 or k > 2 * L:
        return 0.0
    return delta * math.exp((k if k <= L else 2 * L - k) * epsilon)


# ---------------------------------------------------------------------------
# Estimators (Sec. 5.1, App. C, D)
# ---------------------------------------------------------------------------


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
    * ``ml``: ``a_j = g(i)/pi_i`` with ``i = argmax_h pi_{h,j}`` (DECIDE: ties -> smallest h);
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


# ---------------------------------------------------------------------------
# SbH baseline (App. E) and sampled-SbH
# ---------------------------------------------------------------------------


# The released SbH counts carry granular noise only (sql/70_pws.sql, dp_sbh_histogram). Textbook floating-point
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
    return noise


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
    g = choose_granularity(scale, granularity, 1.0)
    if scale / g > MAX_SCALE_STEPS:
        raise DPParameterError(
            f"granularity {g!r} is too fine for the noise scale 1/epsilon = {scale!r}: (1/epsilon) / granularity "
            f"must be <= 2^32; pass granularity >= (1/epsilon) / 2^32 or leave it NULL")
    return g


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


# ---------------------------------------------------------------------------
# Sanitizers (pure given the uniforms; the UDFs below draw them from the noise source)
# ---------------------------------------------------------------------------


# Kernel of the sanitizers: "auto" (numba when installed), "numba" or "numpy". For benchmarks and tests; all
# three return the same outputs for the same uniforms.
SANITIZER_KERNELS = ("auto", "numba", "numpy")
SANITIZER_KERNEL = "auto"  # the one the SQL sanitizer uses
_NUMBA_KERNELS: Optional[tuple] = None
_NUMBA_LOCK = threading.Lock()


def _numba_kernels() -> Optional[tuple]:
    """``(keys, tokens)`` compiled once, lazily (importing numba costs a second); None without numba."""
    global _NUMBA_KERNELS
    with _NUMBA_LOCK:
        if _NUMBA_KERNELS is None:
            try:
                import numba
            except ImportError:
                _NUMBA_KERNELS = ()  # remembered: the import is not retried per vector
                return None

            @numba.njit(cache=True, nogil=True)
            def keys(w, u, pi):  # pragma: no cover (compiled)
                # 1 iff u < pi_w; -1 where w is beyond the table (the caller evaluates q there)
                m = len(pi) - 1
                out = np.zeros(len(w), np.int64)
                for k in range(len(w)):
                    x = w[k]
                    if x > m:
                        out[k] = -1
                    elif x > 0 and u[k] < pi[x]:
                        out[k] = 1
                return out

            @numba.njit(cache=True, nogil=True)
            def tokens(w, u, cum, lo, width, m):  # pragma: no cover (compiled)
                # same search as _tokens_numpy: passed = number of cumulative thresholds <= u in row min(w, m)
                P = cum.shape[1]
                out = np.zeros(len(w), np.int64)
                for k in range(len(w)):
                    x = w[k]
                    if x <= 0:
                        continue
                    r = x if x < m else m
                    uk = u[k]
                    if uk < cum[r, 0]:
                        continue
                    a, b = 1, P
                    while a < b:  # first column a >= 1 with cum[r, a] > u (rows non-decreasing, +inf padded)
                        mid = (a + b) >> 1
                        if cum[r, mid] <= uk:
                            a = mid + 1
                        else:
                            b = mid
                    out[k] = lo[r] + (x - r) + min(a - 1, width[r] - 1)
                return out

            _NUMBA_KERNELS = (keys, tokens)
        return _NUMBA_KERNELS or None


def numba_available() -> bool:
    """True when the compiled sanitizer kernels can be used (numba, the ``fast`` extra, is installed)."""
    return _numba_kernels() is not None


def _use_numba(kernel: str) -> bool:
    if kernel not in SANITIZER_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(SANITIZER_KERNELS)} (got {kernel!r})")
    if kernel == "numpy":
        return False
    if _numba_kernels() is None:
        if kernel == "numba":
            raise ImportError("kernel='numba' needs numba: pip install 'dpsql[fast]'")
        return False
    return True


def sanitize_keys(freqs, uniforms, table: KeyTable, kernel: str = "auto") -> np.ndarray:
    """Report mask: a key of frequency ``w`` is reported iff ``u < pi_w`` (sampling and Alg. 2 fused).

    One uniform per key: ``P[reported] = pi_w`` exactly (up to the 2^-53 grid of ``u``).
    """
    w = np.asarray(freqs, dtype=np.int64)
    return _report_keys(w, np.asarray(uniforms, dtype=np.float64), table, int(w.max()) if len(w) else 0,
                        kernel).astype(bool)


def _report_keys(w: np.ndarray, u: np.ndarray, table: KeyTable, wmax: int, kernel: str) -> np.ndarray:
    """:func:`sanitize_keys` as int64 0/1 (the UDF's output type); ``wmax = max(w)``."""
    if not _use_numba(kernel):
        return (u < table.reporting(w)).astype(np.int64)
    pi = table.pi if wmax <= table.m else _pi_lookup(table.epsilon, table.delta, table.tau, table.scheme,
                                                      table.power, min(MAX_PI_LOOKUP, 1 << wmax.bit_length()))
    out = _numba_kernels()[0](w, u, pi)
    if wmax >= len(pi):  # pi_w = q_w beyond the lookup array (marked -1 by the kernel)
        beyond = np.nonzero(out < 0)[0]
        out[beyond] = u[beyond] < table.q(w[beyond])
    return out


@lru_cache(maxsize=32)
def _pi_lookup(epsilon: float, delta: float, tau: Optional[float], scheme: str, power: float, n: int) -> np.ndarray:
    """``pi_0..pi_n`` as one array (``q`` evaluated once per frequency, not once per key)."""
    return key_table(epsilon, delta, tau, scheme, power, n=n).reporting(np.arange(n + 1))


def sanitize_tokens(freqs, uniforms, table: FrequencyTable, kernel: str = "auto") -> np.ndarray:
    """Token per key (0 = not reported): ``j`` with probability ``pi_{w,j}`` (inverse CDF of the row).

    One uniform per key: token ``j`` iff ``u`` falls in ``[C_{w,j-1}, C_{w,j})`` of the row's cumulative sums
    (``C_{w,0} = pi_{w,0} = 1 - pi_w``), an interval of length ``pi_{w,j}``. Rows beyond ``m`` are shifts of
    row ``m`` (steady tables only).
    """
    w = np.asarray(freqs, dtype=np.int64)
    return _draw_tokens(w, np.asarray(uniforms, dtype=np.float64), table, int(w.max()) if len(w) else 0, kernel)


def _draw_tokens(w: np.ndarray, u: np.ndarray, table: FrequencyTable, wmax: int, kernel: str) -> np.ndarray:
    """:func:`sanitize_tokens` with ``wmax = max(w)`` known."""
    if wmax > table.m and not table.steady:
        # after the charge: the message must not contain the frequency
        raise DPParameterError(f"a frequency is beyond the pi_(i,j) table (rows 0..{table.m}) at tau={table.keys.tau}, "
                               f"power={table.keys.power}; use a larger tau or report keys only")
    cum, lo_rows, width_rows = table.draw_arrays()
    if _use_numba(kernel):
        return _numba_kernels()[1](w, u, cum, lo_rows, width_rows, table.m)
    return _tokens_numpy(w, u, np.clip(w, 0, table.m), cum, lo_rows, width_rows)


def _tokens_numpy(w: np.ndarray, u: np.ndarray, r: np.ndarray, cum: np.ndarray, lo_rows: np.ndarray,
                  width_rows: np.ndarray) -> np.ndarray:
    """The inverse-CDF search of :func:`sanitize_tokens` in numpy (kernel without numba)."""
    # passed = number of cumulative thresholds <= u in row r. The rows are non-decreasing (+inf padded to a
    # power-of-two width P), so a branch-free binary search over the flat array finds it in log2(P) gathers.
    # Most keys are not reported (u < pi_{w,0} = cum[r, 0]): search only the others.
    flat, P = cum.ravel(), cum.shape[1]
    out = np.zeros(len(w), dtype=np.int64)
    hit = np.nonzero((w > 0) & (flat[r * P] <= u))[0]
    if len(hit) == 0:
        return out
    r, uh, wh = r[hit], u[hit], w[hit]
    base = r * P - 1
    passed = np.ones(len(hit), dtype=np.int64)  # cum[r, 0] <= u
    step = P >> 1
    while step:
        cand = passed + step
        ok = cand <= P
        idx = np.where(ok, base + cand, 0)
        passed = np.where(ok & (flat[idx] <= uh), cand, passed)
        step >>= 1
    out[hit] = lo_rows[r] + (wh - r) + np.minimum(passed - 1, width_rows[r] - 1)
    return out


# ---------------------------------------------------------------------------
# UDFs
# ---------------------------------------------------------------------------


def _const(arr: pa.Array, name: str):
    """The (constant) value of a parameter column; parameters are per-call constants in the macros."""
    return arr[0].as_py() if len(arr) else None


def _params(eps, delta, tau, scheme, power):
    return _checked_params(_const(eps, "epsilon"), _const(delta, "delta"), _const(tau, "tau"),
                           _const(scheme, "scheme"), _const(power, "power"))


@lru_cache(maxsize=256)
def _checked_params(epsilon, delta, tau, scheme, power):
    """check_pws_parameters, memoised: the sanitizer UDF sees the same constants in every vector."""
    return check_pws_parameters(epsilon, delta, tau, scheme, power)


# Sanitizer parameter sets, validated, by handle (process-wide; a handle is an index into _SPEC_PARAMS).
_SPEC_LOCK = threading.Lock()
_SPEC_HANDLES: dict[tuple, int] = {}
_SPEC_PARAMS: list[tuple] = []


def sanitizer_spec(epsilon, delta, tau, scheme, power, with_frequencies) -> int:
    """The sanitizer's parameters, validated, as a BIGINT handle (see :func:`_spec_params`).

    DuckDB converts every argument vector of an Arrow UDF on each call (2048 rows): a constant string of
    the parameters cost 40% of a no-op UDF call, a BIGINT handle costs almost nothing. Only validated
    parameter sets get a handle, so the sanitizer cannot run with unchecked parameters."""
    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    if not isinstance(with_frequencies, (bool, np.bool_)):
        raise DPParameterError(f"with_frequencies must be true or false (got {with_frequencies!r})")
    check_frequency_range(epsilon, delta, tau, scheme, power, bool(with_frequencies))
    params = (epsilon, delta, tau, scheme, power, bool(with_frequencies))
    with _SPEC_LOCK:
        handle = _SPEC_HANDLES.get(params)
        if handle is None:
            handle = _SPEC_HANDLES[params] = len(_SPEC_PARAMS)
            _SPEC_PARAMS.append(params)
    return handle


@lru_cache(maxsize=256)
def check_frequency_range(epsilon: float, delta: float, tau: Optional[float], scheme: str, power: float,
                          with_frequencies: bool) -> None:
    """Refuse, from the parameters alone, a setting whose tables cannot serve every frequency up to 2^63.

    Keys only, :func:`key_table` verifies ``pi_i = q_i`` up to q's first 1.0 (``<= MAX_KEY_CHECK``); with
    frequencies, :func:`frequency_table` needs the rows up to ``4 ceil(L) + 8`` past it (``<= MAX_FREQUENCY_ROWS``)
    before they are shifts of each other. Beyond these limits (or when q never reaches 1) the sanitizer would
    fail on a large enough frequency, i.e. depending on the data after the charge; this check fails before it.
    """
    if tau is None or (power == 0 and not with_frequencies):
        q1 = 1  # q is constant for i >= 1: key_table checks two rows
    else:
        q1 = _first_q_one(tau, scheme, power)
    if with_frequencies:
        rows = None if q1 is None else q1 + 4 * math.ceil(L_value(epsilon, delta)) + 8
        if rows is None or rows > MAX_FREQUENCY_ROWS:
            raise DPParameterError(
                f"with_frequencies := true at epsilon={epsilon!r}, delta={delta!r}, tau={tau!r}, power={power!r} "
                f"needs pi_(i,j) rows beyond frequency {MAX_FREQUENCY_ROWS} (q_i must reach 1 early enough); use a "
                f"larger tau (or power), a larger epsilon, or report keys only (with_frequencies := false)")
    elif q1 is None or q1 > MAX_KEY_CHECK:
        raise DPParameterError(
            f"tau={tau!r} with power={power!r}: q_i reaches 1 only beyond frequency {MAX_KEY_CHECK}; use a larger tau")


def _spec_params(handle: object) -> tuple:
    """``(eps, delta, tau, scheme, power, with_frequencies)`` of a handle from :func:`sanitizer_spec`."""
    if not isinstance(handle, (int, np.integer)) or isinstance(handle, bool) or not 0 <= handle < len(_SPEC_PARAMS):
        raise DPParameterError(f"unknown sanitizer spec {handle!r}: pass dp__pws_spec(epsilon, delta, tau, scheme, "
                               f"power, with_frequencies)")
    return _SPEC_PARAMS[handle]


def _grown(build, params: tuple, wmax: int):
    """``build(*params, n=...)`` valid up to frequency ``wmax``: ``n`` is rounded up to a power of two so that
    the vectors of one query share a few cached tables (rows ``<= n`` do not depend on ``n``); falls back to
    ``n = wmax`` when the rounded size is refused by a size limit."""
    wmax = max(1, int(wmax))
    n = 1 << (wmax - 1).bit_length()
    if n == wmax:
        return build(*params, n=n)
    try:
        return build(*params, n=n)
    except DPParameterError:
        return build(*params, n=wmax)


def _freqs(arr: pa.Array, name: str = "frequency") -> np.ndarray:
    if arr.null_count:
        raise DPParameterError(f"{name} must not be NULL")
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def udfs(source) -> list[Udf]:
    """PWS UDFs. Pure: probability tables, estimates, checks. Side effects: the sanitizers (uniforms from ``source``)."""

    def check(epsilon, delta, tau, scheme, power):
        check_pws_parameters(epsilon, delta, tau, scheme, power)
        return True

    def check_estimate(g, estimator):
        _check_g(g)
        _check_estimator(estimator)
        return True

    def check_sampling(tau, scheme, power):
        if tau is None:
            raise DPParameterError("tau must be a finite number > 0 (the sampling threshold), got NULL")
        check_tau(tau), check_scheme(scheme), check_power(power)
        return True

    def q_udf(freq, tau, scheme, power):
        t, s, p = check_tau(_const(tau, "tau")), check_scheme(_const(scheme, "scheme")), check_power(_const(power, "power"))
        if freq.null_count:
            raise DPParameterError("frequency must not be NULL")
        w = freq.to_numpy(zero_copy_only=False).astype(np.float64)
        return pa.array(sampling_probabilities(w, t, s, p), type=pa.float64())

    def pi_udf(freq, eps, delta, tau, scheme, power):
        w = _freqs(freq)
        table = key_table(*_params(eps, delta, tau, scheme, power), n=int(w.max()) if len(w) else 1)
        return pa.array(table.reporting(w), type=pa.float64())

    def pi_ij_udf(freq, token, eps, delta, tau, scheme, power):
        w, j = _freqs(freq), _freqs(token, "token")
        table = frequency_table(*_params(eps, delta, tau, scheme, power), n=max(1, int(w.max()) if len(w) else 1))
        return pa.array([table.entry(int(a), int(b)) if 0 <= b <= a else 0.0 for a, b in zip(w, j)],
                        type=pa.float64())

    def spec_udf(epsilon, delta, tau, scheme, power, with_frequencies):
        spec = sanitizer_spec(epsilon, delta, tau, scheme, power, with_frequencies)
        warn_weak_parameters(epsilon, delta, what="dp_weighted_sample", stacklevel=1)
        return spec

    def sbh_granularity_udf(epsilon, delta, tau, scheme, power, noise, granularity):
        g = sbh_granularity(epsilon, delta, tau, scheme, power, noise, granularity)
        warn_weak_parameters(epsilon, delta, what="dp_sbh_histogram", stacklevel=1)
        return g

    def sanitize_udf(freq, spec):
        """One uniform per key. Keys only: 1 = reported, 0 = not; with frequencies: the token (0 = not reported).

        ``spec`` is the handle of the validated parameters (:func:`sanitizer_spec`): DuckDB converts every
        argument vector of an Arrow UDF per call, and six constant columns cost 4x the sanitizer itself. The
        tables depend only on the public parameters and are valid up to the vector's largest frequency (no
        data-dependent state crosses vectors)."""
        w = _freqs(freq)
        *params, with_frequencies = _spec_params(_const(spec, "spec"))
        params = tuple(params)
        wmax = int(w.max()) if len(w) else 1
        u = source.uniform(len(w))
        if with_frequencies:
            out = _draw_tokens(w, u, _grown(frequency_table, params, wmax), wmax, SANITIZER_KERNEL)
        else:
            out = _report_keys(w, u, _grown(key_table, params, wmax), wmax, SANITIZER_KERNEL)
        return pa.array(out, type=pa.int64())

    def estimate_udf(token, eps, delta, tau, scheme, power, g, estimator):
        j = token.to_numpy(zero_copy_only=False) if token.null_count == 0 else None
        if j is None:
            raise DPParameterError("token is NULL: estimates need a sample drawn with with_frequencies := true")
        coeffs = _coefficients(*_params(eps, delta, tau, scheme, power), _check_g(_const(g, "g")),
                               _check_estimator(_const(estimator, "estimator")), int(j.max()) if len(j) else 0)
        j = j.astype(np.int64)
        if len(j) and j.min() < 0:
            raise DPParameterError("token must be >= 0")
        return pa.array(coeffs[j], type=pa.float64())

    def sbh_noisy_udf(freq, noise, granularity):
        g = _const(granularity, "granularity")
        return pa.array(sbh_noisy_values(_freqs(freq), noise.to_numpy(zero_copy_only=False), g), type=pa.float64())

    def bernoulli_udf(p):
        pr = p.to_numpy(zero_copy_only=False).astype(np.float64)
        return pa.array(source.uniform(len(pr)) < pr, type=pa.bool_())

    d, v, b = DOUBLE, VARCHAR, BIGINT
    return [
        Udf("dp__pws_check", scalar(check), (d, d, d, v, d), BOOLEAN),
        Udf("dp__pws_check_estimate", scalar(check_estimate), (v, v), BOOLEAN),
        Udf("dp__pws_check_sampling", scalar(check_sampling), (d, v, d), BOOLEAN),
        Udf("dp__pws_L", scalar(L_value), (d, d), d),
        Udf("dp__sbh_threshold", scalar(sbh_threshold), (d, d), d),
        Udf("dp__sbh_granularity", scalar(sbh_granularity_udf), (d, d, d, v, d, v, d), d),
        Udf("dp__sbh_noisy", sbh_noisy_udf, (b, d, d), d),
        Udf("dp__pws_q", q_udf, (d, d, v, d), d),
        Udf("dp__pws_pi", pi_udf, (b, d, d, d, v, d), d),
        Udf("dp__pws_pi_ij", pi_ij_udf, (b, b, d, d, d, v, d), d),
        Udf("dp__pws_estimate", estimate_udf, (b, d, d, d, v, d, v, v), d),
        Udf("dp__pws_spec", scalar(spec_udf), (d, d, d, v, d, BOOLEAN), b),
        Udf("dp__pws_sanitize", sanitize_udf, (b, b), b, side_effects=True),
        Udf("dp__bernoulli", bernoulli_udf, (d,), BOOLEAN, side_effects=True),
    ]


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


# ---------------------------------------------------------------------------
# Python API
# ---------------------------------------------------------------------------



def weighted_sample(con, table: str, epsilon: float, delta: float, *, tau: Optional[float] = None,
                    scheme: str = "ppswor", power: float = 1.0, with_frequencies: bool = False,
                    key_col: str = "key", freq_col: Optional[str] = None) -> pa.Table:
    """(epsilon, delta)-DP private weighted sample of ``table`` -- ELEMENT-level privacy, NOT user-level.

    Runs ``dp_weighted_sample`` on a connection prepared by :func:`dpsql.register`; returns Arrow columns
    ``key`` and ``token`` (NULL for keys only), rows sorted by key (the macro's ORDER BY: an order that depends
    on the released keys only). Every parameter is validated before the table is read or the budget charged.
    """
    from dpsql.validation import check_identifier, check_table_name

    epsilon, delta, tau, scheme, power = check_pws_parameters(epsilon, delta, tau, scheme, power)
    check_frequency_range(epsilon, delta, tau, scheme, power, bool(with_frequencies))
    table = check_table_name(table)
    key_col = check_identifier("key_col", key_col)
    freq = "NULL" if freq_col is None else sql_string(check_identifier("freq_col", freq_col))
    sql = (f"SELECT key, token FROM dp_weighted_sample({sql_string(table)}, {epsilon!r}, {delta!r}, "
           f"tau := {'NULL' if tau is None else repr(tau)}, scheme := {sql_string(scheme)}, power := {power!r}, "
           f"with_frequencies := {'true' if with_frequencies else 'false'}, key_col := {sql_string(key_col)}, "
           f"freq_col := {freq})")
    return con.sql(sql).to_arrow_table()
