"""Basic set union: count or weight, add noise, keep what clears a threshold ([DPSU] Alg. 1, Sec. 1.1).

The four parallel one-round methods of sql/30_union/10_basic.sql. Each user's distinct items are
capped to ``max_items`` (a uniform sample depending only on that user's rows); each item gets
the sum over its users of a weight -- ``1`` (count) or ``1/d`` resp. ``1/sqrt(d)`` for a user
with ``d`` kept items (weighted) -- plus Laplace or Gaussian noise, and the items above the
threshold are released. Calibration: the four functions below, on the formulas of
:mod:`dpsql.core.calibration`; privacy argument: ``docs/proofs/<method>.md``. The SQL functions
``dp_gaussian_threshold`` and ``dp_laplace_threshold`` are the weighted methods' thresholds.
"""
from __future__ import annotations

import math

from duckdb.sqltypes import DOUBLE

from dpsql.core.calibration import (SetUnionCalibration, gaussian_sigma, gaussian_threshold, inv, inv_sqrt,
                                   laplace_threshold, one)
from dpsql.core.mechanism import AuditCase, Mechanism, SparkForm, user_item_example, user_item_params
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import check_delta, check_epsilon, check_max_items, user_budget

__all__ = ["MECHANISMS", "weighted_gaussian_calibration", "weighted_laplace_calibration",
           "count_gaussian_calibration", "count_laplace_calibration", "udfs"]


def _checked(epsilon: float, delta: float, max_items: int) -> tuple[float, float, int]:
    return check_epsilon(epsilon), check_delta(delta), check_max_items(max_items)


@user_budget
def weighted_gaussian_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Weighted Gaussian = WGM [MM Alg. 1] = Basic [MAD App. A] ([DPSU] Thm 5.1).

    Each capped user adds ``1/sqrt(|W'|)`` to its items (l2 sensitivity 1);
    ``sigma = sigma(eps, delta/2)``, ``rho`` = :func:`gaussian_threshold` with
    ``delta_novel = delta/2`` and ``h(t) = 1/sqrt(t)``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    sigma = gaussian_sigma(epsilon, delta / 2.0)
    return SetUnionCalibration("gaussian", sigma, gaussian_threshold(sigma, delta / 2.0, max_items, inv_sqrt))


@user_budget
def weighted_laplace_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Weighted Laplace ([DPSU] App. B, Thm 4.1 threshold).

    Each capped user adds ``1/|W'|`` (l1 sensitivity 1); noise ``Lap(1/eps)``;
    ``rho`` = :func:`laplace_threshold` with the whole delta and ``h(t) = 1/t``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    scale = 1.0 / epsilon
    return SetUnionCalibration("laplace", scale, laplace_threshold(scale, delta, max_items, inv))


@user_budget
def count_gaussian_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Count Gaussian, the baseline of [DPSU] Sec. 1.1 (threshold derived in docs/proofs/count_gaussian.md).

    Each capped user adds 1 to each of its ``<= max_items`` items: l2
    sensitivity ``sqrt(max_items)``, so ``sigma_c = sqrt(max_items) sigma(eps,
    delta/2)``; a novel item has count 1, so ``h(t) = 1`` and
    ``rho = 1 + sigma_c PhiInv((1 - delta/2)^(1/max_items))``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    sigma_c = math.sqrt(max_items) * gaussian_sigma(epsilon, delta / 2.0)
    return SetUnionCalibration("gaussian", sigma_c, gaussian_threshold(sigma_c, delta / 2.0, max_items, one))


@user_budget
def count_laplace_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """Count Laplace, the baseline of [DPSU] Sec. 1.1 (threshold derived in docs/proofs/count_laplace.md).

    l1 sensitivity ``max_items``: noise ``Lap(max_items/eps)``; novel counts are 1:
    ``rho = 1 + (max_items/eps) ln(1 / (2 (1 - (1 - delta)^(1/max_items))))``.
    """
    epsilon, delta, max_items = _checked(epsilon, delta, max_items)
    scale = max_items / epsilon
    return SetUnionCalibration("laplace", scale, laplace_threshold(scale, delta, max_items, one))


def udfs(source: object) -> list[Udf]:
    """The weighted methods' thresholds for SQL (``dp_gaussian_threshold``, ``dp_laplace_threshold``)."""

    def weighted_gaussian_threshold(epsilon, delta, max_items):
        return weighted_gaussian_calibration(epsilon, delta, max_items).threshold

    def weighted_laplace_threshold(epsilon, delta, max_items):
        return weighted_laplace_calibration(epsilon, delta, max_items).threshold

    return [Udf("dp__gaussian_threshold", scalar(weighted_gaussian_threshold), (DOUBLE, DOUBLE, DOUBLE), DOUBLE),
            Udf("dp__laplace_threshold", scalar(weighted_laplace_threshold), (DOUBLE, DOUBLE, DOUBLE), DOUBLE)]

# The count methods are audited at max_items 4: the added user's 4 items carry the whole l1 (l2)
# sensitivity 4 (2).
_COUNT_AUDIT = (AuditCase("threshold", options=(("max_items", 4), ("t", 4)), note="max_items 4"),
                AuditCase("order", note="row order, added row stored first"))
# The order case of a method: 2,000 users hold A..E, the added user only E, stored first.
_ORDER = AuditCase("order", note="row order, added row stored first")


def _basic(name: str, description: str, calibrate, weighting: str, gaussian: bool,
           audit: tuple[AuditCase, ...], roles: tuple[str, ...] = ()) -> Mechanism:
    return Mechanism(name=name, family="set_union", macro=f"dp_set_union_{name}", unit="user",
                     params=user_item_params(), description=description, proof=name, calibrate=calibrate,
                     rounds=1, sql="30_union/10_basic.sql", weighting=weighting, spark=SparkForm("one_shot"),
                     gaussian_domain=gaussian, roles=roles, example=user_item_example(), audit=audit)


MECHANISMS: tuple[Mechanism, ...] = (
    _basic("count_laplace", "plain counts of capped users, Laplace noise ([DPSU] Sec. 1.1 baseline)",
           count_laplace_calibration, "count", False, _COUNT_AUDIT),
    # sigma and the l2 sensitivity both scale by sqrt(max_items): the Gaussian of weighted_gaussian per unit
    _basic("count_gaussian", "plain counts of capped users, Gaussian noise ([DPSU] Sec. 1.1 baseline)",
           count_gaussian_calibration, "count", True, _COUNT_AUDIT),
    _basic("weighted_laplace", "weights 1/d per capped user, Laplace noise ([DPSU] App. B)",
           weighted_laplace_calibration, "inverse", False,
           (AuditCase("threshold", options=(("max_items", 100), ("t", 1))), _ORDER)),
    _basic("weighted_gaussian", "weights 1/sqrt(d) per capped user, Gaussian noise (WGM, Basic; [DPSU] Thm 5.1)",
           weighted_gaussian_calibration, "inverse_sqrt", True,
           (AuditCase("threshold", options=(("max_items", 100), ("t", 1))),
            AuditCase("order", options=(("max_items", 100),), note="row order, added row stored first"),
            AuditCase("rows", note="whole output: number of rows, order, exact output"),
            # item identity: the released spelling of a group is the group's, not the first private row's
            AuditCase("spelling", note="item spelling: NOACCENT 'cafe'/'café', added user's spelling stored first"),
            # the audit's own instruments: broken variants of this release, which it must refute
            AuditCase("broken_sigma"), AuditCase("broken_order")),
           # [MM] discovers dp_top_k's domain with WGM; it is also the one-shot method examples lean on
           roles=("top_k_domain", "reference_one_shot")),
)
