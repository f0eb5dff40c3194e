-- Pure epsilon-DP combinatorial optimisation by subsampling (Ghazi et al., "Individualized Privacy
-- Accounting via Subsampling"). Privacy arguments and kernels: dpsql/optimize/ (one module per
-- mechanism) and dpsql/optimize/subsampling.py; proofs: docs/proofs/<mechanism>.md. Privacy unit: one record
-- (a universe element; a user's stream; a point), add/remove. DuckDB does the joins, dense ids and
-- the Poisson subsample (one secure coin per record from dp__poisson_keep(p, hash(record)), never
-- random(); the hash only pins the call to the row);
-- the sequential selection runs once per query in a Python UDF over flat id lists, and only the
-- selected ids come back. k, horizon are DOUBLE so that 2.5 reaches validation instead of being
-- rounded. The private table is `tbl`; epsilon has no default (a default would spend budget nobody
-- typed); failure_probability is the utility guarantees' failure probability (no effect on privacy).
--
-- Release path (sql/00_core/00_release.sql): each macro here is a BODY (dp__body_<macro>); the releasing macro
-- is generated from the declaration around it (binds the parameters, checks, charges once, sorts by the
-- released columns, the DP-chosen rank first: a greedy order or a permutation).
--
-- What is public. The proofs ([SUB] Sec. 4.1, 5.1.2, App. D, G) fix the candidate universe [m] -- the
-- set ids, the matroid, the candidate centres, the buckets Y and the horizon T -- before the data: a
-- record only changes scores. So every candidate list comes from a public table argument (never from
-- the private rows: a set would otherwise leave the output's support when its only element is
-- removed), and private rows outside the public universe (a set that is not a candidate, a bucket
-- not in Y, a time outside 1..horizon, a point that is not a candidate, a NULL there) are ignored,
-- not reported: an error would tell whether some record holds a value the caller chose. (A NULL
-- user of a stream is an error, one that quotes no value.) Errors about public tables come from the
-- calibration CTE, before the charge.

-- p = 1 - exp(-epsilon) (Cor. 3.2): subsampling an ln 2-add-DP mechanism with p makes it epsilon-DP.
CREATE OR REPLACE TEMP MACRO dp_subsampling_probability(epsilon DOUBLE) AS dp__subsampling_probability(epsilon);
-- ln max{1/(1-p), 1 + p (e^eps0 - 1)} (Lemma 3.1): two-sided epsilon of an eps0-add-DP mechanism on S_p.
CREATE OR REPLACE TEMP MACRO dp_subsampled_epsilon(eps0 DOUBLE, p DOUBLE) AS dp__subsampled_epsilon(eps0, p);

-- Columns are picked as in dp__user_item_rows (sql/00_core/20_contribution_bounding.sql): `SELECT *, NULL AS dp__absent`
-- keeps COLUMNS(...) from matching nothing (a binder error naming dpsql's internals), and a missing column is
-- dp__check_column_list's error, which names the parameter. Each releasing macro also checks its private
-- table's columns in dp__cal: its charge waits for the calibration, not for the data.

-- (set_id, element) rows of a set system, as stored (NULLs included: they match no candidate set).
CREATE OR REPLACE TEMP MACRO dp__set_element_rows(tbl VARCHAR, set_col VARCHAR := 'set_id',
        element_col VARCHAR := 'element') AS TABLE
SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(set_col) OR c = 'dp__absent')) AS set_id,
       coalesce(*COLUMNS(lambda c: lower(c) = lower(element_col) OR c = 'dp__absent')) AS element
FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)
      WHERE dp__check_column_list(tbl, ['set_col', 'element_col'], [set_col, element_col]));

-- The public candidate sets: the distinct set ids of candidates_tbl (column set_col), with dense ids
-- sid in set_id order. A NULL id is an error (a public table: the message may name it).
CREATE OR REPLACE TEMP MACRO dp__candidate_sets(candidates_tbl VARCHAR, set_col VARCHAR := 'set_id') AS TABLE
SELECT set_id, (row_number() OVER (ORDER BY set_id) - 1)::BIGINT AS sid
FROM (SELECT DISTINCT coalesce(coalesce(*COLUMNS(lambda c: lower(c) = lower(set_col) OR c = 'dp__absent')),
                               error('dpsql: column ' || set_col || ' of ' || candidates_tbl
                                     || ' (candidates_tbl) contains NULL; list each candidate set id once')) AS set_id
      FROM (SELECT *, NULL AS dp__absent FROM query_table(candidates_tbl)
            WHERE dp__check_column(candidates_tbl, 'set_col', set_col)));

-- TRUE if joining the private key column private_col of private_tbl with public_col of public_tbl
-- cannot fail on a private value; else an error naming the parameter `name`, raised in the
-- calibration CTE (before the charge). The join runs in the columns' common (UNION) type; DuckDB's
-- own join would convert text ids to the public column's type and quote a failing private value in
-- its error. typeof of a LIMIT 0 subquery is folded while planning: no row is read. A missing column
-- (its type would be NULL) is first an error naming its parameter (`name`, `public_name`).
CREATE OR REPLACE TEMP MACRO dp__key_check(name, private_tbl, private_col, public_tbl, public_col, public_name) AS
CASE WHEN dp__check_column(private_tbl, name, private_col) AND dp__check_column(public_tbl, public_name, public_col)
THEN dp__check_key_types(name,
    typeof((SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(private_col) OR c = 'dp__absent'))
            FROM (SELECT *, NULL AS dp__absent FROM query_table(private_tbl)) LIMIT 0)),
    typeof((SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(public_col) OR c = 'dp__absent'))
            FROM (SELECT *, NULL AS dp__absent FROM query_table(public_tbl))
            UNION ALL SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(private_col) OR c = 'dp__absent'))
            FROM (SELECT *, NULL AS dp__absent FROM query_table(private_tbl))
            LIMIT 0))) END;

-- Rows (sid, element) of tbl whose set is a candidate of candidates_tbl, joined in the common
-- type of the two set-id columns (see dp__key_check). The WHERE false branches only unify types.
CREATE OR REPLACE TEMP MACRO dp__candidate_rows(tbl VARCHAR, candidates_tbl VARCHAR,
        set_col VARCHAR := 'set_id', element_col VARCHAR := 'element') AS TABLE
WITH dp__ck AS (
    SELECT set_id AS dp__key, sid FROM dp__candidate_sets(candidates_tbl, set_col := set_col)
    UNION ALL
    SELECT set_id, NULL
    FROM dp__set_element_rows(tbl, set_col := set_col, element_col := element_col) WHERE false),
-- The private branch is filtered by the key check, so that it fails before any private id is cast to
-- the common type (the cast would quote the id it cannot convert).
dp__rk AS (
    SELECT set_id AS dp__key, element
    FROM dp__set_element_rows(tbl, set_col := set_col, element_col := element_col)
    WHERE dp__key_check('set_col', tbl, set_col, candidates_tbl, set_col, 'set_col')
    UNION ALL
    SELECT set_id, NULL FROM dp__candidate_sets(candidates_tbl, set_col := set_col) WHERE false)
SELECT dp__ck.sid, dp__rk.element FROM dp__rk JOIN dp__ck USING (dp__key);

-- Max k-coverage, pure epsilon-DP (Thm 1.2): elements Poisson-subsampled with p = 1 - e^-eps, then
-- DPSubmodGreedy at ln 2 (k exponential mechanisms over all not-yet-chosen candidate sets, score =
-- newly covered sampled elements). candidates_tbl (column set_col) is the public list of candidate
-- sets; rows of tbl for other sets are ignored. Returns (rank, set_id), min(k, #candidates)
-- rows in the greedy's (DP) order. Privacy argument: dpsql/optimize/max_coverage.py.
-- dpsql:body dp__body_max_coverage
WITH dp__sets AS MATERIALIZED (FROM dp__candidate_sets(candidates_tbl, set_col := set_col)),
-- MATERIALIZED: its checks (the public candidates, the key types) run before the rows are read
dp__cal AS MATERIALIZED (  -- reads the public candidates too, so that their errors come before the charge
    SELECT dp__max_coverage_check(k, epsilon, set_col, element_col) AS p, k::BIGINT AS k_sets,
           (SELECT count(set_id) FROM dp__sets) AS n_candidates
    WHERE dp__check_column_list(tbl, ['set_col', 'element_col'], [set_col, element_col])
      AND dp__key_check('set_col', tbl, set_col, candidates_tbl, set_col, 'set_col')),
dp__rows AS (
    SELECT sid, element
    FROM dp__candidate_rows(tbl, candidates_tbl, set_col := set_col, element_col := element_col)
    WHERE element IS NOT NULL),
dp__sampled AS MATERIALIZED (
    SELECT element, (row_number() OVER () - 1)::BIGINT AS eid
    FROM (SELECT DISTINCT element FROM dp__rows) CROSS JOIN dp__cal
    WHERE dp__poisson_keep(p, hash(element))),
dp__pairs AS (SELECT DISTINCT sid, eid FROM dp__rows JOIN dp__sampled USING (element)),
dp__sel AS (
    SELECT dp__max_coverage_select(list(sid), list(eid), (SELECT count(*) FROM dp__sets),
                                   (SELECT count(*) FROM dp__sampled), (SELECT k_sets FROM dp__cal)) AS ids
    FROM dp__pairs),
dp__picked AS (SELECT unnest(ids) AS sid, unnest(range(1, len(ids) + 1)) AS rank FROM dp__sel)
SELECT rank, set_id FROM dp__picked JOIN dp__sets USING (sid) ORDER BY rank;

-- Set cover, pure epsilon-DP: DPGreedyScaling (Alg. 4) in the open-set model. Every candidate set of
-- candidates_tbl once, as (position, set_id): each element is served by the first set holding it.
-- The universe is every distinct non-NULL element of tbl (n = |D|, private); rows for sets that
-- are not candidates add no membership. The subsamples are fresh per round, so the kernel draws them
-- itself (from the same secure source). tau_constant: the printed 1000 (thresholds
-- tau_r = tau_constant * n~ / 2^r; any value keeps the privacy guarantee). Privacy argument:
-- dpsql/optimize/set_cover.py.
-- dpsql:body dp__body_set_cover
WITH dp__sets AS MATERIALIZED (FROM dp__candidate_sets(candidates_tbl, set_col := set_col)),
-- MATERIALIZED: its checks (the public candidates, the key types) run before the rows are read
dp__cal AS MATERIALIZED (  -- reads the public candidates too, so that their errors come before the charge
    SELECT dp__set_cover_check(epsilon, tau_constant, set_col, element_col) AS c, epsilon AS eps,
           (SELECT count(set_id) FROM dp__sets) AS n_candidates
    WHERE dp__check_column_list(tbl, ['set_col', 'element_col'], [set_col, element_col])
      AND dp__key_check('set_col', tbl, set_col, candidates_tbl, set_col, 'set_col')),
dp__elems AS MATERIALIZED (
    SELECT element, (row_number() OVER () - 1)::BIGINT AS eid
    FROM (SELECT DISTINCT element FROM dp__set_element_rows(tbl, set_col := set_col, element_col := element_col)
          WHERE element IS NOT NULL)),
dp__pairs AS (
    SELECT DISTINCT r.sid, e.eid
    FROM dp__candidate_rows(tbl, candidates_tbl, set_col := set_col, element_col := element_col) AS r
    JOIN dp__elems AS e USING (element)),
dp__sel AS (
    SELECT dp__set_cover_select(list(sid), list(eid), (SELECT count(*) FROM dp__sets),
                                (SELECT count(*) FROM dp__elems), (SELECT eps FROM dp__cal),
                                (SELECT c FROM dp__cal)) AS ids
    FROM dp__pairs),
dp__picked AS (SELECT unnest(ids) AS sid, unnest(range(1, len(ids) + 1)) AS position FROM dp__sel)
SELECT position, set_id FROM dp__picked JOIN dp__sets USING (sid);

-- NON-PRIVATE evaluation (reads raw data, releases an exact number): open-set cost of a permutation
-- table (position_col, permutation_set_col; dp_set_cover's output by default) = number of distinct sets
-- that serve some element, each element served by the first set of the permutation holding it.
CREATE OR REPLACE TEMP MACRO dp_eval_set_cover_cost(tbl VARCHAR, permutation_tbl VARCHAR,
        set_col VARCHAR := 'set_id', element_col VARCHAR := 'element', position_col VARCHAR := 'position',
        permutation_set_col VARCHAR := 'set_id') AS TABLE
WITH dp__rows AS (FROM dp__set_element_rows(tbl, set_col := set_col, element_col := element_col)),
dp__perm AS (
    SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(position_col) OR c = 'dp__absent')) AS position,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(permutation_set_col) OR c = 'dp__absent')) AS set_id
    FROM (SELECT *, NULL AS dp__absent FROM query_table(permutation_tbl)
          WHERE dp__check_column_list(permutation_tbl, ['position_col', 'permutation_set_col'],
                                      [position_col, permutation_set_col]))),
dp__served AS (
    SELECT element, arg_min(set_id, position) AS by_set
    FROM dp__rows JOIN dp__perm USING (set_id) WHERE element IS NOT NULL GROUP BY element)
-- from a one-row source: a missing column reads as a constant NULL, and the optimizer may then drop the plan
-- that holds dp__set_element_rows' per-row check
SELECT (SELECT count(DISTINCT by_set) FROM dp__served) AS cost
FROM (SELECT dp__check_column_list(tbl, ['set_col', 'element_col'], [set_col, element_col])
             AND dp__check_column_list(permutation_tbl, ['position_col', 'permutation_set_col'],
                                       [position_col, permutation_set_col]) AS ok) WHERE ok;

-- Shifting heavy hitters, pure epsilon-DP (Thm 5.6): users Poisson-subsampled once with
-- p = 1 - e^-eps, then ThreshMonitor at ln 2 (Alg. 3) over EVERY bucket of buckets_tbl and every
-- t in 1..horizon: report (t, bucket) iff count of active users + Exp(rate ln 2 / k) > tau, with
-- tau = 1.5 p tau*(k), tau*(k) = 4000 k ln(horizon |Y| / failure_probability) / eps. horizon (T) and
-- the bucket set are public and must be given; rows of tbl: (user, t, bucket), one bucket per user and
-- time.
-- A row whose t is not a whole number in 1..horizon or whose bucket is NULL or not in buckets_tbl
-- is ignored (see the header), and so is a (user, t) with several buckets (a per-record rule: the
-- kernel's error would say that such a user exists); a NULL user is an error. Returns (t, bucket)
-- sorted by both. Privacy argument: dpsql/optimize/heavy_hitters.py.
-- dpsql:body dp__body_shifting_heavy_hitters
-- MATERIALIZED: its checks (the columns, the key types) run before the rows are read
WITH dp__cal AS MATERIALIZED (
    SELECT unnest(dp__heavy_hitters_calibration(epsilon, k, failure_probability, horizon, user_col, time_col,
                                                bucket_col))
    WHERE dp__check_column_list(tbl, ['user_col', 'time_col', 'bucket_col'], [user_col, time_col, bucket_col])
      AND dp__key_check('bucket_col', tbl, bucket_col, buckets_tbl, bucket_col, 'bucket_col')),
dp__buckets AS MATERIALIZED (
    SELECT bucket, (row_number() OVER (ORDER BY bucket) - 1)::BIGINT AS bid
    FROM (SELECT DISTINCT coalesce(*COLUMNS(lambda c: lower(c) = lower(bucket_col) OR c = 'dp__absent')) AS bucket
          FROM (SELECT *, NULL AS dp__absent FROM query_table(buckets_tbl)
                WHERE dp__check_column(buckets_tbl, 'bucket_col', bucket_col)))
    WHERE bucket IS NOT NULL),
dp__nb AS (SELECT count(*) AS n_buckets FROM dp__buckets),
dp__tau AS (SELECT dp__heavy_hitters_tau(epsilon, k, failure_probability, horizon, n_buckets) AS tau FROM dp__nb),
dp__stream AS MATERIALIZED (
    SELECT coalesce(coalesce(*COLUMNS(lambda c: lower(c) = lower(user_col) OR c = 'dp__absent')),
                    error('dpsql: column ' || user_col || ' (user_col) contains NULL; filter NULL users out first'))
               AS user_id,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(time_col) OR c = 'dp__absent')) AS t,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(bucket_col) OR c = 'dp__absent')) AS bucket
    FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)
          WHERE dp__check_column_list(tbl, ['user_col', 'time_col', 'bucket_col'],
                                      [user_col, time_col, bucket_col]))),
dp__bkeys AS (
    SELECT bucket AS dp__key, bid FROM dp__buckets
    UNION ALL SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(bucket_col) OR c = 'dp__absent')), NULL
              FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)) WHERE false),
dp__skeys AS (  -- (the key check before any private bucket is cast: see dp__candidate_rows)
    SELECT user_id, t, bucket AS dp__key FROM dp__stream
    WHERE dp__key_check('bucket_col', tbl, bucket_col, buckets_tbl, bucket_col, 'bucket_col')
    UNION ALL SELECT NULL, NULL, bucket FROM dp__buckets WHERE false),
dp__in_domain AS (
    SELECT s.user_id, try_cast(s.t AS DOUBLE)::BIGINT - 1 AS tid, b.bid
    FROM dp__skeys AS s JOIN dp__bkeys AS b USING (dp__key) CROSS JOIN dp__cal
    WHERE try_cast(s.t AS DOUBLE) = floor(try_cast(s.t AS DOUBLE))
      AND try_cast(s.t AS DOUBLE) BETWEEN 1 AND dp__cal.t_steps),
dp__users AS MATERIALIZED (
    SELECT user_id, (row_number() OVER () - 1)::BIGINT AS uid
    FROM (SELECT DISTINCT user_id FROM dp__stream) CROSS JOIN dp__cal WHERE dp__poisson_keep(p, hash(user_id))),
dp__rows AS (  -- a user in several buckets at one time is in none then: an error would leak that such a user exists
    SELECT u.uid, r.tid, min(r.bid) AS bid FROM dp__in_domain AS r JOIN dp__users AS u USING (user_id)
    GROUP BY u.uid, r.tid HAVING count(DISTINCT r.bid) = 1),
dp__sel AS (
    SELECT dp__heavy_hitters_select(list(uid), list(tid), list(bid), (SELECT count(*) FROM dp__users),
                                    (SELECT t_steps FROM dp__cal), (SELECT n_buckets FROM dp__nb),
                                    (SELECT k_max FROM dp__cal), (SELECT tau FROM dp__tau)) AS ids
    FROM dp__rows),
dp__codes AS (SELECT unnest(ids) AS code FROM dp__sel)
SELECT (code // n_buckets + 1)::BIGINT AS t, bucket
FROM dp__codes CROSS JOIN dp__nb JOIN dp__buckets ON bid = code % n_buckets;

-- Coverage under a partition matroid, pure epsilon-DP (Thm 1.3): elements Poisson-subsampled with
-- p = 1 - e^-eps, then PrivContGreedy at ln 2/2 (ceil(4/eta) passes, samples uniform vectors,
-- default 8 per pass: utility only, see _matroid_coverage_arrays), ceil(20 ln(6/failure_probability)/eta)
-- swap roundings and one exponential mechanism at ln 2/2 over them; the kernel draws the subsample
-- itself. The matroid is public: parts_tbl (set_col, part_col) lists the candidate sets, one part
-- each (rows of tbl for sets not listed there are ignored); capacities_tbl (part_col,
-- capacity_col) gives each part's capacity (a whole number >= 0). Returns the chosen independent
-- set as (rank, set_id), rank = position in set_id order. Privacy argument:
-- dpsql/optimize/matroid_coverage.py.
-- dpsql:body dp__body_matroid_coverage
WITH dp__caps_in AS (
    SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(part_col) OR c = 'dp__absent')) AS part,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(capacity_col) OR c = 'dp__absent')) AS capacity
    FROM (SELECT *, NULL AS dp__absent FROM query_table(capacities_tbl)
          WHERE dp__check_column_list(capacities_tbl, ['part_col', 'capacity_col'], [part_col, capacity_col])
            -- both tables' parts have one type before any is read: the join would cast one side and quote
            -- the first value that does not convert in DuckDB's error (here and in dp__parts_in)
            AND dp__check_same_type(capacities_tbl, part_col, 'capacities_tbl', parts_tbl, part_col, 'part_col'))),
dp__caps AS MATERIALIZED (
    SELECT coalesce(part, error('dpsql: column ' || part_col || ' of ' || capacities_tbl || ' contains NULL')) AS part,
           CASE WHEN capacity IS NOT NULL AND capacity::DOUBLE >= 0 AND capacity::DOUBLE = floor(capacity::DOUBLE)
                THEN capacity::BIGINT
                ELSE error('dpsql: capacity of part ' || part || ' must be a whole number >= 0 (column '
                           || capacity_col || ')') END AS capacity,
           CASE WHEN count(*) OVER (PARTITION BY part) = 1
                THEN (row_number() OVER (ORDER BY part) - 1)::BIGINT
                ELSE error('dpsql: part ' || part || ' has more than one capacity in ' || capacities_tbl) END AS pid
    FROM dp__caps_in),
dp__parts_in AS (
    SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(set_col) OR c = 'dp__absent')) AS set_id,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(part_col) OR c = 'dp__absent')) AS part
    FROM (SELECT *, NULL AS dp__absent FROM query_table(parts_tbl)
          WHERE dp__check_column_list(parts_tbl, ['set_col', 'part_col'], [set_col, part_col])
            AND dp__check_same_type(capacities_tbl, part_col, 'capacities_tbl', parts_tbl, part_col, 'part_col'))),
dp__sets AS MATERIALIZED (
    SELECT coalesce(p.set_id, error('dpsql: column ' || set_col || ' of ' || parts_tbl || ' contains NULL')) AS set_id,
           coalesce(c.pid, error('dpsql: part ' || coalesce(p.part::VARCHAR, 'NULL') || ' of set ' || p.set_id
                                 || ' has no capacity in ' || capacities_tbl)) AS pid,
           CASE WHEN count(*) OVER (PARTITION BY p.set_id) = 1
                THEN (row_number() OVER (ORDER BY p.set_id) - 1)::BIGINT
                ELSE error('dpsql: set ' || p.set_id || ' is listed more than once in ' || parts_tbl) END AS sid
    FROM dp__parts_in AS p LEFT JOIN dp__caps AS c ON p.part = c.part),
-- MATERIALIZED: its checks (the public matroid, the key types) run before the rows are read
dp__cal AS MATERIALIZED (  -- reads the public matroid too, so that its errors come before the charge
    SELECT dp__matroid_coverage_check(epsilon, eta, failure_probability, samples, set_col, element_col, part_col,
                                      capacity_col) AS n_samples,
           (SELECT count(part) + count(capacity) + count(pid) FROM dp__caps)
           + (SELECT count(set_id) + count(pid) + count(sid) FROM dp__sets) AS n_public
    WHERE dp__check_column_list(tbl, ['set_col', 'element_col'], [set_col, element_col])
      AND dp__key_check('set_col', tbl, set_col, parts_tbl, set_col, 'set_col')),
dp__skeys AS (
    SELECT set_id AS dp__key, sid FROM dp__sets
    UNION ALL
    SELECT set_id, NULL
    FROM dp__set_element_rows(tbl, set_col := set_col, element_col := element_col) WHERE false),
dp__rkeys AS (  -- (the key check before any private id is cast: see dp__candidate_rows)
    SELECT set_id AS dp__key, element
    FROM dp__set_element_rows(tbl, set_col := set_col, element_col := element_col)
    WHERE dp__key_check('set_col', tbl, set_col, parts_tbl, set_col, 'set_col')
    UNION ALL SELECT set_id, NULL FROM dp__sets WHERE false),
dp__rows AS (
    SELECT s.sid, r.element FROM dp__rkeys AS r JOIN dp__skeys AS s USING (dp__key) WHERE r.element IS NOT NULL),
dp__elems AS MATERIALIZED (
    SELECT element, (row_number() OVER (ORDER BY element) - 1)::BIGINT AS eid FROM (SELECT DISTINCT element FROM dp__rows)),
dp__pairs AS (SELECT DISTINCT sid, eid FROM dp__rows JOIN dp__elems USING (element)),
dp__sel AS (
    SELECT dp__matroid_coverage_select(list(sid), list(eid), (SELECT count(*) FROM dp__sets),
                                       (SELECT count(*) FROM dp__elems),
                                       (SELECT list(pid ORDER BY sid) FROM dp__sets),
                                       (SELECT list(capacity ORDER BY pid) FROM dp__caps),
                                       epsilon, eta, failure_probability, (SELECT n_samples FROM dp__cal)) AS ids
    FROM dp__pairs),
dp__picked AS (SELECT unnest(ids) AS sid, unnest(range(1, len(ids) + 1)) AS rank FROM dp__sel)
SELECT rank, set_id FROM dp__picked JOIN dp__sets USING (sid) ORDER BY rank;

-- TRUE if distances_tbl's point and candidate columns have candidates_tbl's candidate type (schema only),
-- else dp__check_same_type's error naming the parameter.
CREATE OR REPLACE TEMP MACRO dp__k_median_metric_types(candidates_tbl, candidate_col, distances_tbl, distance_point_col,
                                                       distance_candidate_col) AS
    dp__check_same_type(candidates_tbl, candidate_col, 'candidates_tbl', distances_tbl, distance_point_col,
                        'distance_point_col')
    AND dp__check_same_type(candidates_tbl, candidate_col, 'candidates_tbl', distances_tbl, distance_candidate_col,
                            'distance_candidate_col');

-- k-median (q = 1) / k-means (q = 2), pure epsilon-DP (Thm 1.5, App. G): points Poisson-subsampled
-- with p = 1 - e^-eps, then G.2 at ln 2 (bicriteria Repeated-EM at ln 2/2 with L = ceil(2 k ln n_bound)
-- rounds, or every candidate when 2 k ln n_bound >= #candidates; per-centre counts + Exp(rate ln 2/2);
-- local search). The finite metric is public: its points are the candidates of candidates_tbl
-- (candidate_col); each row of tbl is one private record located at a candidate id
-- (point_col; a NULL or a location that is not a candidate is ignored, see the header);
-- distances_tbl (distance_point_col, distance_candidate_col, distance_col) holds the distance for
-- every ordered pair of candidates, all in [0, 1] (diameter <= 1: rescale first). n_bound is a public
-- upper bound on the number of points and must be given: L must not depend on the private count, or
-- the number of exponential mechanisms would leak it (an n_bound below the true count keeps privacy,
-- costs utility). Returns (rank, candidate_id), min(k, #candidates) rows, rank = position in
-- candidate_id order. Privacy argument: dpsql/optimize/k_median.py.
-- dpsql:body dp__body_k_median
WITH dp__cands AS MATERIALIZED (
    SELECT candidate_id, (row_number() OVER (ORDER BY candidate_id) - 1)::BIGINT AS cid
    FROM (SELECT DISTINCT coalesce(coalesce(*COLUMNS(lambda c: lower(c) = lower(candidate_col) OR c = 'dp__absent')),
                                   error('dpsql: column ' || candidate_col || ' of ' || candidates_tbl
                                         || ' contains NULL')) AS candidate_id
          FROM (SELECT *, NULL AS dp__absent FROM query_table(candidates_tbl)
                WHERE dp__check_column(candidates_tbl, 'candidate_col', candidate_col)
                  -- the metric's ids have the candidates' type before any is read: the joins below would
                  -- cast one side and quote the first id that does not convert in DuckDB's error
                  AND dp__k_median_metric_types(candidates_tbl, candidate_col, distances_tbl, distance_point_col,
                                                distance_candidate_col)))),
dp__dist_in AS (
    SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(distance_point_col) OR c = 'dp__absent')) AS point,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(distance_candidate_col) OR c = 'dp__absent')) AS candidate,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(distance_col) OR c = 'dp__absent')) AS distance
    FROM (SELECT *, NULL AS dp__absent FROM query_table(distances_tbl)
          WHERE dp__check_column_list(distances_tbl, ['distance_point_col', 'distance_candidate_col', 'distance_col'],
                                      [distance_point_col, distance_candidate_col, distance_col])
            AND dp__k_median_metric_types(candidates_tbl, candidate_col, distances_tbl, distance_point_col,
                                          distance_candidate_col))),
dp__dist AS (
    SELECT coalesce(c.cid, error('dpsql: candidate ' || coalesce(d.candidate::VARCHAR, 'NULL') || ' of '
                                 || distances_tbl || ' is not in ' || candidates_tbl)) AS row_id,
           coalesce(l.cid, error('dpsql: point ' || coalesce(d.point::VARCHAR, 'NULL') || ' of '
                                 || distances_tbl || ' is not in ' || candidates_tbl)) AS col_id,
           coalesce(d.distance::DOUBLE, error('dpsql: NULL distance in ' || distances_tbl)) AS distance
    FROM dp__dist_in AS d
    LEFT JOIN dp__cands AS c ON d.candidate = c.candidate_id LEFT JOIN dp__cands AS l ON d.point = l.candidate_id),
dp__metric AS (  -- the kernel's checks of the public metric, here so that they come before the charge
    SELECT CASE WHEN count(*) <> (SELECT count(candidate_id) FROM dp__cands) ** 2
                  OR count(DISTINCT (row_id, col_id)) <> count(*)
                THEN error('dpsql: distances_tbl must hold exactly one (point, candidate, distance) row for each '
                           || 'ordered pair of candidates of ' || candidates_tbl)
                WHEN min(distance) < 0 OR max(distance) > 1
                THEN error('dpsql: distances must lie in [0, 1] (rescale the metric to diameter <= 1)')
                ELSE count(*) END AS n_pairs
    FROM dp__dist),
-- MATERIALIZED: its checks (the key types) run before the rows are read
dp__cal AS MATERIALIZED (
    SELECT unnest(dp__k_median_calibration(k, q, epsilon, n_bound, point_col, candidate_col, distance_point_col,
                                           distance_candidate_col, distance_col)),
           (SELECT n_pairs FROM dp__metric) AS n_pairs
    WHERE dp__key_check('point_col', tbl, point_col, candidates_tbl, candidate_col, 'candidate_col')),
dp__ckeys AS (
    SELECT candidate_id AS dp__key, cid FROM dp__cands
    UNION ALL SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(point_col) OR c = 'dp__absent')), NULL
              FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)) WHERE false),
dp__pkeys AS (
    SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(point_col) OR c = 'dp__absent')) AS dp__key
    FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)
          WHERE dp__check_column(tbl, 'point_col', point_col)
            -- (the key check before any private point is cast: see dp__candidate_rows)
            AND dp__key_check('point_col', tbl, point_col, candidates_tbl, candidate_col, 'candidate_col'))
    UNION ALL SELECT candidate_id FROM dp__cands WHERE false),
dp__pts AS (SELECT c.cid AS lid FROM dp__pkeys JOIN dp__ckeys AS c USING (dp__key)),
dp__sel AS (
    SELECT dp__k_median_select((SELECT list(lid ORDER BY lid) FROM dp__pts), list(row_id), list(col_id),
                               list(distance), (SELECT count(*) FROM dp__cands), (SELECT k_max FROM dp__cal),
                               (SELECT q_exp FROM dp__cal), epsilon, (SELECT n_max FROM dp__cal)) AS ids
    FROM dp__dist),
dp__picked AS (SELECT unnest(ids) AS cid, unnest(range(1, len(ids) + 1)) AS rank FROM dp__sel)
SELECT rank, candidate_id FROM dp__picked JOIN dp__cands USING (cid) ORDER BY rank;
