-- Privacy-budget ledger (dpsql/core/ledger.py). Every releasing macro charges its (epsilon, delta) through
-- dp__charge(...) in a one-row MATERIALIZED CTE that its output depends on: after validation, before any
-- output row, exactly once per execution; over budget, the query fails and nothing is charged.
-- The charge's last argument is the macro's calibration CTE cast to text (`cal::VARCHAR`): it makes
-- DuckDB run the calibration, and with it the parameter checks, before the charge.

-- What tracing `tbl` to the tables and files it reads needs from the connection (dpsql/core/scopes.py): a UDF
-- cannot query the connection while the query that calls it runs, so the macro reads it: the names of
-- every table and view, the text of every view (NULL for DuckDB's own) and macro, and the running
-- statement (for its CTEs). The macros come from a scan of duckdb_functions(), which lists every one of
-- DuckDB's functions and is most of a small release's time: dp__catalog_with takes them as an argument.
CREATE OR REPLACE TEMP MACRO dp__catalog_with(macros) AS {
    'database': current_database(), 'schema': current_schema(), 'search_path': current_setting('search_path'),
    'databases': (SELECT list({'name': database_name, 'path': path, 'type': type}) FROM duckdb_databases()),
    'relations': (SELECT list({'database': database_name, 'schema': schema_name, 'name': table_name})
                  FROM (SELECT database_name, schema_name, table_name FROM duckdb_tables()
                        UNION ALL SELECT database_name, schema_name, view_name FROM duckdb_views())),
    'views': (SELECT list({'database': database_name, 'schema': schema_name, 'name': view_name,
                           'sql': CASE WHEN NOT internal THEN sql END}) FROM duckdb_views()),
    'macros': macros,
    'query': current_query()};

CREATE OR REPLACE TEMP MACRO dp__macros() AS TABLE
SELECT list({'name': function_name, 'type': function_type, 'definition': macro_definition}) AS macros
FROM duckdb_functions() WHERE NOT internal AND function_type IN ('macro', 'table_macro');

-- The whole catalog (budgets, the CLI): any scope expression.
CREATE OR REPLACE TEMP MACRO dp__catalog(tbl) AS dp__catalog_with((SELECT macros FROM dp__macros()));

-- A release's catalog: `tbl` is the releasing macro's own parameter, a constant, so query() runs the text
-- dp__catalog_macros_sql renders while DuckDB binds, from `tbl` and the catalog the connection's last
-- charge saw: the scan of dp__macros(), or (`tbl` resolved there to a base table or a file) a NULL list,
-- and then DuckDB never plans the scan. The charge checks that guess on the catalog and statement read
-- here (dpsql.core.scopes.needs_macros).
CREATE OR REPLACE TEMP MACRO dp__release_catalog(tbl) AS
    dp__catalog_with((SELECT macros FROM query(dp__catalog_macros_sql(tbl))));

-- The charge every releasing macro makes (call shape unchanged: seven arguments). The scopes are the
-- base tables and files `tbl` reads (through views and the statement's CTEs), each charged in the ledger
-- of the database holding it; the release is marked seeded on a seeded connection.
CREATE OR REPLACE TEMP MACRO dp__charge(mechanism, unit, tbl, epsilon, delta, parameters, calibration) AS
    dp__charge_scoped(mechanism, unit, tbl, epsilon, delta, parameters, calibration, dp__release_catalog(tbl));

-- Spent and remaining (epsilon, delta) per scope ('database' first, then each table with a budget or a release).
-- Remaining is NULL for a scope without a budget. Composition is basic: sums. seeded_releases counts the
-- scope's releases made on a seeded (NOT private) connection; they are charged like the others.
CREATE OR REPLACE TEMP MACRO dp_budget() AS TABLE
SELECT s.scope, s.epsilon_budget, s.delta_budget, s.epsilon_spent, s.delta_spent,
       s.epsilon_remaining, s.delta_remaining, s.releases, s.seeded_releases
FROM (SELECT unnest(dp__budget_status(0)) AS s);

-- Every charged release, oldest first: when (a TIMESTAMP in UTC; a TIMESTAMPTZ would need pytz in Python),
-- which mechanism, privacy unit ('user', 'record' or 'element'),
-- which scopes (the tables and files it read, comma-separated), its (epsilon, delta), its other parameters and the
-- calibration it used (JSON; NULL when none was recorded; a ledger written by an older dpsql is read into the same
-- JSON, dpsql.core.ledger.json_text), and whether it was made on a seeded connection (reproducible noise: NOT private).
CREATE OR REPLACE TEMP MACRO dp_releases() AS TABLE
SELECT r.release_id, make_timestamp((r.released_at * 1e6)::BIGINT) AS released_at, r.mechanism, r.unit, r.table_name,
       r.epsilon, r.delta, r.parameters::JSON AS parameters, r.calibration::JSON AS calibration, r.seeded
FROM (SELECT unnest(dp__budget_releases(0)) AS r);

-- Set the total (epsilon, delta) of a scope ('database', a table name resolved as a release resolves its table,
-- or a file path) in the ledger its releases are charged to, and return the scope's status afterwards: budget,
-- spent, remaining, releases, the ledger file (NULL: in memory) and a note when the scope names no existing
-- table or file (the budget then waits for it). Refused, changing nothing: a budget below what the scope has
-- spent (equal closes it), a view, and a call hidden in a view or macro or sharing its statement with a release
-- (dpsql/core/ledger_sql.py says why). Not undone by ROLLBACK: the ledger is outside DuckDB's transactions.
CREATE OR REPLACE TEMP MACRO dp_set_budget(scope, epsilon, delta) AS
    dp__set_budget(scope, epsilon, delta, dp__catalog(scope));

-- Remove the budget of a scope (its releases stay charged); the same status, with a note if it had none.
CREATE OR REPLACE TEMP MACRO dp_remove_budget(scope) AS
    dp__remove_budget(scope, dp__catalog(scope));
