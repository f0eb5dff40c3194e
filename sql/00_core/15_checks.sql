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

-- Keys by identity ----------------------------------------------------------------------------------
-- A GROUP BY, DISTINCT or join merges values that compare equal and keeps one row's spelling for the
-- group: when equal values can print differently ('SECRET' = 'secret' under NOCASE, INTERVAL '1 month'
-- = '30 days', -0.0 = 0.0), the spelling released depends on which private row came first, and one
-- added user's spelling shows in the release (unbounded epsilon); merged user ids merge two people's
-- contributions. A key is therefore either made representation-exact (dp__canonical) or refused by its
-- type before anything is read (dp__check_key_columns).

-- x with binary (representation-exact) equality. A VARCHAR of any collation (COLLATE NOCASE in the
-- table or a view, or the session's default_collation) becomes binary-collated: the collation is part
-- of the value's type, so every GROUP BY, DISTINCT, window and join downstream compares bytes. Every
-- other type is returned as it is (no cast: a BIGINT stays a BIGINT, with its fast hashing), except
-- ENUM and JSON, which DuckDB casts implicitly to this VARCHAR overload (same text, type VARCHAR).
-- A typed overload is the only way to apply COLLATE to VARCHAR alone (COLLATE on another type is a binder
-- error); no other overload could be added (a DOUBLE one captures every integer and DECIMAL type by
-- implicit cast), so types whose equality is not exact are refused instead (dp__key_type_problem).
CREATE OR REPLACE TEMP MACRO dp__canonical(x VARCHAR) AS x COLLATE c, (x) AS x;

-- dp__key_type_problem(t, col): NULL if a key column of DESCRIBEd type t groups by identity once passed
-- through dp__canonical, else why not and the fix (for column `col`): a pure Python UDF (dpsql/core/keys.py;
-- an allow-list of types, parsed from the type's text).

-- TRUE if every column of `cols` found in tbl has a key type dp__key_type_problem accepts, else an error
-- naming the first refused one's parameter (from `params`, same order), its type, why, and the fix.
-- Schema only (one DESCRIBE, no rows), so it fails before anything is read; a missing column is left to
-- dp__check_column_list. The table is named unless it is one of dpsql's own relations (a CTE named dp__*
-- that passes the user's rows on, e.g. auto's candidates' rows): its name would mislead, and the
-- parameter and the column already say which input is refused. (A release whose own relation is checked
-- too may raise either check's error first: both refuse the same column for the same reason.)
CREATE OR REPLACE TEMP MACRO dp__check_key_columns(tbl, params, cols) AS (
    SELECT CASE WHEN bad IS NULL THEN true
        ELSE error('dpsql: ' || bad.param || ' := ''' || bad.col || ''''
                   || CASE WHEN starts_with(tbl, 'dp__') THEN '' ELSE ' of ''' || tbl || '''' END
                   || ' has type ' || bad.type
                   || ', which cannot be a grouping key: the spelling released for a group (or the user a row '
                   || 'counts for) would be that of whichever private row came first: ' || bad.why) END
    FROM (SELECT min_by({'param': params[i], 'col': column_name, 'type': column_type, 'why': why}, i) AS bad
          FROM (SELECT column_name, column_type, dp__key_type_problem(column_type, column_name) AS why,
                       list_position(list_transform(cols, lambda c: lower(c)), lower(column_name)) AS i
                FROM (DESCRIBE SELECT * FROM query_table(tbl)))
          WHERE i > 0 AND why IS NOT NULL));

-- TRUE if public_tbl's column public_col (named by the parameter public_param) has the type of tbl's
-- private column col (parameter param), else an error naming both parameters and both types. Comparing
-- two types converts one side, and a private value that does not convert is quoted in DuckDB's error
-- ("Could not convert string '...' to INT64"). Integers of different widths are accepted: their
-- comparison cannot fail and is exact, except UHUGEINT against a signed integer (compared as DOUBLE,
-- inexact), which is refused. Schema only; a missing column is left to dp__check_column_list.
CREATE OR REPLACE TEMP MACRO dp__check_same_type(public_tbl, public_col, public_param, tbl, col, param) AS (
    SELECT CASE WHEN pt IS NULL OR t IS NULL OR pt = t
                     OR (list_contains(ints, pt) AND list_contains(ints, t) AND NOT 'UHUGEINT' IN (pt, t))
                THEN true
        ELSE error('dpsql: column ' || public_col || ' of ' || public_param || ' := ''' || public_tbl || ''' has type '
                   || pt || ' but ' || param || ' := ''' || col || ''' of ''' || tbl || ''' has type ' || t
                   || '; comparing them would convert values, and one that does not convert would be quoted in '
                   || 'the error. Give them one type in a view, e.g. CAST(' || public_col || ' AS ' || t || ')') END
    FROM (SELECT ['TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT', 'HUGEINT', 'UTINYINT', 'USMALLINT', 'UINTEGER',
                  'UBIGINT', 'UHUGEINT'] AS ints,
                 (SELECT any_value(column_type) FROM (DESCRIBE SELECT * FROM query_table(public_tbl))
                  WHERE lower(column_name) = lower(public_col)) AS pt,
                 (SELECT any_value(column_type) FROM (DESCRIBE SELECT * FROM query_table(tbl))
                  WHERE lower(column_name) = lower(col)) AS t));

-- TRUE if tbl's value column col (parameter param) has a type whose conversion to DOUBLE cannot fail at
-- run time, else an error naming the parameter and the type. A failing conversion quotes the value it
-- could not convert (one user's private value), and after the charge its failure alone is a leak.
-- Accepted: the integers (UHUGEINT's largest, 3.4e38, is far below DOUBLE's 1.8e308), DECIMAL (at most
-- 38 digits), FLOAT, DOUBLE. Refused: BIGNUM (a 400-digit value does not convert), VARCHAR, and the rest.
CREATE OR REPLACE TEMP MACRO dp__check_value_type(tbl, col, param) AS (
    SELECT CASE WHEN t IS NULL OR regexp_full_match(t, 'U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\)')
                THEN true
        ELSE error('dpsql: ' || param || ' := ''' || col || ''' of ''' || tbl || ''' has type ' || t
                   || ', whose conversion to DOUBLE can fail on a value, and the error would quote that private '
                   || 'value. Accepted: integer types, DECIMAL, FLOAT, DOUBLE. Convert it in a view, e.g. TRY_CAST('
                   || col || ' AS DOUBLE) (NULL where it does not convert)') END
    FROM (SELECT any_value(column_type) AS t FROM (DESCRIBE SELECT * FROM query_table(tbl))
          WHERE lower(column_name) = lower(col)));
