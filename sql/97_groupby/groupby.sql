-- Private GROUP BY (dpsql/groupby/; privacy argument: docs/proofs/group_by.md).
-- dp_group_by: the groups a set-union method selects (or those of a public table items_tbl), then noisy
-- aggregates of each group; dp_group_by_public: every group of a public table items_tbl, no selection,
-- Laplace noise at (epsilon, 0). The calibration (budget
-- split, accountant, noise, contribution bounds) is dpsql.groupby.calibration's, read from dp__cal.
-- Steps whose SQL depends on the parameters' shape (the selection method, one item column or several
-- group columns) are rendered as text by pure UDFs while binding and run through query().
-- Each macro marked dpsql:body is a body; the releasing macros are generated around them
-- (sql/00_core/00_release.sql).
-- Output: the group (item, or one column per group_cols column), then per requested aggregate its
-- value, its noise scale (none for the derived mean, variance and stddev) and the half-width of a
-- `confidence` interval, before the post-processing of the values (docs/proofs/group_by.md §7).

-- dp_group_by_calibration(epsilon, delta, ...), dp_group_by's calibration without running it, is generated
-- from the declaration (dpsql.groupby.generated_sql), so its defaults are dp_group_by's.

-- (user_id, item, v) per input row; v = value_col as DOUBLE (NULL when value_col is NULL). The value
-- column must have a type whose conversion to DOUBLE cannot fail (dp__check_value_type, on the schema
-- before any row is read: a BIGNUM passes the binder's `+ 0::DOUBLE` but fails on a huge value and
-- quotes it). A NULL value never raises: the aggregates read only the rows of the selected items, so an
-- error there would tell whether a selected item holds a NULL (docs/proofs/group_by.md, "NULL values").
-- Keys by identity (sql/00_core/15_checks.sql).
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

-- The group key of several columns (group_cols): the JSON array of the columns' values, in the table's
-- column order, as binary-collated text (dp__canonical). Every column must have a key type that groups
-- by identity (dp__check_key_columns, the same allow-list as item_col); for those types the JSON text
-- of a value is a function of its identity class and tells different classes apart (strings escaped,
-- numbers, dates and times in their one spelling), so equal keys are equal tuples of values and one
-- key's columns are one tuple (docs/proofs/group_by.md §10). A NULL in any group column is refused, as
-- a NULL item is. The columns are selected case-insensitively; `group_cols` is checked in Python first
-- (dpsql.groupby.check_group_cols: non-empty, distinct names, none an output column's name).
CREATE OR REPLACE TEMP MACRO dp__group_key_value_rows(tbl VARCHAR, value_col VARCHAR, user_col VARCHAR,
        group_cols VARCHAR[]) AS TABLE
SELECT user_id, item, v
FROM (SELECT dp__canonical(coalesce(*COLUMNS(lambda c: lower(c) = lower(user_col) OR c = 'dp__absent'))) AS user_id,
             dp__canonical(json_array(*COLUMNS(lambda c: list_contains(list_transform(group_cols, lambda g: lower(g)),
                                                                        lower(c))))::VARCHAR) AS item,
             coalesce(*COLUMNS(lambda c: lower(c) = lower(value_col) OR c = 'dp__absent')) + 0::DOUBLE AS v
      FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)
            WHERE dp__check_column_list(tbl, ['user_col', 'value_col'] || list_transform(group_cols, lambda g: 'group_cols'),
                                        [user_col, coalesce(value_col, user_col)] || group_cols)
              AND dp__check_key_columns(tbl, ['user_col'] || list_transform(group_cols, lambda g: 'group_cols'),
                                        [user_col] || group_cols)
              AND (value_col IS NULL OR dp__check_value_type(tbl, value_col, 'value_col'))))
WHERE CASE WHEN user_id IS NULL
           THEN error('dpsql: column ' || user_col || ' (user_col) contains NULL; filter NULL users out first, e.g. with a view')
           WHEN list_contains(list_transform(json_extract(item, '$[*]'), lambda x: json_type(x)), 'NULL')
           THEN error('dpsql: a column of group_cols (' || array_to_string(group_cols, ', ') || ') contains NULL; '
                      || 'filter NULL groups out first, e.g. with a view')
           ELSE true END;

-- The pre-thresholded selection of dp_group_by (pre_threshold T > 1; docs/proofs/group_by.md §8):
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

-- The median's utility (docs/proofs/group_by.md §6): for every group of `groups` (column item) and grid
-- point j = 0..K of lower + j (upper - lower)/K, u(j) = -|B(j) - A(j)|, B (A) the number of kept cells of
-- `kept` (item, v) whose value x = clamp(coalesce(v, 0), lower, upper), snapped to its nearest grid point,
-- lies below (above) j. A user adds one cell to a group, which moves B or A (or neither) of each point by
-- at most 1: sensitivity 1 per group. No rows unless the calibration `cal` has a median (median_scale).
-- dpsql:portable dp__median_utility
CREATE OR REPLACE TEMP MACRO dp__median_utility(kept, groups, cal) AS TABLE
WITH dp__hist AS (
    SELECT item, least(c.median_bins, greatest(0, round((greatest(c.lower, least(c.upper, coalesce(v, 0.0))) - c.lower)
                                                     / c.median_step)))::BIGINT AS j, count(*) AS h
    FROM query_table(kept) CROSS JOIN query_table(cal) AS c
    WHERE c.median_scale IS NOT NULL
    GROUP BY ALL),
dp__grid AS (
    SELECT s.item, unnest(range(0, c.median_bins::BIGINT + 1)) AS j
    FROM query_table(groups) AS s CROSS JOIN query_table(cal) AS c
    WHERE c.median_scale IS NOT NULL)
SELECT item, j,
       -abs(coalesce(sum(h) OVER (PARTITION BY item ORDER BY j ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
            - coalesce(sum(h) OVER (PARTITION BY item ORDER BY j ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING), 0))
           AS u
FROM (SELECT g.item, g.j, coalesce(hh.h, 0) AS h FROM dp__grid AS g
      LEFT JOIN dp__hist AS hh ON g.item = hh.item AND g.j = hh.j);

-- The granular noise of one measurement: g * N_Z(0, (scale/g)^2) or g * DLap(scale/g) (dpsql/core/noise.py).
-- `gaussian` is one constant of the release, so only one sampler draws.
CREATE OR REPLACE TEMP MACRO dp__group_by_noise(gaussian, scale, granularity) AS
    CASE WHEN gaussian THEN dp_granular_gaussian_noise(scale, granularity)
         ELSE dp_granular_laplace_noise(scale, granularity) END;

-- The released rows of one GROUP BY, from the noisy measurements (dp__measured: item, n_noisy, r_noisy,
-- s_noisy, q_noisy, median_j) and the calibration row c: post-processing of released numbers and public
-- parameters only (docs/proofs/group_by.md §7). The half-widths are those of the noise, before the
-- rounding and clamping here (a clamp towards a set that holds the true value only moves the estimate
-- closer to it).
--   count, rows: rounded to the nearest integer, at least 0;
--   sum: at least 0 when lower >= 0, at most 0 when upper <= 0 (every user's value has that sign);
--   mean = clamp(sum / count, lower, upper); variance = clamp(sumsq / count - (mean - centre)^2, 0, R^2);
--   stddev = sqrt(variance) (all NULL when the noisy count is <= 0); median = the chosen grid point.
-- mean_ci, variance_ci: union bounds over their measurements' intervals (calibration: ci_mean, ci_variance)
-- divided by the noisy count; stddev_ci = sqrt(variance_ci) (|sqrt(a) - sqrt(b)| <= sqrt(|a - b|)).
-- dpsql:portable dp__group_by_output
CREATE OR REPLACE TEMP MACRO dp__group_by_output(noisy, cal) AS TABLE
SELECT item,
       CASE WHEN n_noisy IS NOT NULL THEN greatest(0, round(n_noisy))::BIGINT END AS "count",
       count_scale, count_ci,
       CASE WHEN r_noisy IS NOT NULL THEN greatest(0, round(r_noisy))::BIGINT END AS "rows",
       rows_scale, rows_ci,
       CASE WHEN lower >= 0 THEN greatest(0, s_noisy) WHEN upper <= 0 THEN least(0, s_noisy) ELSE s_noisy END AS "sum",
       sum_scale, sum_ci,
       CASE WHEN n_noisy > 0 THEN greatest(lower, least(upper, s_noisy / n_noisy)) END AS mean,
       CASE WHEN n_noisy > 0 THEN least(upper - lower,
            (mean_sum_ci + greatest(abs(lower), abs(upper)) * mean_count_ci) / n_noisy) END AS mean_ci,
       CASE WHEN n_noisy > 0 THEN greatest(0.0, least(half * half,
            q_noisy / n_noisy - pow(greatest(lower, least(upper, s_noisy / n_noisy)) - centre, 2))) END AS variance,
       CASE WHEN n_noisy > 0 THEN least(half * half, (var_sumsq_ci + half * half * var_count_ci) / n_noisy
            + 2.0 * half * least(upper - lower, (var_sum_ci + greatest(abs(lower), abs(upper)) * var_count_ci) / n_noisy))
            END AS variance_ci,
       sqrt(variance) AS stddev,
       least(half, sqrt(variance_ci)) AS stddev_ci,
       lower + median_j * median_step AS median, median_scale, median_ci
FROM query_table(noisy) CROSS JOIN query_table(cal);

-- The rows (user_id, item, v) of a release: dp__user_item_value_rows, or dp__group_key_value_rows with
-- group_cols, rendered as text (dpsql.groupby.rows_sql) while binding and run through query(); the
-- getvariable() makes the binder refuse a non-constant parameter first (as in the bodies below).
CREATE OR REPLACE TEMP MACRO dp__group_by_value_rows(tbl, value_col, user_col, item_col, group_cols) AS TABLE
FROM query(CASE WHEN getvariable('dp__bind:' || {'tbl': tbl, 'value_col': value_col, 'user_col': user_col,
                     'item_col': item_col, 'group_cols': group_cols}::VARCHAR) IS NULL OR true
                THEN dp__group_by_rows_sql(tbl, value_col, user_col, item_col, group_cols) END);

-- The median of each group of `groups` (column item): the exponential mechanism over the grid points of
-- dp__median_utility on the cells `kept` and the calibration `cal`, sampled as argmax u(j) + Gumbel(2/eps0)
-- (the Gumbel-max form of exp(eps0 u / 2); float Gumbel noise only decides the argmax, never a released number).
CREATE OR REPLACE TEMP MACRO dp__group_by_median(kept, groups, cal) AS TABLE
SELECT item, arg_max(j, u + dp_gumbel_noise(c.median_scale)) AS median_j
FROM dp__median_utility(kept, groups, cal) CROSS JOIN query_table(cal) AS c
GROUP BY item;

-- The aggregate step of both bodies, given the groups (public from here on): each user's cells capped,
-- the exact measurements, their noise, the median, then the released columns with each group's labels.
-- Relation parameters, the names of the caller's CTEs: `value_rows` (user_id, item, v: the release's
-- dp__group_by_value_rows, one CTE so that DuckDB binds its query once), and MATERIALIZED ones, each
-- evaluated once per release however often it is read here: `groups` (item, n_selected: the noisy count that
-- selected the group, post_threshold's, else NULL), `cal` (the one-row calibration, dpsql.groupby._cal_row),
-- `salt` (s: the release's one cap salt, which dp_group_by's post_threshold cap shares). The groups'
-- columns are read from `labels_tbl` (the public list, else the private table).
CREATE OR REPLACE TEMP MACRO dp__group_by_aggregates(value_rows, groups, cal, salt, labels_tbl, group_cols,
        aggregates, max_items, max_groups) AS TABLE
-- Per (user, group of the selection): the user's total of the group's values and its number of rows.
WITH dp__totals AS (
    SELECT r.user_id, r.item, sum(r.v) AS v, count(*) AS r
    FROM query_table(value_rows) AS r
    SEMI JOIN query_table(groups) AS s ON r.item = s.item
    GROUP BY r.user_id, r.item),
-- Each user keeps at most max_groups of its selected groups (NULL: max_items), the first by a salted
-- hash of the user's own rows (as dp__capped_user_items): the aggregates' own cap, separate from the
-- selection's.
-- dpsql:portable dp__kept
dp__kept AS (
    SELECT user_id, item, v, r FROM dp__totals CROSS JOIN query_table(salt)
    QUALIFY row_number() OVER (PARTITION BY user_id ORDER BY hash(xor(hash(user_id, item), s)))
            <= coalesce(max_groups, max_items)),
-- Per group: n kept users; n_rows = sum of min(rows, max_rows); the value x = clamp(coalesce(total, 0),
-- lower, upper) of every kept user, rounded to each measurement's grid, so every sum is an exact integer
-- number of steps (no floating-point rounding that depends on the order of summation): s_steps = sum of
-- x / g_s, q_steps = sum of (x - centre)^2 / g_q. A NULL total adds NULL (skipped, as SQL's SUM) to
-- s_steps when 0 is within the bounds, where it would add 0 anyway.
-- dpsql:portable dp__stats
dp__stats AS MATERIALIZED (
    SELECT item, count(*) AS n,
           sum(least(r, dp__cal.max_rows))::BIGINT AS n_rows,
           sum(CASE WHEN v IS NOT NULL OR NOT (dp__cal.lower <= 0 AND dp__cal.upper >= 0)
                    THEN round(greatest(dp__cal.lower, least(dp__cal.upper, coalesce(v, 0.0)))
                               / dp__cal.sum_granularity)::BIGINT END) AS s_steps,
           sum(round(pow(greatest(dp__cal.lower, least(dp__cal.upper, coalesce(v, 0.0))) - dp__cal.centre, 2)
                     / dp__cal.sumsq_granularity)::BIGINT) AS q_steps
    FROM dp__kept CROSS JOIN query_table(cal) AS dp__cal
    GROUP BY item),
-- The median, only when requested (dp__group_by_median): its text is chosen while binding
-- (dpsql.groupby.median_sql), so a release without a median neither binds nor plans its grid and windows.
dp__median AS MATERIALIZED (
    FROM query(CASE WHEN getvariable('dp__bind:' || {'aggregates': aggregates, 'groups': groups,
                                                     'cal': cal}::VARCHAR) IS NULL OR true
                    THEN dp__group_by_median_sql(aggregates, 'dp__kept', groups, cal) END)),
-- The exact measurements of every group (also those no kept user holds), sorted by group: the noise then
-- meets the groups in that order, whatever the join's plan (a seeded release is reproducible).
dp__joined AS MATERIALIZED (
    SELECT d.item, d.n_selected, t.n, t.n_rows, t.s_steps, t.q_steps
    FROM query_table(groups) AS d LEFT JOIN dp__stats AS t ON d.item = t.item
    ORDER BY d.item),
-- Noise on every group of the selection. Sums are clamped to +-2^50 steps (1-Lipschitz, so the
-- sensitivity holds) so that sum + noise stays an exact multiple of g in a double (no error after the
-- charge). post_threshold's released count is the noisy count that selected the group (n_selected), not a
-- new draw. The median joins afterwards (dp__measured).
dp__noisy AS MATERIALIZED (
    SELECT t.item,
           CASE WHEN t.n_selected IS NOT NULL THEN t.n_selected
                WHEN c.count_scale IS NOT NULL
                THEN coalesce(t.n, 0) + dp__group_by_noise(c.gaussian, c.count_scale, c.count_granularity) END AS n_noisy,
           CASE WHEN c.rows_scale IS NOT NULL
                THEN coalesce(t.n_rows, 0) + dp__group_by_noise(c.gaussian, c.rows_scale, c.rows_granularity) END AS r_noisy,
           CASE WHEN c.sum_scale IS NOT NULL
                THEN greatest(-c.sum_limit, least(c.sum_limit, coalesce(t.s_steps, 0)))::DOUBLE * c.sum_granularity
                     + dp__group_by_noise(c.gaussian, c.sum_scale, c.sum_granularity) END AS s_noisy,
           CASE WHEN c.sumsq_scale IS NOT NULL
                THEN greatest(-c.sum_limit, least(c.sum_limit, coalesce(t.q_steps, 0)))::DOUBLE * c.sumsq_granularity
                     + dp__group_by_noise(c.gaussian, c.sumsq_scale, c.sumsq_granularity) END AS q_noisy
    FROM dp__joined AS t CROSS JOIN query_table(cal) AS c),
dp__measured AS (SELECT n.*, m.median_j FROM dp__noisy AS n LEFT JOIN dp__median AS m ON n.item = m.item),
-- The group's columns of each released key (dp__key): `item`, or the group_cols columns, read from
-- labels_tbl. They come first in the output (the release's ORDER BY ALL sorts by the group).
dp__labels AS MATERIALIZED (
    FROM query(CASE WHEN getvariable('dp__bind:' || {'tbl': labels_tbl, 'group_cols': group_cols,
                                                     'groups': groups}::VARCHAR) IS NULL OR true
                    THEN dp__group_by_labels_sql(labels_tbl, group_cols, groups) END))
SELECT * EXCLUDE (dp__key)
FROM dp__labels
JOIN (SELECT item AS dp__key, COLUMNS(lambda c: list_contains(aggregates, split_part(c, '_', 1)))
      FROM dp__group_by_output('dp__measured', cal)) USING (dp__key);

-- dpsql:body dp__body_group_by
-- Selection: the set-union method's body (or, with pre_threshold > 1, dp__group_by_pre_selection) at the
-- calibration's (selection_epsilon, selection_delta), inside this release (its wrapper charges the total
-- once). query() binds and runs only that step: its text is rendered while binding by
-- dp__group_by_selection_sql (dpsql.groupby.selection_call_sql, every value a literal), which checks every
-- parameter of dp_group_by first. query() evaluates even a volatile argument, so the getvariable() in it
-- makes the binder refuse a non-constant parameter before the text is rendered (as in
-- sql/30_union/90_dispatch.sql). With group_cols the method reads the keys (dp__group_key_value_rows) of a
-- CTE of that text. With a public items_tbl there is no selection: the groups are its rows
-- (dpsql.groupby.public_items_sql, as dp_group_by_public's). With selection := 'post_threshold' the text
-- selects nothing: the groups are those whose noisy count passes the threshold (dp__post_threshold below;
-- docs/proofs/post_threshold.md). Then the aggregate step, dp__group_by_aggregates.
WITH dp__rendered AS MATERIALIZED (
    FROM query(CASE WHEN getvariable('dp__bind:' || {'tbl': tbl, 'epsilon': epsilon, 'delta': delta,
                         'max_items': max_items, 'aggregates': aggregates, 'value_col': value_col, 'lower': lower,
                         'upper': upper, 'noise': noise, 'max_groups': max_groups, 'max_rows': max_rows,
                         'selection': selection, 'split': split, 'pre_threshold': pre_threshold,
                         'confidence': confidence, 'group_cols': group_cols, 'items_tbl': items_tbl,
                         'user_col': user_col, 'item_col': item_col}::VARCHAR) IS NULL OR true
                    THEN dp__group_by_selection_sql(tbl, epsilon, delta, max_items, aggregates, value_col, lower,
                                                    upper, noise, max_groups, max_rows, selection, split,
                                                    pre_threshold, confidence, group_cols, items_tbl, user_col,
                                                    item_col) END)),
-- The calibration (dpsql.groupby.calibration), its noise for L0 = min(max_groups, the groups released): no
-- user holds more of them (post_threshold: L0 = max_groups, its count noise selects). The release's parameters
-- were checked before anything was read (the wrapper).
-- The struct is unnested from a subquery: unnest(<the UDF call>) would copy the call into each of its ~40
-- fields, every copy bound and planned.
dp__cal AS MATERIALIZED (
    SELECT unnest(dp__c)
    FROM (SELECT dp__group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper, noise,
                                          max_groups, max_rows, selection, split, pre_threshold, confidence,
                                          group_cols, items_tbl, user_col, item_col, k.n) AS dp__c
          FROM (SELECT count(*) AS n FROM dp__rendered) AS k)),
dp__user_item_value_rows AS (FROM dp__group_by_value_rows(tbl, value_col, user_col, item_col, group_cols)),
dp__salt AS MATERIALIZED (SELECT hash(dp__secret_salt()) AS s),
-- post_threshold (docs/proofs/post_threshold.md): each user keeps at most max_groups of ALL its groups (the
-- salted hash of dp__group_by_aggregates's cap, the same salt), n = the kept users per group; the noisy count
-- n + Z of every such group, in group order (reproducible when seeded); a group is released iff it is >= the
-- calibration's threshold, with that same noisy count as its count. Empty unless selection = 'post_threshold'.
dp__post_threshold AS MATERIALIZED (
    SELECT t.item, t.n + dp__group_by_noise(c.gaussian, c.count_scale, c.count_granularity) AS n_noisy
    FROM (SELECT item, count(*) AS n
          FROM (SELECT item FROM (SELECT DISTINCT user_id, item FROM dp__user_item_value_rows
                                  WHERE selection = 'post_threshold' AND items_tbl IS NULL) CROSS JOIN dp__salt
                QUALIFY row_number() OVER (PARTITION BY user_id ORDER BY hash(xor(hash(user_id, item), s)))
                        <= coalesce(max_groups, max_items))
          GROUP BY item ORDER BY item) AS t CROSS JOIN dp__cal AS c),
dp__selected AS MATERIALIZED (
    SELECT item, NULL::DOUBLE AS n_selected FROM dp__rendered
    UNION ALL
    SELECT p.item, p.n_noisy FROM dp__post_threshold AS p CROSS JOIN dp__cal AS c
    WHERE p.n_noisy >= c.selection_threshold)
FROM dp__group_by_aggregates('dp__user_item_value_rows', 'dp__selected', 'dp__cal', 'dp__salt',
                             coalesce(items_tbl, tbl), group_cols, aggregates, max_items, max_groups);

-- dpsql:body dp__body_group_by_public
-- The public domain: the distinct groups of items_tbl (public: its errors may name values), as item_col's
-- canonical values, or as the keys of group_cols (dp__group_by_public_items_sql). The public and the
-- private columns must have one type each (dp__check_same_type): DuckDB's join would otherwise cast the
-- private items and quote one it cannot convert, and a key of another type would not meet its group.
-- No selection, so no selecting count (n_selected NULL). Then the aggregate step, dp__group_by_aggregates.
WITH dp__selected AS MATERIALIZED (
    SELECT item, NULL::DOUBLE AS n_selected
    FROM query(CASE WHEN getvariable('dp__bind:' || {'tbl': tbl, 'items_tbl': items_tbl, 'item_col': item_col,
                         'group_cols': group_cols}::VARCHAR) IS NULL OR true
                    THEN dp__group_by_public_items_sql(tbl, items_tbl, item_col, group_cols) END)),
dp__cal AS MATERIALIZED (
    SELECT unnest(dp__c)
    FROM (SELECT dp__group_by_public_calibration(epsilon, max_items, aggregates, value_col, lower, upper,
                                                 max_groups, max_rows, confidence, group_cols, user_col,
                                                 item_col, k.n) AS dp__c
          FROM (SELECT count(*) AS n FROM dp__selected) AS k)),
dp__user_item_value_rows AS (FROM dp__group_by_value_rows(tbl, value_col, user_col, item_col, group_cols)),
dp__salt AS MATERIALIZED (SELECT hash(dp__secret_salt()) AS s)
FROM dp__group_by_aggregates('dp__user_item_value_rows', 'dp__selected', 'dp__cal', 'dp__salt', items_tbl,
                             group_cols, aggregates, max_items, max_groups);
