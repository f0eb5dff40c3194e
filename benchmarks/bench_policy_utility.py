"""Released items of the sequential policies on the shared datasets and synthetic Zipf data.

Methods (means over ``--runs`` runs, each a fresh seed):

* ``policy_laplace``, ``policy_gaussian``, ``greedy_update``: the macros (default alpha), through
  ``dpsql.set_union``; greedy_update fills each user's items in one keyed global order of the items.
* ``greedy_update_public_rank`` (zipf200k only): greedy_update with ``order_tbl`` = every item with
  ``rank`` = its id. The synthetic ids ARE popularity ranks (zipf_data.py), so this stands for a
  public popularity prior (e.g. a public frequency list); the real datasets have none, so it is skipped.
* ``greedy_update_user_order``: GreedyUpdate with the previous fill order, a keyed hash of the
  (user, item) pair per user (most repeated items first in both). Built here from the same
  kernels (``policy.run_policy``, ``policy.release`` with the windowed rule) to compare the orders.

Settings: (a) epsilon=1, delta=1e-5, max_items=100; (b) epsilon=3, delta=e^-10, max_items=100.
Datasets: the Parquet files of the shared data folder (``DPSQL_SHARED_DATA``, or ``../shared/data``
next to the repository) and ``zipf200k``: the first 200,000 users of ``zipf_data.generate`` (default
parameters, 4M rows).

    python benchmarks/bench_policy_utility.py --runs 3
    python benchmarks/bench_policy_utility.py --datasets tweets,zipf200k --settings a --runs 5 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The datasets, settings and zipf200k of the parallel-default benchmark: the two tables compare.
from bench_parallel_default import DATASETS, SETTINGS, dataset_path  # noqa: E402

METHODS = ["policy_laplace", "policy_gaussian", "greedy_update_user_order", "greedy_update",
           "greedy_update_public_rank"]


def greedy_user_order(con, seed: int, epsilon: float, delta: float) -> int:
    """Released count of GreedyUpdate with a per-user keyed fill order (the previous macro's order)."""
    from dpsql.union import policy
    from dpsql.core.noise import NoiseSource

    src = NoiseSource(seed=seed)
    s_user, s_tie = src.salt() & 0x7FFFFFFFFFFFFFFF, src.salt() & 0x7FFFFFFFFFFFFFFF
    # The same ranking as before: users by a keyed hash, then m DESC, then hash(user, item) keyed.
    keys = con.execute(f"""
        WITH e AS (SELECT user_id, item, count(*) AS m FROM t GROUP BY ALL),
        i AS (SELECT item, row_number() OVER () - 1 AS iid FROM (SELECT DISTINCT item FROM e)),
        u AS (SELECT user_id, row_number() OVER (ORDER BY hash(xor(hash(user_id), {s_user}::UBIGINT)), user_id) - 1
                     AS ord FROM (SELECT DISTINCT user_id FROM e))
        SELECT (ord << 32) | iid AS k FROM e JOIN u USING (user_id) JOIN i USING (item)
        ORDER BY ord, m DESC, hash(xor(hash(user_id, item), {s_tie}::UBIGINT)), item""").fetchnumpy()["k"]
    indptr, indices = policy.csr_from_keys(np.asarray(keys, np.int64), keep_order=True)
    gamma = policy.policy_cutoff("greedy_update", epsilon, delta, 1, policy.DEFAULT_ALPHA["greedy_update"])
    n_items = int(indices.max()) + 1 if len(indices) else 0
    H = policy.run_policy(policy.GREEDY_FILL, indptr, indices, n_items, gamma)
    return len(policy.release(H, policy.greedy_update_calibration(epsilon, delta), src, window=True))


def released(con, method: str, seed: int, epsilon: float, delta: float, max_items: int) -> int:
    import dpsql

    if method == "greedy_update_user_order":
        return greedy_user_order(con, seed, epsilon, delta)
    if method == "greedy_update_public_rank":
        con.execute("CREATE OR REPLACE TABLE public_rank AS SELECT DISTINCT item, item AS rank FROM t")
        return dpsql.set_union(con, "t", "greedy_update", epsilon=epsilon, delta=delta, order_tbl="public_rank",
                               order_col="rank").num_rows
    cap = {} if method == "greedy_update" else {"max_items": max_items}
    return dpsql.set_union(con, "t", method, epsilon=epsilon, delta=delta, **cap).num_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--settings", default="a,b")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import dpsql

    results = []
    tmp = Path(tempfile.mkdtemp(prefix="bench_policy_utility_"))
    for name in args.datasets.split(","):
        path = dataset_path(name, tmp)
        if path is None:
            print(f"{name}: absent, skipped", file=sys.stderr)
            continue
        for setting in args.settings.split(","):
            epsilon, delta, max_items = SETTINGS[setting]
            row = {"dataset": name, "setting": setting}
            for method in args.methods.split(","):
                if method == "greedy_update_public_rank" and name != "zipf200k":
                    continue  # no public popularity prior for the real datasets
                counts, t0 = [], time.perf_counter()
                for run in range(args.runs):
                    con = dpsql.connect(seed=1000 + run)
                    con.execute(f"SET threads = {args.threads}")
                    try:
                        con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
                        counts.append(released(con, method, 1000 + run, epsilon, delta, max_items))
                    finally:
                        con.close()
                row[method] = {"mean": float(np.mean(counts)), "sd": float(np.std(counts, ddof=1)) if len(counts) > 1
                               else 0.0, "runs": counts, "seconds": round(time.perf_counter() - t0, 1)}
                print(f"{name:20s} ({setting}) {method:26s} {row[method]['mean']:9.1f} +- {row[method]['sd']:6.1f} "
                      f"{counts} {row[method]['seconds']}s", flush=True)
            results.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
