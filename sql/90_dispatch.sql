-- GENERATED from the set-union declarations (dpsql.union.METHODS) by dpsql.union.dispatch_sql():
-- do not edit; write dpsql.union.dispatch_sql() to sql/90_dispatch.sql after adding a method
-- (tests/test_mechanisms.py fails while this file and the declarations disagree).
--
-- dp_set_union(tbl, method := ...): one entry point for every set-union method. The default is
-- dpsql.union.DEFAULT_METHOD. `method` is a constant, so DuckDB folds each branch's filter
-- dp__method_is(method, '...') and prunes the untaken branches before execution (tests/test_union.py
-- counts noise draws to prove it). DuckDB cannot fold a function that raises, so for an unknown
-- method every filter stays and the last branch raises the error when the query runs.
-- `method` must be a constant like every parameter (sql/00_release.sql), but the branches' own checks
-- do not see it. So each branch receives its epsilon through dp__dispatched: for a constant method the
-- CASE folds to `epsilon` in the branch taken (and to NULL in the pruned ones); for a method that is not
-- constant it does not fold, and the branch refuses its epsilon as not constant before anything is
-- read or charged. A method's own parameters beyond the common ones keep their defaults here; call
-- its own macro to change them.
CREATE OR REPLACE TEMP MACRO dp__dispatched(method, candidate, epsilon) AS
    CASE WHEN dp__method_is(method, candidate) THEN epsilon END;

CREATE OR REPLACE TEMP MACRO dp_set_union(tbl VARCHAR, epsilon DOUBLE, delta DOUBLE, method VARCHAR := 'sips_cumulative', max_items DOUBLE := 100, user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
SELECT item FROM dp_set_union_count_laplace(tbl, epsilon := dp__dispatched(method, 'count_laplace', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'count_laplace')
UNION ALL
SELECT item FROM dp_set_union_count_gaussian(tbl, epsilon := dp__dispatched(method, 'count_gaussian', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'count_gaussian')
UNION ALL
SELECT item FROM dp_set_union_weighted_laplace(tbl, epsilon := dp__dispatched(method, 'weighted_laplace', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'weighted_laplace')
UNION ALL
SELECT item FROM dp_set_union_weighted_gaussian(tbl, epsilon := dp__dispatched(method, 'weighted_gaussian', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'weighted_gaussian')
UNION ALL
SELECT item FROM dp_set_union_mad(tbl, epsilon := dp__dispatched(method, 'mad', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'mad')
UNION ALL
SELECT item FROM dp_set_union_mad2r(tbl, epsilon := dp__dispatched(method, 'mad2r', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'mad2r')
UNION ALL
SELECT item FROM dp_set_union_sips(tbl, epsilon := dp__dispatched(method, 'sips', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'sips')
UNION ALL
SELECT item FROM dp_set_union_sips_cumulative(tbl, epsilon := dp__dispatched(method, 'sips_cumulative', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'sips_cumulative')
UNION ALL
SELECT item FROM dp_set_union_policy_laplace(tbl, epsilon := dp__dispatched(method, 'policy_laplace', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'policy_laplace')
UNION ALL
SELECT item FROM dp_set_union_policy_gaussian(tbl, epsilon := dp__dispatched(method, 'policy_gaussian', epsilon), delta := delta, max_items := max_items, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'policy_gaussian')
UNION ALL
SELECT item FROM dp_set_union_greedy_update(tbl, epsilon := dp__dispatched(method, 'greedy_update', epsilon), delta := delta, user_col := user_col, item_col := item_col)
WHERE dp__method_is(method, 'greedy_update')
UNION ALL
-- Always planned for an unknown method (its filter cannot be folded), and raises when run.
SELECT NULL AS item WHERE NOT dp__check_method(method)
ORDER BY item;
