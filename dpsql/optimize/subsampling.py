"""Pure epsilon-DP from one-sided ("add") DP by Poisson subsampling, and its building blocks.

Source: [SUB] Ghazi, Kamath, Kumar, Leeman, Manurangsi, Varadarajan, Zhang,
"Individualized Privacy Accounting via Subsampling with Applications in
Combinatorial Optimization" (ICML 2024): Lemma 3.1, Cor. 3.2, Alg. 1
(Repeated-EM, Gupta et al. 2010), Alg. 2 (Repeated-AT), Thm 4.3/4.4, 5.3/5.4.

Privacy unit: one record (a universe element, a point, a user's stream),
add/remove. A mechanism ``M`` is *eps0-add-DP* if for ``D = D' + {x}`` and all
outputs ``O``: ``Pr[M(D) in O] <= e^eps0 Pr[M(D') in O]`` -- only the direction
in which the record is added.

**Lemma 3.1** (one-sided -> two-sided). Run ``M`` on ``S_p(D)``, the Poisson
subsample that keeps every record independently with probability ``p``:

* removal direction: conditioned on ``x`` not being sampled, ``S_p(D)`` is
  distributed as ``S_p(D')``, which happens with probability ``1 - p``; hence
  ``Pr[M(S_p(D)) = o] >= (1 - p) Pr[M(S_p(D')) = o]``;
* add direction: conditioned on ``x`` being sampled (probability ``p``) the
  add-DP property costs a factor ``e^eps0``; hence
  ``Pr[M(S_p(D)) = o] <= (1 + p (e^eps0 - 1)) Pr[M(S_p(D')) = o]``.

So ``M o S_p`` is pure ``ln max{1/(1-p), 1 + p(e^eps0 - 1)}``-DP
(:func:`subsampled_epsilon`). **Cor. 3.2**: with ``eps0 = ln 2`` and
``p = 1 - e^-eps`` (:func:`subsampling_probability`) that is exactly ``eps``,
because ``1/(1-p) = e^eps`` and ``1 + p = 2 - e^-eps <= e^eps``.

Every application in :mod:`dpsql.optimize` therefore (1) draws
``D_s = S_p(D)`` from the connection's secure noise source and (2) runs an
``ln 2``-add-DP algorithm built from the two primitives below on ``D_s``.

* :func:`exp_mech` -- ``ExpMech_eps(C, q)``: ``Pr[c] ∝ exp(eps q(c))`` (no 1/2:
  for *monotone* scores the add-DP loss is ``eps`` times the realised
  sensitivity), sampled as the argmax of ``eps q + Gumbel(1)`` over the
  **full** candidate set, zero-score candidates included (dropping them would
  make the support depend on the data).
* :func:`above_threshold` -- Repeated-AT's test ``h(D) + Exp(rate eps0/Δ) > tau``,
  noise on the query only, one-sided exponential, none on the threshold.

Repeated-EM (Alg. 1, Thm 4.3): if every round's score is monotone (adding a
record never lowers it) and the realised sensitivities along the output sum
to at most ``Δ``, then L rounds of ``ExpMech_{eps0/Δ}`` are eps0-add-DP. The
add direction telescopes: the numerator of round i grows by at most
``e^{eps0/Δ · Δ_i}`` and, by monotonicity, the normaliser does not shrink.
Repeated-AT (Alg. 2, Thm 5.3): the same with ``Σ_{i: reported} Δ_i <= Δ``;
a ⊥ answer is monotone in the right direction for free.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import numpy as np
import pyarrow as pa
from duckdb.sqltypes import BOOLEAN, DOUBLE, UBIGINT

from dpsql.core.noise import NoiseSource
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import DPParameterError, check_epsilon, check_positive

__all__ = [
    "EPS0",
    "subsampling_probability",
    "subsampled_epsilon",
    "check_probability",
    "poisson_subsample",
    "exp_mech",
    "exp_mech_probabilities",
    "exponential_rate",
    "above_threshold",
    "repeated_em",
    "udfs",
]

# Cor. 3.2: the add-DP budget of every inner algorithm.
EPS0 = math.log(2.0)


# --------------------------------------------------------------------------
# Calibration (pure)
# --------------------------------------------------------------------------

def subsampling_probability(epsilon: float) -> float:
    """``p = 1 - e^-eps`` ([SUB] Cor. 3.2): subsampling an ln 2-add-DP mechanism makes it eps-DP."""
    epsilon = check_epsilon(epsilon)
    return -math.expm1(-epsilon)


def check_probability(name: str, p: object) -> float:
    """A sampling probability in (0, 1]."""
    value = check_positive(name, p)
    if value > 1.0:
        raise DPParameterError(f"{name} must be a probability in (0, 1] (got {p!r})")
    return value


def subsampled_epsilon(eps0: float, p: float) -> float:
    """``ln max{1/(1-p), 1 + p (e^eps0 - 1)}`` ([SUB] Lemma 3.1): two-sided eps of an eps0-add-DP mechanism on S_p.

    ``p = 1`` (no subsampling) gives ``inf``: one-sided DP alone bounds nothing in the removal direction.
    """
    eps0 = check_positive("eps0", eps0)
    p = check_probability("p", p)
    removal = math.inf if p == 1.0 else -math.log1p(-p)
    if eps0 <= 700.0 or p == 0.0:
        addition = math.log1p(p * math.expm1(eps0))
    else:  # e^eps0 overflows: ln(p e^eps0 + 1 - p) = eps0 + ln p + ln(1 + (1 - p) e^-eps0 / p)
        addition = eps0 + math.log(p) + math.log1p((1.0 - p) * math.exp(-eps0) / p)
    return max(removal, addition)


def exponential_rate(eps0: float, sensitivity: float = 1.0) -> float:
    """Rate ``eps0 / Δ`` of Repeated-AT's one-sided noise ``Exp(rate)`` (mean ``Δ/eps0``; [SUB] Alg. 2)."""
    return check_positive("eps0", eps0) / check_positive("sensitivity", sensitivity)


# --------------------------------------------------------------------------
# Sampling primitives (draw only from a NoiseSource)
# --------------------------------------------------------------------------

def poisson_subsample(source: NoiseSource, n: int, p: float) -> np.ndarray:
    """Boolean mask of ``S_p``: each of ``n`` records kept independently with probability ``p``."""
    p = check_probability("p", p)
    if n <= 0:
        return np.zeros(0, dtype=bool)
    return source.uniform(n) < p


def exp_mech_probabilities(scores: np.ndarray, epsilon: float) -> np.ndarray:
    """Exact output distribution of :func:`exp_mech`: softmax of ``eps * q``; ``-inf`` marks non-candidates."""
    z = epsilon * np.asarray(scores, dtype=np.float64)
    z = z - np.max(z)
    w = np.exp(z)
    return w / w.sum()


def exp_mech(source: NoiseSource, scores: np.ndarray, epsilon: float) -> int:
    """``ExpMech_eps``: index ``c`` with probability ``∝ exp(eps * scores[c])`` (Gumbel-max).

    ``scores`` covers the full candidate set (zero scores included); entries
    equal to ``-inf`` are not candidates (already chosen) and are never picked.
    ``argmax(eps q + G)`` with i.i.d. standard Gumbel ``G`` has exactly the
    softmax distribution.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0 or not np.any(np.isfinite(scores)):
        raise DPParameterError("exp_mech needs at least one candidate with a finite score in scores "
                               "(-inf marks a non-candidate)")
    noisy = epsilon * scores + source.gumbel(np.ones(scores.size))
    return int(np.argmax(noisy))


def above_threshold(source: NoiseSource, values: np.ndarray, threshold: Union[float, np.ndarray], eps0: float,
                    sensitivity: float = 1.0) -> np.ndarray:
    """Repeated-AT's tests ``value + Exp(rate eps0/Δ) > threshold``, one fresh draw per value ([SUB] Alg. 2)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return np.zeros(0, dtype=bool)
    rate = exponential_rate(eps0, sensitivity)
    return values + source.exponential(np.full(values.size, rate)) > threshold


def repeated_em(source: NoiseSource, rounds: int, scores: Callable[[list[int]], np.ndarray],
                eps0: float = EPS0, sensitivity: float = 1.0) -> list[int]:
    """Repeated-EM ([SUB] Alg. 1): ``rounds`` exponential mechanisms at ``eps0/Δ``.

    ``scores(history)`` returns round i's scores over the full candidate set
    (``-inf`` = not a candidate). The caller guarantees Assumptions 4.1
    (monotone scores) and 4.2 (realised sensitivities along any output sum to
    ``<= Δ``); then the whole run is ``eps0``-add-DP (Thm 4.3). Rounds with no
    candidate left stop the loop (data-independent: candidates are public).
    """
    eps = check_positive("eps0", eps0) / check_positive("sensitivity", sensitivity)
    chosen: list[int] = []
    for _ in range(int(rounds)):
        q = scores(chosen)
        if not np.any(np.isfinite(q)):
            break
        chosen.append(exp_mech(source, q, eps))
    return chosen


# --------------------------------------------------------------------------
# UDFs
# --------------------------------------------------------------------------

def udfs(source: NoiseSource) -> list[Udf]:
    """``dp__subsampling_probability`` (pure) and ``dp__poisson_keep`` (secure coin per row: side effects)."""

    def bernoulli(p: pa.Array, anchor: pa.Array) -> pa.Array:
        # ``anchor`` (e.g. hash(record)) is ignored: it only ties the call to the row, so that the
        # optimiser cannot move a filter on a constant p to the one-row calibration side and
        # evaluate a single coin for all records (observed: all-or-nothing subsamples).
        if p.null_count:
            raise DPParameterError("dp__poisson_keep: p must not be NULL; pass a probability in [0, 1]")
        probs = p.to_numpy(zero_copy_only=False).astype(np.float64)
        if probs.size and not np.all((probs >= 0) & (probs <= 1)):
            raise DPParameterError("dp__poisson_keep: p must be a probability in [0, 1] in every row")
        return pa.array(source.uniform(probs.size) < probs, type=pa.bool_())

    return [
        Udf("dp__subsampling_probability", scalar(subsampling_probability), (DOUBLE,), DOUBLE),
        Udf("dp__subsampled_epsilon", scalar(subsampled_epsilon), (DOUBLE, DOUBLE), DOUBLE),
        Udf("dp__poisson_keep", bernoulli, (DOUBLE, UBIGINT), BOOLEAN, side_effects=True),
    ]
