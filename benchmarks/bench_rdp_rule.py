"""A Rényi-DP keep rule in place of Basic's Gaussian threshold, in expectation: no release is drawn.

Issue 33 names the rule of Harrison & Manurangsi (arXiv 2603.09167) as a direction: a keep probability
``p(c)`` of an item's weight sum ``c``, drawn independently per item and accounted by Rényi DP, in place of
``[c + N(0, sigma^2) >= rho]`` wherever the sums are not released. Only the paper's abstract can be read
here, so this script derives the simplest rule of that kind (benchmarks/README.md, "A Rényi-DP keep rule
in place of the Gaussian threshold", states it and what it claims) and compares it with Basic
(``weighted_gaussian``) on the grid and the shared datasets by their expected released counts
``sum_i p(c_i)``, computed from each table's exact weight sums. It is a numeric construction, not a
proof: nothing in the package uses it.

The rule for an order ``alpha``: ``r`` = the largest Rényi budget that converts to ``(epsilon, delta/2)``;
``p = (delta/2)/max_items`` on ``[0, 1]``; above 1, the pointwise largest ``p`` with
``D_alpha(Bern(p(c+x)) || Bern(p(c))) <= r x^2`` and the same swapped for every ``c >= 0`` and
``0 < x <= 1``, built greedily on a grid of step ``STEP`` and linear between its points.

    python benchmarks/bench_rdp_rule.py --cache /tmp        # grid tables from bench_grid.py's generator
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import ndtr, ndtri

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing
sys.path.insert(0, str(HERE))

import bench_grid as grid  # noqa: E402
from dpsql.core.calibration import gaussian_threshold, inv_sqrt  # noqa: E402
from dpsql.union.basic import weighted_gaussian_calibration  # noqa: E402

ORDERS = (2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 48, 64)  # declared before any run
STEP = 0.01
MAX_ITEMS = 100
TOP = 1.0 - 1e-10  # never 1: D_alpha(Bern(p) || Bern(1)) is infinite for p < 1


def renyi_budget(alpha: float, epsilon: float, delta: float) -> float:
    """The largest ``r`` whose ``(alpha, r)``-RDP converts to ``(epsilon, delta)`` by the conversion
    ``dp_accounting`` uses (Canonne, Kamath & Steinke 2020, Prop. 12):
    ``epsilon = r + log(1 - 1/alpha) - log(delta alpha)/(alpha - 1)``; ``<= 0`` when the order cannot."""
    return epsilon - math.log1p(-1.0 / alpha) + math.log(delta * alpha) / (alpha - 1.0)


def bernoulli_renyi(log_p1, log_q1, log_p0, log_q0, alpha: float):
    """``D_alpha(Bern(p1) || Bern(p0))`` from log-probabilities (``q = 1 - p``), elementwise."""
    return np.logaddexp(alpha * log_p1 + (1 - alpha) * log_p0, alpha * log_q1 + (1 - alpha) * log_q0) / (alpha - 1)


def _both(p1, p0, alpha):
    lp1, lq1, lp0, lq0 = np.log(p1), np.log1p(-p1), np.log(p0), np.log1p(-p0)
    return np.maximum(bernoulli_renyi(lp1, lq1, lp0, lq0, alpha), bernoulli_renyi(lp0, lq0, lp1, lq1, alpha))


@dataclass(frozen=True)
class Rule:
    """A keep rule: ``p`` linear between the grid points ``c`` (constant below and above them)."""

    alpha: float
    budget: float
    c: np.ndarray
    p: np.ndarray

    def __call__(self, weights) -> np.ndarray:
        return np.interp(np.asarray(weights, dtype=float), self.c, self.p)

    def where(self, q: float) -> float:
        """The smallest grid weight at which the keep probability reaches ``q`` (``inf``: never)."""
        k = int(np.searchsorted(self.p, q))
        return float(self.c[k]) if k < len(self.c) else math.inf


def build(alpha: float, epsilon: float, delta: float, max_items: int = MAX_ITEMS, step: float = STEP,
          c_max: float = 200.0) -> Rule | None:
    """The greedy rule for one order (``None`` when the order cannot reach ``(epsilon, delta/2)``)."""
    r = renyi_budget(alpha, epsilon, delta / 2.0)
    if r <= 0:
        return None
    n = int(round(1.0 / step))
    p = [delta / 2.0 / max_items] * (n + 1)  # c = 0, step, ..., 1
    dx = np.arange(n, 0, -1) * step  # distances from the n previous points to the new one
    limit = r * dx ** 2
    while p[-1] < TOP and len(p) * step < c_max:
        prev = np.array(p[-n:])
        lo = math.log(p[-1]) - math.log1p(-p[-1])  # bisect on the log-odds: [current, TOP]
        hi = math.log(TOP) - math.log1p(-TOP)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            cand = 1.0 / (1.0 + math.exp(-mid))
            if np.all(_both(cand, prev, alpha) <= limit):
                lo = mid
            else:
                hi = mid
        p.append(1.0 / (1.0 + math.exp(-lo)))
    c = np.arange(len(p)) * step
    return Rule(alpha, r, c, np.array(p))


def best_rule(epsilon: float, delta: float, max_items: int = MAX_ITEMS, orders=ORDERS) -> Rule:
    """The declared choice: the order whose rule reaches 1/2 at the smallest weight (ties: smaller order)."""
    rules = [rule for a in orders if (rule := build(a, epsilon, delta, max_items)) is not None]
    return min(rules, key=lambda rule: (rule.where(0.5), rule.alpha))


def worst_ratio(rule: Rule, samples: int = 100_000, seed: int = 1) -> float:
    """The largest ``D_alpha / (r x^2)`` (both directions) over random real ``(c, x)`` pairs, ``x`` log-uniform
    in ``[1e-4, 1]``: a check of the linear interpolation between the grid points (1 or less: holds there)."""
    rng = np.random.default_rng(seed)  # a benchmark check, not dpsql's noise
    c = rng.uniform(0.0, rule.c[-1] + 1.0, samples)
    x = np.exp(rng.uniform(math.log(1e-4), 0.0, samples))
    return float(np.max(_both(rule(c + x), rule(c), rule.alpha) / (rule.budget * x ** 2)))


def gaussian_keep(weights, epsilon: float, delta: float, max_items: int = MAX_ITEMS) -> np.ndarray:
    """Basic's keep probability ``P[c + N(0, sigma^2) >= rho]`` (``weighted_gaussian_calibration``)."""
    cal = weighted_gaussian_calibration(epsilon, delta, max_items)
    return ndtr((np.asarray(weights, dtype=float) - cal.threshold) / cal.scale)


def gaussian_where(q: float, epsilon: float, delta: float, max_items: int = MAX_ITEMS) -> float:
    """The weight at which Basic's keep probability is ``q``."""
    cal = weighted_gaussian_calibration(epsilon, delta, max_items)
    return float(cal.threshold + cal.scale * ndtri(q))


def rdp_gaussian_sigma(epsilon: float, delta: float, orders=ORDERS) -> float:
    """The smallest ``sigma`` whose Gaussian mechanism (sensitivity 1, RDP ``alpha/(2 sigma^2)``) converts to
    ``(epsilon, delta)`` at one of ``orders`` by the same conversion as the rule: Basic's threshold rule
    accounted as the rule is, which separates the conversion's cost from the keep rule's gain."""
    from scipy.optimize import brentq

    def excess(sigma: float) -> float:
        return min(a / (2 * sigma * sigma) - renyi_budget(a, epsilon, delta) for a in orders)
    return float(brentq(excess, 0.05, 100.0, xtol=1e-12))


def weight_sums(path: Path, max_items: int = MAX_ITEMS) -> np.ndarray:
    """Basic's weight sum of every item: each user's distinct items capped to the ``max_items`` of smallest
    ``hash(user, item)`` (one fixed cap in place of the release's salted one), ``1/sqrt(d)`` each."""
    import duckdb

    rows = duckdb.sql(f"""
        WITH p AS (SELECT DISTINCT user_id, item FROM read_parquet('{path}')),
             k AS (SELECT user_id, item,
                          row_number() OVER (PARTITION BY user_id ORDER BY hash(user_id, item), item) AS n
                   FROM p),
             c AS (SELECT user_id, item, count(*) OVER (PARTITION BY user_id) AS d FROM k WHERE n <= {int(max_items)})
        SELECT sum(1.0 / sqrt(d)) FROM c GROUP BY item""").fetchall()
    return np.array([r[0] for r in rows], dtype=float)


def readme_basic(readme: Path = HERE / "README.md") -> dict[tuple[str, str], float]:
    return {key: row["basic"] for key, row in grid.readme_sequential(readme, columns=("basic",)).items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=tempfile.gettempdir())
    ap.add_argument("--grid-only", action="store_true", help="skip the shared datasets")
    args = ap.parse_args(argv)
    rules = {}
    print("| setting | Basic σ | Basic: p = 1/2 at | p = 0.9 at | Basic's rule accounted by Rényi DP: σ "
          "| p = 1/2 at | rule: order | Rényi budget | p = 1/2 at | p = 0.9 at "
          "| largest D_α / (r x²) at 10^5 random (c, x) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for setting, (epsilon, delta, _) in grid.SETTINGS.items():
        rule = rules[setting] = best_rule(epsilon, delta)
        sigma = weighted_gaussian_calibration(epsilon, delta, MAX_ITEMS).scale
        sigma_r = rdp_gaussian_sigma(epsilon, delta / 2.0)
        rho_r = gaussian_threshold(sigma_r, delta / 2.0, MAX_ITEMS, inv_sqrt)
        print(f"| ({setting}) | {sigma:.3f} | {gaussian_where(0.5, epsilon, delta):.2f} "
              f"| {gaussian_where(0.9, epsilon, delta):.2f} | {sigma_r:.3f} | {rho_r:.2f} | {rule.alpha:g} "
              f"| {rule.budget:.4f} | {rule.where(0.5):.2f} | {rule.where(0.9):.2f} | {worst_ratio(rule):.4f} |")
    print()
    print("Every order (p = 1/2 at, (a) / (b)): " + "; ".join(
        f"{a}: " + " / ".join("-" if (r := build(a, e, d)) is None else f"{r.where(0.5):.2f}"
                              for e, d, _ in grid.SETTINGS.values()) for a in ORDERS))
    measured = readme_basic()
    points = grid.grid_points() + ([] if args.grid_only else grid.shared_points())
    print()
    print("| point | part | set | Basic (computed) | Basic (measured, 5 runs) | rule | rule / Basic |")
    print("|---|---|---|---:|---:|---:|---:|")
    for point in points:
        try:
            sums = weight_sums(grid.table_path(point, Path(args.cache)))
        except FileNotFoundError:
            print(f"| {point.name} | - | - | not found | | | |")
            continue
        for setting, (epsilon, delta, _) in grid.SETTINGS.items():
            basic = float(gaussian_keep(sums, epsilon, delta).sum())
            ours = float(rules[setting](sums).sum())
            seen = measured.get((point.name, setting))
            part = "T" if point.part == "tuning" else "R"
            print(f"| {point.name} | {part} | {setting} | {basic:,.1f} | "
                  f"{'-' if seen is None else f'{seen:,.1f}'} | {ours:,.1f} | {ours / basic:.3f} |", flush=True)


if __name__ == "__main__":
    main()
