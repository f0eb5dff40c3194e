-- DP-SIPS with the cumulative release rule (dpsql/union/cumulative.py; docs/proofs/sips_cumulative.md).

-- One round: the item's running sum z = z_prev + share[r] * (w + N(0, sigma[r]^2)), where w = sum x_uj
-- over the live rows of `rows_rel` (user_id, item, p: the capped rows of the items not released yet;
-- p FLOAT the item's tilt, 0 for an item an earlier round dropped) and z_prev is the item's sum in
-- `prev_rel` (item, z, passed, dropped; empty in round one); whether it passes,
-- z >= cumulative_share[r] * rho[r] (the precision-weighted mean of the item's noisy weights so far is
-- >= rho[r]); and whether it is dropped, z < cumulative_share[r] * drop_below[r] (its mean is hopeless;
-- -inf: never). A user's weight on a live item is x_uj = min(1, max_boost/sqrt(e_u), p_j/sqrt(S_u)): e_u
-- all its rows (dropped items count, released ones do not), S_u the sum of p^2 over its live rows, so
-- sum_j x_uj^2 <= 1 (S_u sums the same stored p the weights use); with every p = 1 this is
-- min(1/sqrt(d_u), max_boost/sqrt(e_u)); max_boost NULL: no cap. A tilt is at least exp(-30), so only a
-- dropped item's rows have p = 0. Every item of `rows_rel`'s live rows is an item of `prev_rel` neither
-- released nor dropped (after round one), and every such item has live rows (its users still hold it).
-- One GROUP BY adds the rows' x_uj and z_prev / share[r] (cheaper than joining a million running sums),
-- and share[r] multiplies once per item. Each row reads its user's (cap, inv) through a correlated
-- scalar subquery: DuckDB plans it as a SINGLE join, which it never flips, so the hash table holds the
-- users (400k at 10M rows), not the rows (3M); an inner join builds on the side estimated smaller, and
-- the chain's estimates fall to one row by round five. IS NOT DISTINCT FROM (no NULL user gets here)
-- keeps DuckDB from pushing `user_id IS NOT NULL` into the stored rows, where it would meet the other
-- readers' filters as an OR tested on every row. A user is one group, so one match per row.
-- The pre-noise sums (dp__scr_sums) and the state of the noisy sums (dp__scr_state) are the stages the
-- Spark backend translates; it draws the noise of dp__scr_noisy itself, once per item.
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_round(rows_rel VARCHAR, prev_rel VARCHAR, params_rel VARCHAR,
                                                       r INTEGER) AS TABLE
WITH dp__scr_users AS (
    SELECT user_id, least(1.0, max_boost / sqrt(e)) AS cap, 1 / sqrt(s2) AS inv
    FROM (SELECT user_id, sum(p::DOUBLE * p) AS s2, count(*) AS e FROM query_table(rows_rel) GROUP BY user_id)
         CROSS JOIN query_table(params_rel)
    WHERE s2 > 0),
-- dpsql:portable dp__scr_sums
dp__scr_sums AS (
    SELECT item, sum(x) AS y
    FROM (SELECT item, least(w.cap, p * w.inv) AS x
          FROM (SELECT item, p, (SELECT {'cap': cap, 'inv': inv} FROM dp__scr_users
                                 WHERE dp__scr_users.user_id IS NOT DISTINCT FROM dp__scr_rows.user_id) AS w
                FROM query_table(rows_rel) AS dp__scr_rows WHERE p > 0)
          UNION ALL
          SELECT item, z / share[r] AS x FROM query_table(prev_rel) CROSS JOIN query_table(params_rel)
          WHERE NOT passed AND NOT dropped)
    GROUP BY item),
-- the round's noisy weights: one draw per item (read once, so not stored)
dp__scr_noisy AS (SELECT item, y + dp_gaussian_noise(sigma[r]) AS noisy
                  FROM dp__scr_sums CROSS JOIN query_table(params_rel)),
-- dpsql:portable dp__scr_state
dp__scr_state AS (
    SELECT item, z, z >= bar AS passed, z < bar AND z < drop_bar AS dropped
    FROM (SELECT item, share[r] * noisy AS z, cumulative_share[r] * rho[r] AS bar,
                 cumulative_share[r] * drop_below[r] AS drop_bar
          FROM dp__scr_noisy CROSS JOIN query_table(params_rel)))
FROM dp__scr_state;

-- An item's tilt after round r: p = exp(-tilt * clip(score, 0, 3)), score = how many standard
-- deviations of its running mean (mean_sigma[r]) the mean is above the last round's threshold (tilt 0:
-- p = 1); 0 if round r dropped it. FLOAT: the rows of every round are stored. Passes `z_rel`'s other
-- columns through (round one's item id).
-- dpsql:portable dp__sips_cumulative_tilt
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_tilt(z_rel VARCHAR, params_rel VARCHAR, r INTEGER) AS TABLE
SELECT dp__zr.* EXCLUDE (z, passed, dropped),
       CASE WHEN dropped THEN 0.0
            ELSE exp(-tilt * least(greatest((z / cumulative_share[r] - rho[-1]) / mean_sigma[r], 0.0), 3.0))
       END::FLOAT AS p
FROM query_table(z_rel) AS dp__zr CROSS JOIN query_table(params_rel) WHERE NOT passed;

-- The rows of round r + 1 (r >= 2): those of round r (`rows_rel`) minus the items round r released
-- (`z_rel`), each with its new tilt. An item dropped earlier is not in `z_rel`: its rows pass as they are.
-- `plain` (no dropping, so no tilt: every p stays 1) removes the released items with an anti join on
-- them instead of joining every other item's tilt. It is a constant: DuckDB prunes the other branches.
-- The Spark backend also builds round 2's rows with it (r = 1: every p is 1), without the ids below.
-- dpsql:portable dp__sips_cumulative_next
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_next(rows_rel VARCHAR, z_rel VARCHAR, params_rel VARCHAR,
                                                      r INTEGER, plain BOOLEAN) AS TABLE
SELECT user_id, item, p
FROM query_table(rows_rel) ANTI JOIN (SELECT item FROM query_table(z_rel) WHERE passed) USING (item)
WHERE plain
UNION ALL
SELECT user_id, item, p FROM query_table(rows_rel) WHERE p = 0 AND NOT plain
UNION ALL
SELECT user_id, item, p
FROM (SELECT user_id, item FROM query_table(rows_rel) WHERE p > 0 AND NOT plain)
     JOIN dp__sips_cumulative_tilt(z_rel, params_rel, r) USING (item);

-- The rows of round 2: the capped rows (`rows_rel`) minus the items round 1 released, with the user
-- and the item replaced by dense 32-bit ids (`uid_rel`; z_rel's id): later rounds store 12 bytes a row,
-- whatever the columns' types. The ids never leave the query (released items are mapped back). The
-- user's id is a scalar subquery for the reason the round's weights are: the hash table holds the users,
-- not the rows.
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_next_first(rows_rel VARCHAR, uid_rel VARCHAR, z_rel VARCHAR,
                                                            params_rel VARCHAR) AS TABLE
SELECT (SELECT uid FROM query_table(uid_rel) AS dp__scf_uid
        WHERE dp__scf_uid.user_id IS NOT DISTINCT FROM dp__scf_rows.user_id) AS user_id, id AS item, p
FROM query_table(rows_rel) AS dp__scf_rows JOIN dp__sips_cumulative_tilt(z_rel, params_rel, 1) USING (item);

-- len(split) rounds (at most 8). Round r works on the capped rows of the items no earlier round
-- released; each round's rows are stored (they shrink fast: the first, cheap rounds release the
-- items most rows hold). A macro cannot loop over a runtime list, so this is a fixed chain of 8
-- rounds; `len(split) >= r` is a constant, so DuckDB prunes the unused rounds before execution (no
-- noise is drawn for them). Round one numbers the items it saw and the users (32-bit ids: the charge
-- refuses 2^32 capped rows or more before anything is released); released items are mapped back
-- through round one's ids. The running sums never leave the query: only released items do. The
-- default split is seven rounds, each 1.6 times the one before (dpsql.union.cumulative.DEFAULT_SPLIT).
-- The calibration row is stored once and the calibration UDF called once: every round reads it several
-- times, and an inlined unnest(<struct UDF>) costs each reader a copy (a call per field, an unnest to
-- bind and plan), a large part of a small release (benchmarks/README.md, "Release latency on small tables").
-- dpsql:body dp__body_set_union_sips_cumulative
WITH dp__sc_cal AS MATERIALIZED (
    SELECT unnest(dp__c)
    FROM (SELECT dp__sips_cumulative_calibration(epsilon, delta, max_items, split, drop_margin, max_boost, tilt,
                                                 user_col, item_col) AS dp__c)),
dp__sc_rows AS MATERIALIZED (
    SELECT user_id, item
    FROM dp__capped_user_items_window(tbl, max_items := max_items, user_col := user_col, item_col := item_col)),
-- A table too large for the 32-bit ids is refused before round one runs (its size is the only thing
-- the refusal depends on; the release is charged only after the body succeeds).
dp__sc_size AS MATERIALIZED (
    SELECT true AS ok FROM dp__sc_cal
    WHERE CASE WHEN (SELECT count(*) FROM dp__sc_rows) < 4294967296 THEN true
               ELSE error('dpsql: dp_set_union_sips_cumulative takes fewer than 2^32 user-item pairs after '
                          || 'the max_items cap; lower max_items, or use dp_set_union_mad2r') END),
-- Round one reads the capped rows as they are stored (every p = 1); round two reads round one's sums by id.
-- dpsql:portable dp__sc_rows1
dp__sc_rows1 AS NOT MATERIALIZED (SELECT user_id, item, 1.0::FLOAT AS p FROM dp__sc_rows),
dp__sc_none AS (SELECT item, 0.0 AS z, false AS passed, false AS dropped FROM dp__sc_rows LIMIT 0),
dp__sc_z1 AS MATERIALIZED (SELECT *, (row_number() OVER ())::UINTEGER AS id
                           FROM dp__sips_cumulative_round('dp__sc_rows1', 'dp__sc_none', 'dp__sc_cal', 1)
                           WHERE (SELECT ok FROM dp__sc_size)),
dp__sc_p1 AS NOT MATERIALIZED (SELECT id AS item, z, passed, dropped FROM dp__sc_z1),
dp__sc_uid AS MATERIALIZED (SELECT user_id, (row_number() OVER ())::UINTEGER AS uid
                            FROM (SELECT DISTINCT user_id FROM dp__sc_rows) WHERE len(split) >= 2),
dp__sc_k1 AS MATERIALIZED (FROM dp__sips_cumulative_next_first('dp__sc_rows', 'dp__sc_uid', 'dp__sc_z1', 'dp__sc_cal')
                           WHERE len(split) >= 2),
dp__sc_z2 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k1', 'dp__sc_p1', 'dp__sc_cal', 2) WHERE len(split) >= 2),
dp__sc_k2 AS MATERIALIZED (FROM dp__sips_cumulative_next('dp__sc_k1', 'dp__sc_z2', 'dp__sc_cal', 2, drop_margin IS NULL) WHERE len(split) >= 3),
dp__sc_z3 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k2', 'dp__sc_z2', 'dp__sc_cal', 3) WHERE len(split) >= 3),
dp__sc_k3 AS MATERIALIZED (FROM dp__sips_cumulative_next('dp__sc_k2', 'dp__sc_z3', 'dp__sc_cal', 3, drop_margin IS NULL) WHERE len(split) >= 4),
dp__sc_z4 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k3', 'dp__sc_z3', 'dp__sc_cal', 4) WHERE len(split) >= 4),
dp__sc_k4 AS MATERIALIZED (FROM dp__sips_cumulative_next('dp__sc_k3', 'dp__sc_z4', 'dp__sc_cal', 4, drop_margin IS NULL) WHERE len(split) >= 5),
dp__sc_z5 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k4', 'dp__sc_z4', 'dp__sc_cal', 5) WHERE len(split) >= 5),
dp__sc_k5 AS MATERIALIZED (FROM dp__sips_cumulative_next('dp__sc_k4', 'dp__sc_z5', 'dp__sc_cal', 5, drop_margin IS NULL) WHERE len(split) >= 6),
dp__sc_z6 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k5', 'dp__sc_z5', 'dp__sc_cal', 6) WHERE len(split) >= 6),
dp__sc_k6 AS MATERIALIZED (FROM dp__sips_cumulative_next('dp__sc_k5', 'dp__sc_z6', 'dp__sc_cal', 6, drop_margin IS NULL) WHERE len(split) >= 7),
dp__sc_z7 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k6', 'dp__sc_z6', 'dp__sc_cal', 7) WHERE len(split) >= 7),
dp__sc_k7 AS MATERIALIZED (FROM dp__sips_cumulative_next('dp__sc_k6', 'dp__sc_z7', 'dp__sc_cal', 7, drop_margin IS NULL) WHERE len(split) >= 8),
dp__sc_z8 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k7', 'dp__sc_z7', 'dp__sc_cal', 8) WHERE len(split) >= 8),
-- Progress (dpsql.core.progress): once round r's state is stored, dp__progress(r, len(split)) reports r
-- of len(split) rounds done to the caller's progress callback. Each branch reads one row (the count of
-- the round's items, never passed on) whatever the data, so whether and when a round is reported
-- depends on the rounds run alone; the final filter reads the always-true result, so the CTE runs.
dp__sc_progress AS MATERIALIZED (
    SELECT dp__progress(1, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z1)
    UNION ALL SELECT dp__progress(2, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z2) WHERE len(split) >= 2
    UNION ALL SELECT dp__progress(3, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z3) WHERE len(split) >= 3
    UNION ALL SELECT dp__progress(4, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z4) WHERE len(split) >= 4
    UNION ALL SELECT dp__progress(5, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z5) WHERE len(split) >= 5
    UNION ALL SELECT dp__progress(6, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z6) WHERE len(split) >= 6
    UNION ALL SELECT dp__progress(7, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z7) WHERE len(split) >= 7
    UNION ALL SELECT dp__progress(8, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__sc_z8) WHERE len(split) >= 8)
SELECT item
FROM (SELECT item FROM dp__sc_z1
      WHERE passed OR id IN (SELECT item FROM (FROM dp__sc_z2 UNION ALL FROM dp__sc_z3 UNION ALL FROM dp__sc_z4
                                               UNION ALL FROM dp__sc_z5 UNION ALL FROM dp__sc_z6 UNION ALL FROM dp__sc_z7
                                               UNION ALL FROM dp__sc_z8)
                             WHERE passed))
     CROSS JOIN dp__sc_cal
WHERE (SELECT bool_and(ok) FROM dp__sc_progress);
