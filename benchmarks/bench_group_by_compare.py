"""Benchmark: private GROUP BY item, COUNT(DISTINCT user_id), side by side with other DP libraries.

Every engine releases, on one shared dataset (Parquet ``user_id, item``, one row per distinct pair), the
items it selects privately (no public key list) and a noisy count of distinct users per selected item,
at the same (epsilon, delta) and the same contribution bounds: each user counts in at most ``L0``
(``--max-groups``) items, at most once per item; the privacy unit is the user. Engines:

* ``dpsql``: ``dpsql.group_by(con, t, epsilon, delta, max_items=L0)``, every default (selection by
  dp_group_by's default at (epsilon/2, delta), the count with Gaussian noise, composed with the selection
  by zCDP; since issue 34 point 3 that default is chosen per setting: the truncated geometric coin at
  ``L0 = 1``, else the project's default set-union method, which every ``dpsql`` row recorded before used;
  ``dpsql_sips_cumulative`` pins it, to reproduce those rows); ``dpsql_laplace``: the same with ``noise='laplace'``;
  ``dpsql_truncated_geometric``: the same with ``selection='truncated_geometric'`` (dpsql's per-group
  coin, the rule PipelineDP uses by default).
* ``pipeline_dp_laplace`` / ``pipeline_dp_gaussian``: PipelineDP ``DPEngine.aggregate`` with
  ``PRIVACY_ID_COUNT``, private partition selection (its default strategy, ``TRUNCATED_GEOMETRIC``),
  ``max_partitions_contributed = L0``, ``max_contributions_per_partition = 1``,
  ``NaiveBudgetAccountant(epsilon, delta)`` (the budgets it chose are recorded with each run).
* ``tumult``: Tumult Analytics ``Session`` over ``AddRowsWithID('user_id')`` with
  ``ApproxDPBudget(epsilon, delta)``: ``get_groups(['item'])`` after ``MaxRowsPerID(L0)`` at
  (epsilon/2, delta), then ``groupby(keys).count()`` after ``MaxGroupsPerID`` and
  ``MaxRowsPerGroupPerID('item', 1)`` at (epsilon/2, 0) (Laplace).
* ``opendp``: OpenDP's Polars front end, ``Context.compositor`` with ``unit_of(contributions=1,
  identifier=user_id)``, ``loss_of(epsilon, delta)``, one query: ``truncate_per_group(1)``,
  ``truncate_num_groups(L0, keep='first')``, ``group_by('item').agg(dp.len())`` with no keys (the keys
  are released by a threshold on the same noisy count that is published). In opendp 0.16.0 that
  truncation keeps each user's alphabetically first ``L0 - 1`` items (none at ``L0 = 1``).
* ``smartnoise``: SmartNoise SQL over pandas, ``SELECT item, COUNT(DISTINCT user_id) ... GROUP BY item``
  with ``max_ids = L0``, ``censor_dims`` (its thresholding), ``Privacy(epsilon', delta)`` where epsilon' is
  set so that the reader's own ``get_privacy_cost`` of the query equals (epsilon, delta).

Metrics per run: items released, median relative error ``|noisy - true| / true`` over the released items
(true = distinct users per item, uncapped), wall seconds. ``report`` adds the error at equal items: over
the N items most users hold, N = the smallest median number released among the engines at that setting,
among engines that release any; an item an engine did not release counts as error 1 (a count of 0).

Each engine runs in the interpreter that has its library (they pin conflicting versions); every run
writes one JSON line to ``--out``. Comparison libraries are imported only by their own engine.

    python benchmarks/bench_group_by_compare.py run --engine dpsql --data DIR --out runs.jsonl
    PIPELINE_DP_PYTHON benchmarks/bench_group_by_compare.py run --engine pipeline_dp_laplace ...
    python benchmarks/bench_group_by_compare.py report runs.jsonl
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

HERE = Path(__file__).resolve().parent

DATASETS = ("reddit_askreddit_1pct/unigrams", "reddit_askreddit_1pct/bigrams", "health_news_tweets/tweet_tokens",
            "debian_bookworm_descriptions/package_description_tokens")
SETTINGS = ("1:1e-5", f"3:{math.exp(-10)!r}")
ENGINES = ("dpsql", "dpsql_laplace", "dpsql_truncated_geometric", "dpsql_sips_cumulative", "pipeline_dp_laplace",
           "pipeline_dp_gaussian", "tumult", "opendp", "smartnoise")

Pairs = Tuple[List[str], List[str]]  # user ids, items (one entry per distinct pair)
Noisy = Dict[str, float]
LAST_INFO: Dict[str, Any] = {}  # what an engine chose (its budgets), stored with the run


def load(path: Path) -> Pairs:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["user_id", "item"])
    return table.column("user_id").to_pylist(), table.column("item").to_pylist()


def truth_of(items: List[str]) -> Dict[str, int]:
    """Distinct users per item: the rows are distinct (user, item) pairs, so rows per item."""
    out: Dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


# ---------------------------------------------------------------- engines: (path, pairs, eps, delta, L0) -> noisy


def run_dpsql(path: Path, pairs: Pairs, eps: float, delta: float, l0: int, noise: str | None = None,
              **options: Any) -> Noisy:
    import dpsql

    con = dpsql.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
    rows = dpsql.group_by(con, "t", epsilon=eps, delta=delta, max_items=l0, noise=noise, **options)
    con.close()
    return dict(zip(rows.column("item").to_pylist(), rows.column("count").to_pylist()))


def run_pipeline_dp(path: Path, pairs: Pairs, eps: float, delta: float, l0: int, noise: str) -> Noisy:
    import pipeline_dp

    rows = list(zip(*pairs))
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=eps, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE if noise == "laplace" else pipeline_dp.NoiseKind.GAUSSIAN,
        metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT], max_partitions_contributed=l0,
        max_contributions_per_partition=1,
        partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.TRUNCATED_GEOMETRIC)
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                                            value_extractor=lambda r: 0)
    result = engine.aggregate(rows, params, extractors)
    accountant.compute_budgets()
    noisy = {k: float(v.privacy_id_count) for k, v in result}
    LAST_INFO["budgets"] = [{"eps": m.mechanism_spec.eps, "delta": m.mechanism_spec.delta,
                             "kind": m.mechanism_spec.mechanism_type.name} for m in accountant._mechanisms]
    return noisy


_SPARK: Any = None


def _spark() -> Any:
    global _SPARK
    if _SPARK is None:
        from pyspark.sql import SparkSession

        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers need this interpreter's tmlt
        _SPARK = (SparkSession.builder.master("local[2]").appName("dpsql-compare")
                  .config("spark.driver.memory", "6g").config("spark.sql.shuffle.partitions", "8")
                  .config("spark.ui.enabled", "false").getOrCreate())
        _SPARK.sparkContext.setLogLevel("ERROR")
    return _SPARK


def run_tumult(path: Path, pairs: Pairs, eps: float, delta: float, l0: int) -> Noisy:
    from tmlt.analytics import (AddRowsWithID, ApproxDPBudget, KeySet, MaxGroupsPerID, MaxRowsPerGroupPerID,
                                MaxRowsPerID, PureDPBudget, QueryBuilder, Session)

    spark = _spark()
    df = spark.read.parquet(str(path)).select("user_id", "item")
    session = Session.from_dataframe(privacy_budget=ApproxDPBudget(eps, delta), source_id="t", dataframe=df,
                                     protected_change=AddRowsWithID("user_id"))
    # get_groups needs a bound on rows per ID: L0 rows of distinct (user, item) pairs = L0 items, once each
    groups_query = QueryBuilder("t").enforce(MaxRowsPerID(l0)).get_groups(["item"])
    keys_df = session.evaluate(groups_query, ApproxDPBudget(eps / 2, delta))
    keys = KeySet.from_dataframe(keys_df)
    count_query = (QueryBuilder("t").enforce(MaxGroupsPerID("item", l0)).enforce(MaxRowsPerGroupPerID("item", 1))
                   .groupby(keys).count("n"))
    out = session.evaluate(count_query, PureDPBudget(eps / 2))
    return {r["item"]: float(r["n"]) for r in out.collect()}


def run_opendp(path: Path, pairs: Pairs, eps: float, delta: float, l0: int) -> Noisy:
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    # truncate_num_groups(keep='sample') fails in this polars ("multiple fields with name 'item'"), so
    # keep='first'. In opendp 0.16.0 that is filter(struct(item).rank('dense').over(user_id) < L0): each
    # user keeps its alphabetically first items (by value, not row order: the shuffle below changes
    # nothing), and, polars' dense ranks starting at 1, only L0 - 1 of them (none at L0 = 1) while the
    # noise is calibrated to L0. Measured as the library does it; benchmarks/README.md states it.
    rows = pl.read_parquet(path, columns=["user_id", "item"]).sample(fraction=1.0, shuffle=True)
    context = dp.Context.compositor(
        data=rows.lazy(),
        privacy_unit=dp.unit_of(contributions=1, identifier=pl.col("user_id")),
        privacy_loss=dp.loss_of(epsilon=eps, delta=delta), split_evenly_over=1)
    query = (context.query().truncate_per_group(1, by=["item"], keep="first")
             .truncate_num_groups(l0, by=["item"], keep="first")
             .group_by("item").agg(dp.len()))
    out = query.release().collect()
    return dict(zip(out["item"].to_list(), [float(v) for v in out["len"].to_list()]))


def run_smartnoise(path: Path, pairs: Pairs, eps: float, delta: float, l0: int) -> Noisy:
    import pandas as pd
    import snsql
    from snsql import Privacy

    df = pd.DataFrame({"user_id": pairs[0], "item": pairs[1]})
    metadata = {"": {"": {"t": {"row_privacy": False, "max_ids": l0, "censor_dims": True, "rows": len(df),
                                "user_id": {"type": "string", "private_id": True},
                                "item": {"type": "string"}}}}}
    query = "SELECT item, COUNT(DISTINCT user_id) AS n FROM t GROUP BY item"
    # The reader charges epsilon per measured column (the count and the censoring's key count): find the
    # per-column epsilon whose total cost is the benchmark's epsilon.
    privacy = Privacy(epsilon=eps, delta=delta)
    for _ in range(20):  # rescale until the reported cost is within (eps, delta) (it is not linear in delta)
        reader = snsql.from_df(df, privacy=privacy, metadata=metadata)
        cost_eps, cost_delta = reader.get_privacy_cost(query)
        if cost_eps <= eps * (1 + 1e-12) and cost_delta <= delta:
            break
        privacy = Privacy(epsilon=privacy.epsilon * min(1.0, eps / cost_eps),
                          delta=privacy.delta * min(1.0, delta / cost_delta) * (0.999 if cost_delta > delta else 1))
    else:
        raise RuntimeError("smartnoise: no per-column budget within the total")
    LAST_INFO["cost"] = list(reader.get_privacy_cost(query))
    LAST_INFO["per_column"] = [privacy.epsilon, privacy.delta]
    out = reader.execute_df(query)
    return dict(zip(out["item"].astype(str), out["n"].astype(float)))


RUNNERS: Dict[str, Callable[[Path, Pairs, float, float, int], Noisy]] = {
    "dpsql": lambda p, d, e, dl, l0: run_dpsql(p, d, e, dl, l0),
    "dpsql_laplace": lambda p, d, e, dl, l0: run_dpsql(p, d, e, dl, l0, noise="laplace"),
    "dpsql_truncated_geometric": lambda p, d, e, dl, l0: run_dpsql(p, d, e, dl, l0, selection="truncated_geometric"),
    "dpsql_sips_cumulative": lambda p, d, e, dl, l0: run_dpsql(p, d, e, dl, l0, selection="sips_cumulative"),
    "pipeline_dp_laplace": lambda p, d, e, dl, l0: run_pipeline_dp(p, d, e, dl, l0, "laplace"),
    "pipeline_dp_gaussian": lambda p, d, e, dl, l0: run_pipeline_dp(p, d, e, dl, l0, "gaussian"),
    "tumult": run_tumult,
    "opendp": run_opendp,
    "smartnoise": run_smartnoise,
}


def _versions(engine: str) -> Dict[str, str]:
    from importlib import metadata

    names = {"dpsql": ["dpsql", "duckdb"], "dpsql_laplace": ["dpsql", "duckdb"],
             "dpsql_truncated_geometric": ["dpsql", "duckdb"], "dpsql_sips_cumulative": ["dpsql", "duckdb"],
             "pipeline_dp_laplace": ["pipeline-dp", "python-dp"], "pipeline_dp_gaussian": ["pipeline-dp", "python-dp"],
             "tumult": ["tmlt.analytics", "tmlt.core", "pyspark"], "opendp": ["opendp", "polars"],
             "smartnoise": ["smartnoise-sql", "pandas"]}[engine]
    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "?"
    return out


def median_rel_error(noisy: Noisy, truth: Dict[str, int], among: List[str] | None = None) -> float:
    """Median of |noisy - true| / true over the released items (or over ``among``, unreleased = error 1)."""
    if among is None:
        errs = [abs(v - truth[k]) / truth[k] for k, v in noisy.items() if truth.get(k)]
    else:
        errs = [abs(noisy.get(k, 0.0) - truth[k]) / truth[k] for k in among]
    return statistics.median(errs) if errs else float("nan")


def ranked(truth: Dict[str, int]) -> List[str]:
    """Items by number of users, most first (ties by name): the public order of the equal-items metric."""
    return [k for k, _ in sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))]


def run(args: argparse.Namespace) -> int:
    if args.engine.startswith("dpsql"):
        sys.path.insert(0, str(HERE.parent))
    runner = RUNNERS[args.engine]
    versions = _versions(args.engine)
    for name in args.datasets:
        path = Path(args.data) / f"{name}.parquet"
        pairs = load(path)
        truth = truth_of(pairs[1])
        top = ranked(truth)[:args.keep_top]
        for setting in args.settings:
            eps, delta = (float(x) for x in setting.split(":"))
            for l0 in args.max_groups:
                for rep in range(args.reps):
                    started = time.perf_counter()
                    noisy = runner(path, pairs, eps, delta, l0)
                    seconds = time.perf_counter() - started
                    # per rank of the top items: the engine's count (None: not released), for `report`
                    row = {"engine": args.engine, "dataset": name, "epsilon": eps, "delta": delta, "max_groups": l0,
                           "rep": rep, "released": len(noisy), "median_rel_error": median_rel_error(noisy, truth),
                           "seconds": round(seconds, 2), "top_true": [truth[k] for k in top],
                           "top_noisy": [noisy.get(k) for k in top], "versions": versions,
                           "load": os.getloadavg(),
                           "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
                    row.update(LAST_INFO)
                    LAST_INFO.clear()
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    print(json.dumps({k: v for k, v in row.items() if not k.startswith("top_")}), flush=True)
    if _SPARK is not None:
        _SPARK.stop()
    return 0


SHORT = {"reddit_askreddit_1pct/unigrams": "AskReddit unigrams", "reddit_askreddit_1pct/bigrams": "AskReddit bigrams",
         "health_news_tweets/tweet_tokens": "health tweets",
         "debian_bookworm_descriptions/package_description_tokens": "Debian descriptions"}


def _fmt(values: List[float], digits: int = 3) -> str:
    """Median (min-max) of the runs that have a value; '-' when none has (no item released)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return f"{med:.{digits}g}"
    return f"{med:.{digits}g} ({min(values):.{digits}g}–{max(values):.{digits}g})"


def report(args: argparse.Namespace) -> int:
    rows = [json.loads(line) for path in args.files for line in open(path) if line.strip()]
    rows = [r for r in rows if args.max_groups is None or r["max_groups"] in args.max_groups]
    by_cell: Dict[tuple, Dict[str, List[dict]]] = {}
    for r in rows:
        by_cell.setdefault((r["dataset"], r["epsilon"], r["delta"], r["max_groups"]), {}).setdefault(
            r["engine"], []).append(r)
    print("| dataset | (ε, δ) | L0 | engine | runs | items released | median rel. error | N | error, top N "
          "| s/run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    order = {d: i for i, d in enumerate(DATASETS)}
    for (dataset, eps, delta, l0), engines in sorted(by_cell.items(), key=lambda kv: (order.get(kv[0][0], 99),) + kv[0][1:]):
        # N: the fewest items an engine releases (median over its runs), among engines that release any
        n = min([m for m in (int(statistics.median(r["released"] for r in runs)) for runs in engines.values())
                 if m > 0], default=0)
        for engine in [e for e in ENGINES if e in engines]:
            runs = engines[engine]
            at_n = []
            for r in runs:
                k = min(n, len(r["top_true"]))
                errs = [abs((v if v is not None else 0.0) - t) / t for t, v in zip(r["top_true"][:k], r["top_noisy"][:k])]
                at_n.append(statistics.median(errs) if errs else float("nan"))
            setting = f"({eps:g}, {delta:.3g})"
            print(f"| {SHORT.get(dataset, dataset)} | {setting} | {l0} | {engine} | {len(runs)} | "
                  f"{_fmt([r['released'] for r in runs], 4)} | {_fmt([r['median_rel_error'] for r in runs])} | "
                  f"{n} | {_fmt(at_n)} | {statistics.median(r['seconds'] for r in runs):.1f} |")
    return 0


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="one engine's runs, appended to --out as JSON lines")
    r.add_argument("--engine", choices=ENGINES, required=True)
    r.add_argument("--data", required=True, help="folder of the datasets (<dataset>/<file>.parquet)")
    r.add_argument("--datasets", nargs="+", default=list(DATASETS))
    r.add_argument("--settings", nargs="+", default=list(SETTINGS), help="epsilon:delta pairs")
    r.add_argument("--max-groups", type=int, nargs="+", default=[100], help="L0: items per user")
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--keep-top", type=int, default=5000,
                   help="how many of the most-held items to store per run (for the equal-items error)")
    r.add_argument("--out", required=True)
    p = sub.add_parser("report", help="the markdown table of the runs in the given files")
    p.add_argument("files", nargs="+")
    p.add_argument("--max-groups", type=int, nargs="+", help="only these L0 (default: every one in the files)")
    args = ap.parse_args(argv)
    return run(args) if args.mode == "run" else report(args)


if __name__ == "__main__":
    sys.exit(main())
