-- DP-SIPS with the cumulative release rule (dpsql/union/cumulative.py; docs/proofs/sips_cumulative.md).

-- One round r, its calibration as constants (dp__sips_cumulative_rounds below writes them in): the item's
-- running sum z = z_prev + share * (w + N(0, sigma^2)), where w = sum x_uj
-- over the live rows of `rows_rel` (user_id, item, p: the capped rows of the items not released yet;
-- p FLOAT the item's tilt, 0 for an item an earlier round dropped) and z_prev is the item's sum in
-- `prev_rel` (item, z, passed, dropped; empty in round one); whether it passes,
-- z >= cumulative_share * rho (the precision-weighted mean of the item's noisy weights so far is
-- >= rho); and whether it is dropped, z < cumulative_share * drop_below (its mean is hopeless;
-- -inf: never). A user's weight on a live item is x_uj = min(1, max_boost/sqrt(e_u), p_j/sqrt(S_u)): e_u
-- all its rows (dropped items count, released ones do not), S_u the sum of p^2 over its live rows, so
-- sum_j x_uj^2 <= 1 (S_u sums the same stored p the weights use); with every p = 1 this is
-- min(1/sqrt(d_u), max_boost/sqrt(e_u)); max_boost NULL: no cap. A tilt is at least exp(-30), so only a
-- dropped item's rows have p = 0. Every item of `rows_rel`'s live rows is an item of `prev_rel` neither
-- released nor dropped (after round one), and every such item has live rows (its users still hold it).
-- One GROUP BY adds the rows' x_uj and z_prev / share (cheaper than joining a million running sums),
-- and share multiplies once per item. The previous sums read share through a one-row cross join: DuckDB
-- then runs their branch after the rows', as when every round cross joined the calibration row, so the
-- GROUP BY meets the items, and each item its noise draw, in the order it did then (seeded releases
-- unchanged; without the join the previous sums' branch ran first in some rounds). Each row reads its
-- user's (cap, inv) through a correlated scalar subquery: DuckDB plans it as a SINGLE join, which it never
-- flips, so the hash table holds the users (400k at 10M rows), not the rows (3M); an inner join builds on
-- the side estimated smaller, and the chain's estimates fall to one row by round five. IS NOT DISTINCT
-- FROM (no NULL user gets here) keeps DuckDB from pushing `user_id IS NOT NULL` into the stored rows,
-- where it would meet the other readers' filters as an OR tested on every row. A user is one group, so
-- one match per row.
-- The pre-noise sums (dp__scr_sums) and the state of the noisy sums (dp__scr_state) are the stages the
-- Spark backend translates; it draws the noise of dp__scr_noisy itself, once per item.
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_round(rows_rel VARCHAR, prev_rel VARCHAR, share DOUBLE,
                                                       cumulative_share DOUBLE, sigma DOUBLE, rho DOUBLE,
                                                       drop_below DOUBLE, max_boost DOUBLE) AS TABLE
WITH dp__scr_users AS (
    SELECT user_id, least(1.0, max_boost / sqrt(e)) AS cap, 1 / sqrt(s2) AS inv
    FROM (SELECT user_id, sum(p::DOUBLE * p) AS s2, count(*) AS e FROM query_table(rows_rel) GROUP BY user_id)
    WHERE s2 > 0),
-- dpsql:portable dp__scr_sums
dp__scr_sums AS (
    SELECT item, sum(x) AS y
    FROM (SELECT item, least(w.cap, p * w.inv) AS x
          FROM (SELECT item, p, (SELECT {'cap': cap, 'inv': inv} FROM dp__scr_users
                                 WHERE dp__scr_users.user_id IS NOT DISTINCT FROM dp__scr_rows.user_id) AS w
                FROM query_table(rows_rel) AS dp__scr_rows WHERE p > 0)
          UNION ALL
          SELECT item, z / dp__share AS x FROM query_table(prev_rel) CROSS JOIN (SELECT share AS dp__share)
          WHERE NOT passed AND NOT dropped)
    GROUP BY item),
-- the round's noisy weights: one draw per item (read once, so not stored)
dp__scr_noisy AS (SELECT item, y + dp_gaussian_noise(sigma) AS noisy FROM dp__scr_sums),
-- dpsql:portable dp__scr_state
dp__scr_state AS (
    SELECT item, z, z >= bar AS passed, z < bar AND z < drop_bar AS dropped
    FROM (SELECT item, share * noisy AS z, cumulative_share * rho AS bar, cumulative_share * drop_below AS drop_bar
          FROM dp__scr_noisy))
FROM dp__scr_state;

-- An item's tilt after round r: p = exp(-tilt * clip(score, 0, 3)), score = how many standard
-- deviations of its running mean (mean_sigma, round r's) the mean (z / cumulative_share) is above the
-- last round's threshold (last_rho; tilt 0: p = 1); 0 if round r dropped it. FLOAT: the rows of every
-- round are stored. Passes `z_rel`'s other columns through (round one's item id).
-- dpsql:portable dp__sips_cumulative_tilt
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_tilt(z_rel VARCHAR, cumulative_share DOUBLE, mean_sigma DOUBLE,
                                                      last_rho DOUBLE, tilt DOUBLE) AS TABLE
SELECT dp__zr.* EXCLUDE (z, passed, dropped),
       CASE WHEN dropped THEN 0.0
            ELSE exp(-tilt * least(greatest((z / cumulative_share - last_rho) / mean_sigma, 0.0), 3.0))
       END::FLOAT AS p
FROM query_table(z_rel) AS dp__zr WHERE NOT passed;

-- The rows of round r + 1 (r >= 2): those of round r (`rows_rel`) minus the items round r released
-- (`z_rel`), each with its new tilt (round r's calibration, as dp__sips_cumulative_tilt). An item dropped
-- earlier is not in `z_rel`: its rows pass as they are. The Spark backend also builds round 2's rows
-- with it (r = 1), without the ids of dp__sips_cumulative_next_first.
-- dpsql:portable dp__sips_cumulative_next
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_next(rows_rel VARCHAR, z_rel VARCHAR, cumulative_share DOUBLE,
                                                      mean_sigma DOUBLE, last_rho DOUBLE, tilt DOUBLE) AS TABLE
SELECT user_id, item, p FROM query_table(rows_rel) WHERE p = 0
UNION ALL
SELECT user_id, item, p
FROM (SELECT user_id, item FROM query_table(rows_rel) WHERE p > 0)
     JOIN dp__sips_cumulative_tilt(z_rel, cumulative_share, mean_sigma, last_rho, tilt) USING (item);

-- The rows of round r + 1 without dropping (drop_margin NULL: no cap, no tilt, every p stays 1): those of
-- round r minus the items round r released, removed by an anti join on them instead of joining every
-- other item's tilt. A separate macro, so that a release binds and plans only the form it runs.
-- dpsql:portable dp__sips_cumulative_next_plain
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_next_plain(rows_rel VARCHAR, z_rel VARCHAR) AS TABLE
SELECT user_id, item, p
FROM query_table(rows_rel) ANTI JOIN (SELECT item FROM query_table(z_rel) WHERE passed) USING (item);

-- The rows of round 2: the capped rows (`rows_rel`) minus the items round 1 released, with the user
-- and the item replaced by dense 32-bit ids (`uid_rel`; z_rel's id): later rounds store 12 bytes a row,
-- whatever the columns' types. The ids never leave the query (released items are mapped back). The
-- user's id is a scalar subquery for the reason the round's weights are: the hash table holds the users,
-- not the rows.
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_next_first(rows_rel VARCHAR, uid_rel VARCHAR, z_rel VARCHAR,
                                                            cumulative_share DOUBLE, mean_sigma DOUBLE,
                                                            last_rho DOUBLE, tilt DOUBLE) AS TABLE
SELECT (SELECT uid FROM query_table(uid_rel) AS dp__scf_uid
        WHERE dp__scf_uid.user_id IS NOT DISTINCT FROM dp__scf_rows.user_id) AS user_id, id AS item, p
FROM query_table(rows_rel) AS dp__scf_rows
JOIN dp__sips_cumulative_tilt(z_rel, cumulative_share, mean_sigma, last_rho, tilt) USING (item);

-- The rounds of dp_set_union_sips_cumulative (its body renders this call: below) on the capped rows of
-- `tbl`, with every round's calibration (dpsql.union.cumulative.CumulativeParameters) as literals: round
-- r's share<r>, cumulative_share<r>, sigma<r>, mean_sigma<r>, rho<r>, drop_below<r> (NULL for the rounds
-- after the last), last_rho the last round's threshold; `plain`: no dropping. Each round reads them as
-- constants: the one-row calibration cross joined four or five times a round, or a list subscripted at each
-- use, cost every round binding and planning (benchmarks/README.md, "Release latency on small tables").
-- `rounds` rounds (at most 8). Round r works on the capped rows of the items no earlier round
-- released; each round's rows are stored (they shrink fast: the first, cheap rounds release the
-- items most rows hold). A macro cannot loop, so this is a fixed chain of 8 rounds; `rounds >= r` is a
-- constant, so DuckDB prunes the unused rounds before execution (no noise is drawn for them). Each
-- round's next rows are one of two CTEs, chosen by the constant `plain` through query_table(): DuckDB
-- binds only the CTEs a query reads, so only the form that runs is bound and planned. Round one numbers
-- the items it saw and the users (32-bit ids: the charge refuses 2^32 capped rows or more before
-- anything is released); released items are mapped back through round one's ids. The running sums
-- never leave the query: only released items do. The default split is seven rounds, each 1.6 times the
-- one before (dpsql.union.cumulative.DEFAULT_SPLIT).
CREATE OR REPLACE TEMP MACRO dp__sips_cumulative_rounds(tbl VARCHAR, max_items DOUBLE, user_col VARCHAR,
        item_col VARCHAR, rounds INTEGER, plain BOOLEAN, max_boost DOUBLE, tilt DOUBLE, last_rho DOUBLE,
        share1 DOUBLE := NULL, cumulative_share1 DOUBLE := NULL, sigma1 DOUBLE := NULL,
        mean_sigma1 DOUBLE := NULL, rho1 DOUBLE := NULL, drop_below1 DOUBLE := NULL,
        share2 DOUBLE := NULL, cumulative_share2 DOUBLE := NULL, sigma2 DOUBLE := NULL,
        mean_sigma2 DOUBLE := NULL, rho2 DOUBLE := NULL, drop_below2 DOUBLE := NULL,
        share3 DOUBLE := NULL, cumulative_share3 DOUBLE := NULL, sigma3 DOUBLE := NULL,
        mean_sigma3 DOUBLE := NULL, rho3 DOUBLE := NULL, drop_below3 DOUBLE := NULL,
        share4 DOUBLE := NULL, cumulative_share4 DOUBLE := NULL, sigma4 DOUBLE := NULL,
        mean_sigma4 DOUBLE := NULL, rho4 DOUBLE := NULL, drop_below4 DOUBLE := NULL,
        share5 DOUBLE := NULL, cumulative_share5 DOUBLE := NULL, sigma5 DOUBLE := NULL,
        mean_sigma5 DOUBLE := NULL, rho5 DOUBLE := NULL, drop_below5 DOUBLE := NULL,
        share6 DOUBLE := NULL, cumulative_share6 DOUBLE := NULL, sigma6 DOUBLE := NULL,
        mean_sigma6 DOUBLE := NULL, rho6 DOUBLE := NULL, drop_below6 DOUBLE := NULL,
        share7 DOUBLE := NULL, cumulative_share7 DOUBLE := NULL, sigma7 DOUBLE := NULL,
        mean_sigma7 DOUBLE := NULL, rho7 DOUBLE := NULL, drop_below7 DOUBLE := NULL,
        share8 DOUBLE := NULL, cumulative_share8 DOUBLE := NULL, sigma8 DOUBLE := NULL,
        mean_sigma8 DOUBLE := NULL, rho8 DOUBLE := NULL, drop_below8 DOUBLE := NULL) AS TABLE
WITH dp__sc_rows AS MATERIALIZED (
    SELECT user_id, item
    FROM dp__capped_user_items_window(tbl, max_items := max_items, user_col := user_col, item_col := item_col)),
-- A table too large for the 32-bit ids is refused before round one runs (its size is the only thing
-- the refusal depends on; the release is charged only after the body succeeds).
dp__sc_size AS MATERIALIZED (
    SELECT true AS ok
    WHERE CASE WHEN (SELECT count(*) FROM dp__sc_rows) < 4294967296 THEN true
               ELSE error('dpsql: dp_set_union_sips_cumulative takes fewer than 2^32 user-item pairs after '
                          || 'the max_items cap; lower max_items, or use dp_set_union_mad2r') END),
-- Round one reads the capped rows as they are stored (every p = 1); round two reads round one's sums by id.
-- dpsql:portable dp__sc_rows1
dp__sc_rows1 AS NOT MATERIALIZED (SELECT user_id, item, 1.0::FLOAT AS p FROM dp__sc_rows),
dp__sc_none AS (SELECT item, 0.0 AS z, false AS passed, false AS dropped FROM dp__sc_rows LIMIT 0),
dp__sc_z1 AS MATERIALIZED (SELECT *, (row_number() OVER ())::UINTEGER AS id
                           FROM dp__sips_cumulative_round('dp__sc_rows1', 'dp__sc_none', share1, cumulative_share1,
                                                          sigma1, rho1, drop_below1, max_boost)
                           WHERE (SELECT ok FROM dp__sc_size)),
dp__sc_p1 AS NOT MATERIALIZED (SELECT id AS item, z, passed, dropped FROM dp__sc_z1),
dp__sc_uid AS MATERIALIZED (SELECT user_id, (row_number() OVER ())::UINTEGER AS uid
                            FROM (SELECT DISTINCT user_id FROM dp__sc_rows) WHERE rounds >= 2),
dp__sc_k1 AS MATERIALIZED (FROM dp__sips_cumulative_next_first('dp__sc_rows', 'dp__sc_uid', 'dp__sc_z1',
                                                               cumulative_share1, mean_sigma1, last_rho, tilt)
                           WHERE rounds >= 2),
dp__sc_z2 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k1', 'dp__sc_p1', share2, cumulative_share2,
                                                          sigma2, rho2, drop_below2, max_boost)
                           WHERE rounds >= 2),
dp__sc_j2 AS (FROM dp__sips_cumulative_next_plain('dp__sc_k1', 'dp__sc_z2')),
dp__sc_t2 AS (FROM dp__sips_cumulative_next('dp__sc_k1', 'dp__sc_z2', cumulative_share2, mean_sigma2, last_rho, tilt)),
dp__sc_k2 AS MATERIALIZED (FROM query_table(CASE WHEN plain THEN 'dp__sc_j2' ELSE 'dp__sc_t2' END)
                           WHERE rounds >= 3),
dp__sc_z3 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k2', 'dp__sc_z2', share3, cumulative_share3,
                                                          sigma3, rho3, drop_below3, max_boost)
                           WHERE rounds >= 3),
dp__sc_j3 AS (FROM dp__sips_cumulative_next_plain('dp__sc_k2', 'dp__sc_z3')),
dp__sc_t3 AS (FROM dp__sips_cumulative_next('dp__sc_k2', 'dp__sc_z3', cumulative_share3, mean_sigma3, last_rho, tilt)),
dp__sc_k3 AS MATERIALIZED (FROM query_table(CASE WHEN plain THEN 'dp__sc_j3' ELSE 'dp__sc_t3' END)
                           WHERE rounds >= 4),
dp__sc_z4 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k3', 'dp__sc_z3', share4, cumulative_share4,
                                                          sigma4, rho4, drop_below4, max_boost)
                           WHERE rounds >= 4),
dp__sc_j4 AS (FROM dp__sips_cumulative_next_plain('dp__sc_k3', 'dp__sc_z4')),
dp__sc_t4 AS (FROM dp__sips_cumulative_next('dp__sc_k3', 'dp__sc_z4', cumulative_share4, mean_sigma4, last_rho, tilt)),
dp__sc_k4 AS MATERIALIZED (FROM query_table(CASE WHEN plain THEN 'dp__sc_j4' ELSE 'dp__sc_t4' END)
                           WHERE rounds >= 5),
dp__sc_z5 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k4', 'dp__sc_z4', share5, cumulative_share5,
                                                          sigma5, rho5, drop_below5, max_boost)
                           WHERE rounds >= 5),
dp__sc_j5 AS (FROM dp__sips_cumulative_next_plain('dp__sc_k4', 'dp__sc_z5')),
dp__sc_t5 AS (FROM dp__sips_cumulative_next('dp__sc_k4', 'dp__sc_z5', cumulative_share5, mean_sigma5, last_rho, tilt)),
dp__sc_k5 AS MATERIALIZED (FROM query_table(CASE WHEN plain THEN 'dp__sc_j5' ELSE 'dp__sc_t5' END)
                           WHERE rounds >= 6),
dp__sc_z6 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k5', 'dp__sc_z5', share6, cumulative_share6,
                                                          sigma6, rho6, drop_below6, max_boost)
                           WHERE rounds >= 6),
dp__sc_j6 AS (FROM dp__sips_cumulative_next_plain('dp__sc_k5', 'dp__sc_z6')),
dp__sc_t6 AS (FROM dp__sips_cumulative_next('dp__sc_k5', 'dp__sc_z6', cumulative_share6, mean_sigma6, last_rho, tilt)),
dp__sc_k6 AS MATERIALIZED (FROM query_table(CASE WHEN plain THEN 'dp__sc_j6' ELSE 'dp__sc_t6' END)
                           WHERE rounds >= 7),
dp__sc_z7 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k6', 'dp__sc_z6', share7, cumulative_share7,
                                                          sigma7, rho7, drop_below7, max_boost)
                           WHERE rounds >= 7),
dp__sc_j7 AS (FROM dp__sips_cumulative_next_plain('dp__sc_k6', 'dp__sc_z7')),
dp__sc_t7 AS (FROM dp__sips_cumulative_next('dp__sc_k6', 'dp__sc_z7', cumulative_share7, mean_sigma7, last_rho, tilt)),
dp__sc_k7 AS MATERIALIZED (FROM query_table(CASE WHEN plain THEN 'dp__sc_j7' ELSE 'dp__sc_t7' END)
                           WHERE rounds >= 8),
dp__sc_z8 AS MATERIALIZED (FROM dp__sips_cumulative_round('dp__sc_k7', 'dp__sc_z7', share8, cumulative_share8,
                                                          sigma8, rho8, drop_below8, max_boost)
                           WHERE rounds >= 8),
-- Progress (dpsql.core.progress): once round r's state is stored, dp__progress(r, rounds) reports r
-- of `rounds` rounds done to the caller's progress callback. Each branch reads one row (the count of
-- the round's items, never passed on) whatever the data, so whether and when a round is reported
-- depends on the rounds run alone; the final filter reads the always-true result, so the CTE runs.
dp__sc_progress AS MATERIALIZED (
    SELECT dp__progress(1, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z1)
    UNION ALL SELECT dp__progress(2, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z2) WHERE rounds >= 2
    UNION ALL SELECT dp__progress(3, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z3) WHERE rounds >= 3
    UNION ALL SELECT dp__progress(4, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z4) WHERE rounds >= 4
    UNION ALL SELECT dp__progress(5, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z5) WHERE rounds >= 5
    UNION ALL SELECT dp__progress(6, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z6) WHERE rounds >= 6
    UNION ALL SELECT dp__progress(7, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z7) WHERE rounds >= 7
    UNION ALL SELECT dp__progress(8, rounds) AS ok FROM (SELECT count(*) FROM dp__sc_z8) WHERE rounds >= 8)
SELECT item
FROM dp__sc_z1
WHERE (passed OR id IN (SELECT item FROM (FROM dp__sc_z2 UNION ALL FROM dp__sc_z3 UNION ALL FROM dp__sc_z4
                                          UNION ALL FROM dp__sc_z5 UNION ALL FROM dp__sc_z6 UNION ALL FROM dp__sc_z7
                                          UNION ALL FROM dp__sc_z8)
                        WHERE passed))
  AND (SELECT bool_and(ok) FROM dp__sc_progress);

-- The body: the call of dp__sips_cumulative_rounds above with the release's calibration as literals,
-- rendered while DuckDB binds by the pure UDF dp__sips_cumulative_rounds_sql
-- (dpsql.union.cumulative.rounds_sql), which checks every parameter and calibrates first; for an invalid
-- one it renders a call of the calibration UDF instead, whose error the release raises where it runs,
-- before anything is read (an error raised while binding would quote the statement). query() evaluates
-- even a volatile argument, so the argument's getvariable() makes DuckDB's binder refuse any parameter
-- that is not constant before the text is rendered (as in sql/30_union/90_dispatch.sql).
-- dpsql:body dp__body_set_union_sips_cumulative
FROM query(CASE WHEN getvariable('dp__bind:' || {'tbl': tbl, 'epsilon': epsilon, 'delta': delta, 'max_items': max_items,
                     'split': split, 'drop_margin': drop_margin, 'max_boost': max_boost, 'tilt': tilt,
                     'user_col': user_col, 'item_col': item_col}::VARCHAR) IS NULL OR true
                THEN dp__sips_cumulative_rounds_sql(tbl, epsilon, delta, max_items, split, drop_margin, max_boost, tilt,
                                                    user_col, item_col) END);
