-- Private GROUP BY item (dpsql/groupby/__init__.py; privacy argument: docs/proofs/group_by.md).
-- dp_group_by: the items a set-union method selects at (epsilon * split, delta), then granular Laplace
-- count / sum / mean of each selected item at (epsilon * (1 - split), 0). dp_group_by_public: every item
-- of a public table items_tbl, no selection, at (epsilon, 0). The selection step is the chosen method's
-- body, run through query() (see dp__body_group_by).
-- Each macro here is a body; the releasing macros are generated around them (sql/00_core/00_release.sql).
-- Output: item, then per requested aggregate its value, its noise scale (Laplace b; none for the mean)
-- and the half-width of a `confidence` interval; rows sorted by item.

-- dp_group_by_calibration(epsilon, delta, ...), dp_group_by's calibration without running it (the noise scale,
-- grid and interval half-width of each measurement, from the public parameters only), is generated from the
-- declaration (dpsql.groupby.generated_sql), so its defaults are dp_group_by's.

-- (user_id, item, v) per input row; v = value_col as DOUBLE (NULL when value_col is NULL). The value
-- column must have a type whose conversion to DOUBLE cannot fail (dp__check_value_type, on the schema
-- before any row is read: a BIGNUM passes the binder's `+ 0::DOUBLE` but fails on a huge value and
-- quotes it). A NULL value is skipped by the sum, as SQL's SUM skips it, and never raises: the
-- aggregates read only the rows of the selected items, so an error there would tell whether a selected
-- item holds a NULL (docs/proofs/group_by.md, "NULL values"). Keys by identity (sql/00_core/15_checks.sql).
CREATE OR REPLACE TEMP MACRO dp__user_item_value_rows(tbl VARCHAR, value_col VARCHAR, user_col VARCHAR := 'user_id',
        item_col VARCHAR := 'item') AS TABLE
-- The NULL check is a filter, as in dp__user_item_rows: it keeps the columns' statistics (compressed keys).
SELECT user_id, item, v
FROM (SELECT dp__canonical(coalesce(*COLUMNS(lambda c: lower(c) = lower(user_col) OR c = 'dp__absent'))) AS user_id,
             dp__canonical(coalesce(*COLUMNS(lambda c: lower(c) = lower(item_col) OR c = 'dp__absent'))) AS item,
             coalesce(*COLUMNS(lambda c: lower(c) = lower(value_col) OR c = 'dp__absent')) + 0::DOUBLE AS v
      FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)
            WHERE dp__check_column_list(tbl, ['user_col', 'item_col', 'value_col'],
                                        [user_col, item_col, coalesce(value_col, user_col)])
              -- keys by identity, and a value column whose cast to DOUBLE cannot fail on a private
              -- value (a BIGNUM would, quoting it): both by type, before any row is read
              AND dp__check_key_columns(tbl, ['user_col', 'item_col'], [user_col, item_col])
              AND (value_col IS NULL OR dp__check_value_type(tbl, value_col, 'value_col'))))
WHERE CASE WHEN user_id IS NULL
           THEN error('dpsql: column ' || user_col || ' (user_col) contains NULL; filter NULL users out first, e.g. with a view')
           WHEN item IS NULL
           THEN error('dpsql: column ' || item_col || ' (item_col) contains NULL; filter NULL items out first, e.g. with a view')
           ELSE true END;

-- The pre-thresholded selection of dp_group_by (pre_threshold T > 1; docs/proofs/group_by.md):
-- the one-shot weighting of `method` (count_*, weighted_*) over the capped rows; an item with n >= T
-- capped users is released when w - (T - 1) + noise > the method's threshold. Every user's weight per
-- item is <= 1, so an item that reaches T users with the added user has w - (T - 1) <= that user's own
-- weight: exactly the novel-item case the threshold's delta covers. No charge here: it is a step of
-- dp_group_by's release; the noisy weights never leave it.
CREATE OR REPLACE TEMP MACRO dp__group_by_pre_selection(tbl VARCHAR, epsilon DOUBLE, delta DOUBLE, max_items DOUBLE,
        method VARCHAR, pre_threshold DOUBLE, user_col VARCHAR, item_col VARCHAR) AS TABLE
WITH dp__cal AS (SELECT unnest(dp__group_by_pre_calibration(method, epsilon, delta, max_items, pre_threshold))),
-- dpsql:portable dp__weights
dp__weights AS MATERIALIZED (
    SELECT item, count(*) AS n,
           sum(CASE c.weighting WHEN 'count' THEN 1.0 WHEN 'inverse' THEN 1.0 / d ELSE 1.0 / sqrt(d) END) AS w
    FROM dp__capped_user_items(tbl, max_items := max_items, user_col := user_col, item_col := item_col)
    CROSS JOIN dp__cal AS c
    GROUP BY item)
SELECT item FROM dp__weights CROSS JOIN dp__cal AS c
WHERE n >= pre_threshold
  AND w - c.shift + CASE WHEN c.gaussian THEN dp_gaussian_noise(c.scale) ELSE dp_laplace_noise(c.scale) END > c.threshold
ORDER BY item;

-- dpsql:body dp__body_group_by
WITH dp__cal AS (
    SELECT unnest(dp__group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper, selection,
                                           split, pre_threshold, confidence, user_col, item_col))),
-- Selection: the set-union method's body (or, with pre_threshold > 1, dp__group_by_pre_selection) at
-- (epsilon * split, delta), inside this release (its wrapper charges the total once). query() binds and
-- runs only that step: its text is rendered while binding by dp__group_by_selection_sql
-- (dpsql.groupby.selection_call_sql, every value a literal), which checks every parameter of
-- dp_group_by first. query() evaluates even a volatile argument, so the getvariable() in it makes the
-- binder refuse a non-constant parameter before the text is rendered (as in sql/30_union/90_dispatch.sql).
dp__selected AS MATERIALIZED (
    FROM query(CASE WHEN getvariable('dp__bind:' || {'tbl': tbl, 'epsilon': epsilon, 'delta': delta,
                         'max_items': max_items, 'aggregates': aggregates, 'value_col': value_col, 'lower': lower,
                         'upper': upper, 'selection': selection, 'split': split, 'pre_threshold': pre_threshold,
                         'confidence': confidence, 'user_col': user_col, 'item_col': item_col}::VARCHAR) IS NULL OR true
                    THEN dp__group_by_selection_sql(tbl, epsilon, delta, max_items, aggregates, value_col, lower,
                                                    upper, selection, split, pre_threshold, confidence, user_col,
                                                    item_col) END)),
-- Per (user, item of the selection): the user's total of the item's values.
dp__totals AS (
    SELECT r.user_id, r.item, sum(r.v) AS v
    FROM dp__user_item_value_rows(tbl, value_col, user_col := user_col, item_col := item_col) AS r
    SEMI JOIN dp__selected AS s ON r.item = s.item
    GROUP BY r.user_id, r.item),
dp__salt AS MATERIALIZED (SELECT hash(dp__secret_salt()) AS s),
-- Each user keeps at most max_items of its selected items (salted hash of its own rows, as
-- dp__capped_user_items); its total per item is clamped to [lower, upper] and rounded to the grid g of
-- the sum's noise, so each item's sum is an exact integer number of steps (no floating-point rounding
-- that depends on the order of summation; |rounded cell| <= M + g/2, docs/proofs/group_by.md).
-- dpsql:portable dp__stats
dp__stats AS MATERIALIZED (
    SELECT item, count(*) AS n,
           sum(CASE WHEN v IS NOT NULL
                    THEN round(greatest(dp__cal.lower, least(dp__cal.upper, v)) / dp__cal.sum_granularity)::BIGINT END)
               AS s_steps
    FROM (SELECT user_id, item, v FROM dp__totals CROSS JOIN dp__salt
          QUALIFY row_number() OVER (PARTITION BY user_id ORDER BY hash(xor(hash(user_id, item), s))) <= max_items)
    CROSS JOIN dp__cal
    GROUP BY item),
dp__noisy AS MATERIALIZED (
    SELECT d.item,
           CASE WHEN c.count_scale IS NOT NULL
                THEN coalesce(t.n, 0) + dp_granular_laplace_noise(c.count_scale, c.count_granularity) END AS n_noisy,
           CASE WHEN c.sum_scale IS NOT NULL
                THEN greatest(-c.sum_limit, least(c.sum_limit, coalesce(t.s_steps, 0)))::DOUBLE * c.sum_granularity
                     + dp_granular_laplace_noise(c.sum_scale, c.sum_granularity) END AS s_noisy
    FROM dp__selected AS d LEFT JOIN dp__stats AS t ON d.item = t.item CROSS JOIN dp__cal AS c)
SELECT item, COLUMNS(lambda c: list_contains(aggregates, split_part(c, '_', 1)))
FROM (SELECT item, n_noisy AS "count", count_scale AS count_scale, count_ci AS count_ci,
             s_noisy AS "sum", sum_scale AS sum_scale, sum_ci AS sum_ci,
             -- post-processing of the released count and sum; the interval holds w.p. >= confidence
             -- (union bound over both at (1 + confidence)/2) whenever the true count is >= 1.
             CASE WHEN n_noisy > 0 THEN greatest(lower, least(upper, s_noisy / n_noisy)) END AS mean,
             CASE WHEN n_noisy > 0 THEN least(upper - lower,
                  (mean_sum_ci + greatest(abs(lower), abs(upper)) * mean_count_ci) / n_noisy) END AS mean_ci
      FROM dp__noisy CROSS JOIN dp__cal);

-- dpsql:body dp__body_group_by_public
WITH dp__cal AS (
    SELECT unnest(dp__group_by_public_calibration(epsilon, max_items, aggregates, value_col, lower, upper,
                                                  confidence, user_col, item_col))),
-- The public domain: the distinct items of items_tbl's item_col column (public: its errors may name values).
dp__selected AS MATERIALIZED (
    SELECT DISTINCT dp__canonical(coalesce(coalesce(*COLUMNS(lambda c: lower(c) = lower(item_col) OR c = 'dp__absent')),
                             error('dpsql: column ' || item_col || ' (item_col) of items_tbl contains NULL; '
                                   || 'filter it out first'))) AS item
    FROM (SELECT *, NULL AS dp__absent FROM query_table(items_tbl)
          -- the public and the private item columns must have one type before they are joined: DuckDB's
          -- join would otherwise cast the private items and quote one it cannot convert
          WHERE dp__check_column_list(items_tbl, ['item_col'], [item_col])
            AND dp__check_same_type(items_tbl, item_col, 'items_tbl', tbl, item_col, 'item_col'))),
dp__totals AS (
    SELECT r.user_id, r.item, sum(r.v) AS v
    FROM dp__user_item_value_rows(tbl, value_col, user_col := user_col, item_col := item_col) AS r
    SEMI JOIN dp__selected AS s ON r.item = s.item
    GROUP BY r.user_id, r.item),
dp__salt AS MATERIALIZED (SELECT hash(dp__secret_salt()) AS s),
dp__stats AS MATERIALIZED (
    SELECT item, count(*) AS n,
           sum(CASE WHEN v IS NOT NULL
                    THEN round(greatest(dp__cal.lower, least(dp__cal.upper, v)) / dp__cal.sum_granularity)::BIGINT END)
               AS s_steps
    FROM (SELECT user_id, item, v FROM dp__totals CROSS JOIN dp__salt
          QUALIFY row_number() OVER (PARTITION BY user_id ORDER BY hash(xor(hash(user_id, item), s))) <= max_items)
    CROSS JOIN dp__cal
    GROUP BY item),
dp__noisy AS MATERIALIZED (
    SELECT d.item,
           CASE WHEN c.count_scale IS NOT NULL
                THEN coalesce(t.n, 0) + dp_granular_laplace_noise(c.count_scale, c.count_granularity) END AS n_noisy,
           CASE WHEN c.sum_scale IS NOT NULL
                THEN greatest(-c.sum_limit, least(c.sum_limit, coalesce(t.s_steps, 0)))::DOUBLE * c.sum_granularity
                     + dp_granular_laplace_noise(c.sum_scale, c.sum_granularity) END AS s_noisy
    FROM dp__selected AS d LEFT JOIN dp__stats AS t ON d.item = t.item CROSS JOIN dp__cal AS c)
SELECT item, COLUMNS(lambda c: list_contains(aggregates, split_part(c, '_', 1)))
FROM (SELECT item, n_noisy AS "count", count_scale AS count_scale, count_ci AS count_ci,
             s_noisy AS "sum", sum_scale AS sum_scale, sum_ci AS sum_ci,
             CASE WHEN n_noisy > 0 THEN greatest(lower, least(upper, s_noisy / n_noisy)) END AS mean,
             CASE WHEN n_noisy > 0 THEN least(upper - lower,
                  (mean_sum_ci + greatest(abs(lower), abs(upper)) * mean_count_ci) / n_noisy) END AS mean_ci
      FROM dp__noisy CROSS JOIN dp__cal);
