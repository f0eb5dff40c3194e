"""Benchmark: which selection ``dp_group_by`` should default to, per contribution bound (issue 34 point 3).

Declared in benchmarks/README.md ("The default selection per setting") before any run. dpsql only:
``dpsql.group_by(con, t, epsilon, delta, ...)``, the count per group, every other default. Per dataset,
setting (epsilon, delta), L0 and run, three configurations, interleaved on one connection:

* ``i``: ``selection='sips_cumulative'``, ``max_items = max_groups = L0`` (the set-union default, both caps L0);
* ``ii``: ``selection='sips_cumulative'``, ``max_items = 100``, ``max_groups = L0`` (the selection's cap left
  at its default, only the aggregates' cap lowered);
* ``iii``: ``selection='truncated_geometric'``, ``max_items = max_groups = L0`` (its coin caps at max_groups).

The selection is always passed explicitly, so the measurement does not depend on what the default is.
Datasets: the shared ones (``--data``) and two synthetic tables of ``bench_grid.generate`` (Zipf s = 1.0,
10^5 users): ``one`` (each user holds 1 item) and ``few`` (1..3 rows, uniform).

Metrics per run: groups released; median over them of ``|noisy - true| / true`` (true = distinct users of
the group, uncapped); and the same median over the groups all three configurations released in that run
(``common``; NaN when there are none). ``report`` prints the table and applies the declared rule.

    python benchmarks/bench_group_by_default.py run --data DIR --out default.jsonl
    python benchmarks/bench_group_by_default.py report default.jsonl
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent

DATASETS = ("reddit_askreddit_1pct/unigrams", "health_news_tweets/tweet_tokens",
            "debian_bookworm_descriptions/package_description_tokens")
SYNTHETIC = ("one", "few")
SHORT = {"reddit_askreddit_1pct/unigrams": "AskReddit unigrams", "health_news_tweets/tweet_tokens": "health tweets",
         "debian_bookworm_descriptions/package_description_tokens": "Debian descriptions",
         "synthetic-one": "synthetic, 1 item per user", "synthetic-few": "synthetic, 1..3 items per user"}
SETTINGS = ("1:1e-5", f"3:{math.exp(-10)!r}")
L0S = (1, 2, 3, 5)
# label -> (selection, max_items or None for L0); max_groups is always L0
CONFIGS: Dict[str, tuple] = {"i": ("sips_cumulative", None), "ii": ("sips_cumulative", 100),
                             "iii": ("truncated_geometric", None)}
SYNTHETIC_USERS = 100_000
# the decision rule's accuracy guard (README declaration): iii's median error on the common groups at most
# this much above i's
ERROR_GUARD = 0.05


def _load(con: Any, name: str) -> None:
    if name.startswith("synthetic-"):
        sys.path.insert(0, str(HERE))
        import pyarrow as pa
        from bench_grid import Point, generate

        u, i = generate(Point(name, name.split("-", 1)[1], 1.0, SYNTHETIC_USERS, "report"))
        arrow = pa.table({"user_id": u, "item": i})
        con.register("dp_src", arrow)
        con.execute("CREATE TABLE t AS SELECT DISTINCT user_id, item FROM dp_src")
        con.unregister("dp_src")
    else:
        raise ValueError(name)


def median_rel_error(noisy: Dict[Any, float], truth: Dict[Any, int], among: Optional[set] = None) -> float:
    keys = noisy.keys() if among is None else among
    errs = [abs(noisy[k] - truth[k]) / truth[k] for k in keys]
    return statistics.median(errs) if errs else float("nan")


def run(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE.parent))
    import dpsql

    names = list(args.datasets) + [f"synthetic-{s}" for s in args.synthetic]
    for name in names:
        con = dpsql.connect()
        con.execute("SET enable_progress_bar = false")
        if name.startswith("synthetic-"):
            _load(con, name)
        else:
            path = Path(args.data) / f"{name}.parquet"
            con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
        truth = dict(con.execute("SELECT item, count(DISTINCT user_id) FROM t GROUP BY item").fetchall())
        for setting in args.settings:
            eps, delta = (float(x) for x in setting.split(":"))
            for l0 in args.l0:
                for rep in range(args.reps):
                    out: Dict[str, Dict[Any, float]] = {}
                    secs: Dict[str, float] = {}
                    for label in args.configs:
                        selection, max_items = CONFIGS[label]
                        started = time.perf_counter()
                        rows = dpsql.group_by(con, "t", epsilon=eps, delta=delta, selection=selection,
                                              max_items=l0 if max_items is None else max_items, max_groups=l0)
                        secs[label] = time.perf_counter() - started
                        out[label] = dict(zip(rows.column("item").to_pylist(), rows.column("count").to_pylist()))
                    common = set.intersection(*(set(v) for v in out.values()))
                    for label, noisy in out.items():
                        row = {"dataset": name, "epsilon": eps, "delta": delta, "l0": l0, "rep": rep,
                               "config": label, "released": len(noisy),
                               "err": median_rel_error(noisy, truth), "common": len(common),
                               "err_common": median_rel_error(noisy, truth, common),
                               "seconds": round(secs[label], 2), "load": os.getloadavg(),
                               "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
                        with open(args.out, "a") as fh:
                            fh.write(json.dumps(row) + "\n")
                        print(json.dumps(row), flush=True)
        con.close()
    return 0


def _med(values: List[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def _cell(released: List[int], err: List[float], common: List[float]) -> str:
    def f(x: float) -> str:
        return "–" if math.isnan(x) else f"{x:.3f}"
    return f"{statistics.median(released):g} ({min(released)}–{max(released)}) / {f(_med(err))} / {f(_med(common))}"


def report(args: argparse.Namespace) -> int:
    rows = [json.loads(line) for path in args.files for line in open(path) if line.strip()]
    cells: Dict[tuple, Dict[str, Dict[str, list]]] = {}
    for r in rows:
        key = (r["dataset"], r["epsilon"], r["delta"], r["l0"])
        c = cells.setdefault(key, {}).setdefault(r["config"], {"released": [], "err": [], "common": [], "n": []})
        c["released"].append(r["released"])
        c["err"].append(r["err"])
        c["common"].append(r["err_common"])
        c["n"].append(r["common"])
    order = {d: k for k, d in enumerate(list(DATASETS) + [f"synthetic-{s}" for s in SYNTHETIC])}
    print("| dataset | (ε, δ) | L0 | common groups | i: sips, max_items = L0 | ii: sips, max_items = 100 "
          "| iii: truncated_geometric | iii ≥ i | iii ≥ ii |")
    print("|---|---|---|---|---|---|---|---|---|")
    wins: Dict[int, Dict[str, List[bool]]] = {}
    for key in sorted(cells, key=lambda k: (k[3], order.get(k[0], 99), k[1])):
        name, eps, delta, l0 = key
        c = cells[key]
        med = {lab: statistics.median(v["released"]) for lab, v in c.items()}
        err_common = {lab: _med(v["common"]) for lab, v in c.items()}
        # iii at least as many groups as i, and (guard) its error on the common groups at most ERROR_GUARD above i's
        guard = (math.isnan(err_common["iii"]) or math.isnan(err_common["i"])
                 or err_common["iii"] <= err_common["i"] + ERROR_GUARD)
        beat_i = med["iii"] >= med["i"] and guard
        beat_ii = med["iii"] >= med["ii"]
        wins.setdefault(l0, {"i": [], "ii": []})
        wins[l0]["i"].append(beat_i)
        wins[l0]["ii"].append(beat_ii)
        setting = "(1, 1e-5)" if eps == 1 else "(3, e^-10)"
        print(f"| {SHORT.get(name, name)} | {setting} | {l0} | {statistics.median(c['i']['n']):g} | "
              + " | ".join(_cell(c[lab]["released"], c[lab]["err"], c[lab]["common"]) for lab in ("i", "ii", "iii"))
              + f" | {'yes' if beat_i else 'no'} | {'yes' if beat_ii else 'no'} |")
    print()
    l_star, l_star_ii, ok_i, ok_ii = 0, 0, True, True
    for l0 in sorted(wins):
        w = wins[l0]
        maj_i = sum(w["i"]) * 2 > len(w["i"])
        maj_ii = sum(w["ii"]) * 2 > len(w["ii"])
        print(f"L0 = {l0}: iii wins against i on {sum(w['i'])}/{len(w['i'])} pairs, against ii on "
              f"{sum(w['ii'])}/{len(w['ii'])}")
        ok_i = ok_i and maj_i
        ok_ii = ok_ii and maj_ii
        if ok_i:
            l_star = l0
        if ok_ii:
            l_star_ii = l0
    print(f"L* = {l_star} (against i); against ii: {l_star_ii}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", required=True, help="folder of the shared datasets (<dataset>.parquet)")
    r.add_argument("--datasets", nargs="*", default=list(DATASETS))
    r.add_argument("--synthetic", nargs="*", default=list(SYNTHETIC), choices=SYNTHETIC)
    r.add_argument("--settings", nargs="+", default=list(SETTINGS))
    r.add_argument("--l0", nargs="+", type=int, default=list(L0S))
    r.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--out", required=True)
    r.set_defaults(func=run)
    q = sub.add_parser("report")
    q.add_argument("files", nargs="+")
    q.set_defaults(func=report)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
