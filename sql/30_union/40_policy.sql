-- Sequential update policies (Gopi et al. 2020, Alg. 1, 3-6; GreedyUpdate of Carvalho et al. 2022).
-- The engine caps, numbers users and items and packs the entries; one Python UDF call runs the
-- policy over all users in order, adds noise and thresholds; the engine maps the released dense
-- ids back to items. Privacy argument and calibration: dpsql/union/policy.py.

-- (user_id, item, m): each distinct pair of the table with its number of rows m (GreedyUpdate
-- fills a user's most repeated items first). NULL users or items are an error, as in dp__user_items.
CREATE OR REPLACE TEMP MACRO dp__user_item_multiplicities(tbl VARCHAR, user_col VARCHAR := 'user_id',
                                                          item_col VARCHAR := 'item') AS TABLE
SELECT user_id, item, count(*) AS m
FROM dp__user_item_rows(tbl, user_col := user_col, item_col := item_col)
GROUP BY user_id, item;

-- TRUE, or an error: order_tbl/order_col belong to greedy_update only, order_col needs order_tbl, and
-- the named columns must exist (checked on the schema, before any row is read).
CREATE OR REPLACE TEMP MACRO dp__policy_check_order(method, order_tbl, order_col, item_col, tbl) AS
    CASE WHEN order_tbl IS NULL AND order_col IS NULL THEN true
         WHEN method <> 'greedy_update'
             THEN error('dpsql: order_tbl and order_col apply to greedy_update only')
         WHEN order_tbl IS NULL
             THEN error('dpsql: order_col := ''' || order_col || ''' needs order_tbl := ''<public table of items>''')
         -- (bound to tbl's schema when order_tbl is NULL: query_table needs a name; that branch is not taken)
         -- one item type on both sides before they are joined: DuckDB's join would otherwise cast the
         -- private items and quote one it cannot convert
         ELSE dp__check_column_list(coalesce(order_tbl, tbl), ['item_col', 'order_col'],
                                    [item_col, coalesce(order_col, item_col)])
              AND dp__check_same_type(coalesce(order_tbl, tbl), item_col, 'order_tbl', tbl, item_col, 'item_col')
    END;

-- (item, listed, r) of a public order table: one row per item it lists, r = min(order_col) (NULL
-- without order_col). Empty when order_tbl is NULL: the source is then bound to `tbl` (a table that
-- exists and has item_col) under a constant false filter, so no row of it is read. dp__absent_* (as in
-- dp__eval_released_items) make a missing column dp__check_column's error. Its rows pass the type check
-- of both item columns before any of them is read: the join with the private items would otherwise cast
-- them to the private type as soon as they are read, and quote the first that does not convert in
-- DuckDB's error instead of dpsql's (the check in dp__policy_run's calibration runs on its own).
CREATE OR REPLACE TEMP MACRO dp__policy_public_order(order_tbl, order_col, item_col, tbl) AS TABLE
SELECT item, 0 AS listed, min(r) AS r
FROM (SELECT dp__canonical(coalesce(*COLUMNS(lambda c: lower(c) = lower(item_col) OR c = 'dp__absent_item'))) AS item,
             coalesce(*COLUMNS(lambda c: lower(c) = lower(coalesce(order_col, '')) OR c = 'dp__absent_rank')) AS r
      FROM (SELECT *, NULL AS dp__absent_item, NULL AS dp__absent_rank
            FROM query_table(coalesce(order_tbl, tbl))
            WHERE order_tbl IS NOT NULL
              AND dp__check_same_type(coalesce(order_tbl, tbl), item_col, 'order_tbl', tbl, item_col, 'item_col')))
WHERE item IS NOT NULL
GROUP BY item;

-- One sequential-policy release. Users are visited in the order of hash(user_id) keyed with a
-- secret salt drawn for this query (independent of the capping salt, which
-- dp__capped_user_items draws itself); ties of the hash are broken by the user id, so two users
-- are never merged. GreedyUpdate visits users with fewer distinct items first (then the keyed
-- hash): a function of each user's own rows, so adding a user still leaves the others' relative
-- order unchanged (docs/proofs/greedy_update.md section 5). Items get dense ids 0.. in the
-- engine. Each entry is packed into one BIGINT (user ordinal << 32 | item id): one flat list is
-- much cheaper to hand to Python than two.
-- Within a user, GreedyUpdate fills items by decreasing multiplicity, ties in ONE global order of
-- the items: those of the public order_tbl first (by ascending order_col), then hash(item) keyed
-- with the order salt, then the item itself (hash collisions). The
-- same order for every user makes users fill the same items (the budget a user frees lands where
-- the others also spend); a user's order still depends only on its own rows and the salt.
CREATE OR REPLACE TEMP MACRO dp__policy_run(tbl VARCHAR, method VARCHAR, epsilon DOUBLE, delta DOUBLE,
        max_items DOUBLE, alpha DOUBLE, passes DOUBLE, user_col VARCHAR, item_col VARCHAR,
        order_tbl VARCHAR := NULL, order_col VARCHAR := NULL) AS TABLE
WITH dp__cal AS (
    SELECT unnest(dp__policy_calibration(method, epsilon, delta, max_items, alpha, passes, user_col, item_col))
    WHERE dp__policy_check_order(method, order_tbl, order_col, item_col, tbl)),
dp__order_salt AS MATERIALIZED (SELECT hash(dp__secret_salt()) AS s),
-- GreedyUpdate's public order (order_tbl: public, or an earlier DP release): its items are filled
-- first, by ascending order_col (when given), before the items it does not list.
dp__public_order AS MATERIALIZED (FROM dp__policy_public_order(order_tbl, order_col, item_col, tbl)),
-- Dense item ids. GreedyUpdate's follow its global order (public order first, then the keyed hash,
-- then the item), so a user's fill order is (multiplicity descending, id): three integers to sort
-- instead of a hash and the item itself on every pair. The other policies' ids are
-- arbitrary (their updates do not depend on the order). Materialised: row_number() OVER () is not
-- reproducible, and the ids are used twice.
dp__items AS MATERIALIZED (
    SELECT item, CASE WHEN n < 4294967296 THEN n
                      ELSE error('dpsql: more than 2^32 distinct items; the policy methods cannot number them') END AS iid
    FROM (SELECT item, row_number() OVER (ORDER BY o.listed NULLS LAST, o.r NULLS LAST, hash(xor(hash(item), s)), item) - 1 AS n
          FROM (SELECT DISTINCT item FROM dp__user_item_rows(tbl, user_col := user_col, item_col := item_col))
          CROSS JOIN dp__order_salt LEFT JOIN dp__public_order o USING (item)
          WHERE method = 'greedy_update'
          UNION ALL
          SELECT item, row_number() OVER () - 1 AS n
          FROM (SELECT DISTINCT item FROM dp__user_item_rows(tbl, user_col := user_col, item_col := item_col))
          WHERE method <> 'greedy_update')),
-- The entries (user_id, item, m) a policy sees: the capped distinct pairs (m = 1), or for GreedyUpdate
-- every distinct pair with its multiplicity and no cap. `method` is a constant: the untaken branch is
-- pruned while planning (it draws no salt). GreedyUpdate's pairs are stored because it also counts
-- each user's distinct items from them (a second DISTINCT of the rows costs more than storing them).
dp__mult AS MATERIALIZED (
    FROM dp__user_item_multiplicities(tbl, user_col := user_col, item_col := item_col) WHERE method = 'greedy_update'),
dp__pairs AS NOT MATERIALIZED (
    SELECT user_id, item, 1::BIGINT AS m
    FROM dp__capped_user_items(tbl, max_items := max_items, user_col := user_col, item_col := item_col)
    WHERE method <> 'greedy_update'
    UNION ALL
    FROM dp__mult),
-- Users: GreedyUpdate needs each user's number of distinct items (from the pairs' multiplicities,
-- which it reads anyway); the others need only the distinct users, not a second DISTINCT of the pairs.
dp__users AS (
    SELECT user_id, CASE WHEN n < 2147483648 THEN n
                         ELSE error('dpsql: more than 2^31 users; the policy methods cannot number them') END AS ord
    FROM (SELECT user_id, row_number() OVER (ORDER BY CASE WHEN method = 'greedy_update' THEN d END,
                                                      hash(xor(hash(user_id), s)), user_id) - 1 AS n
          FROM (SELECT user_id, count(*) AS d FROM dp__mult GROUP BY user_id
                UNION ALL
                SELECT user_id, NULL AS d
                FROM dp__user_item_rows(tbl, user_col := user_col, item_col := item_col)
                WHERE method <> 'greedy_update' GROUP BY user_id)
          CROSS JOIN dp__order_salt)),
dp__entries AS NOT MATERIALIZED (
    SELECT (ord << 32) | iid AS k, m FROM dp__pairs JOIN dp__users USING (user_id) JOIN dp__items USING (item)),
-- One row for the method's branch, even without entries (HAVING: an aggregate over the pruned branch's
-- empty input would add a second row with an empty list): the kernel then runs on no entries, releases
-- nothing and reports its progress as with entries, so a caller listening to a release that holds an
-- empty policy step (auto's unchosen candidate) hears what it would hear otherwise, but for the times.
-- GreedyUpdate's entries arrive unordered: the kernel sorts
-- them into the fill order (user, m descending, id; dpsql.union.policy.fill_order), at a fraction of the
-- cost of an ordered list aggregate. Its pairs with m = 1 (most, in most tables) go as keys alone;
-- the repeated ones as structs, so each key keeps its m.
dp__lists AS (
    SELECT list(k) AS keys, NULL::STRUCT(k BIGINT, m BIGINT)[] AS entries
    FROM dp__entries WHERE method <> 'greedy_update' HAVING method <> 'greedy_update'
    UNION ALL
    SELECT list(k) FILTER (WHERE m = 1) AS keys, list({'k': k, 'm': m}) FILTER (WHERE m > 1) AS entries
    FROM dp__entries WHERE method = 'greedy_update' HAVING method = 'greedy_update'),
dp__released AS (
    SELECT unnest(dp__policy_release(method, keys, entries, noise, scale, threshold, gamma, n_passes)) AS iid
    FROM dp__lists CROSS JOIN dp__cal)
-- Sorted: the dense ids follow the engine's hash order, which depends on the data.
SELECT item FROM dp__released JOIN dp__items USING (iid)
ORDER BY item;

-- Policy Laplace (Gopi et al. 2020, Alg. 4): l1-descent towards Gamma = rho_Lap + alpha/epsilon,
-- Lap(1/epsilon) noise, threshold rho_Lap. passes := P runs P passes with budget 1/P each.
-- dpsql:body dp__body_set_union_policy_laplace
FROM dp__policy_run(tbl, 'policy_laplace', epsilon, delta, max_items, alpha, passes, user_col, item_col);

-- Policy Gaussian (Gopi et al. 2020, Alg. 6): l2-descent towards Gamma = rho_Gauss + alpha*sigma,
-- N(0, sigma^2) noise with sigma = sigma(epsilon, delta/2), threshold rho_Gauss.
-- dpsql:body dp__body_set_union_policy_gaussian
FROM dp__policy_run(tbl, 'policy_gaussian', epsilon, delta, max_items, alpha, passes, user_col, item_col);

-- GreedyUpdate (Carvalho et al. 2022): no cap; users with fewer distinct items first; each fills
-- its items, most repeated rows first and otherwise in one global order of the items (order_tbl's
-- items first, by order_col; then a keyed hash), up to Gamma = max(rho + alpha/epsilon, 1) with l1 budget 1; Lap(1/epsilon) noise;
-- windowed release: rho - weight < L <= rho, L ~ Lap(1/epsilon), rho = max(1, ln((e^epsilon - 1)/(2 delta))/epsilon)
-- (dpsql/union/policy.py; docs/proofs/greedy_update.md). One pass.
-- dpsql:body dp__body_set_union_greedy_update
FROM dp__policy_run(tbl, 'greedy_update', epsilon, delta, 1, alpha, 1, user_col, item_col,
                    order_tbl := order_tbl, order_col := order_col);
