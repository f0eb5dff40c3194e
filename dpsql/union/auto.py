"""A private choice between the default and the few-items method: ``auto``.

The default set-union method (the most preferred declaration, ``Mechanism.preference``) releases the most
on most tables; the method declaring the role ``few_items`` (GreedyUpdate today) releases more where
most users hold few items (benchmarks/README.md, "Robustness grid": its private choice).
``auto`` spends a share ``eps0 = choice_share * epsilon`` of the budget choosing
between them from the data's shape, privately, and runs the chosen one on the rest. Both candidates are
found by their declarations (:func:`candidates`), so this module names neither:

1. **The statistic.** Each user ``u`` with ``d_u`` distinct items (``D`` = ``degree_bound``) adds
   ``s_u = 2 [d_u <= D] - 1``; ``f = sum_u s_u``, an integer, ``>= 0`` exactly when at least half of
   the users hold at most ``D`` items. ``max_items``'s cap keeps ``min(d_u, max_items)`` items, and
   ``[min(d_u, max_items) <= D] = [d_u <= D]`` while ``D <= max_items`` (a larger ``D`` is refused), so
   the uncapped count is used: the statistic needs no sample. Adding or removing one user with all its
   rows adds or removes its own term only: sensitivity 1.
2. **The choice.** The few-items method iff ``f + Z >= 0``, ``Z ~ DLap(1/eps0)`` (pmf proportional to
   ``exp(-eps0 |z|)`` on the integers), drawn once by dpsql's discrete Laplace sampler
   (``dp_granular_laplace_noise(1/eps0, 1)``): the geometric mechanism, ``eps0``-DP exactly; the choice is
   a post-processing of ``f + Z``. (Beyond the sampler's ``2^32`` steps, ``eps0 < 2^-32``, the pick is
   the default without reading the data: 0-DP.)
3. **The release.** The chosen method runs at ``(epsilon - eps0, delta)`` with its own defaults and the
   same ``max_items`` (where it takes one), ``user_col``, ``item_col``, through the set-union step
   ``dp__body_set_union``. Basic sequential composition, which allows the second mechanism to be chosen
   from the first one's output, makes the pair ``(epsilon, delta)``-DP; the released items are the chosen
   method's.

``epsilon - eps0`` is computed as ``epsilon - choice_share * epsilon`` here and in the macro (the same
IEEE operations, so the candidates' calibrations are the ones :func:`auto_calibration` lists).
Argument: docs/proofs/auto.md; the body: sql/30_union/95_auto.sql.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import duckdb
from duckdb.sqltypes import BOOLEAN, DOUBLE, VARCHAR

from dpsql.core.calibration import SetUnionCalibration
from dpsql.core.errors import ParameterError
from dpsql.core.mechanism import (AuditCase, Mechanism, Param, preferred, user_item_example, user_item_params,
                                  with_role)
from dpsql.core.noise import MAX_SCALE_STEPS
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import (DPParameterError, check_column_pair, check_delta, check_epsilon, check_max_items,
                                   derived_budget)

__all__ = ["MECHANISMS", "DEFAULT_CHOICE_SHARE", "MAX_CHOICE_SHARE", "DEFAULT_DEGREE_BOUND", "AutoCalibration",
           "FEW_ITEMS", "check_choice_share", "check_degree_bound", "candidates", "auto_calibration", "udfs"]

# The variant the benchmark's declared rules chose (benchmarks/README.md, "Robustness grid": its private
# choice, the study of its cut, and the study of its share): 1 % of epsilon, users with at most 5 items.
DEFAULT_CHOICE_SHARE = 0.01
DEFAULT_DEGREE_BOUND = 5
# The role (Mechanism.roles) of the set-union method the choice runs where most users hold few items.
FEW_ITEMS = "few_items"
# At most half of the budget on the choice: beyond, the candidates would run on less than the choice.
MAX_CHOICE_SHARE = 0.5


def check_choice_share(value: object) -> float:
    """choice_share: the share of epsilon the choice spends, a number with 0 < choice_share <= 0.5."""
    if value is None:
        raise DPParameterError(f"choice_share must not be NULL; pass e.g. choice_share := {DEFAULT_CHOICE_SHARE}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or not 0.0 < float(value) <= MAX_CHOICE_SHARE:
        raise DPParameterError(f"choice_share must be a number with 0 < choice_share <= {MAX_CHOICE_SHARE} "
                               f"(got {value!r}); pass e.g. choice_share := {DEFAULT_CHOICE_SHARE}")
    return float(value)


def check_degree_bound(value: object) -> int:
    """degree_bound: a whole number >= 1 (a float with an integral value is accepted), the D of the statistic."""
    if value is None:
        raise DPParameterError(f"degree_bound must not be NULL; pass e.g. degree_bound := {DEFAULT_DEGREE_BOUND}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or float(value) != int(float(value)) or float(value) < 1:
        raise DPParameterError(f"degree_bound must be a whole number >= 1 (got {value!r}); pass e.g. "
                               f"degree_bound := {DEFAULT_DEGREE_BOUND}")
    return int(float(value))


def candidates() -> tuple[str, str]:
    """(the default, the few-items method): the most preferred set-union method and the one declaring the role
    :data:`FEW_ITEMS`, read from the declarations when called (this module is one of them)."""
    from dpsql import union  # the family's registry; imported here, as it imports this module

    methods = list(union.METHODS.values())
    return preferred(methods), with_role(methods, FEW_ITEMS)


@dataclass(frozen=True)
class AutoCalibration(SetUnionCalibration):
    """The calibration of ``auto``: its choice and both candidates (the one that runs is chosen privately).

    The inherited ``noise``, ``scale`` and ``threshold`` describe the choice: ``"discrete_laplace"`` noise of
    scale ``1/choice_epsilon`` on the statistic ``f``, the few-items method iff ``f + Z >= threshold = 0``.
    ``choice_epsilon`` is ``eps0``; ``rest_epsilon``, ``delta``: the budget of the chosen method;
    ``default`` and ``greedy``: the calibrations of the default and of the few-items method
    (:func:`candidates`) at ``(rest_epsilon, delta)``. ``choice_from_data`` False: ``1/choice_epsilon``
    exceeds the sampler's 2^32 steps, and the pick is the default whatever the data (0-DP).
    """

    choice_epsilon: float = 0.0
    degree_bound: int = DEFAULT_DEGREE_BOUND
    rest_epsilon: float = 0.0
    delta: float = 0.0
    default: Optional[SetUnionCalibration] = None
    greedy: Optional[SetUnionCalibration] = None
    choice_from_data: bool = True


def auto_calibration(epsilon: float, delta: float, max_items: int, choice_share: float = DEFAULT_CHOICE_SHARE,
                     degree_bound: int = DEFAULT_DEGREE_BOUND) -> AutoCalibration:
    """``eps0 = choice_share * epsilon`` (the choice's discrete Laplace of scale ``1/eps0``, sensitivity 1), and
    both candidates at ``(epsilon - choice_share * epsilon, delta)``.

    Refuses ``degree_bound > max_items`` (the statistic reads the uncapped degree, equal to the capped one's
    test only while ``degree_bound <= max_items``). An ``eps0`` whose scale the sampler cannot take
    (``1/eps0 > 2^32``) picks the default without reading the data (``choice_from_data`` False).
    Example: ``auto_calibration(1.0, 1e-5, 100)``: ``eps0 = 0.01``, scale 100, the candidates at
    ``epsilon = 0.99``.
    """
    return _calibration(check_epsilon(epsilon), check_delta(delta), check_max_items(max_items),
                        check_choice_share(choice_share), check_degree_bound(degree_bound))


@lru_cache(maxsize=256)
def _calibration(epsilon: float, delta: float, max_items: int, choice_share: float,
                 degree_bound: int) -> AutoCalibration:
    if degree_bound > max_items:
        raise ParameterError(f"degree_bound must be <= max_items (got degree_bound {degree_bound}, max_items "
                             f"{max_items}); pass degree_bound := {max_items} or less to dp_set_union_auto, or a "
                             f"larger max_items (dp_set_union, dp_top_k and dp_group_by run auto with degree_bound "
                             f"{DEFAULT_DEGREE_BOUND}: max_items >= {DEFAULT_DEGREE_BOUND})")
    eps0 = choice_share * epsilon
    scale = 1.0 / eps0 if eps0 > 0 else math.inf
    rest = epsilon - choice_share * epsilon  # the macro's expression (module docstring)
    from dpsql import union  # as in candidates()

    default_method, few_method = candidates()
    with derived_budget():  # shares of the checked epsilon
        default = union.calibrate(default_method, rest, delta, max_items)
        greedy = union.calibrate(few_method, rest, delta, max_items)
    # Beyond the sampler's 2^32 steps (eps0 < 2^-32, e.g. at the documented minimum epsilon 1e-200) the pick is
    # the default without reading the data: 0-DP, within eps0.
    return AutoCalibration("discrete_laplace", scale, 0.0, choice_epsilon=eps0, degree_bound=degree_bound,
                           rest_epsilon=rest, delta=delta, default=default, greedy=greedy,
                           choice_from_data=scale <= MAX_SCALE_STEPS)


def udfs(source) -> list[Udf]:
    """``dp__auto_calibration``: the choice's noise scale and the candidates' epsilon (pure; folded while planning);
    ``dp__auto_candidate(few_items)``: the name of a candidate (:func:`candidates`)."""

    def cal(epsilon, delta, max_items, choice_share, degree_bound, user_col, item_col):
        check_column_pair(user_col, item_col)
        c = auto_calibration(epsilon, delta, max_items, choice_share, degree_bound)
        return {"choice_scale": c.scale, "choice_from_data": c.choice_from_data,
                "degree_bound": float(c.degree_bound), "rest_epsilon": c.rest_epsilon}

    def candidate(few_items):
        return candidates()[1 if few_items else 0]

    d = DOUBLE
    return [Udf("dp__auto_calibration", scalar(cal), (d, d, d, d, d, VARCHAR, VARCHAR),
                duckdb.struct_type({"choice_scale": DOUBLE, "choice_from_data": BOOLEAN, "degree_bound": DOUBLE,
                                    "rest_epsilon": DOUBLE})),
            # the candidate's method name, read while DuckDB binds the body's set-union steps (pure)
            Udf("dp__auto_candidate", scalar(candidate), (BOOLEAN,), VARCHAR)]


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="auto", family="set_union", macro="dp_set_union_auto", unit="user",
        params=user_item_params(
            Param("choice_share", "DOUBLE", DEFAULT_CHOICE_SHARE, check_choice_share,
                  f"share of epsilon spent choosing the method (0 < choice_share <= {MAX_CHOICE_SHARE})"),
            Param("degree_bound", "DOUBLE", DEFAULT_DEGREE_BOUND, check_degree_bound,
                  "the few-items method when (noisily) at least half of the users hold at most this many "
                  "distinct items (<= max_items)")),
        description="a private choice (choice_share of epsilon, discrete Laplace) between the default method "
                    "and the sequential greedy fill (the few_items role) from the share of users holding at "
                    "most degree_bound items; the chosen method runs on the rest of the budget",
        proof="auto", calibrate=auto_calibration, rounds=2, sql="30_union/95_auto.sql",  # after the set-union step it calls (90_dispatch.sql)
        # No Spark form: the Spark backend has no sequential policy, so no few-items candidate.
        example=user_item_example(choice_share="0.05", degree_bound="3"),
        # The choice's case runs at choice_share 0.5 (eps0 = epsilon / 2), so that its noise moves the output
        # measurably; at the default share the audited bound could not tell the choice's noise from none.
        audit=(AuditCase("choice", options=(("choice_share", 0.5),),
                         note="the choice: statistic 0 on D, -1 on D'; choice_share 0.5"),
               AuditCase("order", note="row order, added row stored first"))),
)
