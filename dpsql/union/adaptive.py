"""Adaptive weighting for set union: MAD, MAD2R and DP-SIPS ([MAD] Chen et al.).

All three are instances of the weight-and-threshold meta-algorithm ([MAD] Alg. 1):
cap every user to ``max_items`` distinct items, compute item weights with a
weighting algorithm ALG, add ``N(0, sigma^2)`` to each weight and release the items
whose noisy weight is ``>= rho``. The SQL macros are in ``sql/30_union/20_adaptive.sql``;
this module holds their calibration, the checks of the conditions the privacy
proofs need, the UserWeights subroutine (a straightforward reference and the
vectorised version behind the ``dp__user_weights`` UDF) and ``udfs(source)``.

Privacy argument ([MAD] Thm 3.3): if ALG has l2 sensitivity <= 1 (new
coordinates counted) and every item held only by the added user (``t`` of them)
gets weight ``<= h(t)``, then ``sigma = sigma(eps, delta/2)`` and
``rho = max_t h(t) + sigma PhiInv((1 - delta/2)^(1/t))`` make releasing the item
set -- and even the noisy weights extended by pure noise outside the union,
``w~_ext`` -- (eps, delta)-DP.

* **MAD** ([MAD] Alg. 3, unbiased: ``b = 1``, ``b_min = b_max = 1``). Users of
  degree ``<= d_max`` first send ``1/d`` to each item; item weights are truncated
  at ``tau = rho + beta sigma``; the truncated excess goes back to the users in
  proportion to what they sent (``e_u = mean_i r(i)`` with
  ``r(i) = max(0, (w_init - tau)/w_init)`` -- ERRATUM: printed ``min``), a
  fraction ``alpha = b_min - 1/(2 sqrt(d_max))`` of it is rerouted evenly over
  the user's items, and finally every user adds ``UserWeights(S_u) - 1/d``
  (adaptive users) or ``UserWeights(S_u)`` (the others). l2 sensitivity <= 1
  (Lemma 5.6, with alpha from Lemma 5.8) and novel l_inf sensitivity
  ``<= b_max/sqrt(t)`` (Lemma 5.3) if ``tau >= 1``, ``d_max > 1`` and
  ``d_max >= 4`` or ``2 alpha/sqrt(d_max) <= b_max``, and ``0.5 <= b_min <= 1 <= b_max``.
  With ``b_max = 1`` MAD has exactly the sigma and rho of Basic (Cor. 5.2).
* **MAD2R** ([MAD] Alg. 4): round 1 is unbiased MAD, round 2 runs biased MAD with
  ``h(t) = b_max/sqrt(t)`` on the same capped sets minus the items released in round 1 and the
  items whose upper confidence bound ``w~1 + C_ub sigma1`` is below ``rho2``, with biases
  ``b = min(1, rho2 / max(0, w~1 - C_lb sigma1))``. Round 2 reads only round 1's ``w~_ext`` on items
  of the union (post-processing). ERRATUM: rho1/rho2 use each round's novel-item delta, not delta.
* **DP-SIPS** (Swanberg et al. 2023, as in [MAD]): Basic (``1/sqrt(d)``) in each round on the
  capped sets minus every item released earlier (post-processing).

Composition (:func:`multi_round_noise`, docs/proofs/mad2r.md section 5): every round is a Gaussian
mechanism of l2 sensitivity 1 on the extended coordinates plus the event that a novel item passes.
The Gaussian rounds compose exactly to one Gaussian mechanism with ``mu = sqrt(sum 1/sigma_r^2)``
(calibrated to ``(eps, delta/2)``), the events add up to ``delta/2``; the split gives round r the
share ``f_r`` of ``mu^2`` and of the events' ``delta/2``. Each round has less noise than with basic
composition of ``(f_r eps, f_r delta)``.

Decisions: the ``max_items`` cap is drawn once per query (one secret salt) and every round works on
those capped sets. ``max_adaptive_degree`` is used as ``max(2, min(max_adaptive_degree, max_items))``:
after the cap no user has more than ``max_items`` items ([MAD] takes ``d_max in (1, Delta_0]``), and
a smaller d_max reroutes more weight.
"""
from __future__ import annotations

from functools import lru_cache

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence, TypeGuard

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from duckdb.sqltypes import DOUBLE, VARCHAR

from dpsql.core.errors import ParameterError
from dpsql.core import accounting, calibration
from dpsql.core.calibration import Accounting, RoundCalibration, SetUnionCalibration
from dpsql.core.mechanism import AuditCase, Mechanism, Param, SparkForm, user_item_example, user_item_params
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import (DPParameterError, check_column_pair, check_delta, check_epsilon, check_max_items, derived_budget,
                              user_budget)

__all__ = [
    "MECHANISMS",
    "mad_parameters",
    "MadRound", "Mad2rCalibration", "MAX_SIPS_ROUNDS", "NORM_TOLERANCE", "SMALL_TOLERANCE",
    "reroute_discount", "min_adaptive_degree", "check_split", "check_mad_conditions",
    "mad_round", "mad_calibration", "multi_round_noise", "mad2r_calibration", "sips_calibration", "sips_accounting",
    "mad_set_union_calibration", "mad2r_set_union_calibration", "sips_set_union_calibration",
    "user_weights", "user_weights_batch", "udfs",
]

# DP-SIPS runs as a fixed chain of CTEs in sql/30_union/20_adaptive.sql (a macro cannot loop over the
# length of a runtime list, and each round re-aggregates the data because removing items changes
# the users' degrees); rounds beyond len(split) are pruned when the query is planned.
MAX_SIPS_ROUNDS = 5

# UserWeights stops once the squared norm reaches 1 within this tolerance ([MAD] Alg. 2 line 6),
# and counts a weight as "small" (line 7) only below (1 - SMALL_TOLERANCE)/sqrt(d): an item scaled
# up to b_max/sqrt(d) = 1/sqrt(d) (b_max = 1) may land one rounding error short of it, and must not
# be scaled again (that could loop for ever on rounding errors).
NORM_TOLERANCE = 1e-12
SMALL_TOLERANCE = 1e-12

_SPLIT_TOLERANCE = 1e-9
# Smallest budget fraction of one round. A round with less than a millionth of the budget releases
# nothing; the bound keeps each round's share of the smallest accepted epsilon and delta
# (dpsql.core.validation.EPSILON_MIN, DELTA_MIN) in the range where the calibrations were checked to stay
# finite (tests/frontends/test_python_api.py), so no error ever quotes a round's share instead of the user's value.
SPLIT_MIN = 1e-6


def _is_real(x: object) -> TypeGuard[numbers.Real]:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _real(name: str, value: object, *, low: float = -math.inf, high: float = math.inf,
          allow_inf: bool = False, hint: str = "") -> float:
    if value is None:
        raise DPParameterError(f"{name} must not be NULL{hint}")
    if not _is_real(value) or math.isnan(float(value)) or (math.isinf(float(value)) and not allow_inf):
        raise DPParameterError(f"{name} must be a finite number (got {value!r}){hint}")
    v = float(value)
    if not low <= v <= high:
        raise DPParameterError(f"{name} must be between {low:g} and {high:g} (got {value!r}){hint}")
    return v


def check_beta(beta: object) -> float:
    """beta >= 0 (finite): the adaptive threshold is tau = rho + beta * sigma."""
    return _real("beta", beta, low=0.0, hint="; MAD truncates at tau = rho + beta*sigma, e.g. beta := 2")


def check_max_adaptive_degree(value: object) -> int:
    """A whole number >= 2 (Alg. 3 needs d_max > 1)."""
    if value is None:
        raise DPParameterError("max_adaptive_degree must not be NULL; pass e.g. max_adaptive_degree := 50")
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) != int(float(value)) \
            or float(value) < 2:
        raise DPParameterError(
            f"max_adaptive_degree must be a whole number >= 2 (got {value!r}); users with at most this many "
            f"items take part in MAD's rerouting, e.g. max_adaptive_degree := 50")
    return int(float(value))


def check_bias_bounds(b_min: object, b_max: object) -> tuple[float, float]:
    """0.5 <= b_min <= 1 <= b_max (finite): the bias limits of UserWeights ([MAD] Alg. 2, Lemma 5.4)."""
    lo = _real("b_min", b_min, hint="; the privacy proof of MAD needs 0.5 <= b_min <= 1")
    hi = _real("b_max", b_max, hint="; the privacy proof of MAD needs b_max >= 1 (finite)")
    if not 0.5 <= lo <= 1.0:
        raise DPParameterError(f"b_min must satisfy 0.5 <= b_min <= 1 (got {b_min!r}); "
                               "the privacy proof of MAD (Lemma 5.6) needs it")
    if hi < 1.0:
        raise DPParameterError(f"b_max must be >= 1 (got {b_max!r}); the privacy proof of MAD needs it")
    return lo, hi


def check_split(split: object, *, min_rounds: int = 1, max_rounds: int = MAX_SIPS_ROUNDS,
                name: str = "split") -> tuple[float, ...]:
    """Budget fractions: ``min_rounds..max_rounds`` finite numbers > 0 summing to 1 (within 1e-9)."""
    if split is None:
        raise DPParameterError(f"{name} must not be NULL; pass e.g. {name} := [0.1, 0.9]")
    if isinstance(split, (str, bytes)) or not isinstance(split, Sequence):
        raise DPParameterError(f"{name} must be a list of budget fractions, e.g. [0.1, 0.9] (got {split!r})")
    fractions = list(split)
    if not min_rounds <= len(fractions) <= max_rounds:
        count = (f"exactly {min_rounds}" if min_rounds == max_rounds
                 else f"between {min_rounds} and {max_rounds}")
        raise DPParameterError(f"{name} must have {count} fractions (got {len(fractions)}: {fractions!r})")
    for f in fractions:
        if f is None or not _is_real(f) or not math.isfinite(float(f)) or float(f) <= 0:
            raise DPParameterError(f"every fraction of {name} must be a finite number > 0 (got {fractions!r})")
        if float(f) < SPLIT_MIN:
            raise DPParameterError(f"every fraction of {name} must be >= {SPLIT_MIN:g} (got {fractions!r}); a round "
                                   f"with a smaller share of the budget releases nothing, e.g. {name} := [0.1, 0.9]")
    total = math.fsum(float(f) for f in fractions)
    if abs(total - 1.0) > _SPLIT_TOLERANCE:
        raise DPParameterError(f"the fractions of {name} must sum to 1 (got {fractions!r}, sum {total!r})")
    return tuple(float(f) for f in fractions)


def _check_nonnegative(name: str, value: object) -> float:
    return _real(name, value, low=0.0, hint=f"; {name} is a number of round-one standard deviations >= 0")


# --------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------

def reroute_discount(max_adaptive_degree: float, b_min: float = 1.0) -> float:
    """``alpha = b_min - 1/(2 sqrt(d_max))`` ([MAD] Alg. 3 line 2; Lemma 5.8 with C = 2 b_min, y = d_max)."""
    return b_min - 1.0 / (2.0 * math.sqrt(max_adaptive_degree))


def min_adaptive_degree(b_min: float) -> int:
    """``ceil(1/b_min^2)``: users with fewer items do not adapt ([MAD] Alg. 3 line 3)."""
    return math.ceil(1.0 / (b_min * b_min))


def check_mad_conditions(tau: float, max_adaptive_degree: float, alpha: float, b_min: float, b_max: float) -> None:
    """Raise unless the conditions of [MAD] Lemmas 5.3, 5.4 and 5.6 hold.

    ``tau >= 1`` (a new user's lone items are never truncated), ``d_max > 1``,
    ``d_max >= 4`` or ``2 alpha/sqrt(d_max) <= b_max`` (novel items stay below
    ``b_max/sqrt(t)``), ``0.5 <= b_min <= 1 <= b_max``.
    """
    check_bias_bounds(b_min, b_max)
    if tau is None or math.isnan(tau) or tau < 1.0:
        raise DPParameterError(
            f"MAD needs an adaptive threshold tau >= 1 (got {tau!r}); tau = rho + beta*sigma, raise beta")
    if not max_adaptive_degree > 1:
        raise DPParameterError(f"MAD needs max_adaptive_degree > 1 (got {max_adaptive_degree!r})")
    if not (max_adaptive_degree >= 4 or 2.0 * alpha / math.sqrt(max_adaptive_degree) <= b_max):
        raise DPParameterError(
            f"MAD needs max_adaptive_degree >= 4 or 2*alpha/sqrt(max_adaptive_degree) <= b_max "
            f"(alpha = {alpha!r}, max_adaptive_degree = {max_adaptive_degree!r}, b_max = {b_max!r})")


@dataclass(frozen=True)
class MadRound:
    """Calibration of one MAD weight-and-threshold round.

    ``sigma = sigma(epsilon, delta/2)``;
    ``rho = max_t b_max/sqrt(t) + sigma PhiInv((1 - delta/2)^(1/t))``;
    ``tau = rho + beta sigma``; users with ``min_adaptive_degree <= d <=
    max_adaptive_degree`` adapt; ``alpha`` is the reroute discount.
    """

    epsilon: float
    delta: float
    sigma: float
    rho: float
    tau: float
    alpha: float
    min_adaptive_degree: int
    max_adaptive_degree: int
    b_min: float
    b_max: float

    def as_round(self) -> RoundCalibration:
        return RoundCalibration(self.epsilon, self.delta, self.sigma, self.rho, self.tau)

    def sql_row(self, suffix: str = "") -> dict:
        return {f"sigma{suffix}": self.sigma, f"rho{suffix}": self.rho, f"tau{suffix}": self.tau,
                f"alpha{suffix}": self.alpha, f"min_degree{suffix}": float(self.min_adaptive_degree),
                f"max_degree{suffix}": float(self.max_adaptive_degree)}


def effective_max_adaptive_degree(max_adaptive_degree: int, max_items: int) -> int:
    """``max(2, min(max_adaptive_degree, max_items))``: no capped user has more than max_items items."""
    return max(2, min(int(max_adaptive_degree), int(max_items)))


@user_budget  # the round's epsilon and delta are checked as given; delta/2 inside is a share
def mad_round(epsilon: float, delta: float, max_items: int, max_adaptive_degree: int = 50, beta: float = 2.0,
              b_min: float = 1.0, b_max: float = 1.0) -> MadRound:
    """One MAD round at ``(epsilon, delta)`` with novel-item bound ``h(t) = b_max/sqrt(t)`` ([MAD] Alg. 1, 3, 4)."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    sigma = calibration.gaussian_sigma(epsilon, delta / 2.0)
    return _mad_round_at(sigma, delta / 2.0, epsilon, delta, max_items, max_adaptive_degree, beta, b_min, b_max)


def _mad_round_at(sigma: float, delta_novel: float, epsilon_share: float, delta_share: float, max_items: int,
                  max_adaptive_degree: int, beta: float, b_min: float, b_max: float) -> MadRound:
    """A MAD round of noise ``sigma`` whose novel items pass with probability ``<= delta_novel``."""
    max_items = check_max_items(max_items)
    d_max = effective_max_adaptive_degree(check_max_adaptive_degree(max_adaptive_degree), max_items)
    beta = check_beta(beta)
    b_min, b_max = check_bias_bounds(b_min, b_max)
    rho = calibration.gaussian_threshold(sigma, delta_novel, max_items, lambda t: b_max / math.sqrt(t))
    tau = rho + beta * sigma
    alpha = reroute_discount(d_max, b_min)
    check_mad_conditions(tau, d_max, alpha, b_min, b_max)
    return MadRound(epsilon_share, delta_share, sigma, rho, tau, alpha, min_adaptive_degree(b_min), d_max,
                    b_min, b_max)


def mad_calibration(epsilon: float, delta: float, max_items: int, max_adaptive_degree: int = 50,
                    beta: float = 2.0) -> MadRound:
    """Unbiased MAD: the sigma and rho of Basic (weighted Gaussian), ``tau = rho + beta sigma``."""
    return mad_round(epsilon, delta, max_items, max_adaptive_degree, beta, 1.0, 1.0)


@dataclass(frozen=True)
class Mad2rCalibration:
    """Both rounds of MAD2R, the confidence-bound offsets ``C_lb sigma1`` and ``C_ub sigma1``, and the accountant's total."""

    round1: MadRound
    round2: MadRound
    c_lb: float
    c_ub: float
    accounting: Accounting

    @property
    def lower_offset(self) -> float:
        return self.c_lb * self.round1.sigma

    @property
    def upper_offset(self) -> float:
        return self.c_ub * self.round1.sigma


def multi_round_noise(epsilon: float, delta: float, fractions: Sequence[float]) -> tuple[tuple[float, ...],
                                                                                          tuple[float, ...]]:
    """Per-round ``(sigma_r, delta_novel_r)`` of Gaussian rounds sharing ``(epsilon, delta)``, composed tightly.

    Half of delta covers the novel items, split like the budget: ``delta_novel_r = w_r delta/2``
    (``w_r = f_r / sum(f)``); the other half is the delta of the composed Gaussian rounds,
    ``sigma_r = s/sqrt(w_r)`` with ``s = gaussian_sigma(epsilon, delta/2)`` (up to
    :data:`dpsql.core.accounting.FLOAT_MARGIN`): :func:`dpsql.core.accounting.gaussian_rounds_sigmas`.
    Proof: docs/proofs/mad2r.md, section 5.
    """
    total = math.fsum(fractions)
    sigmas = accounting.gaussian_rounds_sigmas(epsilon, delta / 2.0, fractions)
    return sigmas, tuple(f / total * delta / 2.0 for f in fractions)


def mad2r_calibration(epsilon: float, delta: float, max_items: int, split: Optional[Sequence[float]] = (0.1, 0.9),
                      max_adaptive_degree: int = 50, beta: float = 2.0, b_min: float = 0.5, b_max: float = 2.0,
                      c_lb: float = 1.0, c_ub: float = 3.0) -> Mad2rCalibration:
    """MAD2R ([MAD] Alg. 4), rounds composed tightly: :func:`multi_round_noise`; round 1 unbiased, round 2 biased."""
    return _mad2r_calibration(*_mad2r_key(epsilon, delta, max_items, split, max_adaptive_degree, beta, b_min, b_max,
                                          c_lb, c_ub))


def _mad2r_key(epsilon, delta, max_items, split, max_adaptive_degree, beta, b_min, b_max, c_lb, c_ub) -> tuple:
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    fractions = check_split(split, min_rounds=2, max_rounds=2)
    c_lb, c_ub = _check_nonnegative("c_lb", c_lb), _check_nonnegative("c_ub", c_ub)
    b_min, b_max = check_bias_bounds(b_min, b_max)
    max_items = check_max_items(max_items)
    beta = check_beta(beta)
    return (epsilon, delta, max_items, fractions, check_max_adaptive_degree(max_adaptive_degree), beta,
            b_min, b_max, c_lb, c_ub)


# The accountant costs milliseconds and dp-accounting's import a second: once per parameter set.
@lru_cache(maxsize=256)
def _mad2r_calibration(epsilon: float, delta: float, max_items: int, fractions: tuple[float, ...],
                       max_adaptive_degree: int, beta: float, b_min: float, b_max: float, c_lb: float,
                       c_ub: float) -> Mad2rCalibration:
    (s1, s2), (n1, n2) = multi_round_noise(epsilon, delta, fractions)
    f1, f2 = fractions
    with derived_budget():  # f * epsilon, f * delta are shares of the values checked above
        r1 = _mad_round_at(s1, n1, f1 * epsilon, f1 * delta, max_items, max_adaptive_degree, beta, 1.0, 1.0)
        r2 = _mad_round_at(s2, n2, f2 * epsilon, f2 * delta, max_items, max_adaptive_degree, beta, b_min, b_max)
    return Mad2rCalibration(r1, r2, c_lb, c_ub, accounting.account_gaussian_rounds((s1, s2), n1 + n2, epsilon, delta))


def sips_calibration(epsilon: float, delta: float, max_items: int,
                     split: Optional[Sequence[float]] = (0.1, 0.9)) -> tuple[RoundCalibration, ...]:
    """DP-SIPS: one Basic (weighted Gaussian) round per fraction, composed tightly (:func:`multi_round_noise`).

    Round r: ``sigma_r``, ``rho_r = max_t 1/sqrt(t) + sigma_r PhiInv((1 - delta_novel_r)^(1/t))``.
    """
    return _sips_calibration(*_sips_key(epsilon, delta, max_items, split))[0]


def sips_accounting(epsilon: float, delta: float, max_items: int,
                    split: Optional[Sequence[float]] = (0.1, 0.9)) -> Accounting:
    """The accountant's total privacy loss of DP-SIPS at these parameters."""
    return _sips_calibration(*_sips_key(epsilon, delta, max_items, split))[1]


def _sips_key(epsilon, delta, max_items, split) -> tuple:
    return check_epsilon(epsilon), check_delta(delta), check_max_items(max_items), check_split(split)


@lru_cache(maxsize=256)
def _sips_calibration(epsilon: float, delta: float, max_items: int,
                      fractions: tuple[float, ...]) -> tuple[tuple[RoundCalibration, ...], Accounting]:
    sigmas, novel = multi_round_noise(epsilon, delta, fractions)
    with derived_budget():  # the rounds' delta_novel are shares of the checked delta
        rounds = tuple(RoundCalibration(f * epsilon, f * delta, s, calibration.gaussian_threshold(s, n, max_items))
                       for f, s, n in zip(fractions, sigmas, novel))
    return rounds, accounting.account_gaussian_rounds(sigmas, math.fsum(novel), epsilon, delta)


def mad_set_union_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """MAD with its defaults, as a :class:`SetUnionCalibration` (for ``union.METHODS``)."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    with derived_budget():  # mad_round halves delta
        r = mad_calibration(epsilon, delta, max_items)
    return SetUnionCalibration("gaussian", r.sigma, r.rho, (r.as_round(),))


def mad2r_set_union_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """MAD2R with its defaults; ``scale``/``threshold`` are round two's."""
    c = mad2r_calibration(epsilon, delta, max_items)
    return SetUnionCalibration("gaussian", c.round2.sigma, c.round2.rho, (c.round1.as_round(), c.round2.as_round()),
                               c.accounting)


def sips_set_union_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """DP-SIPS with its default split; ``scale``/``threshold`` are the last round's."""
    rounds = sips_calibration(epsilon, delta, max_items)
    return SetUnionCalibration("gaussian", rounds[-1].scale, rounds[-1].threshold, rounds,
                               sips_accounting(epsilon, delta, max_items))


# --------------------------------------------------------------------------
# UserWeights ([MAD] Alg. 2)
# --------------------------------------------------------------------------

def _user_weights(b: Sequence[float] | np.ndarray, b_min: float, b_max: float) -> tuple[np.ndarray, int]:
    b = np.asarray(b, dtype=np.float64)
    d = len(b)
    w = np.zeros(d)
    if d == 0:
        return w, 0
    sq = math.sqrt(d)
    biased = b < 1.0
    w[biased] = np.maximum(b_min, b[biased]) / sq
    k = float(np.sum(w[biased] ** 2))
    n_unbiased = d - int(biased.sum())
    if n_unbiased:
        w[~biased] = min(b_max / sq, math.sqrt(max(0.0, 1.0 - k)) / math.sqrt(n_unbiased))
    iterations = 0
    for _ in range(d + 1):  # each pass ends the loop or lifts the largest small weight out of S_small
        total = float(np.sum(w ** 2))
        if total >= 1.0 - NORM_TOLERANCE:
            break
        small = w < (1.0 - SMALL_TOLERANCE) / sq
        if not small.any():
            break
        c = min((b_max / sq) / float(w[small].max()), math.sqrt(1.0 + (1.0 - total) / float(np.sum(w[small] ** 2))))
        if c <= 1.0:
            break
        w[small] *= c
        iterations += 1
    return w, iterations


def user_weights(b: Sequence[float], b_min: float = 1.0, b_max: float = 1.0) -> np.ndarray:
    """UserWeights of one user ([MAD] Alg. 2), written out as in the paper; the reference for tests.

    ``b[i]`` is the bias of the user's i-th item (1 = unbiased). Items with
    ``b < 1`` get ``max(b_min, b)/sqrt(d)``; the others share the rest of the
    unit l2 budget, at most ``b_max/sqrt(d)`` each; while the squared norm is
    below 1 the weights under ``1/sqrt(d)`` are scaled up by a common factor,
    at most up to ``b_max/sqrt(d)``. Result: weights in
    ``[b_min/sqrt(d), b_max/sqrt(d)]`` with l2 norm <= 1 (Lemma 5.4); with
    ``b = 1`` every weight is ``1/sqrt(d)``.
    """
    return _user_weights(b, b_min, b_max)[0]


def user_weights_batch(b: np.ndarray, offsets: np.ndarray, b_min, b_max) -> np.ndarray:
    """UserWeights of many users at once; user ``u`` owns ``b[offsets[u]:offsets[u+1]]``.

    The same arithmetic as :func:`user_weights`, with the while loop run for
    all users together (a user leaves the loop when it would stop there).
    ``b_min``/``b_max`` are scalars or one value per user.
    """
    b = np.asarray(b, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n_users = len(offsets) - 1
    lengths = np.diff(offsets)
    if n_users <= 0 or len(b) == 0:
        return np.zeros(len(b))
    seg = np.repeat(np.arange(n_users), lengths)
    sq = np.sqrt(np.maximum(lengths, 1).astype(np.float64))  # users without items get no weight anyway
    sq_e = sq[seg]
    b_min_u = np.broadcast_to(np.asarray(b_min, dtype=np.float64), (n_users,))
    b_max_u = np.broadcast_to(np.asarray(b_max, dtype=np.float64), (n_users,))
    cap_u = b_max_u / sq
    biased = b < 1.0
    w = np.where(biased, np.maximum(b_min_u[seg], b) / sq_e, 0.0)
    k = np.bincount(seg, weights=w * w, minlength=n_users)
    n_unbiased = np.bincount(seg, weights=(~biased).astype(np.float64), minlength=n_users)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.sqrt(np.maximum(0.0, 1.0 - k)) / np.sqrt(n_unbiased)
    w = np.where(biased, w, np.minimum(cap_u, share)[seg])
    nonempty = lengths > 0
    starts = offsets[:-1][nonempty]
    active = nonempty.copy()
    for _ in range(int(lengths.max()) + 1):
        total = np.bincount(seg, weights=w * w, minlength=n_users)
        small = w < (1.0 - SMALL_TOLERANCE) / sq_e
        small_sq = np.bincount(seg, weights=np.where(small, w * w, 0.0), minlength=n_users)
        small_max = np.zeros(n_users)
        small_max[nonempty] = np.maximum.reduceat(np.where(small, w, 0.0), starts)
        go = active & (total < 1.0 - NORM_TOLERANCE) & (small_sq > 0)
        if not go.any():
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.minimum(cap_u / small_max, np.sqrt(1.0 + (1.0 - total) / small_sq))
        go &= c > 1.0
        if not go.any():
            break
        w = np.where(small & go[seg], w * np.where(go, c, 1.0)[seg], w)
        active = go
    return w


# --------------------------------------------------------------------------
# UDFs
# --------------------------------------------------------------------------

def _user_weights_udf(b: pa.Array, b_min: pa.Array, b_max: pa.Array) -> pa.Array:
    """Arrow body of ``dp__user_weights(b DOUBLE[], b_min, b_max) -> DOUBLE[]`` (one list per user)."""
    if isinstance(b, pa.ChunkedArray):
        b = b.combine_chunks()
    if b.null_count or b_min.null_count or b_max.null_count:
        raise ParameterError("dp__user_weights: NULL biases or bias limits")
    lengths = pc.list_value_length(b).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pc.list_flatten(b).to_numpy(zero_copy_only=False)
    lo = b_min.to_numpy(zero_copy_only=False).astype(np.float64)
    hi = b_max.to_numpy(zero_copy_only=False).astype(np.float64)
    for l, h in set(zip(lo.tolist(), hi.tolist())):
        check_bias_bounds(l, h)
    w = user_weights_batch(values, offsets, lo, hi)
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), pa.array(w, type=pa.float64()))


def mad_parameters(tau: object, max_adaptive_degree: object, max_items: object, b_min: object,
                   b_max: object) -> dict[str, float]:
    """MAD's parameters for a given ``tau`` (may be +inf) on data that is already capped.

    The testing macros' ``dp__mad_parameters`` and the Spark backend's MAD stages read this one function.
    """
    tau = _real("tau", tau, low=1.0, allow_inf=True, hint="; MAD needs tau >= 1")
    d_max = effective_max_adaptive_degree(check_max_adaptive_degree(max_adaptive_degree),
                                          check_max_items(max_items))
    b_min, b_max = check_bias_bounds(b_min, b_max)
    alpha = reroute_discount(d_max, b_min)
    check_mad_conditions(tau, d_max, alpha, b_min, b_max)
    return {"tau": tau, "alpha": alpha, "min_degree": float(min_adaptive_degree(b_min)),
            "max_degree": float(d_max), "b_min": b_min, "b_max": b_max}


def _accounting_row(a: Accounting) -> dict:
    return {"accountant": a.accountant, "total_epsilon": a.epsilon, "total_delta": a.delta}


def udfs(source) -> list[Udf]:
    """Calibration/validation UDFs of the adaptive macros and the UserWeights UDF (all pure)."""

    # A macro references its calibration CTE several times and DuckDB evaluates the (pure) UDF once
    # per reference, so the rows are cached (MAD2R's grows with max_items: benchmarks/README.md). Failures
    # raise every time (lru_cache stores results, not exceptions).
    @lru_cache(maxsize=128)
    def _mad_row(*args):
        return mad_calibration(*args).sql_row()

    @lru_cache(maxsize=128)
    def _mad2r_row(epsilon, delta, max_items, split, *rest):
        c = mad2r_calibration(epsilon, delta, max_items, list(split) if split is not None else None, *rest)
        return {**c.round1.sql_row("1"), **c.round2.sql_row("2"), "min_bias": c.round2.b_min,
                "max_bias": c.round2.b_max, "lower_offset": c.lower_offset, "upper_offset": c.upper_offset,
                **_accounting_row(c.accounting)}

    @lru_cache(maxsize=128)
    def _sips_row(epsilon, delta, max_items, split):
        split = list(split) if split is not None else None
        rounds = sips_calibration(epsilon, delta, max_items, split)
        return {"sigma": [r.scale for r in rounds], "rho": [r.threshold for r in rounds],
                **_accounting_row(sips_accounting(epsilon, delta, max_items, split))}

    def _key(split):
        return tuple(split) if isinstance(split, list) else split

    def mad_cal(epsilon, delta, max_items, max_adaptive_degree, beta, user_col, item_col):
        check_column_pair(user_col, item_col)
        check_epsilon(epsilon), check_delta(delta)  # the user's values, before mad_round's shares
        with derived_budget():
            row = dict(_mad_row(epsilon, delta, max_items, max_adaptive_degree, beta))
        return row

    def mad2r_cal(epsilon, delta, max_items, split, max_adaptive_degree, beta, b_min, b_max, c_lb, c_ub,
                  user_col, item_col):
        check_column_pair(user_col, item_col)
        row = dict(_mad2r_row(epsilon, delta, max_items, _key(split), max_adaptive_degree, beta, b_min, b_max,
                              c_lb, c_ub))
        return row

    def sips_cal(epsilon, delta, max_items, split, user_col, item_col):
        check_column_pair(user_col, item_col)
        row = _sips_row(epsilon, delta, max_items, _key(split))
        return {**row, "sigma": list(row["sigma"]), "rho": list(row["rho"])}

    d, v = DOUBLE, VARCHAR
    dl = duckdb.list_type(DOUBLE)

    def struct(names):
        return duckdb.struct_type({n: DOUBLE for n in names})

    round_fields = ["sigma", "rho", "tau", "alpha", "min_degree", "max_degree"]
    accounting_fields = {"accountant": VARCHAR, "total_epsilon": DOUBLE, "total_delta": DOUBLE}
    return [
        Udf("dp__mad_calibration", scalar(mad_cal), (d, d, d, d, d, v, v), struct(round_fields)),
        Udf("dp__mad2r_calibration", scalar(mad2r_cal), (d, d, d, dl, d, d, d, d, d, d, v, v),
            duckdb.struct_type({**{n: DOUBLE for n in [f + "1" for f in round_fields] + [f + "2" for f in round_fields]
                                   + ["min_bias", "max_bias", "lower_offset", "upper_offset"]},
                                **accounting_fields})),
        Udf("dp__sips_calibration", scalar(sips_cal), (d, d, d, dl, v, v),
            duckdb.struct_type({"sigma": dl, "rho": dl, **accounting_fields})),
        Udf("dp__mad_parameters", scalar(mad_parameters), (d, d, d, d, d),
            struct(["tau", "alpha", "min_degree", "max_degree", "b_min", "b_max"])),
        Udf("dp__user_weights", _user_weights_udf, (dl, d, d), dl),
    ]


# -- declarations (dpsql.core.mechanism) ------------------------------------------------------------------

# Audit cases (dpsql.tools.audit): the threshold pairs at max_items 100 (the added user holds one item the
# others hold), and the row-order attack.
_THRESHOLD = AuditCase("threshold", options=(("max_items", 100), ("t", 1)))
_ORDER = AuditCase("order", note="row order, added row stored first")


def _split_param() -> Param:
    return Param("split", "DOUBLE[]", (0.1, 0.9), lambda v: check_split(list(v)),
                 "budget share of each round (sums to 1)")


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="mad", family="set_union", macro="dp_set_union_mad", unit="user",
        params=user_item_params(
            Param("max_adaptive_degree", "DOUBLE", 50, check_max_adaptive_degree,
                  "users with at most this many items reroute excess weight"),
            Param("beta", "DOUBLE", 2, check_beta, "reroute above the threshold plus beta sigma")),
        description="MaxAdaptiveDegree: Basic's noise and threshold, excess weight of items far above the "
                    "threshold rerouted to the others ([MAD] Alg. 3)",
        proof="mad", calibrate=mad_set_union_calibration, rounds=1, sql="30_union/20_adaptive.sql",
        spark=SparkForm("biased_round", mad_calibration), gaussian_domain=True,
        example=user_item_example(max_adaptive_degree="50", beta="2"),
        audit=(_THRESHOLD,
               AuditCase("mad_min", name="mad_adaptive", note="max_adaptive_degree 4, rerouting dataset"),
               _ORDER,
               # the audit's own instrument: the printed min{0, .} of Alg. 3 line 6, which it must refute
               AuditCase("broken_mad_min"))),
    Mechanism(
        name="mad2r", family="set_union", macro="dp_set_union_mad2r", unit="user",
        params=user_item_params(
            _split_param(),
            Param("max_adaptive_degree", "DOUBLE", 50, check_max_adaptive_degree,
                  "users with at most this many items reroute excess weight"),
            Param("beta", "DOUBLE", 2, check_beta, "reroute above the threshold plus beta sigma"),
            Param("b_min", "DOUBLE", 0.5, None, "smallest round-two bias"),
            Param("b_max", "DOUBLE", 2.0, None, "largest round-two bias"),
            Param("c_lb", "DOUBLE", 1.0, None, "lower offset of the bias ramp, in round-one sigmas"),
            Param("c_ub", "DOUBLE", 3.0, None, "upper offset of the bias ramp, in round-one sigmas")),
        description="MAD in two rounds (budget 0.1/0.9), round two biased by round one's noisy weights "
                    "([MAD] Alg. 4)",
        proof="mad2r", calibrate=mad2r_set_union_calibration, rounds=2, sql="30_union/20_adaptive.sql",
        spark=SparkForm("two_rounds", mad2r_calibration), gaussian_domain=True,
        # the best method the Spark backend runs (benchmarks/README.md, "Utility"): its default
        preference=2,
        example=user_item_example(max_adaptive_degree="50", beta="2", split="[0.1, 0.9]", b_min="0.5", b_max="2.0",
                                  c_lb="1.0", c_ub="3.0"),
        audit=(_THRESHOLD, _ORDER)),
    Mechanism(
        name="sips", family="set_union", macro="dp_set_union_sips", unit="user",
        params=user_item_params(_split_param()),
        description="DP-SIPS: Basic in two rounds (budget 0.1/0.9), round two without round one's items "
                    "(Swanberg et al. 2023)",
        proof="sips", calibrate=sips_set_union_calibration, rounds=2, sql="30_union/20_adaptive.sql",
        spark=SparkForm("peeling_rounds", sips_calibration), gaussian_domain=True,
        example=user_item_example(split="[0.1, 0.9]"), audit=(_THRESHOLD, _ORDER)),
)
