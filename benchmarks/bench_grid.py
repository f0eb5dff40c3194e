"""Robustness grid: released items of every set-union method on synthetic tables of many shapes.

Issue 33 ("Utility that holds on data nobody tuned on"). The default ``sips_cumulative`` was tuned on
the shared datasets; this benchmark measures it, every sequential method, ``mad2r`` and Basic on a
declared grid of synthetic user-item tables (and on the shared datasets), at both settings.

**Grid** (``grid_points``): degree shape x item popularity x number of users.

* Degree shape (rows per user, drawn per user): ``one`` (exactly 1), ``few`` (uniform on 1..3),
  ``geom`` (geometric, P(d = k) = p (1-p)^(k-1), p = 1/5: mean 5, median 4), ``pareto``
  (``floor(2 u^(-1/1.3))``, u ~ U(0, 1), capped at 10,000: discrete Pareto, mean about 8.5, median 3,
  tail P(d >= x) ~ (2/x)^1.3).
* Item popularity: Zipf over a vocabulary of V = n_users items, P(item = k) ~ k^-s, s in {0.7, 1.0, 1.5}
  (exact discrete law, inverse CDF). A user's rows draw their items independently (with
  replacement, so a user may repeat an item; the mechanisms count distinct pairs).
* Users: 10^3, 10^4, 10^5 for every shape; 10^6 for ``one`` and ``pareto`` at s = 1.0 (the extremes of
  the degree shapes; the compute budget of one 2-core machine).

**Split** (declared before any tuning; ``part``): a point with 10^4 or 10^5 users is TUNING when
``(shape index + exponent index + size index) % 2 == 0`` (indices in the orders above, size index
1 for 10^4, 2 for 10^5), otherwise REPORT; every 10^3 and 10^6 point and every shared dataset is
REPORT. Each (shape, exponent) pair is so tuned at exactly one of 10^4 / 10^5 users.

Data: generated with numpy's seeded generator (synthetic data only; the mechanisms' noise is dpsql's
own) into Parquet files under ``--cache`` (default: the system's temporary folder), never the repository.

**Methods** (``METHODS``): the default ``sips_cumulative``; the sequential methods ``greedy_update``
(keyed global fill order, no cap), ``policy_laplace``, ``policy_gaussian``; ``mad2r``; Basic
(``weighted_gaussian``); ``count_laplace`` with ``max_items := 1`` (``one_item``: close to the optimal
one-item-per-user rule). All with ``max_items := 100`` where they take it, through ``dpsql.set_union``
on an in-memory DuckDB table loaded from the Parquet file. Prototype ``split_d<d0>`` (a measurement, not a release method):
the users are split by their own number of distinct items d (a function of each user's own data, so a
user is in exactly one part and under add/remove-one-user neighbours each part may spend the whole
(epsilon, delta), parallel composition); users with d <= d0 go to ``count_laplace`` with
``max_items := 1``, the others to the default ``sips_cumulative``; the released items are the union.
``splitg_d<d0>`` (second prototype, declared after the first's tuning run): the same split with
``greedy_update`` on the low-degree part.

Settings: (a) epsilon=1, delta=1e-5, max_items=100; (b) epsilon=3, delta=e^-10, max_items=100.
Runs are interleaved: run i of every method runs on one connection seeded ``1000 + i`` (the table loaded
into memory once per run). A method whose first run on a point takes longer than ``--max-seconds`` is
not run again on that point (reported as such, never dropped).

Findings (2026-11-28, benchmarks/README.md, "Robustness grid"): the default is at or above the best
sequential method (``greedy_update`` on every grid point) only where users hold several items in doubt
(geometric / heavy-tailed degrees with flat popularity); it falls to 0.32-0.80 of it where users hold
one to three items and to 0.72-0.96 with steep popularity. Neither prototype closes the gap: splitting
users by degree splits the holders of the items the parts share.

The shared datasets are found as by the other benchmarks (``DPSQL_SHARED_DATA``, or ``../shared/data``
next to the repository).

    python benchmarks/bench_grid.py --list
    python benchmarks/bench_grid.py --part tuning --runs 5 --json tuning.json
    python benchmarks/bench_grid.py --points one-s1.0-n1e6 --runs 5 --json big.json
    python benchmarks/bench_grid.py --shared-only --runs 5 --json shared.json
    python benchmarks/bench_grid.py --table tuning.json shared.json --choose
    python benchmarks/bench_grid.py --doubt 8,30 --sizes 10000,100000 --shared
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_parallel_default import DATASETS, SETTINGS, dataset_path  # noqa: E402  (the shared datasets)

SHAPES = ["one", "few", "geom", "pareto"]
EXPONENTS = [0.7, 1.0, 1.5]
SIZES = [1_000, 10_000, 100_000, 1_000_000]
BIG_EXPONENT = 1.0  # the only exponent at 10^6 users
BIG_SHAPES = ("one", "pareto")  # the only shapes at 10^6 users (the compute budget)
DEFAULT = "sips_cumulative"
SEQUENTIAL = ["greedy_update", "policy_laplace", "policy_gaussian"]
# label -> (method, options); ``max_items`` 100 is added where the method takes it
METHODS: dict[str, tuple[str, dict]] = {
    "sips_cumulative": ("sips_cumulative", {}),
    "greedy_update": ("greedy_update", {}),
    "policy_laplace": ("policy_laplace", {}),
    "policy_gaussian": ("policy_gaussian", {}),
    "mad2r": ("mad2r", {}),
    "basic": ("weighted_gaussian", {}),
    "one_item": ("count_laplace", {"max_items": 1}),
}


@dataclass(frozen=True)
class Point:
    """One table of the grid (or a shared dataset: ``shape`` = its name, ``users`` 0)."""

    name: str
    shape: str
    exponent: float
    users: int
    part: str  # "tuning" or "report"


def _size_label(n: int) -> str:
    return f"1e{round(math.log10(n))}"


def grid_points() -> list[Point]:
    """The declared grid, in a fixed order, with its tuning / report split (module docstring)."""
    out = []
    for k, n in enumerate(SIZES):
        for a, shape in enumerate(SHAPES):
            for b, s in enumerate(EXPONENTS):
                if n == 1_000_000 and (s != BIG_EXPONENT or shape not in BIG_SHAPES):
                    continue
                part = "tuning" if n in (10_000, 100_000) and (a + b + k) % 2 == 0 else "report"
                out.append(Point(f"{shape}-s{s}-n{_size_label(n)}", shape, s, n, part))
    return out


def shared_points() -> list[Point]:
    return [Point(name, name, 0.0, 0, "report") for name in DATASETS]


def generate(point: Point, seed: int = 33):
    """(user_id, item) int64 arrays of a grid point: seeded numpy, a function of the point and seed only."""
    import numpy as np

    rng = np.random.default_rng([seed, SHAPES.index(point.shape), int(point.exponent * 10), point.users])
    n = point.users
    if point.shape == "one":
        deg = np.ones(n, np.int64)
    elif point.shape == "few":
        deg = rng.integers(1, 4, n)
    elif point.shape == "geom":
        deg = rng.geometric(0.2, n)
    elif point.shape == "pareto":
        deg = np.minimum(10_000, np.floor(2.0 * (1.0 - rng.random(n)) ** (-1.0 / 1.3))).astype(np.int64)
    else:
        raise ValueError(point.shape)
    vocabulary = n
    cdf = np.cumsum(np.arange(1, vocabulary + 1, dtype=np.float64) ** -point.exponent)
    cdf /= cdf[-1]
    rows = int(deg.sum())
    items = np.minimum(np.searchsorted(cdf, rng.random(rows), side="right"), vocabulary - 1) + 1
    users = np.repeat(np.arange(n, dtype=np.int64), deg)
    order = rng.permutation(rows)  # an event log: users interleaved
    return users[order], items[order].astype(np.int64)


def table_path(point: Point, cache: Path) -> Path:
    """The Parquet file of a point (generated once into ``cache``; shared datasets as they are)."""
    if point.users == 0:
        path = dataset_path(point.name, cache)
        if path is None:
            raise FileNotFoundError(point.name)
        return path
    out = cache / f"grid_{point.name}.parquet"
    if not out.is_file():
        import pyarrow as pa
        import pyarrow.parquet as pq

        u, i = generate(point)
        tmp = out.with_suffix(".tmp")
        pq.write_table(pa.table({"user_id": u, "item": i}), tmp)
        tmp.rename(out)
    return out


def describe(path: Path) -> dict:
    """Public-free statistics of a table (for the README): users, distinct pairs and items, degrees."""
    import duckdb

    con = duckdb.connect()
    try:
        row = con.execute(f"""
            WITH p AS (SELECT DISTINCT user_id, item FROM read_parquet('{path}')),
                 d AS (SELECT user_id, count(*) AS d FROM p GROUP BY user_id)
            SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM p), (SELECT count(DISTINCT item) FROM p),
                   (SELECT median(d) FROM d), (SELECT avg(d) FROM d), (SELECT max(d) FROM d),
                   (SELECT avg((d <= 3)::INT) FROM d)""").fetchone()
    finally:
        con.close()
    keys = ["users", "pairs", "items", "median_degree", "mean_degree", "max_degree", "share_degree_le3"]
    return dict(zip(keys, [float(x) for x in row]))


def in_doubt(path: Path, low: int, high: int) -> float:
    """Diagnostic (not a release): among the users holding an item with ``low``..``high`` holders (the
    range where a method's release is in doubt), the mean number of such items a user holds."""
    import duckdb

    con = duckdb.connect()
    try:
        return float(con.execute(f"""
            WITH p AS (SELECT DISTINCT user_id, item FROM read_parquet('{path}')),
                 n AS (SELECT item, count(*) AS k FROM p GROUP BY item HAVING k BETWEEN {low} AND {high})
            SELECT avg(c) FROM (SELECT user_id, count(*) AS c FROM p JOIN n USING (item) GROUP BY user_id)
            """).fetchone()[0] or 0.0)
    finally:
        con.close()


def _open(path: Path, seed: int, threads: int):
    """A seeded dpsql connection with the table loaded into memory as ``t`` (every method of a run reads it)."""
    import dpsql

    con = dpsql.connect(seed=seed)
    con.execute(f"SET threads = {threads}")
    con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
    return con


def _release(con, table: str, method: str, options: dict, epsilon: float, delta: float, max_items: int) -> set:
    import dpsql
    import dpsql.core.registry

    declared = {p.name for p in dpsql.core.registry.set_union_methods()[method].params}
    opts = {"max_items": max_items, **options} if "max_items" in declared else dict(options)
    out = dpsql.set_union(con, table, method, epsilon=epsilon, delta=delta, **opts)
    return set(out.column("item").to_pylist())


def released(con, label: str, epsilon: float, delta: float, max_items: int) -> int:
    """Items released by ``label`` (a method of ``METHODS`` or ``split_d<d0>``) on the connection's ``t``."""
    if label.startswith("split_d"):
        return len(split_release(con, int(label[len("split_d"):]), epsilon, delta, max_items))
    if label.startswith("splitg_d"):
        return len(split_release(con, int(label[len("splitg_d"):]), epsilon, delta, max_items, low="greedy_update"))
    method, options = METHODS[label]
    return len(_release(con, "t", method, options, epsilon, delta, max_items))


def split_release(con, d0: int, epsilon: float, delta: float, max_items: int, low: str = "count_laplace") -> set:
    """Prototype: users with at most ``d0`` distinct items -> ``low``, the rest -> the default.

    ``low``: ``count_laplace`` with ``max_items := 1`` (``split_d<d0>``) or ``greedy_update``
    (``splitg_d<d0>``, its own defaults).

    The parts are disjoint sets of users chosen by each user's own degree, so adding or removing one
    user changes one part only and each release may take the whole (epsilon, delta) (parallel
    composition). Both parts always run (an empty part releases nothing), so what runs does not
    depend on the data.
    """
    con.execute("CREATE OR REPLACE TEMP TABLE deg AS SELECT user_id, count(DISTINCT item) AS d FROM t GROUP BY user_id")
    con.execute(f"CREATE OR REPLACE VIEW t_low AS SELECT user_id, item FROM t JOIN deg USING (user_id) WHERE d <= {d0}")
    con.execute(f"CREATE OR REPLACE VIEW t_high AS SELECT user_id, item FROM t JOIN deg USING (user_id) WHERE d > {d0}")
    low_options: dict = {"max_items": 1} if low == "count_laplace" else {}
    low_items = _release(con, "t_low", low, low_options, epsilon, delta, max_items)
    high = _release(con, "t_high", DEFAULT, {}, epsilon, delta, max_items)
    return low_items | high


def run_point(point: Point, labels: list[str], settings: list[str], runs: int, threads: int, cache: Path,
              max_seconds: float, log: Callable[[str], None]) -> list[dict]:
    path = table_path(point, cache)
    stats = describe(path)
    rows = []
    for setting in settings:
        epsilon, delta, max_items = SETTINGS[setting]
        counts: dict[str, list[int]] = {label: [] for label in labels}
        seconds: dict[str, list[float]] = {label: [] for label in labels}
        stopped: dict[str, bool] = {label: False for label in labels}
        load = []
        for run in range(runs):
            load.append(os.getloadavg()[0])
            con = _open(path, 1000 + run, threads)  # one seeded connection per run, every method on it
            try:
                for label in labels:
                    if stopped[label]:
                        continue
                    t0 = time.perf_counter()
                    counts[label].append(released(con, label, epsilon, delta, max_items))
                    seconds[label].append(time.perf_counter() - t0)
                    if seconds[label][-1] > max_seconds:
                        stopped[label] = True
            finally:
                con.close()
        row = {"point": point.name, "shape": point.shape, "exponent": point.exponent, "users": point.users,
               "part": point.part, "setting": setting, "stats": stats, "counts": counts, "seconds": seconds,
               "load": load, "runs": runs}
        rows.append(row)
        log(json.dumps({"point": point.name, "setting": setting,
                        "means": {k: (statistics.mean(v) if v else None) for k, v in counts.items()},
                        "s": {k: round(sum(v), 1) for k, v in seconds.items()}}))
    return rows


def _cell(v: list[int], runs: int) -> str:
    if not v:
        return "-"
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    text = f"{statistics.mean(v):,.1f} ± {sd:,.1f}"
    return text if len(v) == runs else f"{text} ({len(v)} run{'s' if len(v) > 1 else ''}: slow)"


def readme_sequential(readme: Path = HERE / "README.md",
                      columns=SEQUENTIAL) -> dict[tuple[str, str], dict[str, float]]:
    """(point, setting) -> the sequential methods' means (or ``columns``') in the results table of this
    README's "Robustness grid" section (the reference of the scripts that vary the default against it)."""
    text = readme.read_text()
    lines = text[text.index("## Robustness grid"):].splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("| point | part | set | median d |"))
    head = [c.strip().strip("*").replace(" (default)", "") for c in lines[start].strip("|").split("|")]
    out = {}
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0].startswith("---"):
            continue
        row = dict(zip(head, cells))
        out[(row["point"], row["set"])] = {k: float(re.sub(r"[,\s]", "", row[k].split("±")[0]))
                                           for k in columns if row.get(k, "-") != "-"}
    return out


def table(rows: list[dict], labels: list[str]) -> str:
    """Markdown: mean ± sd per method, and the default's ratio to the best sequential method (by mean)."""
    head = ["point", "part", "set", "median d", *labels, "best seq.", "default / best seq."]
    out = ["| " + " | ".join(head) + " |", "|---|---|---|---:|" + "---:|" * (len(labels) + 2)]
    for r in rows:
        means = {k: statistics.mean(v) for k, v in r["counts"].items() if v}
        seq = {k: means[k] for k in SEQUENTIAL if k in means}
        best = max(seq, key=lambda k: seq[k]) if seq else None
        ratio = "-"
        if best is not None and DEFAULT in means:
            ratio = f"{means[DEFAULT] / seq[best]:.2f}" if seq[best] > 0 else ("=" if means[DEFAULT] == 0 else "∞")
        cells = [_cell(r["counts"].get(k, []), r["runs"]) for k in labels]
        part = "**T**" if r["part"] == "tuning" else "R"
        out.append(f"| {r['point']} | {part} | {r['setting']} | {r['stats']['median_degree']:g} | "
                   + " | ".join(cells) + f" | {best or '-'} | {ratio} |")
    return "\n".join(out)


def merge_rows(rows: list[dict]) -> list[dict]:
    """Rows of the same (point, setting) from several runs of the script, their methods' counts merged
    (a later file's method replaces an earlier's), in the grid's order."""
    merged: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["point"], r["setting"])
        if key in merged:
            for field in ("counts", "seconds"):
                merged[key][field] = {**merged[key][field], **r[field]}
        else:
            merged[key] = {**r, "counts": dict(r["counts"]), "seconds": dict(r["seconds"])}
    order = {p.name: k for k, p in enumerate(grid_points() + shared_points())}
    return sorted(merged.values(), key=lambda r: (order.get(r["point"], len(order)), r["setting"]))


def summary(rows: list[dict], labels: list[str]) -> list[str]:
    """Per part (tuning, report grid, shared datasets) and label: pairs at or above the best sequential
    method (by mean), the smallest ratio and where, the geometric mean of the ratios, and the range of
    the ratio to ``mad2r``. Pairs where every sequential method released nothing are left out."""
    out = []
    parts = {"tuning": lambda r: r["part"] == "tuning",
             "report (grid)": lambda r: r["part"] == "report" and r["users"] > 0,
             "report (shared)": lambda r: r["users"] == 0}
    for part, keep in parts.items():
        for label in labels:
            ratios, mad = [], []
            for r in rows:
                if not keep(r) or not r["counts"].get(label):
                    continue
                mean = statistics.mean(r["counts"][label])
                seq = max((statistics.mean(r["counts"][k]) for k in SEQUENTIAL if r["counts"].get(k)), default=0.0)
                if seq > 0:
                    ratios.append((mean / seq, f"{r['point']} ({r['setting']})"))
                if r["counts"].get("mad2r") and statistics.mean(r["counts"]["mad2r"]) > 0:
                    mad.append(mean / statistics.mean(r["counts"]["mad2r"]))
            if not ratios:
                continue
            low = min(ratios)
            geo = math.exp(statistics.mean(math.log(max(x, 1e-9)) for x, _ in ratios))
            wins = sum(x >= 1 for x, _ in ratios)
            mad_text = f"; / mad2r {min(mad):.2f}-{max(mad):.2f}" if mad else ""
            out.append(f"{part}, {label}: >= best sequential on {wins}/{len(ratios)}; ratio {low[0]:.2f} "
                       f"(lowest, {low[1]}) to {max(ratios)[0]:.2f} (highest, {max(ratios)[1]}); geometric mean "
                       f"{geo:.2f}{mad_text}")
    return out


def choose_d0(rows: list[dict], candidates: list[str]) -> list[tuple[str, float, float, int]]:
    """The declared rule on the tuning rows: per candidate (min ratio, geometric mean ratio, pairs) to the
    best sequential method, best first (max of the min, then of the geometric mean, then the smaller d0).

    Pairs where every sequential method released nothing (mean 0) are left out.
    """
    scored = []
    for label in candidates:
        ratios = []
        for r in rows:
            if r["part"] != "tuning" or not r["counts"].get(label):
                continue
            seq = max((statistics.mean(r["counts"][k]) for k in SEQUENTIAL if r["counts"].get(k)), default=0.0)
            if seq > 0:
                ratios.append(statistics.mean(r["counts"][label]) / seq)
        if ratios:
            geo = math.exp(statistics.mean(math.log(max(x, 1e-9)) for x in ratios))
            scored.append((label, min(ratios), geo, len(ratios)))
    return sorted(scored, key=lambda x: (-x[1], -x[2], int(x[0].rpartition("_d")[2]) if x[0].startswith("split") else 0))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["tuning", "report", "all"], default="all")
    ap.add_argument("--points", help="comma-separated point names (default: every point of --part)")
    ap.add_argument("--sizes", help="comma-separated numbers of users to keep (e.g. 1000,10000)")
    ap.add_argument("--shared", action="store_true", help="also the shared datasets (report part)")
    ap.add_argument("--shared-only", action="store_true")
    ap.add_argument("--methods", default=",".join(METHODS), help="labels; split_d<d0> for the prototype")
    ap.add_argument("--settings", default="a,b")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--cache", default=tempfile.gettempdir())
    ap.add_argument("--json", help="append the results (one JSON line per point and setting) to this file")
    ap.add_argument("--list", action="store_true", help="list the grid and its split, then stop")
    ap.add_argument("--describe", action="store_true", help="generate and describe the points, then stop")
    ap.add_argument("--doubt", help="low,high: per point, the mean number of items with low..high holders "
                    "held by a user holding one (a diagnostic), then stop")
    ap.add_argument("--table", nargs="+", help="print the markdown table of these JSON files, then stop")
    ap.add_argument("--choose", action="store_true", help="with --table: score the split_d<d0> labels by the "
                    "declared rule on the tuning rows")
    args = ap.parse_args(argv)
    labels = args.methods.split(",")
    if args.table:
        rows = merge_rows([json.loads(line) for f in args.table for line in Path(f).read_text().splitlines()
                           if line.strip()])
        present = [k for k in labels if any(k in r["counts"] for r in rows)]
        print(table(rows, present))
        for line in summary(rows, [k for k in present if k == DEFAULT or k.startswith("split")]):
            print(line)
        if args.choose:
            for label, low, geo, n in choose_d0(rows, [k for k in present if k.startswith("split")] + [DEFAULT]):
                print(f"{label}: min ratio {low:.3f}, geometric mean {geo:.3f} over {n} tuning pairs")
        return
    points = [] if args.shared_only else grid_points()
    if args.part != "all":
        points = [p for p in points if p.part == args.part]
    if args.points:
        wanted = args.points.split(",")
        points = [p for p in grid_points() if p.name in wanted]
    if args.sizes:
        sizes = {int(float(x)) for x in args.sizes.split(",")}
        points = [p for p in points if p.users in sizes]
    if args.shared or args.shared_only:
        points += shared_points()
    if args.list:
        for p in points:
            print(f"{p.name:24s} {p.part}")
        return
    cache = Path(args.cache)
    if args.doubt:
        low, high = (int(x) for x in args.doubt.split(","))
        for p in points:
            print(f"{p.name} {p.part} {in_doubt(table_path(p, cache), low, high):.2f}", flush=True)
        return
    if args.describe:
        for p in points:
            print(p.name, p.part, json.dumps(describe(table_path(p, cache))), flush=True)
        return
    warnings.simplefilter("ignore")
    print(f"load {os.getloadavg()[0]:.1f}; runs {args.runs}; {len(points)} points; methods {labels}", flush=True)
    all_rows = []
    for p in points:
        rows = run_point(p, labels, args.settings.split(","), args.runs, args.threads, cache, args.max_seconds,
                         lambda s: print(s, flush=True))
        all_rows += rows
        if args.json:
            with open(args.json, "a") as fh:
                for r in rows:
                    fh.write(json.dumps(r) + "\n")
    print(table(all_rows, labels))


if __name__ == "__main__":
    main()
