"""Benchmark: the default's time at 10M rows against Basic, with its own split and with splits of fewer rounds.

Issue 33 point 4 holds the default to at most 3x Basic (``weighted_gaussian``) at 10M rows. The default's
time is mostly its rounds' (benchmarks/README.md, "The default at 10M rows"), so this times the default
(``dp_set_union_sips_cumulative``, its own split), each ``split_*`` variant of ``bench_grid_params.VARIANTS``
named on the command line (the same release with that ``split``), and Basic, on the table of
``bench_floor.py`` (``benchmarks/data/zipf.duckdb``, opened read-only), one connection, ``epsilon = 1``,
``delta = 1e-5``, ``max_items = 100``.

The timing is ``bench_floor.py``'s (``bench_time``): one unmeasured run of each query, then ``--reps``
rounds that run every query once in a rotating order. Reported per query: the median wall time and the
median of the per-round ratios to Basic (the budget's measure), with the 1-minute load average and the
share of the cores other processes kept busy.

    python benchmarks/bench_rounds_time.py --variants split_6x1.6,split_5x1.6 --reps 7
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing
sys.path.insert(0, str(HERE))

import dpsql  # noqa: E402
from bench_floor import bench_time  # noqa: E402
from bench_grid_params import VARIANTS  # noqa: E402
from bench_set_union import _pct, ensure_table, machine_info  # noqa: E402


def queries(table: str, variants: list[str]) -> dict[str, str]:
    """Label -> SQL: Basic (``weighted_gaussian``, the ratios' reference), the default, and the default with
    each variant's split."""
    call = "SELECT count(*) FROM dp_set_union_{m}('{t}', epsilon := 1.0, delta := 1e-5, max_items := 100{o})"
    out = {"weighted_gaussian": call.format(m="weighted_gaussian", t=table, o=""),
           "default": call.format(m="sips_cumulative", t=table, o="")}
    for label in variants:
        split = VARIANTS[label].get("split")
        if split is None or set(VARIANTS[label]) != {"split"}:
            raise SystemExit(f"{label}: not a split variant of bench_grid_params.VARIANTS")
        out[label] = call.format(m="sips_cumulative", t=table,
                                 o=", split := [" + ", ".join(repr(float(x)) for x in split) + "]")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="", help="comma-separated split_* labels of bench_grid_params.VARIANTS")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--db", default=str(HERE / "data" / "zipf.duckdb"))
    ap.add_argument("--json", help="also write the raw results to this JSON file")
    args = ap.parse_args(argv)
    info = machine_info()
    print(json.dumps(info))
    table = ensure_table(args.db, args.rows, "BIGINT")
    texts = queries(table, [v for v in args.variants.split(",") if v])
    con = dpsql.connect(args.db, read_only=True)
    r = bench_time(con, table, list(texts), args.reps, 100, texts=texts)  # bench_floor's rotating rounds
    con.close()
    print(f"{table}: load(1min) {min(r['loads']):.2f}-{max(r['loads']):.2f}, others' CPU {_pct(r['others_busy'])}")
    print(f"  {'query':18s} {'median s':>9s} {'min s':>8s} {'x Basic':>8s}")
    for n, m in r["methods"].items():
        print(f"  {n:18s} {m['median']:9.2f} {m['min']:8.2f} {m['x_basic_rounds']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=info, table=table, **r), f, indent=1)


if __name__ == "__main__":
    main()
