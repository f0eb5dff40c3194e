"""Benchmark: dp_group_by (count per item) against PipelineDP's aggregate and against dp_set_union.

Three modes:

* ``real`` (dpsql): on each real dataset (Parquet ``user_id, item``, one row per distinct pair),
  ``reps`` releases of ``dp_group_by(..., aggregates := ['count'])`` at (epsilon, delta,
  max_items), selection ``--selection`` (default the project's default method) at split 0.5;
  reports items released and the median relative error ``|noisy - true| / true`` of the counts
  (true = distinct users per item, uncapped). Also ``count_laplace`` selection (count
  thresholding, what the peers do) through the same macro.
* ``pipeline-dp`` (run with an interpreter that has ``pipeline-dp`` and ``pyarrow``): PipelineDP's
  ``DPEngine.aggregate`` with ``PRIVACY_ID_COUNT``, Laplace noise, private partition selection
  (``TRUNCATED_GEOMETRIC``), ``max_partitions_contributed = max_items``,
  ``max_contributions_per_partition = 1``, ``NaiveBudgetAccountant(epsilon, delta)`` (which splits
  epsilon equally between the selection and the count: the same split as dp_group_by's default).
  Same two numbers.
* ``cost`` (dpsql): ``dp_set_union`` (default method) against ``dp_group_by`` (count; and count,
  sum, mean of a value column) on the Zipfian table of ``zipf_data.py``, interleaved, after one
  warm-up each; median seconds.
* ``accuracy`` (dpsql): the count per group of ``dp_group_by`` with every default but the noise and the
  aggregates' cap, on each real dataset: Laplace noise, and Gaussian noise with ``max_groups`` in
  ``--max-groups`` (``0`` stands for the default, NULL = ``max_items``); per configuration the items
  released, the median relative error ``|noisy - true| / true`` of the released counts (true = distinct
  users per item, uncapped), the same among the 20 items most users hold, and the 95 % half-width the
  release reports. Each configuration's ``reps`` releases run on one connection, interleaved with the
  others'. ``--baseline``: only the defaults, with the script's parameters a dpsql before Gaussian
  aggregates takes (run with that checkout first on ``PYTHONPATH``): the old default.

    python benchmarks/bench_group_by.py real --data DIR [--max-items 10 100] [--reps 3]
    python benchmarks/bench_group_by.py accuracy --data DIR [--max-groups 0 10 1] [--reps 3] [--baseline]
    PYDP_PYTHON benchmarks/bench_group_by.py pipeline-dp --data DIR [--max-items 10 100] [--reps 3]
* ``selection`` (dpsql): the count per group under each way of selecting the groups -- the default
  set-union selection (``sips_cumulative``), ``truncated_geometric`` and ``post_threshold`` -- at ``max_groups``
  in ``--max-groups`` (``0``: the default, ``max_items`` = 100) and at each ``(epsilon, delta)`` of
  ``--settings``, on each real dataset and on a synthetic table where every user holds one item (``--synthetic``
  users; user ``u`` holds item ``floor(f^-2)``, ``f = frac((u + 0.5) phi)``: item ``k`` has about ``N k^-1.5 / 2``
  users). Per configuration: items released, the median relative error of the released counts (true =
  distinct users per item, uncapped) and among the 20 items most users hold; ``reps`` releases each, the
  configurations interleaved on one connection.

    python benchmarks/bench_group_by.py cost [--rows 10000000] [--reps 3]
    python benchmarks/bench_group_by.py selection --data DIR [--max-groups 1 3 0] [--reps 2] [--synthetic 200000]
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

HERE = Path(__file__).resolve().parent

DATASETS = ("reddit_askreddit_1pct/unigrams", "reddit_askreddit_1pct/bigrams", "health_news_tweets/tweet_tokens",
            "debian_bookworm_descriptions/package_description_tokens")


def _median_rel_error(noisy: dict, truth: dict, among=None) -> float:
    errs = [abs(v - truth[k]) / truth[k] for k, v in noisy.items() if truth.get(k) and (among is None or k in among)]
    return statistics.median(errs) if errs else float("nan")


def _top(truth: dict, n: int = 20) -> set:
    """The n items most users hold (ties by name): a set on which every engine's error is comparable."""
    return {k for k, _ in sorted(truth.items(), key=lambda kv: (-kv[1], str(kv[0])))[:n]}


def run_real(args) -> list[dict]:
    sys.path.insert(0, str(HERE.parent))
    import dpsql

    out = []
    for name in args.datasets:
        path = Path(args.data) / f"{name}.parquet"
        con = dpsql.connect()
        con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
        truth = dict(con.execute("SELECT item, count(DISTINCT user_id) FROM t GROUP BY item").fetchall())
        top = _top(truth)
        for max_items in args.max_items:
            for selection in (args.selection, "count_laplace"):
                released, errors, top_errors, seconds = [], [], [], []
                for _ in range(args.reps):
                    started = time.perf_counter()
                    rows = con.execute(
                        f"SELECT item, \"count\" FROM dp_group_by('t', epsilon := {args.epsilon}, delta := {args.delta}, "
                        f"max_items := {max_items}, selection := '{selection}')").fetchall()
                    seconds.append(time.perf_counter() - started)
                    released.append(len(rows))
                    errors.append(_median_rel_error(dict(rows), truth))
                    top_errors.append(_median_rel_error(dict(rows), truth, top))
                out.append({"engine": "dpsql", "dataset": name, "max_items": max_items, "selection": selection,
                            "released": statistics.mean(released), "median_rel_error": statistics.mean(errors),
                            "median_rel_error_top20": statistics.mean(top_errors),
                            "seconds": statistics.median(seconds)})
                print(json.dumps(out[-1]), flush=True)
        con.close()
    return out


def run_pipeline_dp(args) -> list[dict]:
    import pipeline_dp
    import pyarrow.parquet as pq

    out = []
    for name in args.datasets:
        table = pq.read_table(Path(args.data) / f"{name}.parquet", columns=["user_id", "item"])
        rows = list(zip(table.column("user_id").to_pylist(), table.column("item").to_pylist()))
        truth: dict = {}
        for _, item in set(rows):
            truth[item] = truth.get(item, 0) + 1
        top = _top(truth)
        for max_items in args.max_items:
            released, errors, top_errors, seconds = [], [], [], []
            for _ in range(args.reps):
                started = time.perf_counter()
                accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=args.epsilon, total_delta=args.delta)
                engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
                params = pipeline_dp.AggregateParams(
                    noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT],
                    max_partitions_contributed=max_items, max_contributions_per_partition=1,
                    partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.TRUNCATED_GEOMETRIC)
                extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                                        partition_extractor=lambda r: r[1],
                                                        value_extractor=lambda r: 0)
                result = engine.aggregate(rows, params, extractors)
                accountant.compute_budgets()
                noisy = {k: v.privacy_id_count for k, v in result}
                seconds.append(time.perf_counter() - started)
                released.append(len(noisy))
                errors.append(_median_rel_error(noisy, truth))
                top_errors.append(_median_rel_error(noisy, truth, top))
            out.append({"engine": "pipeline_dp", "dataset": name, "max_items": max_items,
                        "selection": "truncated_geometric", "released": statistics.mean(released),
                        "median_rel_error": statistics.mean(errors),
                            "median_rel_error_top20": statistics.mean(top_errors), "seconds": statistics.median(seconds)})
            print(json.dumps(out[-1]), flush=True)
    return out


def run_accuracy(args) -> list[dict]:
    sys.path.insert(0, str(HERE.parent))
    import dpsql

    if args.baseline:  # a dpsql before Gaussian aggregates (no noise, no max_groups): its defaults only
        configs = [("baseline: the defaults of this dpsql", None, None)]
    else:
        configs = [("laplace, max_groups default (= max_items)", "laplace", None)]
        configs += [(f"gaussian, max_groups {'default (= max_items)' if g == 0 else g}", "gaussian", g or None)
                    for g in args.max_groups]
    out = []
    for name in args.datasets:
        path = Path(args.data) / f"{name}.parquet"
        con = dpsql.connect()
        con.execute("SET enable_progress_bar = false")
        con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
        truth = dict(con.execute("SELECT item, count(DISTINCT user_id) FROM t GROUP BY item").fetchall())
        top = _top(truth)
        runs: dict = {label: {"released": [], "err": [], "top": [], "ci": []} for label, _, _ in configs}
        for _ in range(args.reps):
            for label, noise, groups in configs:
                rows = con.execute(
                    f"SELECT item, \"count\", count_ci FROM dp_group_by('t', epsilon := {args.epsilon}, "
                    f"delta := {args.delta}" + (f", noise := '{noise}'" if noise else "")
                    + (f", max_groups := {groups}" if groups else "") + ")").fetchall()
                noisy = {r[0]: r[1] for r in rows}
                runs[label]["released"].append(len(rows))
                runs[label]["err"].append(_median_rel_error(noisy, truth))
                runs[label]["top"].append(_median_rel_error(noisy, truth, top))
                runs[label]["ci"].append(rows[0][2] if rows else float("nan"))
        for label, _, _ in configs:
            r = runs[label]
            out.append({"dataset": name, "config": label, "released": statistics.mean(r["released"]),
                        "median_rel_error": statistics.mean(r["err"]),
                        "median_rel_error_top20": statistics.mean(r["top"]),
                        "count_ci": statistics.mean(r["ci"])})
            print(json.dumps(out[-1]), flush=True)
        con.close()
    return out


SELECTION_RULES = ("sips_cumulative", "truncated_geometric", "post_threshold")


def _one_item_per_user(con, users: int) -> None:
    """Table ``t``: user u holds the one item floor(f^-2), f = frac((u + 0.5) * golden ratio) (deterministic)."""
    con.execute(f"CREATE OR REPLACE TABLE t AS SELECT u AS user_id, "
                f"'k' || floor(pow(((u + 0.5) * 0.6180339887498949) % 1.0, -2.0))::BIGINT AS item "
                f"FROM range({users}) r(u)")


def run_selection(args) -> list[dict]:
    sys.path.insert(0, str(HERE.parent))
    import dpsql

    settings = [tuple(float(x) for x in s.split(",")) for s in args.settings]
    sources = [(name, Path(args.data) / f"{name}.parquet") for name in args.datasets]
    sources.append((f"synthetic: one item per user ({args.synthetic} users)", None))
    out = []
    for name, path in sources:
        con = dpsql.connect()
        con.execute("SET enable_progress_bar = false")
        if path is None:
            _one_item_per_user(con, args.synthetic)
        else:
            con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
        truth = dict(con.execute("SELECT item, count(DISTINCT user_id) FROM t GROUP BY item").fetchall())
        top = _top(truth)
        configs = [(eps, dlt, g, sel) for eps, dlt in settings for g in args.max_groups for sel in SELECTION_RULES]
        runs: dict = {c: {"released": [], "err": [], "top": [], "s": []} for c in configs}
        for _ in range(args.reps):
            for eps, dlt, g, sel in configs:
                started = time.perf_counter()
                rows = con.execute(
                    f"SELECT item, \"count\" FROM dp_group_by('t', epsilon := {eps!r}, delta := {dlt!r}, "
                    f"selection := '{sel}'" + (f", max_groups := {g}" if g else "") + ")").fetchall()
                r = runs[(eps, dlt, g, sel)]
                r["s"].append(time.perf_counter() - started)
                noisy = dict(rows)
                r["released"].append(len(rows))
                r["err"].append(_median_rel_error(noisy, truth))
                r["top"].append(_median_rel_error(noisy, truth, top))
        for (eps, dlt, g, sel), r in runs.items():
            out.append({"dataset": name, "epsilon": eps, "delta": dlt, "max_groups": g or "default (100)",
                        "selection": sel, "released": statistics.mean(r["released"]),
                        "median_rel_error": statistics.mean(r["err"]),
                        "median_rel_error_top20": statistics.mean(r["top"]), "seconds": statistics.median(r["s"])})
            print(json.dumps(out[-1]), flush=True)
        con.close()
    return out


COST_QUERIES = {
    "set_union": "SELECT count(*) FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5, max_items := 100)",
    "group_by_count": "SELECT count(*) FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, max_items := 100)",
    "group_by_count_sum_mean": (
        "SELECT count(*) FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, max_items := 100, "
        "aggregates := ['count', 'sum', 'mean'], value_col := 'v', lower := 0, upper := 100)"),
}


def run_cost(args) -> list[dict]:
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    import dpsql
    import zipf_data

    con = dpsql.connect()
    con.execute("SET enable_progress_bar = false")
    zipf_data.generate(con, "t_generated", args.rows)
    con.execute("CREATE TABLE t AS SELECT user_id, item, (hash(user_id, item) % 101)::DOUBLE AS v FROM t_generated")
    con.execute("DROP TABLE t_generated")
    times: dict[str, list[float]] = {k: [] for k in COST_QUERIES}
    for rep in range(args.reps + 1):
        for name, sql in COST_QUERIES.items():
            started = time.perf_counter()
            con.execute(sql).fetchall()
            if rep:  # rep 0 is the warm-up
                times[name].append(time.perf_counter() - started)
    con.close()
    base = statistics.median(times["set_union"])
    out = [{"query": k, "median_s": statistics.median(v), "vs_set_union": statistics.median(v) / base, "runs": v}
           for k, v in times.items()]
    for row in out:
        print(json.dumps(row), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["real", "pipeline-dp", "cost", "accuracy", "selection"])
    ap.add_argument("--data", help="folder of the real datasets (<dataset>/<file>.parquet)")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("--max-items", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--selection", default="mad2r")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--max-groups", type=int, nargs="+", default=[0, 10, 1],
                    help="accuracy: the Gaussian configurations' max_groups (0: the default)")
    ap.add_argument("--settings", nargs="+", default=["1,1e-5", f"3,{math.exp(-10)!r}"],
                    help="selection: the (epsilon,delta) settings")
    ap.add_argument("--synthetic", type=int, default=200_000, help="selection: users of the one-item table")
    ap.add_argument("--baseline", action="store_true",
                    help="accuracy: only dp_group_by's defaults, for a dpsql before Gaussian aggregates "
                         "(run it with that checkout first on the path)")
    args = ap.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result = {"real": run_real, "pipeline-dp": run_pipeline_dp, "cost": run_cost,
              "accuracy": run_accuracy, "selection": run_selection}[args.mode](args)
    print(json.dumps({"mode": args.mode, "started": started, "machine": platform.machine(),
                      "cpus": os.cpu_count(), "load": os.getloadavg(), "results": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
