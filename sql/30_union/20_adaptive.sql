-- Adaptive weighting for set union: MAD, MAD2R and DP-SIPS (Chen et al., "Scalable Private
-- Partition Selection via Adaptive Weighting", Alg. 1-4; Swanberg et al. 2023 for DP-SIPS).
-- Calibration, proof conditions and UserWeights: dpsql/union/adaptive.py. Every stage is a GROUP BY or a
-- join (linear work, a constant number of passes). UserWeights (MAD2R's round two) is a closed form
-- in SQL when b_min * b_max >= 1 (the defaults) and a vectorised Python UDF otherwise.
-- Helpers take the NAMES of relations of the calling query (query_table resolves CTE names), so the
-- rounds of one query share one materialised capped table: one secret salt, one cap per query.

-- MAD weighting (Alg. 3) of the rows of `rows_rel` (user_id, item, d = the user's degree,
-- uw = UserWeights of the user for this item) with the one-row `params_rel` (tau, alpha,
-- min_degree, max_degree). Users with min_degree <= d <= max_degree adapt:
--   w_init(i)    = sum over adaptive users of 1/d
--   r(i)         = max(0, (w_init(i) - tau) / w_init(i))      (ERRATUM: printed min{0, .})
--   e_u          = (1/d_u) sum_{i in S_u} r(i)                  (adaptive users)
--   w_reroute(i) = sum over adaptive users of alpha * e_u / max_degree
--   w(i)         = min(w_init, tau) + w_reroute + sum_u uw(u,i) - w_init(i)
--                = sum_u uw(u,i) + w_reroute(i) - max(0, w_init(i) - tau).
-- Only items above tau have r > 0, so the excess pass touches only the rows of those items.
-- Returns pre-noise weights: internal (releases add noise and threshold them inside one query).
-- dpsql:portable dp__mad_stage
CREATE OR REPLACE TEMP MACRO dp__mad_stage(rows_rel VARCHAR, params_rel VARCHAR) AS TABLE
WITH dp__ms_p AS (SELECT tau, alpha, min_degree, max_degree FROM query_table(params_rel)),
dp__ms_rows AS NOT MATERIALIZED (
    SELECT user_id, item, uw, d,
           CASE WHEN d >= min_degree AND d <= max_degree THEN 1.0 / d ELSE 0.0 END AS w0
    FROM query_table(rows_rel) CROSS JOIN dp__ms_p),
dp__ms_heavy AS (
    SELECT item, (w_init - tau) / w_init AS r
    FROM (SELECT item, sum(w0) AS w_init FROM dp__ms_rows GROUP BY item) CROSS JOIN dp__ms_p
    WHERE w_init > tau),
dp__ms_excess AS (
    SELECT user_id, sum(r) / d AS e FROM dp__ms_rows JOIN dp__ms_heavy USING (item)
    WHERE w0 > 0 GROUP BY user_id, d),
-- One pass for the rest. Its aggregates read both sides of the join, which keeps DuckDB from
-- pre-aggregating dp__ms_rows by (user_id, item) (partial aggregate pushdown), a wasted pass.
dp__ms_items AS (
    SELECT item, sum(uw) AS w_user, sum(w0) AS w_init, sum(coalesce(e, 0.0)) AS e_sum
    FROM dp__ms_rows LEFT JOIN dp__ms_excess USING (user_id) GROUP BY item)
SELECT item,
       w_user + alpha / max_degree * e_sum - greatest(0.0, w_init - tau) AS w,
       w_init,
       least(w_init, tau) AS w_trunc,
       alpha / max_degree * e_sum AS w_reroute
FROM dp__ms_items CROSS JOIN dp__ms_p;

-- UserWeights (Alg. 2) of every user of `rows_rel` (user_id, item, b = bias in [0, 1]).
-- Output: user_id, item, d (the user's number of rows), uw. In units of 1/sqrt(d): a biased item
-- (b < 1) starts at v = max(b_min, b), the unbiased ones at u = min(b_max, sqrt((d - sum v^2)/n));
-- if the squared norm is still below d, the biased items under 1 (less a 1e-12 rounding margin, as
-- in dpsql.union.adaptive) are scaled by
-- C = min(b_max / max v, sqrt(1 + (d - norm) / sum v^2)). When b_min * b_max >= 1 (the defaults
-- 0.5 and 2) one such step ends the loop of Alg. 2 -- after it either the norm is 1 or every scaled
-- item is >= b_min * b_max / max v > 1 -- so this closed form is exact: one GROUP BY and one join.
-- Otherwise the loop can take more steps and runs in the vectorised UDF dp__user_weights, one list
-- per user. b_min and b_max are constants, so DuckDB prunes the branch not taken.
-- dpsql:portable dp__user_weight_rows
CREATE OR REPLACE TEMP MACRO dp__user_weight_rows(rows_rel VARCHAR, b_min DOUBLE, b_max DOUBLE) AS TABLE
-- NOT MATERIALIZED: read twice; recomputing the projection is cheaper than storing a copy of the rows.
WITH dp__uw_in AS NOT MATERIALIZED (
    SELECT user_id, item, CASE WHEN b < 1.0 THEN greatest(b_min, b) END AS v FROM query_table(rows_rel)),
dp__uw_users AS (
    SELECT user_id, d, u, m, q, kv + (d - n_biased) * coalesce(u * u, 0.0) AS norm
    FROM (SELECT *, CASE WHEN d > n_biased THEN least(b_max, sqrt(greatest(0.0, d - kv)) / sqrt(d - n_biased)) END AS u
          FROM (SELECT user_id, count(*) AS d, count(v) AS n_biased, coalesce(sum(v * v), 0.0) AS kv,
                       max(v) FILTER (WHERE v < 1.0 - 1e-12) AS m, sum(v * v) FILTER (WHERE v < 1.0 - 1e-12) AS q
                FROM dp__uw_in GROUP BY user_id))),
dp__uw_scale AS (
    SELECT user_id, d, u,
           CASE WHEN m IS NULL OR norm >= d * (1.0 - 1e-12) THEN 1.0
                ELSE greatest(1.0, least(b_max / m, sqrt(1.0 + (d - norm) / q))) END AS c
    FROM dp__uw_users)
SELECT user_id, item, d, CASE WHEN v IS NULL THEN u WHEN v < 1.0 - 1e-12 THEN v * c ELSE v END / sqrt(d) AS uw
FROM dp__uw_in JOIN dp__uw_scale USING (user_id)
WHERE b_min * b_max >= 1.0
UNION ALL
SELECT user_id, x.item AS item, d, uw
FROM (SELECT user_id, len(l) AS d, unnest(l) AS x,
             unnest(dp__user_weights(list_transform(l, lambda e: e.b), b_min, b_max)) AS uw
      FROM (SELECT user_id, list({'item': item, 'b': b}) AS l FROM query_table(rows_rel) GROUP BY user_id))
WHERE b_min * b_max < 1.0;

-- ---------------------------------------------------------------------------------------------
-- Bodies of the releases. Each returns one column `item` and nothing else; the releasing macro around
-- it is generated (sql/00_core/00_release.sql).
-- ---------------------------------------------------------------------------------------------

-- MAD (unbiased, Alg. 3 inside Alg. 1): the sigma and rho of Weighted Gaussian / Basic,
-- tau = rho + beta*sigma; release w + N(0, sigma^2) >= rho.
-- dpsql:body dp__body_set_union_mad
WITH dp__mad_cal AS (
    SELECT unnest(dp__mad_calibration(epsilon, delta, max_items, max_adaptive_degree, beta, user_col, item_col))),
-- dpsql:portable dp__mad_rows
dp__mad_rows AS MATERIALIZED (
    SELECT user_id, item, d, 1.0 / sqrt(d) AS uw
    FROM dp__capped_user_items_window(tbl, max_items := max_items, user_col := user_col, item_col := item_col))
SELECT item FROM dp__mad_stage('dp__mad_rows', 'dp__mad_cal') CROSS JOIN dp__mad_cal
WHERE w + dp_gaussian_noise(sigma) >= rho;

-- MAD2R (Alg. 4): (eps_r, delta_r) = (split[r]*epsilon, split[r]*delta), one cap for both rounds.
-- Round 1: unbiased MAD; its noisy weights stay in this query (dp__m2_noisy1 is never output).
-- Round 2: items not released in round 1 whose upper bound w~1 + c_ub*sigma1 reaches rho2, with
-- bias b = min(1, rho2 / max(0, w~1 - c_lb*sigma1)); biased MAD with h(t) = b_max/sqrt(t).
-- dpsql:body dp__body_set_union_mad2r
WITH dp__m2_cal AS (
    SELECT unnest(dp__mad2r_calibration(epsilon, delta, max_items, split, max_adaptive_degree, beta,
                                        b_min, b_max, c_lb, c_ub, user_col, item_col))),
dp__m2_p1 AS (SELECT tau1 AS tau, alpha1 AS alpha, min_degree1 AS min_degree, max_degree1 AS max_degree
              FROM dp__m2_cal),
-- (the struct names the bias limits min_bias/max_bias: inside this macro b_min/b_max are the arguments)
dp__m2_p2 AS (SELECT tau2 AS tau, alpha2 AS alpha, min_degree2 AS min_degree, max_degree2 AS max_degree,
                     min_bias AS b_min, max_bias AS b_max FROM dp__m2_cal),
-- dpsql:portable dp__m2_rows
dp__m2_rows AS MATERIALIZED (
    SELECT user_id, item, d, 1.0 / sqrt(d) AS uw
    FROM dp__capped_user_items_window(tbl, max_items := max_items, user_col := user_col, item_col := item_col)),
dp__m2_noisy1 AS MATERIALIZED (
    SELECT item, w + dp_gaussian_noise(sigma1) AS noisy
    FROM dp__mad_stage('dp__m2_rows', 'dp__m2_p1') CROSS JOIN dp__m2_cal),
-- dpsql:portable dp__m2_items2
dp__m2_items2 AS (
    SELECT item, CASE WHEN noisy - lower_offset > rho2 THEN rho2 / (noisy - lower_offset) ELSE 1.0 END AS b
    FROM dp__m2_noisy1 CROSS JOIN dp__m2_cal
    WHERE noisy < rho1 AND noisy + upper_offset >= rho2),
-- dpsql:portable dp__m2_biased
dp__m2_biased AS NOT MATERIALIZED (SELECT user_id, item, b FROM dp__m2_rows JOIN dp__m2_items2 USING (item)),
dp__m2_rows2 AS MATERIALIZED (FROM dp__user_weight_rows('dp__m2_biased', b_min, b_max)),
-- Progress (dpsql.core.progress): once round one's noisy weights are stored, round 1 of 2 is done. One
-- row (a count, never passed on) whatever the data; the first branch's filter reads it, so it runs.
dp__m2_progress AS MATERIALIZED (SELECT dp__progress(1, 2) AS ok FROM (SELECT count(*) FROM dp__m2_noisy1))
SELECT item FROM dp__m2_noisy1 CROSS JOIN dp__m2_cal WHERE noisy >= rho1 AND (SELECT ok FROM dp__m2_progress)
UNION ALL
SELECT item FROM dp__mad_stage('dp__m2_rows2', 'dp__m2_p2') CROSS JOIN dp__m2_cal
WHERE w + dp_gaussian_noise(sigma2) >= rho2;

-- One DP-SIPS round: Basic (1/sqrt(d) on the reduced sets) on the rows of `rows_rel` whose item is
-- not in `removed_rel`, calibrated by element `r` of the lists sigma/rho of `params_rel`.
CREATE OR REPLACE TEMP MACRO dp__sips_round(rows_rel VARCHAR, removed_rel VARCHAR, params_rel VARCHAR,
                                            r INTEGER) AS TABLE
-- NOT MATERIALIZED: read twice, recomputed (a scan and an anti join with the released items) rather
-- than stored: storing it would copy nearly every capped row once per round.
WITH dp__sr_kept AS NOT MATERIALIZED (
    SELECT user_id, item FROM query_table(rows_rel) ANTI JOIN query_table(removed_rel) USING (item)),
-- dpsql:portable dp__sr_weights
dp__sr_weights AS (
    SELECT item, sum(1.0 / sqrt(d)) AS w
    FROM dp__sr_kept JOIN (SELECT user_id, count(*) AS d FROM dp__sr_kept GROUP BY user_id) USING (user_id)
    GROUP BY item)
SELECT item FROM dp__sr_weights CROSS JOIN (SELECT sigma[r] AS s, rho[r] AS t FROM query_table(params_rel))
WHERE w + dp_gaussian_noise(s) >= t;

-- DP-SIPS: len(split) rounds (at most 5) of Basic at (split[r]*epsilon, split[r]*delta); round r
-- removes every item released earlier from the users' capped sets. A macro cannot loop over a
-- runtime list, so this is a fixed chain of 5 rounds; `len(split) >= r` is a constant, so DuckDB
-- prunes the unused rounds before execution (no noise is drawn for them).
-- dpsql:body dp__body_set_union_sips
WITH dp__s_cal AS (
    SELECT unnest(dp__sips_calibration(epsilon, delta, max_items, split, user_col, item_col))),
-- dpsql:portable dp__s_rows
dp__s_rows AS MATERIALIZED (
    SELECT user_id, item
    FROM dp__capped_user_items_window(tbl, max_items := max_items, user_col := user_col, item_col := item_col)),
dp__s_none AS (SELECT item FROM dp__s_rows LIMIT 0),
dp__s_r1 AS MATERIALIZED (FROM dp__sips_round('dp__s_rows', 'dp__s_none', 'dp__s_cal', 1)),
dp__s_u1 AS (FROM dp__s_r1),
dp__s_r2 AS MATERIALIZED (FROM dp__sips_round('dp__s_rows', 'dp__s_u1', 'dp__s_cal', 2) WHERE len(split) >= 2),
dp__s_u2 AS (FROM dp__s_u1 UNION ALL FROM dp__s_r2),
dp__s_r3 AS MATERIALIZED (FROM dp__sips_round('dp__s_rows', 'dp__s_u2', 'dp__s_cal', 3) WHERE len(split) >= 3),
dp__s_u3 AS (FROM dp__s_u2 UNION ALL FROM dp__s_r3),
dp__s_r4 AS MATERIALIZED (FROM dp__sips_round('dp__s_rows', 'dp__s_u3', 'dp__s_cal', 4) WHERE len(split) >= 4),
dp__s_u4 AS (FROM dp__s_u3 UNION ALL FROM dp__s_r4),
dp__s_r5 AS MATERIALIZED (FROM dp__sips_round('dp__s_rows', 'dp__s_u4', 'dp__s_cal', 5) WHERE len(split) >= 5),
-- Progress (dpsql.core.progress): once round r's released items are stored, r of len(split) rounds are
-- done. Each branch reads one row (a count, never passed on) whatever the data, so whether and when a
-- round is reported depends on the rounds run alone; the final filter reads the result, so the CTE runs.
dp__s_progress AS MATERIALIZED (
    SELECT dp__progress(1, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__s_r1)
    UNION ALL SELECT dp__progress(2, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__s_r2) WHERE len(split) >= 2
    UNION ALL SELECT dp__progress(3, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__s_r3) WHERE len(split) >= 3
    UNION ALL SELECT dp__progress(4, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__s_r4) WHERE len(split) >= 4
    UNION ALL SELECT dp__progress(5, len(split)::INTEGER) AS ok FROM (SELECT count(*) FROM dp__s_r5) WHERE len(split) >= 5)
SELECT item FROM (FROM dp__s_u4 UNION ALL FROM dp__s_r5) CROSS JOIN dp__s_cal
WHERE (SELECT bool_and(ok) FROM dp__s_progress);

-- ---------------------------------------------------------------------------------------------
-- Testing / audit only: PRE-NOISE weights, exact aggregates of the raw data. NOT releases.
-- ---------------------------------------------------------------------------------------------

-- Unbiased MAD weights (item, w, w_init, w_trunc, w_reroute) of the capped `tbl` at a given tau
-- (tau may be +inf: then MAD equals Basic).
CREATE OR REPLACE TEMP MACRO dp__mad_weights(tbl VARCHAR, tau DOUBLE, max_adaptive_degree DOUBLE := 50,
        max_items DOUBLE := 100, user_col VARCHAR := 'user_id', item_col VARCHAR := 'item') AS TABLE
WITH dp__mw_p AS (SELECT unnest(dp__mad_parameters(tau, max_adaptive_degree, max_items, 1.0, 1.0))),
dp__mw_rows AS MATERIALIZED (
    SELECT user_id, item, d, 1.0 / sqrt(d) AS uw
    FROM dp__capped_user_items_window(tbl, max_items := max_items, user_col := user_col, item_col := item_col))
FROM dp__mad_stage('dp__mw_rows', 'dp__mw_p');

-- Biased MAD weights, as in round two of MAD2R, of the already capped rows of `rows_tbl`
-- (user_id, item, b = bias in [0, 1]); no cap is applied here.
CREATE OR REPLACE TEMP MACRO dp__mad_biased_weights(rows_tbl VARCHAR, tau DOUBLE, max_adaptive_degree DOUBLE := 50,
        b_min DOUBLE := 0.5, b_max DOUBLE := 2.0) AS TABLE
WITH dp__mb_p AS (SELECT unnest(dp__mad_parameters(tau, max_adaptive_degree, max_adaptive_degree, b_min, b_max))),
dp__mb_in AS (SELECT user_id, item, b FROM query_table(rows_tbl)),
dp__mb_rows AS MATERIALIZED (FROM dp__user_weight_rows('dp__mb_in', b_min, b_max))
FROM dp__mad_stage('dp__mb_rows', 'dp__mb_p');
