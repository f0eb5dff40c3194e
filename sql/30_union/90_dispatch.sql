-- GENERATED from the set-union declarations (dpsql.union.METHODS) by dpsql.union.dispatch_sql():
-- do not edit; write dpsql.union.dispatch_sql() to sql/30_union/90_dispatch.sql after adding a method
-- (tests/conformance/test_mechanisms.py fails while this file and the declarations disagree).
--
-- dp__body_set_union(tbl, epsilon, delta, method := ...): the BODY of every set-union method, by name,
-- for the releases that use a set union as one of their steps (dp_top_k's domain, dp_group_by's
-- selection) and for dp_set_union: no binding and no charge here, the calling release's wrapper does
-- both for its total. DuckDB's query() evaluates its argument once, while it binds: the pure UDF
-- dp__set_union_body_sql renders the call of the chosen method's body (dpsql.union.body_call_sql,
-- every value a SQL literal), so only that body is bound, planned and run (a UNION ALL of every
-- method's body, pruned by constant filters, was bound and planned whole: ~0.4 s a release).
-- An unknown method is the UDF's error, while binding: before anything is read.
-- query() evaluates even a volatile argument, so the argument's getvariable() makes DuckDB's binder
-- refuse any parameter that is not constant before the text is rendered (the wrappers' binding,
-- sql/00_core/00_release.sql): nothing is read or drawn, a sequence is not advanced.
-- A method's own parameters beyond the common ones keep their defaults here.

CREATE OR REPLACE TEMP MACRO dp__body_set_union(tbl VARCHAR, epsilon DOUBLE, delta DOUBLE, method VARCHAR := 'sips_cumulative', max_items DOUBLE := 100, user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
FROM query(CASE WHEN getvariable('dp__bind:' || {'method': method, 'tbl': tbl, 'epsilon': epsilon, 'delta': delta, 'max_items': max_items, 'user_col': user_col, 'item_col': item_col}::VARCHAR) IS NULL OR true
                THEN dp__set_union_body_sql(method, tbl, epsilon, delta, max_items, user_col, item_col) END);
