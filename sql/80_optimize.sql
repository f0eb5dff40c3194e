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
SELECT rank, set_id FROM picked JOIN sets USING (sid) ORDER BY rank;

-- Set cover, pure epsilon-DP: DPGreedyScaling (Alg. 4) in the open-set model. Every set id once, as
-- (position, set_id): each element is served by the first set holding it. The subsamples are fresh
-- per round, so the kernel draws them itself (from the same secure source). tau_constant: the
-- printed 1000 (thresholds tau_r = tau_constant * n~ / 2^r; any value keeps the privacy guarantee).
CREATE OR REPLACE TEMP MACRO dp_set_cover(sets_tbl VARCHAR, epsilon DOUBLE := 1.0, set_col VARCHAR := 'set_id',
        element_col VARCHAR := 'element', tau_constant DOUBLE := 1000.0) AS TABLE
WITH cal AS (SELECT dp__set_cover_check(epsilon, tau_constant, set_col, element_col) AS c, epsilon AS eps),
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
SELECT position, set_id FROM picked JOIN sets USING (sid) ORDER BY position;

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
FROM codes CROSS JOIN nb JOIN buckets ON bid = code % n_buckets
ORDER BY t, bid;
