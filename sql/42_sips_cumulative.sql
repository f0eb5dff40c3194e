-- DP-SIPS with the cumulative release rule (dpsql/cumulative.py; docs/proofs/sips_cumulative.md).

-- One round: the item's running sum z = z_prev + share[r] * (w + N(0, sigma[r]^2)), where w = sum
-- 1/sqrt(d) is Basic's weight on the rows of `kept_rel` (the capped rows of the items not released
-- yet) and z_prev is the item's sum in `prev_rel` (item, z, passed; empty in round one), and whether
-- it passes: z >= cumulative_share[r] * rho[r], i.e. the precision-weighted mean of the item's noisy
-- weights so far is >= rho[r]. Every item of `kept_rel` is an item of `prev_rel` not released yet
-- (after round one), and every such item has rows in `kept_rel` (its users still hold it). One GROUP BY
-- adds the rows' 1/sqrt(d) and z_prev / share[r] (cheaper than joining a million running sums), and
-- share[r] multiplies once per item: per user and per item, not per row (-16 % time at 10M).
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_round(kept_rel VARCHAR, prev_rel VARCHAR, params_rel VARCHAR,
                                                       r INTEGER) AS TABLE
WITH dp__scr_sums AS (
    SELECT item, sum(x) AS y
    FROM (SELECT item, x
          FROM query_table(kept_rel)
               JOIN (SELECT user_id, 1 / sqrt(count(*)) AS x FROM query_table(kept_rel) GROUP BY user_id) USING (user_id)
          UNION ALL
          SELECT item, z / share[r] AS x FROM query_table(prev_rel) CROSS JOIN query_table(params_rel) WHERE NOT passed)
    GROUP BY item)
SELECT item, z, z >= bar AS passed
FROM (SELECT item, share[r] * (y + dp_gaussian_noise(sigma[r])) AS z, cumulative_share[r] * rho[r] AS bar
      FROM dp__scr_sums CROSS JOIN query_table(params_rel));

-- len(split) rounds (at most 8). Round r works on the capped rows of the items no earlier round
-- released; each round's rows are stored (they shrink fast: the first, cheap rounds release the
-- items most rows hold) and are the previous round's minus those of the items it released (an anti
-- join with a few thousand items is cheaper than a semi join with every item not released). A macro cannot loop over a runtime list, so this is a fixed chain of 8
-- rounds; `len(split) >= r` is a constant, so DuckDB prunes the unused rounds before execution (no
-- noise is drawn for them). The running sums never leave the query: only released items do. The
-- default split is 1:2:4:8:16:32 (dpsql.cumulative.DEFAULT_SPLIT).
CREATE OR REPLACE TEMP MACRO dp_set_union_sips_cumulative(tbl VARCHAR, epsilon DOUBLE, delta DOUBLE,
        max_items DOUBLE := 100,
        split DOUBLE[] := [0.015873015873015872, 0.031746031746031744, 0.06349206349206349, 0.12698412698412698,
                          0.25396825396825395, 0.5079365079365079],
        user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
WITH dp__sc_cal AS (
    SELECT unnest(dp__sips_cumulative_calibration(epsilon, delta, max_items, split, user_col, item_col))
    WHERE dp__constant('tbl', tbl) AND dp__constant('epsilon', epsilon) AND dp__constant('delta', delta)
      AND dp__constant('max_items', max_items) AND dp__constant('split', split)
      AND dp__constant('user_col', user_col) AND dp__constant('item_col', item_col)),
dp__sc_rows AS MATERIALIZED (
    SELECT user_id, item
    FROM dp__capped_user_items_window(tbl, max_items := max_items, user_col := user_col, item_col := item_col)),
-- Charged after the data is read (sql/00_release.sql): a NULL user fails before the charge.
dp__sc_paid AS MATERIALIZED (SELECT dp__charge('dp_set_union_sips_cumulative', 'user', tbl, epsilon, delta,
        {'max_items': max_items, 'split': split, 'user_col': user_col, 'item_col': item_col}::VARCHAR,
        dp__sc_cal::VARCHAR) AS paid
    FROM dp__sc_cal WHERE (SELECT count(*) FROM dp__sc_rows) >= 0),
dp__sc_none AS (SELECT item, 0.0 AS z, false AS passed FROM dp__sc_rows LIMIT 0),
dp__sc_z1 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_rows', 'dp__sc_none', 'dp__sc_cal', 1)),
dp__sc_k1 AS MATERIALIZED (SELECT user_id, item FROM dp__sc_rows ANTI JOIN (SELECT item FROM dp__sc_z1 WHERE passed) USING (item)
                           WHERE len(split) >= 2),
dp__sc_z2 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k1', 'dp__sc_z1', 'dp__sc_cal', 2) WHERE len(split) >= 2),
dp__sc_k2 AS MATERIALIZED (SELECT user_id, item FROM dp__sc_k1 ANTI JOIN (SELECT item FROM dp__sc_z2 WHERE passed) USING (item)
                           WHERE len(split) >= 3),
dp__sc_z3 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k2', 'dp__sc_z2', 'dp__sc_cal', 3) WHERE len(split) >= 3),
dp__sc_k3 AS MATERIALIZED (SELECT user_id, item FROM dp__sc_k2 ANTI JOIN (SELECT item FROM dp__sc_z3 WHERE passed) USING (item)
                           WHERE len(split) >= 4),
dp__sc_z4 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k3', 'dp__sc_z3', 'dp__sc_cal', 4) WHERE len(split) >= 4),
dp__sc_k4 AS MATERIALIZED (SELECT user_id, item FROM dp__sc_k3 ANTI JOIN (SELECT item FROM dp__sc_z4 WHERE passed) USING (item)
                           WHERE len(split) >= 5),
dp__sc_z5 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k4', 'dp__sc_z4', 'dp__sc_cal', 5) WHERE len(split) >= 5),
dp__sc_k5 AS MATERIALIZED (SELECT user_id, item FROM dp__sc_k4 ANTI JOIN (SELECT item FROM dp__sc_z5 WHERE passed) USING (item)
                           WHERE len(split) >= 6),
dp__sc_z6 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k5', 'dp__sc_z5', 'dp__sc_cal', 6) WHERE len(split) >= 6),
dp__sc_k6 AS MATERIALIZED (SELECT user_id, item FROM dp__sc_k5 ANTI JOIN (SELECT item FROM dp__sc_z6 WHERE passed) USING (item)
                           WHERE len(split) >= 7),
dp__sc_z7 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k6', 'dp__sc_z6', 'dp__sc_cal', 7) WHERE len(split) >= 7),
dp__sc_k7 AS MATERIALIZED (SELECT user_id, item FROM dp__sc_k6 ANTI JOIN (SELECT item FROM dp__sc_z7 WHERE passed) USING (item)
                           WHERE len(split) >= 8),
dp__sc_z8 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k7', 'dp__sc_z7', 'dp__sc_cal', 8) WHERE len(split) >= 8)
SELECT item FROM (FROM dp__sc_z1 UNION ALL FROM dp__sc_z2 UNION ALL FROM dp__sc_z3 UNION ALL FROM dp__sc_z4
                  UNION ALL FROM dp__sc_z5 UNION ALL FROM dp__sc_z6 UNION ALL FROM dp__sc_z7 UNION ALL FROM dp__sc_z8)
     CROSS JOIN dp__sc_cal CROSS JOIN dp__sc_paid
WHERE passed AND paid
ORDER BY item;
