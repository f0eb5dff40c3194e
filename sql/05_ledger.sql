-- Privacy-budget ledger (dpsql/ledger.py). Every releasing macro charges its (epsilon, delta) through
-- dp__charge(...) in a one-row MATERIALIZED CTE that its output depends on: after validation, before any
-- output row, exactly once per execution; over budget, the query fails and nothing is charged.
-- The charge's last argument is the macro's calibration CTE cast to text (`cal::VARCHAR`): it makes
-- DuckDB run the calibration, and with it the parameter checks, before the charge.

-- Spent and remaining (epsilon, delta) per scope ('database' first, then each table with a budget or a release).
-- Remaining is NULL for a scope without a budget. Composition is basic: sums.
CREATE OR REPLACE TEMP MACRO dp_budget() AS TABLE
SELECT s.scope, s.epsilon_budget, s.delta_budget, s.epsilon_spent, s.delta_spent,
       s.epsilon_remaining, s.delta_remaining, s.releases
FROM (SELECT unnest(dp__budget_status(0)) AS s);

-- Every charged release, oldest first: when, which mechanism, privacy unit ('user' or 'element'),
-- which table, its (epsilon, delta), its other parameters and the calibration it used.
CREATE OR REPLACE TEMP MACRO dp_releases() AS TABLE
SELECT r.release_id, to_timestamp(r.released_at) AS released_at, r.mechanism, r.unit, r.table_name,
       r.epsilon, r.delta, r.parameters, r.calibration
FROM (SELECT unnest(dp__budget_releases(0)) AS r);
