-- auto: a private choice between the default set-union method and the few-items one (the method declaring
-- the role few_items), then the chosen one on the rest of the budget (dpsql/union/auto.py;
-- docs/proofs/auto.md).

-- (f, users, pairs) of one table: f = sum over users of 2 [d <= degree_bound] - 1, d the user's number of
-- distinct items (uncapped: [min(d, max_items) <= degree_bound] = [d <= degree_bound] while degree_bound
-- <= max_items, which the calibration enforces), its number of users and of distinct (user, item) pairs.
-- NOT a release: exact aggregates of the raw data (the body and the tests use them).
CREATE OR REPLACE TEMP MACRO dp__auto_statistic(tbl VARCHAR, degree_bound DOUBLE, user_col VARCHAR := 'user_id',
                                                item_col VARCHAR := 'item') AS TABLE
SELECT coalesce(sum(CASE WHEN d <= degree_bound THEN 1 ELSE -1 END), 0)::BIGINT AS f,
       count(*) AS users, coalesce(sum(d), 0)::BIGINT AS pairs
FROM (SELECT user_id, count(*) AS d
      FROM dp__user_items(tbl, user_col := user_col, item_col := item_col) GROUP BY user_id);

-- The private choice, one row: greedy = f + Z >= 0, Z ~ DLap(1/eps0) in integer steps (the granular
-- sampler at grid 1), eps0 = choice_share * epsilon; one draw (one row, a side-effect UDF). Before it, a
-- table either candidate would refuse for its size (the sequential fill: 2^31 users or 2^32 items; the
-- default: 2^32 capped pairs; both bounded here by the distinct pairs) is refused whatever the choice, so whether the
-- release fails never depends on it. The body reads it once (MATERIALIZED); the tests call it directly.
CREATE OR REPLACE TEMP MACRO dp__auto_choice(tbl VARCHAR, epsilon DOUBLE, delta DOUBLE, max_items DOUBLE,
        choice_share DOUBLE, degree_bound DOUBLE, user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
WITH dp__auc_cal AS MATERIALIZED (
    SELECT unnest(dp__c)
    FROM (SELECT dp__auto_calibration(epsilon, delta, max_items, choice_share, degree_bound, user_col, item_col) AS dp__c))
SELECT f + dp_granular_laplace_noise(choice_scale, 1.0) >= 0 AS greedy
FROM dp__auto_statistic(tbl, degree_bound, user_col := user_col, item_col := item_col) CROSS JOIN dp__auc_cal
WHERE choice_from_data
  AND CASE WHEN users < 2147483648 AND pairs < 4294967296 THEN true
         ELSE error('dpsql: dp_set_union_auto takes fewer than 2^31 users and 2^32 distinct user-item pairs '
                    || '(the limits of its candidates); use dp_set_union_mad2r') END
-- eps0 below 2^-32 (beyond the sampler's 2^32 steps): the default, whatever the data (0-DP)
UNION ALL
SELECT false AS greedy FROM dp__auc_cal WHERE NOT choice_from_data;

-- The chosen method's body reads the table through a CTE whose rows pass only if it is the chosen one:
-- the other body is planned but reads no row (it draws no noise: both draw per item, and only for the
-- rows they read; each still draws its own salts, which no data reaches). Both run at
-- epsilon - choice_share * epsilon (the calibration's expression) with their own defaults. Each is the body
-- call the set-union step dp__body_set_union renders (dp__set_union_body_sql, while DuckDB binds), of the
-- method dp__auto_candidate reads from the declarations; one query() runs both calls' text. Not that macro
-- itself, which may be the one running this body (dp_set_union, dp_top_k, dp_group_by): DuckDB refuses to
-- expand a macro in itself.
-- query() evaluates even a volatile argument, so the argument's getvariable() makes DuckDB's binder refuse
-- any parameter that is not constant before the text is rendered (as in sql/30_union/90_dispatch.sql).
-- dpsql:body dp__body_set_union_auto
WITH dp__au_pick AS MATERIALIZED (
    FROM dp__auto_choice(tbl, epsilon, delta, max_items, choice_share, degree_bound, user_col := user_col,
                         item_col := item_col)),
dp__au_few_rows AS (SELECT * FROM query_table(tbl) WHERE (SELECT greedy FROM dp__au_pick)),
dp__au_default_rows AS (SELECT * FROM query_table(tbl) WHERE NOT (SELECT greedy FROM dp__au_pick))
FROM query(CASE WHEN getvariable('dp__bind:' || {'tbl': tbl, 'epsilon': epsilon, 'delta': delta, 'max_items': max_items,
                     'choice_share': choice_share, 'user_col': user_col, 'item_col': item_col}::VARCHAR) IS NULL OR true
                THEN dp__set_union_body_sql(dp__auto_candidate(true), 'dp__au_few_rows',
                                            epsilon - choice_share * epsilon, delta, max_items, user_col, item_col)
                     || ' UNION ALL '
                     || dp__set_union_body_sql(dp__auto_candidate(false), 'dp__au_default_rows',
                                               epsilon - choice_share * epsilon, delta, max_items, user_col, item_col)
                END);
