-- Contribution bounding shared by every user-level mechanism.
-- A line `-- dpsql:portable <name>` directly above a macro or CTE marks a stage other engines may
-- translate (dpsql/frontends/portable.py; checked by tests/frontends/test_portable.py): rename it only with its users.

-- The (user_id, item) rows of one table or view, one per input row. `tbl` is typed VARCHAR so that a
-- list of tables is refused by the binder: one release reads one table.
-- A NULL user or item is an error (a NULL is not a user, and merging all NULL-user rows into
-- one "user" would under-count people); filter them out first if that is what you mean.
-- The constant column dp__absent keeps COLUMNS(...) from matching nothing (a binder error naming
-- dpsql's internals): a missing column becomes dp__check_columns' error, which names the parameter.
-- The NULL check is a filter, not coalesce(column, error(...)) in the projection: a projection through
-- error() loses the columns' statistics, and with them DuckDB's compressed keys (a BIGINT id that fits
-- 32 bits is hashed as an INTEGER), which made every DISTINCT and GROUP BY downstream slower than the
-- same query on the bare table (benchmarks/README.md, "Every method against the floor").
-- Both keys are by identity (sql/00_core/15_checks.sql): a type whose equal values can print differently is
-- refused before any row is read, and dp__canonical makes a VARCHAR of any collation binary, so every
-- group downstream holds one spelling (a released item is a function of its group, not of which private
-- row came first) and two spellings of a user id are two users. It adds no expression for other types:
-- a BIGINT item is read and hashed as the bare column.
CREATE OR REPLACE TEMP MACRO dp__user_item_rows(tbl VARCHAR, user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
SELECT user_id, item
FROM (SELECT dp__canonical(coalesce(*COLUMNS(lambda c: lower(c) = lower(user_col) OR c = 'dp__absent'))) AS user_id,
             dp__canonical(coalesce(*COLUMNS(lambda c: lower(c) = lower(item_col) OR c = 'dp__absent'))) AS item
      FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)
            WHERE dp__check_columns(tbl, user_col, item_col)
              AND dp__check_key_columns(tbl, ['user_col', 'item_col'], [user_col, item_col])))
WHERE CASE WHEN user_id IS NULL
           THEN error('dpsql: column ' || user_col || ' (user_col) contains NULL; filter NULL users out first, e.g. with a view')
           WHEN item IS NULL
           THEN error('dpsql: column ' || item_col || ' (item_col) contains NULL; filter NULL items out first, e.g. with a view')
           ELSE true END;

-- Distinct (user_id, item) pairs of one table or view.
-- dpsql:portable dp__user_items
CREATE OR REPLACE TEMP MACRO dp__user_items(tbl VARCHAR, user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
SELECT DISTINCT user_id, item FROM dp__user_item_rows(tbl, user_col := user_col, item_col := item_col);

-- Each user's distinct items capped to max_items by a uniform sample without replacement
-- that depends only on that user's own rows: order the user's items by a hash keyed with a
-- per-query secret salt from the secure source and keep the first max_items. Users at or
-- under the cap keep every item and skip the ranking. Output: user_id, item, d = capped degree.
-- dpsql:portable dp__capped_user_items
CREATE OR REPLACE TEMP MACRO dp__capped_user_items(tbl VARCHAR, max_items DOUBLE := 100,
                                                   user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
WITH dp__pairs AS (FROM dp__user_items(tbl, user_col := user_col, item_col := item_col)),
dp__degrees AS (SELECT user_id, count(*) AS d FROM dp__pairs GROUP BY user_id),
dp__salt AS MATERIALIZED (SELECT hash(dp__secret_salt()) AS s)
SELECT user_id, item, d FROM dp__pairs JOIN dp__degrees USING (user_id) WHERE d <= max_items
UNION ALL
SELECT user_id, item, max_items::BIGINT AS d
FROM (SELECT user_id, item, hash(xor(hash(user_id, item), s)) AS h
      FROM dp__pairs JOIN dp__degrees USING (user_id) CROSS JOIN dp__salt
      WHERE d > max_items)
QUALIFY row_number() OVER (PARTITION BY user_id ORDER BY h) <= max_items;

-- The same capped rows (for one salt: the same rows, tests/union/test_union.py), computed by one window
-- over the distinct pairs. For callers that store the capped rows themselves (MAD, MAD2R, DP-SIPS:
-- their rounds re-read them): dp__capped_user_items reads the pairs three times, so DuckDB stores
-- the pairs and the degrees as well, two more copies that spill on a table larger than memory.
-- For a caller that reads the capped rows once, dp__capped_user_items is the faster: this window
-- sorts every user's pairs, the join ranks only the users over the cap (benchmarks/README.md,
-- "Out-of-core"). The ranking key hash(xor(hash(user_id, item), s)) must stay the same in both.
-- dpsql:portable dp__capped_user_items_window
CREATE OR REPLACE TEMP MACRO dp__capped_user_items_window(tbl VARCHAR, max_items DOUBLE := 100,
                                                          user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
WITH dp__salt AS MATERIALIZED (SELECT hash(dp__secret_salt()) AS s)
SELECT user_id, item, least(d, max_items)::BIGINT AS d
FROM (SELECT user_id, item, count(*) OVER (PARTITION BY user_id) AS d,
             row_number() OVER (PARTITION BY user_id ORDER BY hash(xor(hash(user_id, item), s))) AS rn
      FROM dp__user_items(tbl, user_col := user_col, item_col := item_col) CROSS JOIN dp__salt)
WHERE rn <= max_items;
