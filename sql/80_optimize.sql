-- Pure epsilon-DP combinatorial optimisation by subsampling (Ghazi et al., "Individualized Privacy
-- Accounting via Subsampling", paper 003). Privacy arguments and kernels: dpsql/optimize.py and
-- dpsql/subsampling.py. Privacy unit: one record (a universe element; a user's stream), add/remove.
-- DuckDB does the joins, dense ids and the Poisson subsample (one secure coin per record from
-- dp__poisson_keep(p, hash(record)), never random(); the hash only pins the call to the row); the
-- sequential selection runs once per query in a Python UDF over flat id lists, and only the selected
-- ids come back. k, horizon are DOUBLE so that 2.5 reaches
-- validation instead of being rounded.

-- p = 1 - exp(-epsilon) (Cor. 3.2): subsampling an ln 2-add-DP mechanism with p makes it epsilon-DP.
CREATE OR REPLACE TEMP MACRO dp_subsampling_probability(epsilon DOUBLE) AS dp__subsampling_probability(epsilon);
-- ln max{1/(1-p), 1 + p (e^eps0 - 1)} (Lemma 3.1): two-sided epsilon of an eps0-add-DP mechanism on S_p.
CREATE OR REPLACE TEMP MACRO dp_subsampled_epsilon(eps0 DOUBLE, p DOUBLE) AS dp__subsampled_epsilon(eps0, p);

-- (set_id, element) rows of a set system; a NULL set id is an error, a NULL element declares a set
-- without contributing an element (set ids are public; elements are the private records).
CREATE OR REPLACE TEMP MACRO dp__set_element_rows(tbl VARCHAR, set_col VARCHAR := 'set_id',
        element_col VARCHAR := 'element') AS TABLE
SELECT coalesce(COLUMNS(lambda c: lower(c) = lower(set_col)),
                error('dpsql: column ' || set_col || ' (set_col) contains NULL; filter NULL sets out first')) AS set_id,
       COLUMNS(lambda c: lower(c) = lower(element_col)) AS element
FROM query_table(tbl);

-- Max k-coverage, pure epsilon-DP (Thm 1.2): elements Poisson-subsampled with p = 1 - e^-eps, then
-- DPSubmodGreedy at ln 2 (k exponential mechanisms over all not-yet-chosen sets, score = newly
-- covered sampled elements). Returns (rank, set_id), min(k, #sets) rows.
CREATE OR REPLACE TEMP MACRO dp_max_coverage(sets_tbl VARCHAR, k DOUBLE, epsilon DOUBLE := 1.0,
        set_col VARCHAR := 'set_id', element_col VARCHAR := 'element') AS TABLE
WITH cal AS (SELECT dp__max_coverage_check(k, epsilon, set_col, element_col) AS p, k::BIGINT AS k_sets),
paid AS MATERIALIZED (SELECT dp__charge('dp_max_coverage', 'record', sets_tbl, epsilon, 0.0,
        {'k': k, 'set_col': set_col, 'element_col': element_col}::VARCHAR, cal::VARCHAR) AS paid FROM cal),
rows AS (FROM dp__set_element_rows(sets_tbl, set_col := set_col, element_col := element_col)),
sets AS MATERIALIZED (
    SELECT set_id, (row_number() OVER (ORDER BY set_id) - 1)::BIGINT AS sid FROM (SELECT DISTINCT set_id FROM rows)),
sampled AS MATERIALIZED (
    SELECT element, (row_number() OVER () - 1)::BIGINT AS eid
    FROM (SELECT DISTINCT element FROM rows WHERE element IS NOT NULL) CROSS JOIN cal
    WHERE dp__poisson_keep(p, hash(element))),
pairs AS (SELECT DISTINCT s.sid, e.eid FROM rows JOIN sets AS s USING (set_id) JOIN sampled AS e USING (element)),
sel AS (
    SELECT dp__max_coverage_select(list(sid), list(eid), (SELECT count(*) FROM sets), (SELECT count(*) FROM sampled),
                                   (SELECT k_sets FROM cal)) AS ids
    FROM pairs),
picked AS (SELECT unnest(ids) AS sid, unnest(range(1, len(ids) + 1)) AS rank FROM sel)
SELECT rank, set_id FROM picked JOIN sets USING (sid) CROSS JOIN paid WHERE paid ORDER BY rank;

-- Set cover, pure epsilon-DP: DPGreedyScaling (Alg. 4) in the open-set model. Every set id once, as
-- (position, set_id): each element is served by the first set holding it. The subsamples are fresh
-- per round, so the kernel draws them itself (from the same secure source). tau_constant: the
-- printed 1000 (thresholds tau_r = tau_constant * n~ / 2^r; any value keeps the privacy guarantee).
CREATE OR REPLACE TEMP MACRO dp_set_cover(sets_tbl VARCHAR, epsilon DOUBLE := 1.0, set_col VARCHAR := 'set_id',
        element_col VARCHAR := 'element', tau_constant DOUBLE := 1000.0) AS TABLE
WITH cal AS (SELECT dp__set_cover_check(epsilon, tau_constant, set_col, element_col) AS c, epsilon AS eps),
paid AS MATERIALIZED (SELECT dp__charge('dp_set_cover', 'record', sets_tbl, epsilon, 0.0,
        {'tau_constant': tau_constant, 'set_col': set_col, 'element_col': element_col}::VARCHAR, cal::VARCHAR) AS paid FROM cal),
rows AS (FROM dp__set_element_rows(sets_tbl, set_col := set_col, element_col := element_col)),
sets AS MATERIALIZED (
    SELECT set_id, (row_number() OVER (ORDER BY set_id) - 1)::BIGINT AS sid FROM (SELECT DISTINCT set_id FROM rows)),
elems AS MATERIALIZED (
    SELECT element, (row_number() OVER () - 1)::BIGINT AS eid
    FROM (SELECT DISTINCT element FROM rows WHERE element IS NOT NULL)),
pairs AS (SELECT DISTINCT s.sid, e.eid FROM rows JOIN sets AS s USING (set_id) JOIN elems AS e USING (element)),
sel AS (
    SELECT dp__set_cover_select(list(sid), list(eid), (SELECT count(*) FROM sets), (SELECT count(*) FROM elems),
                                (SELECT eps FROM cal), (SELECT c FROM cal)) AS ids
    FROM pairs),
picked AS (SELECT unnest(ids) AS sid, unnest(range(1, len(ids) + 1)) AS position FROM sel)
SELECT position, set_id FROM picked JOIN sets USING (sid) CROSS JOIN paid WHERE paid ORDER BY position;

-- NON-PRIVATE evaluation (reads raw data, releases an exact number): open-set cost of a permutation
-- table (position, set_id) = number of distinct sets that serve some element, each element served by
-- the first set of the permutation holding it.
CREATE OR REPLACE TEMP MACRO dp_eval_set_cover_cost(sets_tbl VARCHAR, permutation_tbl VARCHAR,
        set_col VARCHAR := 'set_id', element_col VARCHAR := 'element') AS TABLE
WITH rows AS (FROM dp__set_element_rows(sets_tbl, set_col := set_col, element_col := element_col)),
perm AS (SELECT position, set_id FROM query_table(permutation_tbl)),
served AS (
    SELECT element, arg_min(set_id, position) AS by_set
    FROM rows JOIN perm USING (set_id) WHERE element IS NOT NULL GROUP BY element)
SELECT count(DISTINCT by_set) AS cost FROM served;

-- Shifting heavy hitters, pure epsilon-DP (Thm 5.6): users Poisson-subsampled once with
-- p = 1 - e^-eps, then ThreshMonitor at ln 2 (Alg. 3) over EVERY bucket of buckets_tbl and every
-- t in 1..horizon: report (t, bucket) iff count of active users + Exp(rate ln 2 / k) > tau, with
-- tau = 1.5 p tau*(k), tau*(k) = 4000 k ln(horizon |Y| / beta) / eps. horizon (T) and the bucket
-- set are public and must be given; stream rows: (user, t in 1..horizon, bucket), one bucket per
-- user and time (a NULL bucket = no bucket at that time).
CREATE OR REPLACE TEMP MACRO dp_shifting_heavy_hitters(stream_tbl VARCHAR, buckets_tbl VARCHAR, k DOUBLE,
        epsilon DOUBLE := 1.0, beta DOUBLE := 0.05, horizon DOUBLE := NULL, user_col VARCHAR := 'user_id',
        time_col VARCHAR := 't', bucket_col VARCHAR := 'bucket') AS TABLE
WITH cal AS (SELECT unnest(dp__heavy_hitters_calibration(epsilon, k, beta, horizon, user_col, time_col, bucket_col))),
paid AS MATERIALIZED (SELECT dp__charge('dp_shifting_heavy_hitters', 'record', stream_tbl, epsilon, 0.0,
        {'buckets_tbl': buckets_tbl, 'k': k, 'beta': beta, 'horizon': horizon, 'user_col': user_col,
         'time_col': time_col, 'bucket_col': bucket_col}::VARCHAR, cal::VARCHAR) AS paid FROM cal),
buckets AS MATERIALIZED (
    SELECT bucket, (row_number() OVER (ORDER BY bucket) - 1)::BIGINT AS bid
    FROM (SELECT DISTINCT COLUMNS(lambda c: lower(c) = lower(bucket_col)) AS bucket FROM query_table(buckets_tbl))
    WHERE bucket IS NOT NULL),
nb AS (SELECT count(*) AS n_buckets FROM buckets),
tau AS (SELECT dp__heavy_hitters_tau(epsilon, k, beta, horizon, n_buckets) AS tau FROM nb),
stream AS (
    SELECT coalesce(COLUMNS(lambda c: lower(c) = lower(user_col)),
                    error('dpsql: column ' || user_col || ' (user_col) contains NULL; filter NULL users out first')) AS user_id,
           coalesce(COLUMNS(lambda c: lower(c) = lower(time_col)),
                    error('dpsql: column ' || time_col || ' (time_col) contains NULL')) AS t,
           COLUMNS(lambda c: lower(c) = lower(bucket_col)) AS bucket
    FROM query_table(stream_tbl)),
users AS MATERIALIZED (
    SELECT user_id, (row_number() OVER () - 1)::BIGINT AS uid
    FROM (SELECT DISTINCT user_id FROM stream) CROSS JOIN cal WHERE dp__poisson_keep(p, hash(user_id))),
rows AS (
    SELECT u.uid,
           CASE WHEN s.t = floor(s.t) AND s.t BETWEEN 1 AND cal.t_steps THEN s.t::BIGINT - 1
                ELSE error('dpsql: time step ' || s.t || ' is not a whole number in 1..horizon') END AS tid,
           coalesce(b.bid, error('dpsql: bucket ' || s.bucket || ' of the stream is not in ' || buckets_tbl)) AS bid
    FROM stream AS s JOIN users AS u USING (user_id) LEFT JOIN buckets AS b USING (bucket) CROSS JOIN cal
    WHERE s.bucket IS NOT NULL),
sel AS (
    SELECT dp__heavy_hitters_select(list(uid), list(tid), list(bid), (SELECT count(*) FROM users),
                                    (SELECT t_steps FROM cal), (SELECT n_buckets FROM nb), (SELECT k_max FROM cal),
                                    (SELECT tau FROM tau)) AS ids
    FROM rows),
codes AS (SELECT unnest(ids) AS code FROM sel)
SELECT (code // n_buckets + 1)::BIGINT AS t, bucket
FROM codes CROSS JOIN nb JOIN buckets ON bid = code % n_buckets CROSS JOIN paid
WHERE paid
ORDER BY t, bid;

-- Coverage under a partition matroid, pure epsilon-DP (Thm 1.3): elements Poisson-subsampled with
-- p = 1 - e^-eps, then PrivContGreedy at ln 2/2 (ceil(4/eta) passes, samples uniform vectors,
-- default 8 per pass: utility only, see matroid_coverage_arrays), ceil(20 ln(6/beta)/eta) swap
-- roundings and one exponential mechanism at ln 2/2 over them; the kernel draws the subsample
-- itself. The matroid is public: parts_tbl (set_col, part_col) lists the candidate sets, one part
-- each (rows of sets_tbl for sets not listed there are ignored); capacities_tbl (part_col,
-- capacity_col) gives each part's capacity (a whole number >= 0). Returns the chosen independent
-- set as (rank, set_id), rank = position in set_id order.
CREATE OR REPLACE TEMP MACRO dp_matroid_coverage(sets_tbl VARCHAR, parts_tbl VARCHAR, capacities_tbl VARCHAR,
        epsilon DOUBLE := 1.0, eta DOUBLE := 0.2, beta DOUBLE := 0.05, samples DOUBLE := NULL,
        set_col VARCHAR := 'set_id', element_col VARCHAR := 'element', part_col VARCHAR := 'part',
        capacity_col VARCHAR := 'capacity') AS TABLE
WITH cal AS (SELECT dp__matroid_coverage_check(epsilon, eta, beta, samples, set_col, element_col, part_col,
                                               capacity_col) AS n_samples),
dp__paid AS MATERIALIZED (SELECT dp__charge('dp_matroid_coverage', 'record', sets_tbl, epsilon, 0.0,
        {'parts_tbl': parts_tbl, 'capacities_tbl': capacities_tbl, 'eta': eta, 'beta': beta,
         'samples': samples, 'set_col': set_col, 'element_col': element_col, 'part_col': part_col,
         'capacity_col': capacity_col}::VARCHAR, cal::VARCHAR) AS paid FROM cal),
dp__caps_in AS (
    SELECT COLUMNS(lambda c: lower(c) = lower(part_col)) AS part,
           COLUMNS(lambda c: lower(c) = lower(capacity_col)) AS capacity
    FROM query_table(capacities_tbl)),
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
    SELECT COLUMNS(lambda c: lower(c) = lower(set_col)) AS set_id,
           COLUMNS(lambda c: lower(c) = lower(part_col)) AS part
    FROM query_table(parts_tbl)),
dp__sets AS MATERIALIZED (
    SELECT coalesce(p.set_id, error('dpsql: column ' || set_col || ' of ' || parts_tbl || ' contains NULL')) AS set_id,
           coalesce(c.pid, error('dpsql: part ' || coalesce(p.part::VARCHAR, 'NULL') || ' of set ' || p.set_id
                                 || ' has no capacity in ' || capacities_tbl)) AS pid,
           CASE WHEN count(*) OVER (PARTITION BY p.set_id) = 1
                THEN (row_number() OVER (ORDER BY p.set_id) - 1)::BIGINT
                ELSE error('dpsql: set ' || p.set_id || ' is listed more than once in ' || parts_tbl) END AS sid
    FROM dp__parts_in AS p LEFT JOIN dp__caps AS c ON p.part = c.part),
dp__rows AS (
    SELECT s.sid, r.element
    FROM dp__set_element_rows(sets_tbl, set_col := set_col, element_col := element_col) AS r JOIN dp__sets AS s USING (set_id)
    WHERE r.element IS NOT NULL),
dp__elems AS MATERIALIZED (
    SELECT element, (row_number() OVER (ORDER BY element) - 1)::BIGINT AS eid FROM (SELECT DISTINCT element FROM dp__rows)),
dp__pairs AS (SELECT DISTINCT sid, eid FROM dp__rows JOIN dp__elems USING (element)),
dp__sel AS (
    SELECT dp__matroid_coverage_select(list(sid), list(eid), (SELECT count(*) FROM dp__sets), (SELECT count(*) FROM dp__elems),
                                       (SELECT list(pid ORDER BY sid) FROM dp__sets),
                                       (SELECT list(capacity ORDER BY pid) FROM dp__caps),
                                       epsilon, eta, beta, (SELECT n_samples FROM cal)) AS ids
    FROM dp__pairs),
dp__picked AS (SELECT unnest(ids) AS sid, unnest(range(1, len(ids) + 1)) AS rank FROM dp__sel)
SELECT rank, set_id FROM dp__picked JOIN dp__sets USING (sid) CROSS JOIN dp__paid WHERE paid ORDER BY rank;

-- k-median (q = 1) / k-means (q = 2), pure epsilon-DP (Thm 1.5, App. G): points Poisson-subsampled
-- with p = 1 - e^-eps, then G.2 at ln 2 (bicriteria Repeated-EM at ln 2/2 with L = ceil(2 k ln n_bound)
-- rounds, or every candidate when 2 k ln n_bound >= #candidates; per-centre counts + Exp(rate ln 2/2);
-- local search). The finite metric is public: its points are the candidates of candidates_tbl
-- (candidate_col); each row of points_tbl is one private record located at a candidate id
-- (point_col); distances_tbl (point, candidate, distance) holds the distance for every ordered pair
-- of candidates, all in [0, 1] (diameter <= 1: rescale first). n_bound is a public upper bound on the
-- number of points and must be given: L must not depend on the private count, or the number of
-- exponential mechanisms would leak it (an n_bound below the true count keeps privacy, costs utility).
-- Returns (rank, candidate_id), min(k, #candidates) rows, rank = position in candidate_id order.
CREATE OR REPLACE TEMP MACRO dp_k_median(points_tbl VARCHAR, candidates_tbl VARCHAR, distances_tbl VARCHAR, k DOUBLE,
        q DOUBLE := 1, epsilon DOUBLE := 1.0, n_bound DOUBLE := NULL, point_col VARCHAR := 'point',
        candidate_col VARCHAR := 'candidate_id') AS TABLE
WITH cal AS (SELECT unnest(dp__k_median_calibration(k, q, epsilon, n_bound, point_col, candidate_col))),
dp__paid AS MATERIALIZED (SELECT dp__charge('dp_k_median', 'record', points_tbl, epsilon, 0.0,
        {'candidates_tbl': candidates_tbl, 'distances_tbl': distances_tbl, 'k': k, 'q': q,
         'n_bound': n_bound, 'point_col': point_col, 'candidate_col': candidate_col}::VARCHAR, cal::VARCHAR) AS paid FROM cal),
dp__cands AS MATERIALIZED (
    SELECT candidate_id, (row_number() OVER (ORDER BY candidate_id) - 1)::BIGINT AS cid
    FROM (SELECT DISTINCT coalesce(COLUMNS(lambda c: lower(c) = lower(candidate_col)),
                                   error('dpsql: column ' || candidate_col || ' of ' || candidates_tbl
                                         || ' contains NULL')) AS candidate_id
          FROM query_table(candidates_tbl))),
dp__dist AS (
    SELECT coalesce(c.cid, error('dpsql: candidate ' || coalesce(d.candidate::VARCHAR, 'NULL') || ' of '
                                 || distances_tbl || ' is not in ' || candidates_tbl)) AS row_id,
           coalesce(l.cid, error('dpsql: point ' || coalesce(d.point::VARCHAR, 'NULL') || ' of '
                                 || distances_tbl || ' is not in ' || candidates_tbl)) AS col_id,
           coalesce(d.distance::DOUBLE, error('dpsql: NULL distance in ' || distances_tbl)) AS distance
    FROM query_table(distances_tbl) AS d
    LEFT JOIN dp__cands AS c ON d.candidate = c.candidate_id LEFT JOIN dp__cands AS l ON d.point = l.candidate_id),
dp__pts AS (
    SELECT coalesce(c.cid, error('dpsql: a point of ' || points_tbl || ' (column ' || point_col
                                 || ') is NULL or not a candidate of ' || candidates_tbl)) AS lid
    FROM (SELECT COLUMNS(lambda c: lower(c) = lower(point_col)) AS point FROM query_table(points_tbl)) AS p
    LEFT JOIN dp__cands AS c ON p.point = c.candidate_id),
dp__sel AS (
    SELECT dp__k_median_select((SELECT list(lid ORDER BY lid) FROM dp__pts), list(row_id), list(col_id), list(distance),
                               (SELECT count(*) FROM dp__cands), (SELECT k_max FROM cal), (SELECT q_exp FROM cal),
                               epsilon, (SELECT n_max FROM cal)) AS ids
    FROM dp__dist),
dp__picked AS (SELECT unnest(ids) AS cid, unnest(range(1, len(ids) + 1)) AS rank FROM dp__sel)
SELECT rank, candidate_id FROM dp__picked JOIN dp__cands USING (cid) CROSS JOIN dp__paid WHERE paid ORDER BY rank;
