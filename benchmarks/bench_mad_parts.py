"""Benchmark: the parts MAD and MAD2R cannot avoid in DuckDB SQL, against their whole queries.

Issue "Speed" asks for MAD <= 1.6x and MAD2R <= 2.0x the floor (``bench_floor.py``), or the
profile that shows a target out of reach. MAD's weights are three dependent aggregations of the
capped pairs ([MAD] Alg. 3, ``dp__mad_stage``)::

    w_init(i) = sum_{u holds i} 1/d_u                  (per item)
    e_u       = (1/d_u) sum_{i in S_u} r(w_init(i))    (per user: needs every w_init)
    w(i)      = ... + sum_{u holds i} e_u              (per item: needs every e_u)

so the capped pairs are read three times after they are formed: stored (or formed again, which
costs at least as much). MAD2R adds a second round on the pairs of the round-two items: UserWeights
(per user, then per pair) and MAD again, four more dependent aggregations. This script times, in
rotating rounds on one connection (as ``bench_floor.py``):

* the floor, Basic, MAD and MAD2R (the release macros, ``--reps`` rounds);
* ``cap_join_stored`` / ``cap_window_stored``: forming and storing the capped pairs with the two
  caps of sql/00_core/20_contribution_bounding.sql (the join is the cheaper);
* ``stage_bare``: MAD's three dependent aggregations over the stored capped pairs (per item, per
  user, per item) and the two joins that carry each result to the next, with nothing else (no
  degree test, no CASE, no noise): less than MAD needs, and none of it can be skipped by a
  formulation in GROUP BYs and joins;
* ``mad_stage``: MAD's weights as dpsql computes them (``dp__mad_stage``) on the stored pairs, plus
  the noise and threshold;
* ``round2_bare``: the round-two pairs (the stored pairs joined with MAD2R's round-two items),
  their per-user norm joined back (UserWeights, bare) and ``stage_bare`` on them;
* ``round2``: MAD2R's round two as the macro computes it, on the stored pairs and round one's
  stored noisy weights.

The stored tables are built once before the rounds (not timed), so the parts run on warm data: a
lower bound for the same work inside one query. **Lower bounds** (printed): MAD >= cap_join_stored +
stage_bare, MAD2R >= cap_join_stored + stage_bare + round2_bare.

    python benchmarks/bench_mad_parts.py --rows 10000000 --reps 5
    python benchmarks/bench_mad_parts.py --rows 50000000 --item-type VARCHAR --reps 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing
sys.path.insert(0, str(HERE))

import dpsql  # noqa: E402
from bench_set_union import FLOOR, _pct, ensure_table, machine_info, run_once  # noqa: E402

EPS, DELTA, MAX_ITEMS = 1.0, 1e-5, 100
CAL = (f"dp__mad2r_calibration({EPS}, {DELTA}, {MAX_ITEMS}, [0.1, 0.9], 50, 2, 0.5, 2.0, 1.0, 3.0, "
       "'user_id', 'item')")


def setup(con, table: str) -> None:
    """The stored inputs of the parts: MAD2R's calibration, the capped pairs, round one's noisy weights."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE bm_cal AS SELECT unnest({CAL})")
    con.execute("CREATE OR REPLACE TEMP TABLE bm_p1 AS SELECT tau1 AS tau, alpha1 AS alpha, min_degree1 AS min_degree, "
                "max_degree1 AS max_degree FROM bm_cal")
    con.execute("CREATE OR REPLACE TEMP TABLE bm_p2 AS SELECT tau2 AS tau, alpha2 AS alpha, min_degree2 AS min_degree, "
                "max_degree2 AS max_degree FROM bm_cal")
    con.execute("CREATE OR REPLACE TEMP TABLE bm_rows AS SELECT user_id, item, d, 1.0 / sqrt(d) AS uw "
                f"FROM dp__capped_user_items('{table}', max_items := {MAX_ITEMS})")
    con.execute("CREATE OR REPLACE TEMP TABLE bm_noisy1 AS SELECT item, w + dp_gaussian_noise(sigma1) AS noisy "
                "FROM dp__mad_stage('bm_rows', 'bm_p1') CROSS JOIN bm_cal")
    con.execute("CREATE OR REPLACE TEMP TABLE bm_items2 AS SELECT item, CASE WHEN noisy - lower_offset > rho2 "
                "THEN rho2 / (noisy - lower_offset) ELSE 1.0 END AS b FROM bm_noisy1 CROSS JOIN bm_cal "
                "WHERE noisy < rho1 AND noisy + upper_offset >= rho2")


def _bare_stage(rows: str, weight: str, params: str) -> str:
    """CTEs of MAD's three dependent aggregations and the two joins that carry each result to the next
    (per item, per user, per item), with nothing else: no degree window, no CASE, no noise."""
    return (f"dp__wi AS (SELECT item, sum({weight}) AS w FROM {rows} GROUP BY item), "
            f"dp__heavy AS (SELECT item, (w - tau) / w AS r FROM dp__wi CROSS JOIN {params} WHERE w > tau), "
            f"dp__e AS (SELECT user_id, sum(r) AS e FROM {rows} JOIN dp__heavy USING (item) GROUP BY user_id), "
            f"dp__w AS (SELECT item, sum(e) AS w FROM {rows} JOIN dp__e USING (user_id) GROUP BY item)")


def queries(table: str) -> dict[str, str]:
    release = f"('{table}', epsilon := {EPS}, delta := {DELTA}, max_items := {MAX_ITEMS})"
    cap = "SELECT user_id, item, d, 1.0 / sqrt(d) AS uw FROM {m}('" + table + f"', max_items := {MAX_ITEMS})"
    return {
        "floor": FLOOR.format(t=table),
        "weighted_gaussian": f"SELECT count(*) FROM dp_set_union_weighted_gaussian{release}",
        "mad": f"SELECT count(*) FROM dp_set_union_mad{release}",
        "mad2r": f"SELECT count(*) FROM dp_set_union_mad2r{release}",
        "cap_join_stored": f"WITH r AS MATERIALIZED ({cap.format(m='dp__capped_user_items')}) SELECT count(*) FROM r",
        "cap_window_stored": f"WITH r AS MATERIALIZED ({cap.format(m='dp__capped_user_items_window')}) "
                             "SELECT count(*) FROM r",
        "stage_bare": f"WITH {_bare_stage('bm_rows', 'uw', 'bm_p1')} SELECT count(*) FROM dp__w",
        "mad_stage": "SELECT count(*) FROM dp__mad_stage('bm_rows', 'bm_p1') CROSS JOIN bm_cal "
                     "WHERE w + dp_gaussian_noise(sigma1) >= rho1",
        "round2_bare": "WITH r2 AS MATERIALIZED (SELECT user_id, item, b FROM bm_rows JOIN bm_items2 USING (item)), "
                       "u2 AS (SELECT user_id, sqrt(sum(b * b)) AS n FROM r2 GROUP BY user_id), "
                       "rows2 AS MATERIALIZED (SELECT user_id, item, b / n AS uw FROM r2 JOIN u2 USING (user_id)), "
                       f"{_bare_stage('rows2', 'uw', 'bm_p2')} SELECT count(*) FROM dp__w",
        "round2": "WITH r2 AS MATERIALIZED (SELECT user_id, item, b FROM bm_rows JOIN bm_items2 USING (item)), "
                  "rows2 AS MATERIALIZED (FROM dp__user_weight_rows('r2', 0.5, 2.0)) "
                  "SELECT count(*) FROM dp__mad_stage('rows2', 'bm_p2') CROSS JOIN bm_cal "
                  "WHERE w + dp_gaussian_noise(sigma2) >= rho2",
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--db", default=str(HERE / "data" / "zipf.duckdb"))
    ap.add_argument("--item-type", choices=("BIGINT", "VARCHAR"), default="BIGINT")
    ap.add_argument("--json", help="also write the raw times to this JSON file")
    args = ap.parse_args(argv)
    print(json.dumps(machine_info()), flush=True)
    table = ensure_table(args.db, args.rows, args.item_type)
    con = dpsql.connect(args.db, read_only=True)
    setup(con, table)
    qs = queries(table)
    names = list(qs)
    for name in names:  # one unmeasured run each
        con.execute(qs[name]).fetchall()
    times: dict[str, list[float]] = {n: [] for n in names}
    load, busy = [os.getloadavg()[0]], []
    for r in range(args.reps):  # rotating order: round r starts at query r
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds, _, others = run_once(con, qs[name])
            times[name].append(seconds)
            if others is not None:
                busy.append(others)
        load.append(os.getloadavg()[0])
    med = {n: statistics.median(v) for n, v in times.items()}
    floor = med["floor"]
    print(f"{table}: {args.rows:,} rows, item {args.item_type}, {args.reps} rounds, load(1min) "
          f"{min(load):.2f}-{max(load):.2f}, others' CPU {_pct(busy)}")
    print(f"  {'query':22s} {'median s':>9s} {'x floor':>8s}")
    for n in names:
        print(f"  {n:22s} {med[n]:9.2f} {med[n] / floor:8.2f}")
    mad_lb = med["cap_join_stored"] + med["stage_bare"]
    print(f"  lower bound MAD   = cap_join_stored + stage_bare               = {mad_lb / floor:.2f}x floor "
          f"(MAD {med['mad'] / floor:.2f}x; target 1.6x)")
    m2_lb = mad_lb + med["round2_bare"]
    print(f"  lower bound MAD2R = cap_join_stored + stage_bare + round2_bare = {m2_lb / floor:.2f}x floor "
          f"(MAD2R {med['mad2r'] / floor:.2f}x; target 2.0x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_info(), "table": table, "times": times,
                                               "load": load, "busy": busy}))


if __name__ == "__main__":
    main()
