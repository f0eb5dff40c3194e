"""DP-SIPS with a cumulative release rule: ``sips_cumulative``.

DP-SIPS (Swanberg et al. 2023) runs Basic in rounds, each on the capped sets minus the items
released earlier, and releases an item when one round's noisy weight passes that round's
threshold. An item that is not released keeps what the earlier rounds measured about it here:
round ``r`` adds its noisy weight to a running sum, and the item is released when the
precision-weighted mean of its noisy weights so far passes a threshold.

Split ``f_1..f_R`` (normalised, ``F_r = f_1 + ... + f_r``), ``s = sigma(eps, delta/2)``:

    y_r(i) = w_r(i) + N(0, sigma_r^2),         sigma_r = s / sqrt(f_r)
    z_r(i) = sum_{k<=r} f_k y_k(i)             (z_r / F_r has noise s / sqrt(F_r))
    release i in round r  iff  z_r(i) >= F_r rho_r,
    rho_r  = max_t 1/sqrt(t) + (s/sqrt(F_r)) PhiInv((1 - f_r delta/2)^(1/t)).

``w_r`` is Basic's weight (``sum 1/sqrt(d_u)`` over the users still holding ``i``). The rounds'
noisy weights compose exactly to one Gaussian mechanism of ``mu = 1/s`` (the rounds of DP-SIPS,
unchanged); ``z_r`` is a post-processing of them. A novel item (held only by the added user) gets
``<= 1/sqrt(t)`` in every round until one passes, so its mean has mean ``<= 1/sqrt(t)`` and the
events add up to ``delta/2``. Argument: docs/proofs/sips_cumulative.md. The macro is
``dp_set_union_sips_cumulative`` (sql/42_sips_cumulative.sql).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import duckdb
from duckdb.sqltypes import DOUBLE, VARCHAR

from dpsql import accounting, calibration
from dpsql.adaptive import check_split, multi_round_noise
from dpsql.calibration import Accounting, RoundCalibration, SetUnionCalibration
from dpsql.mechanism import Mechanism, Param, user_item_params
from dpsql.udf import Udf, scalar
from dpsql.validation import check_column_pair, check_delta, check_epsilon, check_max_items, derived_budget, \
    warn_weak_parameters

__all__ = ["MECHANISMS", "DEFAULT_SPLIT", "MAX_ROUNDS", "CumulativeRound", "sips_cumulative_calibration",
           "sips_cumulative_accounting", "sips_cumulative_set_union_calibration", "udfs"]

# Six rounds, each with twice the budget of the one before: the early rounds are cheap and release
# the items far above any threshold, so the later ones spread the users' weight over fewer items
# (benchmarks/README.md, "Utility": 5 and 8 rounds and factors 1.5 and 3 release no more).
DEFAULT_SPLIT: tuple[float, ...] = tuple(2.0 ** k / 63.0 for k in range(6))
# The macro is a fixed chain of this many rounds (a macro cannot loop); unused ones are pruned.
MAX_ROUNDS = 8


@dataclass(frozen=True)
class CumulativeRound:
    """Round ``r``: budget ``share`` = f_r, ``cumulative_share`` = F_r; its weights get ``N(0, sigma^2)``;
    the running mean ``z_r / F_r`` has noise ``mean_sigma`` = s/sqrt(F_r) and passes at ``threshold``;
    ``delta_novel`` = f_r delta/2 bounds the novel items passing in this round."""

    share: float
    cumulative_share: float
    sigma: float
    mean_sigma: float
    threshold: float
    delta_novel: float


def sips_cumulative_calibration(epsilon: float, delta: float, max_items: int,
                                split: Optional[Sequence[float]] = DEFAULT_SPLIT) -> tuple[CumulativeRound, ...]:
    """Every round's noise, the noise of the running mean and its threshold (module docstring)."""
    return _calibration(*_key(epsilon, delta, max_items, split))[0]


def sips_cumulative_accounting(epsilon: float, delta: float, max_items: int,
                               split: Optional[Sequence[float]] = DEFAULT_SPLIT) -> Accounting:
    """The accountant's total: the rounds as one Gaussian mechanism plus the novel-item events."""
    return _calibration(*_key(epsilon, delta, max_items, split))[1]


def _key(epsilon, delta, max_items, split) -> tuple:
    return (check_epsilon(epsilon), check_delta(delta), check_max_items(max_items),
            check_split(split, max_rounds=MAX_ROUNDS))


@lru_cache(maxsize=256)
def _calibration(epsilon: float, delta: float, max_items: int,
                 fractions: tuple[float, ...]) -> tuple[tuple[CumulativeRound, ...], Accounting]:
    sigmas, novel = multi_round_noise(epsilon, delta, fractions)
    # s: the noise of the composed rounds, sum_r 1/sigma_r^2 = 1/s^2 (shares normalised)
    s = 1.0 / math.sqrt(math.fsum(1.0 / x ** 2 for x in sigmas))
    total = math.fsum(fractions)
    rounds = []
    cumulative = 0.0
    for f, sigma, delta_novel in zip(fractions, sigmas, novel):
        share = f / total
        cumulative = min(1.0, cumulative + share)
        mean_sigma = s / math.sqrt(cumulative)
        with derived_budget():  # delta_novel is a share of the checked delta
            threshold = calibration.gaussian_threshold(mean_sigma, delta_novel, max_items)
        rounds.append(CumulativeRound(share, cumulative, sigma, mean_sigma, threshold, delta_novel))
    return tuple(rounds), accounting.account_gaussian_rounds(sigmas, math.fsum(novel), epsilon, delta)


def sips_cumulative_set_union_calibration(epsilon: float, delta: float, max_items: int) -> SetUnionCalibration:
    """The default split as a :class:`SetUnionCalibration`: ``scale``/``threshold`` are the last round's
    running mean (an item every round measures alike, e.g. one held by single-item users, passes the
    last round with probability ``P[w + N(0, scale^2) >= threshold]``); each round lists its own
    ``sigma`` and the threshold of its running mean."""
    rounds = sips_cumulative_calibration(epsilon, delta, max_items)
    listed = tuple(RoundCalibration(r.share * epsilon, r.share * delta, r.sigma, r.threshold) for r in rounds)
    return SetUnionCalibration("gaussian", rounds[-1].mean_sigma, rounds[-1].threshold, listed,
                               sips_cumulative_accounting(epsilon, delta, max_items))


def udfs(source) -> list[Udf]:
    """The calibration UDF of ``dp_set_union_sips_cumulative`` (pure; rows cached per parameters)."""

    @lru_cache(maxsize=128)
    def _row(epsilon, delta, max_items, split):
        key = _key(epsilon, delta, max_items, list(split) if split is not None else None)
        rounds, a = _calibration(*key)
        return {"share": tuple(r.share for r in rounds), "cumulative_share": tuple(r.cumulative_share for r in rounds),
                "sigma": tuple(r.sigma for r in rounds), "mean_sigma": tuple(r.mean_sigma for r in rounds),
                "rho": tuple(r.threshold for r in rounds),
                "accountant": a.accountant, "total_epsilon": a.epsilon, "total_delta": a.delta}

    def cal(epsilon, delta, max_items, split, user_col, item_col):
        check_column_pair(user_col, item_col)
        row = _row(epsilon, delta, max_items, tuple(split) if isinstance(split, list) else split)
        warn_weak_parameters(epsilon, delta, what="dp_set_union_sips_cumulative", stacklevel=1)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in row.items()}

    dl = duckdb.list_type(DOUBLE)
    returns = duckdb.struct_type({"share": dl, "cumulative_share": dl, "sigma": dl, "mean_sigma": dl, "rho": dl,
                                  "accountant": VARCHAR, "total_epsilon": DOUBLE, "total_delta": DOUBLE})
    return [Udf("dp__sips_cumulative_calibration", scalar(cal), (DOUBLE, DOUBLE, DOUBLE, dl, VARCHAR, VARCHAR),
                returns)]


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="sips_cumulative", family="set_union", macro="dp_set_union_sips_cumulative", unit="user",
        params=user_item_params(
            Param("split", "DOUBLE[]", DEFAULT_SPLIT, lambda v: check_split(list(v), max_rounds=MAX_ROUNDS),
                  f"budget share of each round (at most {MAX_ROUNDS}, sums to 1; default 1:2:4:8:16:32)")),
        description="DP-SIPS in six rounds (budget doubling), an item released once the precision-weighted "
                    "mean of its noisy weights so far passes the round's threshold",
        proof="sips_cumulative", calibrate=sips_cumulative_set_union_calibration, rounds=len(DEFAULT_SPLIT),
        spark=False),
)
