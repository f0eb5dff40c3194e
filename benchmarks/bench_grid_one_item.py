"""The optimal one-item rule on the grid's one-item shape, in expectation: no release is drawn.

Issue 33 names the optimal rule for users holding one item each ([DVGM22], the truncated geometric
selection, ``dpsql.groupby.selection``) as a direction where users hold few items. On the grid's ``one``
shape every user holds exactly one item, so one user moves one item's count by 1 and a rule that keeps an
item with probability ``p(n)`` of its count ``n`` releases ``sum_i p(n_i)`` items in expectation. This
script computes that sum exactly from each ``one`` point's item counts, at the full ``(epsilon, delta)`` of
both settings, for

* ``truncated_geometric``: ``keep_probabilities(epsilon, delta)`` of ``dpsql.groupby.selection`` (the
  largest keep probabilities any ``(epsilon, delta)``-DP rule of one count may have, with ``L0 = 1``);
* ``count_laplace`` with ``max_items := 1``: ``P[n + Lap(1/epsilon) >= T]``, ``T = 1 + ln(1/(2 delta))/epsilon``
  (``dpsql.union.basic.count_laplace_calibration``; the grid's ``one_item`` column measures it);

and sets them beside ``greedy_update``'s measured mean (5 runs, the results table of benchmarks/README.md,
"Robustness grid"; its windowed rule depends on the order the users fill items, so it is not computed).
The grid's Parquet files come from ``bench_grid.py``'s seeded generator (``--cache``).

    python benchmarks/bench_grid_one_item.py --cache /tmp

[DVGM22] Desfontaines, Voss, Gipson & Mandayam, Differentially private partition selection, PoPETs 2022.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing
sys.path.insert(0, str(HERE))

import bench_grid as grid  # noqa: E402
from dpsql.groupby.selection import keep_probabilities  # noqa: E402
from dpsql.union.basic import count_laplace_calibration  # noqa: E402


def expected_truncated_geometric(counts: np.ndarray, epsilon: float, delta: float) -> float:
    """``sum_i p(n_i)``: the expected number of items the truncated geometric rule keeps."""
    p = keep_probabilities(epsilon, delta)  # p[n] for n = 0 .. the first n with p = 1
    return float(np.where(counts < len(p), p[np.minimum(counts, len(p) - 1)], 1.0).sum())


def expected_count_laplace(counts: np.ndarray, epsilon: float, delta: float) -> float:
    """``sum_i P[n_i + Lap(b) >= T]``, ``b`` and ``T`` of ``count_laplace_calibration(epsilon, delta, 1)``
    (``b = 1/epsilon``, ``T = 1 + ln(1/(2 delta))/epsilon``)."""
    c = count_laplace_calibration(epsilon, delta, 1)
    gap = (counts.astype(float) - c.threshold) / c.scale
    tail = 0.5 * np.exp(-np.abs(gap))
    return float(np.where(gap >= 0, 1.0 - tail, tail).sum())


def item_counts(path: Path) -> np.ndarray:
    import duckdb

    rows = duckdb.sql(f"SELECT count(DISTINCT user_id) FROM read_parquet('{path}') GROUP BY item").fetchall()
    return np.array([r[0] for r in rows], dtype=np.int64)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=tempfile.gettempdir())
    args = ap.parse_args(argv)
    measured = grid.readme_sequential()
    print("| point | set | truncated geometric | count_laplace (max_items 1) | greedy_update (measured) "
          "| truncated geometric / greedy_update |")
    print("|---|---|---:|---:|---:|---:|")
    for point in grid.grid_points():
        if point.shape != "one":
            continue
        counts = item_counts(grid.table_path(point, Path(args.cache)))
        for setting, (epsilon, delta, _) in grid.SETTINGS.items():
            tg = expected_truncated_geometric(counts, epsilon, delta)
            cl = expected_count_laplace(counts, epsilon, delta)
            greedy = measured[(point.name, setting)]["greedy_update"]
            print(f"| {point.name} | {setting} | {tg:,.1f} | {cl:,.1f} | {greedy:,.1f} | {tg / greedy:.3f} |")


if __name__ == "__main__":
    main()
