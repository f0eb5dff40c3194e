-- Unknown-domain top-k, k-hitting set, and the Durfee-Rogers limited-domain baseline
-- (Dick, Joseph & Raman, "Missing Mass for DP Domain Discovery", Alg. 2-4; Durfee & Rogers 2019, Alg. 1).
-- Privacy arguments and calibration: dpsql/topk/__init__.py. Each macro returns (rank, item) only; noisy
-- counts never leave the query. This file loads after 30_union/90_dispatch.sql because the domain step
-- calls dp__body_set_union (DuckDB binds a table macro's body against the macros that exist when it
-- is created). k and k_bar are DOUBLE so that 2.5 reaches validation instead of being rounded.

-- Calibration in SQL: per-step epsilon of k-fold peeling (Lemma B.1) and of k limited-domain
-- steps (Durfee & Rogers 2019, Thm 1, with delta' = delta_prime).
CREATE OR REPLACE TEMP MACRO dp_peeling_epsilon(epsilon DOUBLE, delta DOUBLE, k DOUBLE) AS
    dp__peeling_epsilon(epsilon, delta, k);
CREATE OR REPLACE TEMP MACRO dp_limited_domain_epsilon(epsilon DOUBLE, delta_prime DOUBLE, k DOUBLE) AS
    dp__limited_domain_epsilon(epsilon, delta_prime, k);

-- Top-k with an unknown domain: a set-union release at (epsilon/2, delta/2) is the domain, then
-- one-shot Gumbel top-k (= k-fold peeling exponential mechanism) on the uncapped user counts of
-- the domain's items at (epsilon/2, delta/2), Gumbel scale 1/eps0 of Lemma B.1. Returns
-- min(k, |domain|) rows.
-- dpsql:body dp__body_top_k
WITH dp__cal AS (
    SELECT unnest(dp__top_k_calibration(k, epsilon, delta, max_items, domain_method, user_col, item_col))),
-- The domain step: a set-union body at its share; the release's wrapper charges the total (epsilon, delta) once.
dp__domain AS MATERIALIZED (
    SELECT item FROM dp__body_set_union(tbl, method := domain_method, epsilon := dp__top_k_share('epsilon', epsilon), delta := dp__top_k_share('delta', delta),
                                  max_items := max_items, user_col := user_col, item_col := item_col)),
dp__counts AS (
    SELECT p.item, count(*) AS n
    FROM dp__user_items(tbl, user_col := user_col, item_col := item_col) AS p SEMI JOIN dp__domain AS d ON p.item = d.item
    GROUP BY p.item),
dp__noisy AS (SELECT item, n + dp_gumbel_noise(gumbel_scale) AS score, dp__cal.k AS k_rows FROM dp__counts CROSS JOIN dp__cal)
SELECT row_number() OVER (ORDER BY score DESC) AS rank, item
FROM dp__noisy
QUALIFY rank <= k_rows;

-- k-hitting set with an unknown domain: the same domain step, then user peeling (Alg. 4):
-- exactly min(k, |domain|) rounds, each picking the item with the largest
-- (number of not-yet-hit users holding it) + fresh Gumbel(1/eps0) noise. The sequential part
-- runs in one Python UDF call on compact arrays (one list of dense item ids per user).
-- dpsql:body dp__body_hitting_set
WITH dp__cal AS (
    SELECT unnest(dp__top_k_calibration(k, epsilon, delta, max_items, domain_method, user_col, item_col))),
-- The domain step: a set-union body at its share; the release's wrapper charges the total (epsilon, delta) once.
-- MATERIALIZED: the release is used twice and must be drawn (and paid for) once.
dp__domain AS MATERIALIZED (
    SELECT item, row_number() OVER (ORDER BY item) - 1 AS iid
    FROM dp__body_set_union(tbl, method := domain_method, epsilon := dp__top_k_share('epsilon', epsilon), delta := dp__top_k_share('delta', delta),
                      max_items := max_items, user_col := user_col, item_col := item_col)),
dp__per_user AS (
    SELECT list(d.iid) AS iids
    FROM dp__user_items(tbl, user_col := user_col, item_col := item_col) AS p JOIN dp__domain AS d ON p.item = d.item
    GROUP BY p.user_id),
dp__picked AS MATERIALIZED (
    SELECT dp__user_peeling(u.all_iids, m.n_items, dp__cal.k, dp__cal.gumbel_scale) AS chosen
    FROM (SELECT list(iids) AS all_iids FROM dp__per_user) AS u,
         (SELECT count(*) AS n_items FROM dp__domain) AS m,
         dp__cal),
dp__ranked AS (SELECT unnest(range(1, len(chosen) + 1)) AS rank, unnest(chosen) AS iid FROM dp__picked)
SELECT r.rank, d.item FROM dp__ranked AS r JOIN dp__domain AS d ON r.iid = d.iid;

-- Durfee & Rogers (2019) limited-domain top-k (Alg. 1), the baseline of [MM] Sec. 5.2.
-- Counts of distinct users per item (each user capped to max_items items; NULL = no cap); the
-- true top k_bar items (ties broken by a fixed hash of the item) and
-- h_bot = h_(k_bar+1) + 1 + ln(min(max_items, k_bar)/delta_step)/eps_step get independent
-- Gumbel(1/eps_step) noise; items are output in noisy order while they beat noisy h_bot, at most k.
-- k_bar := 'infinity' considers every item and needs max_items.
-- dpsql:body dp__body_top_k_limited_domain
WITH dp__cal AS (
    SELECT unnest(dp__limited_domain_calibration(k, k_bar, epsilon, delta, max_items, user_col, item_col))),
dp__counts AS (
    -- With no cap the capped macro keeps every item (the cap is larger than any degree).
    SELECT item, count(*) AS n
    FROM dp__capped_user_items(tbl, max_items := coalesce(max_items, 4e18), user_col := user_col, item_col := item_col)
    GROUP BY item),
dp__ranked AS (SELECT item, n, row_number() OVER (ORDER BY n DESC, hash(item)) AS r FROM dp__counts),
dp__bottom AS MATERIALIZED (
    SELECT h.h_next + dp__cal.offset + dp_gumbel_noise(dp__cal.gumbel_scale) AS v_bot
    FROM (SELECT coalesce(max(n) FILTER (WHERE r = dp__cal.k_bar + 1), 0) AS h_next FROM dp__ranked CROSS JOIN dp__cal) AS h
    CROSS JOIN dp__cal),
dp__noisy AS (
    SELECT item, n + dp_gumbel_noise(dp__cal.gumbel_scale) AS score, dp__cal.k AS k_rows
    FROM dp__ranked CROSS JOIN dp__cal WHERE r <= dp__cal.k_bar)
SELECT row_number() OVER (ORDER BY score DESC) AS rank, item
FROM dp__noisy CROSS JOIN dp__bottom
WHERE score > v_bot
QUALIFY rank <= k_rows;
