"""Basic set union: count or weight, add noise, keep what clears a threshold ([DPSU] Alg. 1, Sec. 1.1).

The four parallel one-round methods of sql/30_union/10_basic.sql. Each user's distinct items are
capped to ``max_items`` (a uniform sample depending only on that user's rows); each item gets
the sum over its users of a weight -- ``1`` (count) or ``1/d`` resp. ``1/sqrt(d)`` for a user
with ``d`` kept items (weighted) -- plus Laplace or Gaussian noise, and the items above the
threshold are released. Calibration: :mod:`dpsql.core.calibration`; privacy argument:
``docs/proofs/<method>.md``.
"""
from __future__ import annotations

from dpsql.core import calibration
from dpsql.core.mechanism import AuditCase, Mechanism, SparkForm, user_item_example, user_item_params

__all__ = ["MECHANISMS"]

# The count methods are audited at max_items 4: the added user's 4 items carry the whole l1 (l2)
# sensitivity 4 (2).
_COUNT_AUDIT = (AuditCase("threshold", options=(("max_items", 4), ("t", 4)), note="max_items 4"),
                AuditCase("order", note="row order, added row stored first"))
# The order case of a method: 2,000 users hold A..E, the added user only E, stored first.
_ORDER = AuditCase("order", note="row order, added row stored first")


def _basic(name: str, description: str, calibrate, weighting: str, gaussian: bool,
           audit: tuple[AuditCase, ...]) -> Mechanism:
    return Mechanism(name=name, family="set_union", macro=f"dp_set_union_{name}", unit="user",
                     params=user_item_params(), description=description, proof=name, calibrate=calibrate,
                     rounds=1, sql="30_union/10_basic.sql", weighting=weighting, spark=SparkForm("one_shot"),
                     gaussian_domain=gaussian, example=user_item_example(), audit=audit)


MECHANISMS: tuple[Mechanism, ...] = (
    _basic("count_laplace", "plain counts of capped users, Laplace noise ([DPSU] Sec. 1.1 baseline)",
           calibration.count_laplace_calibration, "count", False, _COUNT_AUDIT),
    # sigma and the l2 sensitivity both scale by sqrt(max_items): the Gaussian of weighted_gaussian per unit
    _basic("count_gaussian", "plain counts of capped users, Gaussian noise ([DPSU] Sec. 1.1 baseline)",
           calibration.count_gaussian_calibration, "count", True, _COUNT_AUDIT),
    _basic("weighted_laplace", "weights 1/d per capped user, Laplace noise ([DPSU] App. B)",
           calibration.weighted_laplace_calibration, "inverse", False,
           (AuditCase("threshold", options=(("max_items", 100), ("t", 1))), _ORDER)),
    _basic("weighted_gaussian", "weights 1/sqrt(d) per capped user, Gaussian noise (WGM, Basic; [DPSU] Thm 5.1)",
           calibration.weighted_gaussian_calibration, "inverse_sqrt", True,
           (AuditCase("threshold", options=(("max_items", 100), ("t", 1))),
            AuditCase("order", options=(("max_items", 100),), note="row order, added row stored first"),
            AuditCase("rows", note="whole output: number of rows, order, exact output"),
            # item identity: the released spelling of a group is the group's, not the first private row's
            AuditCase("spelling", note="item spelling: NOACCENT 'cafe'/'café', added user's spelling stored first"))),
)
