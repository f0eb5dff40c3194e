"""Basic set union: count or weight, add noise, keep what clears a threshold ([DPSU] Alg. 1, Sec. 1.1).

The four parallel one-round methods of sql/30_set_union.sql. Each user's distinct items are
capped to ``max_items`` (a uniform sample depending only on that user's rows); each item gets
the sum over its users of a weight -- ``1`` (count) or ``1/d`` resp. ``1/sqrt(d)`` for a user
with ``d`` kept items (weighted) -- plus Laplace or Gaussian noise, and the items above the
threshold are released. Calibration: :mod:`dpsql.core.calibration`; privacy argument:
``docs/proofs/<method>.md``.
"""
from __future__ import annotations

from dpsql.core import calibration
from dpsql.core.mechanism import Mechanism, user_item_params

__all__ = ["MECHANISMS"]


def _basic(name: str, description: str, calibrate) -> Mechanism:
    return Mechanism(name=name, family="set_union", macro=f"dp_set_union_{name}", unit="user",
                     params=user_item_params(), description=description, proof=name, calibrate=calibrate,
                     rounds=1, spark=True)


MECHANISMS: tuple[Mechanism, ...] = (
    _basic("count_laplace", "plain counts of capped users, Laplace noise ([DPSU] Sec. 1.1 baseline)",
           calibration.count_laplace_calibration),
    _basic("count_gaussian", "plain counts of capped users, Gaussian noise ([DPSU] Sec. 1.1 baseline)",
           calibration.count_gaussian_calibration),
    _basic("weighted_laplace", "weights 1/d per capped user, Laplace noise ([DPSU] App. B)",
           calibration.weighted_laplace_calibration),
    _basic("weighted_gaussian", "weights 1/sqrt(d) per capped user, Gaussian noise (WGM, Basic; [DPSU] Thm 5.1)",
           calibration.weighted_gaussian_calibration),
)
