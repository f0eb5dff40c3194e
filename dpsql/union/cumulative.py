"""DP-SIPS with a cumulative release rule: ``sips_cumulative``.

DP-SIPS (Swanberg et al. 2023) runs Basic in rounds, each on the capped sets minus the items
released earlier, and releases an item when one round's noisy weight passes that round's
threshold. An item that is not released keeps what the earlier rounds measured about it here:
round ``r`` adds its noisy weight to a running sum, and the item is released when the
precision-weighted mean of its noisy weights so far passes a threshold.

Split ``f_1..f_R`` (normalised, ``F_r = f_1 + ... + f_r``), ``s = sigma(eps, delta/2)`` (without
dropping; with it, ``sigma(eps, 0.6 delta)``):

    y_r(i) = w_r(i) + N(0, sigma_r^2),         sigma_r = s / sqrt(f_r)
    z_r(i) = sum_{k<=r} f_k y_k(i)             (z_r / F_r has noise s / sqrt(F_r))
    release i in round r  iff  z_r(i) >= F_r rho_r,
    rho_r  = max_t 1/sqrt(t) + (s/sqrt(F_r)) PhiInv((1 - f_r delta/2)^(1/t)).

``w_r`` is Basic's weight (``sum 1/sqrt(d_u)`` over the users still holding ``i``). The rounds'
noisy weights compose exactly to one Gaussian mechanism of ``mu = 1/s`` (the rounds of DP-SIPS,
unchanged); ``z_r`` is a post-processing of them. A novel item (held only by the added user) gets
``<= 1/sqrt(t)`` in every round until one passes, so its mean has mean ``<= 1/sqrt(t)`` and the
events add up to ``delta/2``.

**Dropping hopeless items** (``drop_margin`` = c, ``max_boost`` = b, ``tilt`` = kappa; the default,
c = 3, b = 2, kappa = 0.7). After round ``r < R`` an item not released whose mean is hopeless,
``z_r/F_r + c_r s/sqrt(F_r) < rho_R`` with ``c_r = c (1 - 0.6 (r-1)/(R-1))`` falling linearly from c in
round 1 to 0.5 c = 1.5 in round 6 of the default seven (the last that drops), is dropped: it leaves
every user's set and is never released. A user's weight on a live item is ``x_ui = min(1,
b/sqrt(e_u), p_i/sqrt(sum_{j live} p_j^2))``, ``e_u`` its items not released (dropped ones counted),
``p_i = exp(-kappa clip((z_{r-1}(i)/F_{r-1} - rho_R) / (s/sqrt(F_{r-1})), 0, 3))`` the tilt away from
items already above the last threshold: still ``sum_i x_ui^2 <= 1``. Until one of the added user's t
novel items is released, ``e_u >= t``, so every novel weight is ``<= h(t) = min(1, b/sqrt(t))``
whatever was dropped or tilted; the novel items' weights then depend on each other's noise, so the
thresholds take a union bound over them, and delta is split 0.6 / 0.4 (Gaussian rounds / novel
items, 90 % of the latter in the last round):

    rho_r  = max_t h(t) + (s/sqrt(F_r)) PhiInv(1 - delta_novel_r / t).

From round two on, users and items are 32-bit ids: the guarantee holds on tables with fewer than 2^32
user-item pairs after the cap, and a larger one is refused before the charge, on its size alone (the
refusal tells only that the table is outside that domain).

Argument: docs/proofs/sips_cumulative.md. The macro is ``dp_set_union_sips_cumulative``
(sql/30_union/30_cumulative.sql); the Spark backend runs its translated stages on the same
:func:`sips_cumulative_parameters` (``dpsql.frontends.spark``, release ``cumulative_rounds``) and
needs no ids, so it has no 2^32 bound.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional, Sequence

import duckdb
from duckdb.sqltypes import DOUBLE, VARCHAR

from dpsql.core import accounting, calibration, release
from dpsql.union.adaptive import check_split, multi_round_noise
from dpsql.core.calibration import Accounting, RoundCalibration, SetUnionCalibration
from dpsql.core.mechanism import AuditCase, Mechanism, Param, SparkForm, user_item_example, user_item_params
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import DPParameterError, check_column_pair, check_delta, check_epsilon, check_max_items, \
    derived_budget

__all__ = ["MECHANISMS", "DEFAULT_SPLIT", "MAX_ROUNDS", "DEFAULT_DROP_MARGIN", "DEFAULT_MAX_BOOST", "DEFAULT_TILT",
           "NOVEL_SHARE", "LAST_NOVEL_SHARE", "CumulativeRound", "CumulativeParameters", "check_drop_margin",
           "check_max_boost", "check_tilt", "novelty_bound", "sips_cumulative_calibration", "sips_cumulative_parameters",
           "sips_cumulative_accounting", "sips_cumulative_set_union_calibration", "rounds_sql", "udfs"]

# Seven rounds, each with 1.6 times the budget of the one before: the early rounds are cheap and release
# the items far above any threshold or drop the hopeless ones, so the later ones spread the users'
# weight over fewer items (benchmarks/README.md, "Utility": with dropping and the tilt, 8 rounds x1.5
# release a little more than 7 x1.6, and more than 6 x2; 12 x1.3 more still, beyond the macro's chain
# of 8). Seven, not eight: every round re-aggregates the live rows by user and by item, and the eighth
# put the release above a default's time budget, 3x Basic (benchmarks/README.md, "The new default").
_DEFAULT_ROUNDS, _DEFAULT_GROWTH = 7, 1.6
DEFAULT_SPLIT: tuple[float, ...] = tuple(_DEFAULT_GROWTH ** k / math.fsum(_DEFAULT_GROWTH ** j
                                                                     for j in range(_DEFAULT_ROUNDS))
                                         for k in range(_DEFAULT_ROUNDS))
# The macro is a fixed chain of this many rounds (a macro cannot loop); unused ones are pruned.
MAX_ROUNDS = 8
# Drop an item once its mean is drop_margin standard deviations of the running mean below the last
# round's threshold in round 1, the margin falling linearly, drop_margin (1 - 0.6 (r-1)/(R-1)), to
# 0.5 drop_margin in round 6 of 7, the last that drops (the mean firms up; round R, where the formula
# gives 0.4, drops nothing); cap every weight at 2/sqrt(e_u); tilt each user's weight away from the
# items already above the last threshold. Measured on the shared datasets (benchmarks/README.md,
# "Utility"): a constant margin, caps 1.5 and 3 and no tilt release less on health tweets, the case
# closest to the sequential methods.
DEFAULT_DROP_MARGIN = 3.0
_MARGIN_FALL = 0.6
DEFAULT_MAX_BOOST = 2.0
DEFAULT_TILT = 0.7
# With dropping, the novel-item events get 40 % of delta (the Gaussian rounds 60 %), 90 % of it in the
# last round, whose threshold decides the marginal items (the early rounds' thresholds are far above
# any novel item's weight, so a small share costs them little).
NOVEL_SHARE = 0.4
LAST_NOVEL_SHARE = 0.9
# Larger margins drop nothing a user would notice, larger caps only raise the thresholds.
_MAX_DROP_MARGIN = 100.0
_MAX_BOOST = 1000.0
_MAX_TILT = 10.0


def _optional(name: str, value: object, low: float, high: float, null: str) -> Optional[float]:
    """A number in [low, high], or None (SQL NULL, meaning ``null``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= float(value) <= high:
        raise DPParameterError(f"{name} must be a number between {low:g} and {high:g}, or NULL {null} "
                               f"(got {value!r})")
    return float(value)


def check_drop_margin(value: object) -> Optional[float]:
    """``drop_margin`` (standard deviations of an item's running mean): [0, 100], or None (never drop)."""
    return _optional("drop_margin", value, 0.0, _MAX_DROP_MARGIN, "to drop nothing")


def check_tilt(value: object) -> Optional[float]:
    """``tilt``: [0, 10], or None (no tilt, as 0)."""
    return _optional("tilt", value, 0.0, _MAX_TILT, "for none")


def check_max_boost(value: object) -> Optional[float]:
    """``max_boost``: [1, 1000], or None (no cap: the novelty bound is then 1)."""
    return _optional("max_boost", value, 1.0, _MAX_BOOST, "for no cap")


@dataclass(frozen=True)
class CumulativeRound:
    """Round ``r``: budget ``share`` = f_r, ``cumulative_share`` = F_r; its weights get ``N(0, sigma^2)``;
    the running mean ``z_r / F_r`` has noise ``mean_sigma`` = s/sqrt(F_r) and passes at ``threshold``;
    ``delta_novel`` bounds the novel items passing in this round (f_r delta/2 without dropping; with
    it, 0.4 delta split 0.1/(R-1) per round and 0.9 for the last). ``drop_below``: an item not released
    whose mean is below it is dropped after this round (``rho_R - c_r mean_sigma``; None without
    dropping and in the last round)."""

    share: float
    cumulative_share: float
    sigma: float
    mean_sigma: float
    threshold: float
    delta_novel: float
    drop_below: Optional[float] = None


def sips_cumulative_calibration(epsilon: float, delta: float, max_items: int,
                                split: Optional[Sequence[float]] = DEFAULT_SPLIT,
                                drop_margin: Optional[float] = DEFAULT_DROP_MARGIN,
                                max_boost: Optional[float] = DEFAULT_MAX_BOOST) -> tuple[CumulativeRound, ...]:
    """Every round's noise, the noise of the running mean, its threshold and its drop bound (module
    docstring)."""
    return _calibration(*_key(epsilon, delta, max_items, split, drop_margin, max_boost))[0]


def sips_cumulative_accounting(epsilon: float, delta: float, max_items: int,
                               split: Optional[Sequence[float]] = DEFAULT_SPLIT,
                               drop_margin: Optional[float] = DEFAULT_DROP_MARGIN,
                               max_boost: Optional[float] = DEFAULT_MAX_BOOST) -> Accounting:
    """The accountant's total: the rounds as one Gaussian mechanism plus the novel-item events."""
    return _calibration(*_key(epsilon, delta, max_items, split, drop_margin, max_boost))[1]


def novelty_bound(drop_margin: Optional[float], max_boost: Optional[float]) -> calibration.NoveltyBound:
    """The largest weight of a novel item before one is released: ``1/sqrt(t)`` without dropping,
    ``min(1, b/sqrt(t))`` with it (``1`` without a cap)."""
    if drop_margin is None:
        return calibration.inv_sqrt
    if max_boost is None:
        return lambda t: 1.0
    b = float(max_boost)
    return lambda t: min(1.0, b / math.sqrt(t))


def _dropping_noise(epsilon: float, delta: float, fractions: Sequence[float]) -> tuple[tuple[float, ...],
                                                                                       tuple[float, ...]]:
    """With dropping: ``sigma_r`` of Gaussian rounds composing to ``(epsilon, (1 - q) delta)``, and the
    novel-item deltas ``q delta`` split ``0.1/(R-1)`` per round but the last, ``0.9`` for the last."""
    sigmas = accounting.gaussian_rounds_sigmas(epsilon, (1.0 - NOVEL_SHARE) * delta, fractions)
    n = len(fractions)
    weights = [1.0] if n == 1 else [(1.0 - LAST_NOVEL_SHARE) / (n - 1)] * (n - 1) + [LAST_NOVEL_SHARE]
    return sigmas, tuple(w * NOVEL_SHARE * delta for w in weights)


def _key(epsilon, delta, max_items, split, drop_margin, max_boost) -> tuple:
    return (check_epsilon(epsilon), check_delta(delta), check_max_items(max_items),
            check_split(split, max_rounds=MAX_ROUNDS), check_drop_margin(drop_margin), check_max_boost(max_boost))


@lru_cache(maxsize=256)
def _calibration(epsilon: float, delta: float, max_items: int, fractions: tuple[float, ...],
                 drop_margin: Optional[float], max_boost: Optional[float]
                 ) -> tuple[tuple[CumulativeRound, ...], Accounting]:
    if drop_margin is None:
        sigmas, novel = multi_round_noise(epsilon, delta, fractions)
    else:
        sigmas, novel = _dropping_noise(epsilon, delta, fractions)
    # s: the noise of the composed rounds, sum_r 1/sigma_r^2 = 1/s^2 (shares normalised)
    s = 1.0 / math.sqrt(math.fsum(1.0 / x ** 2 for x in sigmas))
    total = math.fsum(fractions)
    h = novelty_bound(drop_margin, max_boost)
    dropping = drop_margin is not None
    rounds = []
    cumulative = 0.0
    for f, sigma, delta_novel in zip(fractions, sigmas, novel):
        share = f / total
        cumulative = min(1.0, cumulative + share)
        mean_sigma = s / math.sqrt(cumulative)
        with derived_budget():  # delta_novel is a share of the checked delta
            threshold = calibration.gaussian_threshold(mean_sigma, delta_novel, max_items, h, union_bound=dropping)
        rounds.append(CumulativeRound(share, cumulative, sigma, mean_sigma, threshold, delta_novel))
    if drop_margin is not None and len(rounds) > 1:
        last, n = rounds[-1].threshold, len(rounds) - 1
        rounds = [replace(r, drop_below=last - drop_margin * (1.0 - _MARGIN_FALL * k / n) * r.mean_sigma)
                  for k, r in enumerate(rounds[:-1])] + rounds[-1:]
    return tuple(rounds), accounting.account_gaussian_rounds(sigmas, math.fsum(novel), epsilon, delta)


def sips_cumulative_set_union_calibration(epsilon: float, delta: float, max_items: int,
                                          drop_margin: Optional[float] = DEFAULT_DROP_MARGIN,
                                          max_boost: Optional[float] = DEFAULT_MAX_BOOST) -> SetUnionCalibration:
    """The default split as a :class:`SetUnionCalibration`: ``scale``/``threshold`` are the last round's
    running mean (an item every round measures alike, e.g. one held by single-item users, passes the
    last round with probability ``P[w + N(0, scale^2) >= threshold]``); each round lists its own
    ``sigma`` and the threshold of its running mean."""
    rounds = sips_cumulative_calibration(epsilon, delta, max_items, DEFAULT_SPLIT, drop_margin, max_boost)
    listed = tuple(RoundCalibration(r.share * epsilon, r.share * delta, r.sigma, r.threshold) for r in rounds)
    return SetUnionCalibration("gaussian", rounds[-1].mean_sigma, rounds[-1].threshold, listed,
                               sips_cumulative_accounting(epsilon, delta, max_items, DEFAULT_SPLIT, drop_margin,
                                                          max_boost))


@dataclass(frozen=True)
class CumulativeParameters:
    """What every round of a release reads, written into the macro's rounds as literals (:func:`rounds_sql`;
    :meth:`sql_row` is the calibration UDF's struct); the Spark form's calibration too. Per round (lists,
    round ``r`` at ``r - 1``): ``share``, ``cumulative_share``, ``sigma``, ``mean_sigma``, ``rho`` (the
    running mean's threshold), ``drop_below`` (-inf where nothing is dropped, so the SQL comparison needs
    no NULL case); ``max_boost`` (None: no cap, as ``least()`` skips NULLs) and ``tilt`` (0 without
    dropping: the tilt needs the cap's novelty bound, and without dropping every weight is 1/sqrt(d));
    ``plain``: no dropping (``drop_margin`` NULL: no cap, no tilt, every p stays 1)."""

    share: tuple[float, ...]
    cumulative_share: tuple[float, ...]
    sigma: tuple[float, ...]
    mean_sigma: tuple[float, ...]
    rho: tuple[float, ...]
    drop_below: tuple[float, ...]
    max_boost: Optional[float]
    tilt: float
    plain: bool
    accounting: Accounting

    @property
    def rounds(self) -> int:
        return len(self.share)

    def sql_row(self) -> dict:
        """The struct of ``dp__sips_cumulative_calibration`` (lists as tuples)."""
        a = self.accounting
        return {"share": self.share, "cumulative_share": self.cumulative_share, "sigma": self.sigma,
                "mean_sigma": self.mean_sigma, "rho": self.rho, "drop_below": self.drop_below,
                "max_boost": self.max_boost, "tilt": self.tilt,
                "accountant": a.accountant, "total_epsilon": a.epsilon, "total_delta": a.delta}


def sips_cumulative_parameters(epsilon: float, delta: float, max_items: int,
                               split: Optional[Sequence[float]] = DEFAULT_SPLIT,
                               drop_margin: Optional[float] = DEFAULT_DROP_MARGIN,
                               max_boost: Optional[float] = DEFAULT_MAX_BOOST,
                               tilt: Optional[float] = DEFAULT_TILT) -> CumulativeParameters:
    """Every parameter checked (``tilt`` too where it does not apply), then the rounds'
    :class:`CumulativeParameters`: the one calibration of both backends."""
    key = _key(epsilon, delta, max_items, list(split) if split is not None else None, drop_margin, max_boost)
    return _parameters(key, check_tilt(tilt))


@lru_cache(maxsize=128)
def _parameters(key: tuple, tilt: Optional[float]) -> CumulativeParameters:
    rounds, a = _calibration(*key)
    dropping = key[4] is not None
    return CumulativeParameters(
        share=tuple(r.share for r in rounds), cumulative_share=tuple(r.cumulative_share for r in rounds),
        sigma=tuple(r.sigma for r in rounds), mean_sigma=tuple(r.mean_sigma for r in rounds),
        rho=tuple(r.threshold for r in rounds),
        drop_below=tuple(-math.inf if r.drop_below is None else r.drop_below for r in rounds),
        max_boost=key[5] if dropping else None, tilt=(tilt or 0.0) if dropping else 0.0, plain=not dropping,
        accounting=a)


def _double(value: Optional[float]) -> str:
    """A DOUBLE as a SQL literal DuckDB reads back exactly and binds as a constant: the shortest repr with an
    exponent (DuckDB types a number with an exponent DOUBLE, where ``0.5`` would be a DECIMAL, and a CAST
    would be one more expression to bind at every use); NULL; an infinity as text cast to DOUBLE."""
    if value is None:
        return "NULL"
    if math.isinf(value):
        return "'-inf'::DOUBLE" if value < 0 else "'inf'::DOUBLE"
    text = repr(float(value))
    return text if "e" in text else text + "e0"


def rounds_sql(tbl: str, epsilon: float, delta: float, max_items: int, split: Optional[Sequence[float]],
               drop_margin: Optional[float], max_boost: Optional[float], tilt: Optional[float], user_col: str,
               item_col: str) -> str:
    """The SQL text of the body of ``dp_set_union_sips_cumulative``: its rounds (the macro
    ``dp__sips_cumulative_rounds``, sql/30_union/30_cumulative.sql) on the release's capped rows, with every
    round's calibration (:func:`sips_cumulative_parameters`) written in as literals, so each round reads
    constants (no one-row relation to join, no list to subscript at each use); a table or column name is a
    quoted literal (:func:`dpsql.core.release.sql_value`): data, never SQL text.

    An invalid parameter is not raised here, while DuckDB binds (its error would then carry the statement's
    text): the text returned calls the calibration UDF on the same values where it runs, before reading any
    row, so the release is refused with the error it gave before (a releasing macro's check refuses first).
    """
    try:
        check_column_pair(user_col, item_col)
        c = sips_cumulative_parameters(epsilon, delta, max_items, split, drop_margin, max_boost, tilt)
        return _rounds_call(release.sql_value("tbl", tbl, "VARCHAR"),
                            release.sql_value("max_items", max_items, "DOUBLE"),
                            release.sql_value("user_col", user_col, "VARCHAR"),
                            release.sql_value("item_col", item_col, "VARCHAR"), c)
    except DPParameterError:
        pass
    args = ", ".join(release.sql_value(name, value, sql_type) for name, value, sql_type in (
        ("epsilon", epsilon, "DOUBLE"), ("delta", delta, "DOUBLE"), ("max_items", max_items, "DOUBLE"),
        ("split", split, "DOUBLE[]"), ("drop_margin", drop_margin, "DOUBLE"), ("max_boost", max_boost, "DOUBLE"),
        ("tilt", tilt, "DOUBLE"), ("user_col", user_col, "VARCHAR"), ("item_col", item_col, "VARCHAR")))
    return f"SELECT item FROM (SELECT NULL AS item) WHERE dp__sips_cumulative_calibration({args}) IS NULL"


_ROUND_FIELDS = ("share", "cumulative_share", "sigma", "mean_sigma", "rho", "drop_below")


@lru_cache(maxsize=64)
def _rounds_call(tbl: str, max_items: str, user_col: str, item_col: str, c: CumulativeParameters) -> str:
    per_round = ", ".join(f"{name}{r} := {_double(v)}" for r in range(1, c.rounds + 1)
                          for name, v in ((n, getattr(c, n)[r - 1]) for n in _ROUND_FIELDS))
    return (f"SELECT item FROM dp__sips_cumulative_rounds({tbl}, max_items := {max_items}, user_col := {user_col}, "
            f"item_col := {item_col}, rounds := {c.rounds}, plain := {'true' if c.plain else 'false'}, "
            f"max_boost := {_double(c.max_boost)}, tilt := {_double(c.tilt)}, last_rho := {_double(c.rho[-1])}, "
            f"{per_round})")


def udfs(source) -> list[Udf]:
    """The calibration UDF of ``dp_set_union_sips_cumulative`` (pure; rows cached per parameters) and the
    UDF that renders its body's rounds (:func:`rounds_sql`, pure: called while DuckDB binds)."""

    def cal(epsilon, delta, max_items, split, drop_margin, max_boost, tilt, user_col, item_col):
        check_column_pair(user_col, item_col)
        row = sips_cumulative_parameters(epsilon, delta, max_items, split, drop_margin, max_boost, tilt).sql_row()
        return {k: list(v) if isinstance(v, tuple) else v for k, v in row.items()}

    dl = duckdb.list_type(DOUBLE)
    returns = duckdb.struct_type({"share": dl, "cumulative_share": dl, "sigma": dl, "mean_sigma": dl, "rho": dl,
                                  "drop_below": dl, "max_boost": DOUBLE, "tilt": DOUBLE,
                                  "accountant": VARCHAR, "total_epsilon": DOUBLE, "total_delta": DOUBLE})
    return [Udf("dp__sips_cumulative_calibration", scalar(cal),
                (DOUBLE, DOUBLE, DOUBLE, dl, DOUBLE, DOUBLE, DOUBLE, VARCHAR, VARCHAR), returns),
            Udf("dp__sips_cumulative_rounds_sql", scalar(rounds_sql),
                (VARCHAR, DOUBLE, DOUBLE, DOUBLE, dl, DOUBLE, DOUBLE, DOUBLE, VARCHAR, VARCHAR), VARCHAR)]


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="sips_cumulative", family="set_union", macro="dp_set_union_sips_cumulative", unit="user",
        params=user_item_params(
            Param("split", "DOUBLE[]", DEFAULT_SPLIT, lambda v: check_split(list(v), max_rounds=MAX_ROUNDS),
                  f"budget share of each round (at most {MAX_ROUNDS}, sums to 1; default {_DEFAULT_ROUNDS} rounds, "
                  f"each {_DEFAULT_GROWTH:g} times the one before)"),
            Param("drop_margin", "DOUBLE", DEFAULT_DROP_MARGIN, check_drop_margin,
                  "drop an item whose running mean is this many of its standard deviations below the last "
                  "round's threshold in round 1, falling to half of it in the last round that drops "
                  "(NULL: drop nothing, and no cap or tilt)"),
            Param("max_boost", "DOUBLE", DEFAULT_MAX_BOOST, check_max_boost,
                  "cap every weight at max_boost/sqrt(items not released) (NULL: no cap)"),
            Param("tilt", "DOUBLE", DEFAULT_TILT, check_tilt,
                  "spread a user's weight less on items already above the last threshold: "
                  "exp(-tilt * min(3, standard deviations above)) (NULL or 0: evenly)")),
        description=f"DP-SIPS in {_DEFAULT_ROUNDS} rounds, an item released once the precision-weighted mean of "
                    "its noisy weights so far passes the round's threshold; hopeless items dropped, weights "
                    "tilted towards the items still in doubt",
        proof="sips_cumulative", calibrate=sips_cumulative_set_union_calibration, rounds=len(DEFAULT_SPLIT),
        sql="30_union/30_cumulative.sql",
        # The Spark form: the macro's rounds, translated (dpsql.frontends.spark), on the same parameters.
        spark=SparkForm("cumulative_rounds", sips_cumulative_parameters),
        # Not a Gaussian domain for dp_top_k's zCDP route: at the default drop_margin its
        # rounds compose to gaussian_sigma(epsilon, 0.6 delta), below the gaussian_sigma(epsilon, delta/2)
        # that route assumes (its novel items take 0.4 delta), so the route would understate its zCDP.
        # The best parallel method measured (benchmarks/README.md, "Utility"): dpsql.union.DEFAULT_METHOD, and
        # the Spark backend's default (dpsql.frontends.spark.DEFAULT_METHOD).
        preference=1,
        example=user_item_example(split="[0.2, 0.3, 0.5]", drop_margin="1.5", max_boost="3", tilt="0.5"),
        audit=(AuditCase("threshold", options=(("max_items", 100), ("t", 1)), note="last round's running mean"),
               AuditCase("boost", name="sips_cumulative_boost",
                         note="dropping: the added user's own items dropped, its weight on a shared item capped"),
               AuditCase("order", note="row order, added row stored first"))),
)
