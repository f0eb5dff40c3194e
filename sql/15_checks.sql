-- Checks of the input description that DuckDB's binder would otherwise report with dpsql's internal
-- expressions (a COLUMNS(...) star expression over an empty set of columns).

-- TRUE if every name of `cols` is a column of tbl (compared case-insensitively, as the macros'
-- COLUMNS(...) select it), else an error naming the first missing one's parameter (from `params`,
-- same order), the table and its columns (names only: the schema, never a data value). One
-- DESCRIBE per call: it reads the schema of a table, a view or a file, no rows.
CREATE OR REPLACE TEMP MACRO dp__check_column_list(tbl, params, cols) AS (
    SELECT CASE WHEN missing = 0 THEN true
        ELSE error('dpsql: ' || params[missing] || ' := ''' || cols[missing] || ''' is not a column of '''
                   || tbl || '''; its columns are ' || names || '. Pass ' || params[missing]
                   || ' := ''<column name>''') END
    FROM (SELECT coalesce(list_position(list_transform(cols, lambda c: list_contains(have, lower(c))), false), 0)
                     AS missing,
                 names
          FROM (SELECT list(lower(column_name)) AS have, string_agg(column_name, ', ') AS names
                FROM (DESCRIBE SELECT * FROM query_table(tbl)))));

-- One column (`param` names it in the error).
CREATE OR REPLACE TEMP MACRO dp__check_column(tbl, param, col) AS dp__check_column_list(tbl, [param], [col]);

-- Both columns of a user-level release (dp__user_item_rows).
CREATE OR REPLACE TEMP MACRO dp__check_columns(tbl, user_col, item_col) AS
    dp__check_column_list(tbl, ['user_col', 'item_col'], [user_col, item_col]);
