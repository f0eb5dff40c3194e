-- GENERATED from the set-union declarations (dpsql.union.METHODS) by dpsql.union.dispatch_sql():
-- do not edit; write dpsql.union.dispatch_sql() to sql/90_dispatch.sql after adding a method
-- (tests/test_mechanisms.py fails while this file and the declarations disagree).
--
-- dp__body_set_union(tbl, epsilon, delta, method := ...): the BODY of every set-union method, by name,
-- for the releases that use a set union as one of their steps (dp_top_k's domain, dp_group_by's
-- selection): no binding and no charge here, the calling release's wrapper does both for its total.
-- `method` is a constant (the caller's wrapper binds it), so DuckDB folds each branch's filter
-- dp__method_is(method, '...') and prunes the untaken branches before execution (tests/test_union.py
-- counts noise draws to prove it). DuckDB cannot fold a function that raises, so for an unknown method
-- every filter stays and the last branch raises the error when the query runs. A method's own
-- parameters beyond the common ones keep their defaults here.

CREATE OR REPLACE TEMP MACRO dp__body_set_union(tbl VARCHAR, epsilon DOUBLE, delta DOUBLE, method VARCHAR := 'sips_cumulative', max_items DOUBLE := 100, user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
SELECT item FROM dp__body_set_union_count_laplace(tbl, epsilon := CASE WHEN dp__method_is(method, 'count_laplace') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'count_laplace')
UNION ALL
SELECT item FROM dp__body_set_union_count_gaussian(tbl, epsilon := CASE WHEN dp__method_is(method, 'count_gaussian') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'count_gaussian')
UNION ALL
SELECT item FROM dp__body_set_union_weighted_laplace(tbl, epsilon := CASE WHEN dp__method_is(method, 'weighted_laplace') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'weighted_laplace')
UNION ALL
SELECT item FROM dp__body_set_union_weighted_gaussian(tbl, epsilon := CASE WHEN dp__method_is(method, 'weighted_gaussian') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'weighted_gaussian')
UNION ALL
SELECT item FROM dp__body_set_union_mad(tbl, epsilon := CASE WHEN dp__method_is(method, 'mad') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'mad')
UNION ALL
SELECT item FROM dp__body_set_union_mad2r(tbl, epsilon := CASE WHEN dp__method_is(method, 'mad2r') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'mad2r')
UNION ALL
SELECT item FROM dp__body_set_union_sips(tbl, epsilon := CASE WHEN dp__method_is(method, 'sips') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'sips')
UNION ALL
SELECT item FROM dp__body_set_union_sips_cumulative(tbl, epsilon := CASE WHEN dp__method_is(method, 'sips_cumulative') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'sips_cumulative')
UNION ALL
SELECT item FROM dp__body_set_union_policy_laplace(tbl, epsilon := CASE WHEN dp__method_is(method, 'policy_laplace') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'policy_laplace')
UNION ALL
SELECT item FROM dp__body_set_union_policy_gaussian(tbl, epsilon := CASE WHEN dp__method_is(method, 'policy_gaussian') THEN epsilon END, delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'policy_gaussian')
UNION ALL
SELECT item FROM dp__body_set_union_greedy_update(tbl, epsilon := CASE WHEN dp__method_is(method, 'greedy_update') THEN epsilon END, delta := delta, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'greedy_update')
UNION ALL
-- Always planned for an unknown method (its filter cannot be folded), and raises when run.
SELECT NULL AS item WHERE NOT dp__check_method(method);
