-- The release path (dpsql/release.py). Every releasing macro calls dp__constant on each of its
-- parameters in the one-row CTE that its calibration and its charge read, and ends with ORDER BY
-- its released columns (engine hash order depends on the data).

-- TRUE if `x` is a constant expression (a literal, a prepared-statement parameter, getvariable()),
-- else an error naming the parameter `name`. stats(x) is replaced by the statistics of the
-- substituted expression while the query is planned; only a single-valued expression passes.
CREATE OR REPLACE TEMP MACRO dp__constant(name, x) AS dp__check_constant(name, stats(x)::JSON::VARCHAR);
