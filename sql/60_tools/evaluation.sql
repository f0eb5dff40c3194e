-- NON-PRIVATE evaluation of released item sets (Dick, Joseph & Raman, "Missing Mass for DP Domain
-- Discovery", Sec. 2 and 4; Chen et al., Figure 1). Every dp_eval_* macro reads the RAW table and
-- returns exact statistics of it: its output is NOT differentially private and must not be
-- published. Use them to judge mechanisms on data you may look at (tests, benchmarks, demos).
-- `released_tbl` names a table or view with a column `released_col` (default 'item') holding the
-- released items, e.g. a table made with CREATE TABLE r AS SELECT * FROM dp_top_k(...).
-- N(x) = number of distinct users holding x, N = sum_x N(x) = number of distinct (user, item) pairs.

-- Distinct non-NULL released items.
CREATE OR REPLACE TEMP MACRO dp__eval_released_items(released_tbl VARCHAR, released_col VARCHAR := 'item') AS TABLE
-- dp__absent (sql/00_core/20_contribution_bounding.sql): a missing column is dp__check_column's error, which names
-- the parameter, instead of a binder error naming dpsql's internals.
SELECT DISTINCT item
FROM (SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(released_col) OR c = 'dp__absent')) AS item
      FROM (SELECT *, NULL AS dp__absent FROM query_table(released_tbl)
            WHERE dp__check_column(released_tbl, 'released_col', released_col)))
WHERE item IS NOT NULL;

-- TRUE, or the error naming the first of user_col, item_col, released_col that is not a column of its table. Each
-- dp_eval_* macro evaluates it on a one-row source: a missing column reads as a constant NULL, and the optimizer
-- may then drop the plan that holds the per-row checks (nothing is released, so no row would ever be checked).
CREATE OR REPLACE TEMP MACRO dp__eval_check(tbl, released_tbl, user_col, item_col, released_col) AS
    dp__check_columns(tbl, user_col, item_col) AND dp__check_column(released_tbl, 'released_col', released_col);

-- N(x) of every item of the raw table (uncapped).
CREATE OR REPLACE TEMP MACRO dp__eval_item_counts(tbl VARCHAR, user_col VARCHAR := 'user_id',
                                                  item_col VARCHAR := 'item') AS TABLE
SELECT item, count(*) AS n FROM dp__user_items(tbl, user_col := user_col, item_col := item_col) GROUP BY item;

-- MM_p(W, S) = || (N(x)/N)_{x not in S} ||_p. p = 1: missing mass MM; p = 0: number of items missed;
-- p = 'infinity'::DOUBLE: largest missed share. One row (p, missing_mass); 0 for an empty table.
CREATE OR REPLACE TEMP MACRO dp_eval_missing_mass(tbl VARCHAR, released_tbl VARCHAR, p DOUBLE := 1,
        user_col VARCHAR := 'user_id', item_col VARCHAR := 'item', released_col VARCHAR := 'item') AS TABLE
WITH dp__chk AS (
    SELECT CASE WHEN p IS NULL OR isnan(p) OR p < 0
                THEN error('dpsql: p must be a number >= 0 or infinity (got ' || coalesce(p::VARCHAR, 'NULL') || ')')
                ELSE p END AS p
    WHERE dp__eval_check(tbl, released_tbl, user_col, item_col, released_col)),
dp__freq AS (FROM dp__eval_item_counts(tbl, user_col := user_col, item_col := item_col)),
dp__tot AS (SELECT sum(n)::DOUBLE AS total FROM dp__freq),
dp__rel AS (FROM dp__eval_released_items(released_tbl, released_col := released_col)),
dp__missed AS (
    SELECT f.n / t.total AS share
    FROM dp__freq AS f CROSS JOIN dp__tot AS t
    WHERE NOT EXISTS (SELECT 1 FROM dp__rel AS r WHERE r.item = f.item))
SELECT c.p,
       CASE WHEN c.p = 0 THEN (SELECT count(*) FROM dp__missed)::DOUBLE
            WHEN isinf(c.p) THEN coalesce((SELECT max(share) FROM dp__missed), 0.0)
            ELSE coalesce((SELECT power(sum(power(share, c.p)), 1.0 / c.p) FROM dp__missed), 0.0) END AS missing_mass
FROM dp__chk AS c;

-- Top-k missing mass MM^k(W, S) = (sum_{i<=k} N_(i) - sum_{x in S} N(x)) / N for a released S of at most k
-- items (more is an error: pass the first k by rank). One row (k, released_items, top_k_missing_mass).
CREATE OR REPLACE TEMP MACRO dp_eval_top_k_missing_mass(tbl VARCHAR, released_tbl VARCHAR, k DOUBLE,
        user_col VARCHAR := 'user_id', item_col VARCHAR := 'item', released_col VARCHAR := 'item') AS TABLE
WITH dp__chk AS (
    SELECT CASE WHEN k IS NULL OR isnan(k) OR isinf(k) OR k < 1 OR k > 1e15 OR k <> floor(k)
                THEN error('dpsql: k must be a whole number between 1 and 1e15 (got ' || coalesce(k::VARCHAR, 'NULL') || ')')
                ELSE least(k, 1e15)::BIGINT END AS k  -- least: the cast must not fail before the check
    WHERE dp__eval_check(tbl, released_tbl, user_col, item_col, released_col)),
dp__freq AS (FROM dp__eval_item_counts(tbl, user_col := user_col, item_col := item_col)),
dp__rel AS (FROM dp__eval_released_items(released_tbl, released_col := released_col)),
dp__q AS (
    SELECT CASE WHEN count(*) > any_value(c.k)
                THEN error('dpsql: released_tbl ''' || released_tbl || ''' holds ' || count(*) || ' items, more than k = ' || any_value(c.k)
                           || '; pass only the first k released items')
                ELSE count(*) END AS q
    FROM dp__rel CROSS JOIN dp__chk AS c),
dp__top AS (
    SELECT coalesce(sum(n), 0) AS top_sum
    FROM (SELECT n, row_number() OVER (ORDER BY n DESC) AS r FROM dp__freq) CROSS JOIN dp__chk AS c WHERE r <= c.k),
dp__got AS (SELECT coalesce(sum(f.n), 0) AS got_sum FROM dp__freq AS f SEMI JOIN dp__rel AS r ON f.item = r.item),
dp__tot AS (SELECT sum(n)::DOUBLE AS total FROM dp__freq)
SELECT c.k, dp__q.q AS released_items,
       coalesce((dp__top.top_sum - dp__got.got_sum) / nullif(dp__tot.total, 0), 0.0) AS top_k_missing_mass
FROM dp__chk AS c, dp__q, dp__top, dp__got, dp__tot;

-- Hits(W, S) = number of users holding at least one released item. One row (hits, users).
CREATE OR REPLACE TEMP MACRO dp_eval_hits(tbl VARCHAR, released_tbl VARCHAR,
        user_col VARCHAR := 'user_id', item_col VARCHAR := 'item', released_col VARCHAR := 'item') AS TABLE
WITH dp__pairs AS (FROM dp__user_items(tbl, user_col := user_col, item_col := item_col)),
dp__rel AS (FROM dp__eval_released_items(released_tbl, released_col := released_col))
SELECT (SELECT count(DISTINCT p.user_id) FROM dp__pairs AS p SEMI JOIN dp__rel AS r ON p.item = r.item) AS hits,
       (SELECT count(DISTINCT user_id) FROM dp__pairs) AS users
FROM (SELECT dp__eval_check(tbl, released_tbl, user_col, item_col, released_col) AS ok) WHERE ok;

-- Items and released items per frequency bucket (the data of Chen et al., Figure 1): bucket b holds
-- the items with 2^b <= N(x) <= 2^(b+1) - 1. Released items absent from the table are ignored.
CREATE OR REPLACE TEMP MACRO dp_eval_coverage_by_frequency(tbl VARCHAR, released_tbl VARCHAR,
        user_col VARCHAR := 'user_id', item_col VARCHAR := 'item', released_col VARCHAR := 'item') AS TABLE
WITH dp__chk AS MATERIALIZED (SELECT dp__eval_check(tbl, released_tbl, user_col, item_col, released_col) AS ok),
dp__freq AS (FROM dp__eval_item_counts(tbl, user_col := user_col, item_col := item_col)),
dp__rel AS (FROM dp__eval_released_items(released_tbl, released_col := released_col)),
dp__tagged AS (
    SELECT floor(log2(f.n))::INTEGER AS bucket, r.item IS NOT NULL AS is_released
    FROM dp__freq AS f LEFT JOIN dp__rel AS r ON f.item = r.item)
SELECT bucket, (2 ** bucket)::BIGINT AS min_frequency, (2 ** (bucket + 1) - 1)::BIGINT AS max_frequency,
       count(*) AS items, count(*) FILTER (WHERE is_released) AS released_items
FROM dp__tagged WHERE (SELECT ok FROM dp__chk) GROUP BY bucket ORDER BY bucket;
