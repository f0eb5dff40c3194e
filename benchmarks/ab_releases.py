"""Everything a user can observe of seeded ``sips_cumulative`` releases, to compare two checkouts of dpsql.

A change meant to make a release faster must not change what it releases: with a test seed (NOT private)
the noise stream is fixed, so the same query must give the same rows. The script runs a grid of cases on
the dpsql first on ``PYTHONPATH`` and writes them to a JSON file; ``--compare`` diffs two such files.

* tables: Zipfian 5,000 rows (``zipf_data.generate``), Zipfian 20,000 rows with text items stored by
  user, and two small dense ones; seeds 1-3; two budgets;
* ``dp_set_union_sips_cumulative`` with the default and eleven other parameter sets (splits of one to
  eight rounds, ``drop_margin`` / ``max_boost`` / ``tilt`` off, at their bounds and in between,
  ``max_items``); ``dp_set_union``, ``dpsql.set_union`` with and without options, ``dp_group_by``;
* ten refused parameter sets (their error type and message);
* the ledger's rows (mechanism, parameters, calibration, charge), the time stamp left out.

    PYTHONPATH=<old checkout> python benchmarks/ab_releases.py before.json
    PYTHONPATH=<new checkout> python benchmarks/ab_releases.py after.json
    python benchmarks/ab_releases.py --compare before.json after.json
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TABLES: dict[str, Callable[[Any], object]] = {
    "zipf5k": lambda con: __import__("zipf_data").generate(con, "t", 5000),
    "zipf20k_text_by_user": lambda con: __import__("zipf_data").generate(con, "t", 20000, item_type="VARCHAR",
                                                                         order="user"),
    "small": lambda con: con.execute(
        "CREATE TABLE t AS SELECT (i % 60) AS user_id, "
        "'i' || floor(300 * pow(((i * 7919) % 1009) / 1009.0, 3))::BIGINT AS item FROM range(900) r(i)"),
    "dense": lambda con: con.execute(
        "CREATE TABLE t AS SELECT (i % 400) AS user_id, floor(50 * pow(((i * 31) % 997) / 997.0, 2))::INTEGER AS item "
        "FROM range(8000) r(i)"),
}
PARAMS = ["", ", split := [0.2, 0.3, 0.5]", ", split := [1.0]", ", drop_margin := NULL",
          ", drop_margin := 1.5, max_boost := 3, tilt := 0.5", ", max_boost := NULL", ", tilt := NULL", ", tilt := 0",
          ", split := [0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125]", ", max_items := 5",
          ", split := [0.5, 0.5], drop_margin := NULL", ", drop_margin := 0, max_boost := 1, tilt := 10"]
BUDGETS = [("1.0", "1e-5"), ("4.0", "1e-6")]
REFUSED = [", split := [0.5, 0.6]", ", split := [0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.2]", ", drop_margin := -1",
           ", tilt := 11", ", max_boost := 0.5", ", user_col := 'nope'", ", item_col := 'user_id'", ", split := NULL",
           ", max_items := 0", ", split := [0.5, NULL]"]


def _rows(con, sql: str) -> Any:
    try:
        return [str(r) for r in con.execute(sql).fetchall()]
    except Exception as e:  # the error is an observable too
        return f"{type(e).__name__} {e}"


def observe() -> dict[str, Any]:
    import dpsql

    out: dict[str, Any] = {}
    for tname, make in TABLES.items():
        for seed in (1, 2, 3):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                con = dpsql.connect(seed=seed)
                make(con)
                for eps, delta in BUDGETS:
                    for p in PARAMS:
                        sql = f"SELECT * FROM dp_set_union_sips_cumulative('t', epsilon := {eps}, delta := {delta}{p})"
                        out[f"{tname}|{seed}|{eps}|{p}"] = _rows(con, sql)
                out[f"{tname}|{seed}|dp_set_union"] = _rows(con, "SELECT * FROM dp_set_union('t', epsilon := 1.0, "
                                                                  "delta := 1e-5)")
                out[f"{tname}|{seed}|python"] = str(dpsql.set_union(con, "t", epsilon=1.0, delta=1e-5))
                out[f"{tname}|{seed}|python_options"] = str(dpsql.set_union(
                    con, "t", "sips_cumulative", epsilon=2.0, delta=1e-5, split=[0.3, 0.7], tilt=0.2))
                out[f"{tname}|{seed}|dp_group_by"] = _rows(con, "SELECT * FROM dp_group_by('t', epsilon := 1.0, "
                                                                 "delta := 1e-5) ORDER BY ALL")
                for bad in REFUSED:
                    out[f"{tname}|{seed}|refused{bad}"] = _rows(
                        con, f"SELECT * FROM dp_set_union_sips_cumulative('t', epsilon := 1.0, delta := 1e-5{bad})")
                out[f"{tname}|{seed}|ledger"] = _rows(con, "SELECT * EXCLUDE (released_at) FROM dp_releases()")
                con.close()
    return out


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    print(f"{len(a)} / {len(b)} cases, {len(differ)} differ")
    for k in differ[:20]:
        print(f"{k}\n  before: {str(a.get(k))[:300]}\n  after:  {str(b.get(k))[:300]}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="where to write the observations (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="diff two observation files")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        ap.error("give the output file, or --compare BEFORE AFTER")
    obs = observe()
    Path(args.out).write_text(json.dumps(obs, indent=0, sort_keys=True))
    print(f"{len(obs)} cases written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
