"""Plot how many items of each frequency several set-union methods release (cf. Chen et al., Figure 1).

    python examples/coverage_by_frequency.py [DATA.parquet] [--output coverage.png] [--seed N]

DATA is a Parquet file with columns user_id, item (default: the embedded r/AskReddit sample).
Each method runs once at epsilon = 1, delta = 1e-5, max_items = 100 (where the method takes it). The released sets are
private; the per-frequency counts are computed from the raw data with dp_eval_coverage_by_frequency
and are a NON-PRIVATE evaluation. Needs matplotlib (pip install ".[plot]" in the checkout).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import dpsql
from dpsql.tools import demo


def coverage(con, methods: list[str]) -> dict[str, list[tuple]]:
    """method -> rows (bucket, min_frequency, max_frequency, items, released_items). NON-PRIVATE."""
    out = {}
    for method in methods:
        # max_items where the method bounds contributions by it (greedy_update bounds them its own way)
        cap = {"max_items": 100} if "max_items" in dpsql.METHODS[method].param_names else {}
        released = dpsql.set_union(con, "data", method, epsilon=1.0, delta=1e-5, **cap)
        con.register("released_items", released)
        try:
            out[method] = con.execute("FROM dp_eval_coverage_by_frequency('data', 'released_items')").fetchall()
        finally:
            con.unregister("released_items")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", help="Parquet file with user_id, item (default: embedded AskReddit)")
    parser.add_argument("--output", default="coverage_by_frequency.png", help="PNG file to write")
    parser.add_argument("--seed", type=int, help="reproducible noise (NOT private)")
    args = parser.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("This example needs matplotlib: pip install \".[plot]\" in dpsql's checkout", file=sys.stderr)
        return 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        con = dpsql.connect(seed=args.seed)
    try:
        if args.data:
            source = Path(args.data)
            con.execute("CREATE TEMP TABLE data AS SELECT user_id, item FROM read_parquet(?)", [str(source)])
        else:
            with demo.dataset_path() as source:
                con.execute("CREATE TEMP TABLE data AS SELECT user_id, item FROM read_parquet(?)", [str(source)])
        rows = coverage(con, list(dpsql.METHODS))
    finally:
        con.close()

    fig, ax = plt.subplots(figsize=(8, 4.5))
    first = next(iter(rows.values()))
    labels = [f"{lo}" if lo == hi else f"{lo}-{hi}" for _, lo, hi, _, _ in first]
    xs = range(len(first))
    ax.bar(xs, [n for *_, n, _ in first], color="lightgrey", label="all items (raw data)")
    for method, r in rows.items():
        ax.plot(xs, [m for *_, m in r], marker="o", label=method)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels, rotation=45, ha="right")
    ax.set_xlabel("item frequency N(x) (users holding the item)")
    ax.set_ylabel("items")
    ax.set_title("Released items by frequency, epsilon=1, delta=1e-5, max_items=100\n"
                 "(counts from the raw data: NON-PRIVATE evaluation)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
