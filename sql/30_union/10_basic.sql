-- User-level (epsilon, delta)-DP set union (partition selection) with an independent
-- update policy (Gopi et al. 2020, Alg. 1 / Sec. 1.1, App. B; Chen et al., Alg. 1).
-- Each BODY (dp__body_<macro>, its query under `-- dpsql:body <name>`, its header generated from the
-- declaration) returns one column `item` of the input's type and nothing else: the noisy
-- weights never leave the query. The releasing macro around it is generated from the declaration
-- (sql/00_core/00_release.sql: parameters bound once, checked, charged once, rows sorted). Calibration:
-- dpsql/core/calibration.py. epsilon and delta have no default: a default would spend budget nobody typed.

-- Release threshold of Weighted Gaussian / WGM / Basic at total budget (epsilon, delta):
-- sigma = dp_gaussian_sigma(epsilon, delta/2),
-- rho = max_{t <= max_items} 1/sqrt(t) + sigma * PhiInv((1 - delta/2)^(1/t))   (Gopi et al. 2020, Thm 5.1).
CREATE OR REPLACE TEMP MACRO dp_gaussian_threshold(epsilon DOUBLE, delta DOUBLE, max_items DOUBLE := 100) AS
    dp__gaussian_threshold(epsilon, delta, max_items);

-- Release threshold of Weighted Laplace at total budget (epsilon, delta), noise Lap(1/epsilon):
-- rho = max_{t <= max_items} 1/t + (1/epsilon) * ln(1 / (2 (1 - (1 - delta)^(1/t))))   (Gopi et al. 2020, Thm 4.1).
CREATE OR REPLACE TEMP MACRO dp_laplace_threshold(epsilon DOUBLE, delta DOUBLE, max_items DOUBLE := 100) AS
    dp__laplace_threshold(epsilon, delta, max_items);

-- Pre-noise item weights of the independent update policies. NOT a release: these are exact
-- aggregates of the raw data (tests and audits use them); only the macros below publish.
-- weighting: 'count' adds 1 per capped user (count baselines), 'inverse' adds 1/d (Weighted
-- Laplace, l1 sensitivity 1), 'inverse_sqrt' adds 1/sqrt(d) (Weighted Gaussian, l2 sensitivity 1).
-- dpsql:portable dp__set_union_weights
CREATE OR REPLACE TEMP MACRO dp__set_union_weights(tbl VARCHAR, weighting VARCHAR, max_items DOUBLE := 100,
        user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
SELECT item,
       sum(CASE weighting WHEN 'count' THEN 1.0 WHEN 'inverse' THEN 1.0 / d WHEN 'inverse_sqrt' THEN 1.0 / sqrt(d)
                ELSE error('dpsql: unknown weighting ' || weighting) END) AS w
FROM dp__capped_user_items(tbl, max_items := max_items, user_col := user_col, item_col := item_col)
GROUP BY item;

-- dpsql:body dp__body_set_union_count_laplace
WITH dp__cal AS (
    SELECT unnest(dp__set_union_calibration('count_laplace', epsilon, delta, max_items, user_col, item_col))),
dp__weights AS MATERIALIZED (FROM dp__set_union_weights(tbl, 'count', max_items := max_items, user_col := user_col, item_col := item_col))
SELECT item FROM dp__weights CROSS JOIN dp__cal
WHERE w + dp_laplace_noise(scale) > threshold;

-- dpsql:body dp__body_set_union_count_gaussian
WITH dp__cal AS (
    SELECT unnest(dp__set_union_calibration('count_gaussian', epsilon, delta, max_items, user_col, item_col))),
dp__weights AS MATERIALIZED (FROM dp__set_union_weights(tbl, 'count', max_items := max_items, user_col := user_col, item_col := item_col))
SELECT item FROM dp__weights CROSS JOIN dp__cal
WHERE w + dp_gaussian_noise(scale) > threshold;

-- dpsql:body dp__body_set_union_weighted_laplace
WITH dp__cal AS (
    SELECT unnest(dp__set_union_calibration('weighted_laplace', epsilon, delta, max_items, user_col, item_col))),
dp__weights AS MATERIALIZED (FROM dp__set_union_weights(tbl, 'inverse', max_items := max_items, user_col := user_col, item_col := item_col))
SELECT item FROM dp__weights CROSS JOIN dp__cal
WHERE w + dp_laplace_noise(scale) > threshold;

-- dpsql:body dp__body_set_union_weighted_gaussian
WITH dp__cal AS (
    SELECT unnest(dp__set_union_calibration('weighted_gaussian', epsilon, delta, max_items, user_col, item_col))),
dp__weights AS MATERIALIZED (FROM dp__set_union_weights(tbl, 'inverse_sqrt', max_items := max_items, user_col := user_col, item_col := item_col))
SELECT item FROM dp__weights CROSS JOIN dp__cal
WHERE w + dp_gaussian_noise(scale) > threshold;
