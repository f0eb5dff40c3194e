-- Private weighted sampling (Cohen et al., "Differentially Private Weighted Sampling"), its threshold
-- samples, estimators and the stability-based-histogram baseline. Formulas, tables and the privacy
-- arguments: dpsql/pws/ (sanitizer.py: dp_weighted_sample, sbh.py: dp_sbh_histogram); proofs:
-- docs/proofs/weighted_sample.md, docs/proofs/sbh_histogram.md.
--
-- !!! PRIVACY UNIT: ONE ELEMENT (one row of an event table), NOT ONE USER. !!!
-- Neighbouring datasets differ in one element: one key's frequency changes by one. A user with many
-- rows is not protected as a whole; use dp_set_union & co. for user-level privacy.
--
-- Input: an element table (one row per element, key column `key_col`), or an aggregated table
-- (`key_col`, `freq_col` = non-negative integer frequency; rows of the same key are summed).

-- True iff tbl names, as database.schema.table (unquoted, case-insensitive), exactly one base table with a
-- single-column PRIMARY KEY or UNIQUE constraint on key_col: the engine then guarantees one row per non-NULL
-- key and the input need not be re-aggregated. Only the three-part name is trusted: query_table resolves
-- 'agg' and even 'main.agg' to a CTE named agg of the calling query, which carries no constraint.
CREATE OR REPLACE TEMP MACRO dp__pws_declared_unique(tbl, key_col) AS (
    SELECT count(*) = 1 AND coalesce(bool_and(has_key), false)
    FROM (SELECT EXISTS (SELECT 1 FROM duckdb_constraints() c
                         WHERE c.database_oid = t.database_oid AND c.table_oid = t.table_oid
                           AND c.constraint_type IN ('PRIMARY KEY', 'UNIQUE')
                           AND len(c.constraint_column_names) = 1
                           AND lower(c.constraint_column_names[1]) = lower(key_col)) AS has_key
          FROM duckdb_tables() t
          WHERE lower(t.database_name || '.' || t.schema_name || '.' || t.table_name) = lower(tbl)));

-- (key, frequency) with frequency >= 1. Not a release. Every row is validated (NULL keys, NULL / negative /
-- fractional / too large frequencies raise). Rows of the same key are summed by a GROUP BY in the engine, unless
-- the key is declared unique (dp__pws_declared_unique): then the rows pass through as they are, which skips
-- the aggregation, the dominant cost on large aggregated inputs. A duplicated key must never reach the
-- sanitizer as two rows: it would get two draws and double its contribution (element-level guarantee).
-- The GROUP BY groups the key column itself and rejects NULL keys on their (single) group: an expression key
-- would cost a pass per row and hide the column's min/max from the planner, which then cannot choose its
-- perfect-hash aggregate for integer keys of small range (enabled by SET perfect_ht_threshold). Frequencies
-- are BIGINT (sum() accumulates them in 128 bits; a sum beyond BIGINT raises).
-- The errors name the column, never a value of it: they can fire after the release was charged.
-- CTE names start with dp__: query_table(tbl) would otherwise resolve a table named like one of them to the CTE.
CREATE OR REPLACE TEMP MACRO dp__pws_frequencies(tbl VARCHAR, key_col VARCHAR := 'key', freq_col VARCHAR := NULL) AS TABLE
WITH dp__uq AS MATERIALIZED (SELECT dp__pws_declared_unique(tbl, key_col) AS declared),
-- f: the frequency as BIGINT, b = try_cast(fv AS BIGINT) (NULL when out of range); fv must equal b as a DOUBLE
-- (fractional and non-numeric values do not). Half the cost of testing fv::DOUBLE against floor().
dp__src AS NOT MATERIALIZED (
    SELECT k,
           CASE WHEN freq_col IS NULL THEN 1::BIGINT
                ELSE CASE WHEN fv IS NULL
                               THEN error('dpsql: column ' || freq_col || ' (freq_col) contains NULL frequencies')
                          WHEN b IS NULL OR b < 0 OR b <> try_cast(fv AS DOUBLE)
                               THEN error('dpsql: column ' || freq_col || ' (freq_col) must hold whole numbers in '
                                          || '0..2^63-1; it holds another value (negative, fractional, too large or '
                                          || 'not a number)')
                          ELSE b END END AS f
    -- dp__absent (sql/00_core/20_contribution_bounding.sql): a missing column is dp__check_column_list's error, which
    -- names the parameter, instead of a binder error naming dpsql's internals.
    -- The key by identity (sql/00_core/15_checks.sql): refused by type before any row is read, or made binary.
    FROM (SELECT dp__canonical(coalesce(*COLUMNS(lambda c: lower(c) = lower(key_col) OR c = 'dp__absent'))) AS k,
                 coalesce(*COLUMNS(lambda c: lower(c) = lower(coalesce(freq_col, key_col)) OR c = 'dp__absent')) AS fv,
                 try_cast(coalesce(*COLUMNS(lambda c: lower(c) = lower(coalesce(freq_col, key_col))
                                                      OR c = 'dp__absent')) AS BIGINT) AS b
          FROM (SELECT *, NULL AS dp__absent FROM query_table(tbl)
                WHERE dp__check_column_list(tbl, ['key_col', 'freq_col'], [key_col, coalesce(freq_col, key_col)])
                  AND dp__check_key_columns(tbl, ['key_col'], [key_col]))))
SELECT coalesce(k, error('dpsql: column ' || key_col || ' (key_col) contains NULL; filter NULL keys out first')) AS key,
       f AS frequency
FROM dp__src CROSS JOIN dp__uq WHERE declared AND f > 0
UNION ALL
SELECT k AS key,
       coalesce(try_cast(sum(f) AS BIGINT),
                error('dpsql: column ' || coalesce(freq_col, key_col) || ' (freq_col): the frequencies of a key sum '
                      || 'to more than 2^63-1')) AS frequency
FROM dp__src CROSS JOIN dp__uq WHERE NOT declared
GROUP BY k
HAVING CASE WHEN k IS NULL
            THEN error('dpsql: column ' || key_col || ' (key_col) contains NULL; filter NULL keys out first')::BOOLEAN
            ELSE sum(f) > 0 END;

-- Sampling probability q_i of threshold sampling (Alg. 1): 1 - exp(-tau i^power) for ppswor,
-- min(1, tau i^power) for priority (Poisson PPS); tau NULL = no sampling (q = 1).
CREATE OR REPLACE TEMP MACRO dp_pws_q(frequency, tau DOUBLE, scheme VARCHAR := 'ppswor', power DOUBLE := 1.0) AS
    dp__pws_q(frequency, tau, scheme, power);

-- Overall reporting probability pi_i of a key of frequency i by dp_weighted_sample (Alg. 3).
CREATE OR REPLACE TEMP MACRO dp_pws_pi(frequency, epsilon DOUBLE, delta DOUBLE, tau DOUBLE := NULL,
                                       scheme VARCHAR := 'ppswor', power DOUBLE := 1.0) AS
    dp__pws_pi(frequency, epsilon, delta, tau, scheme, power);

-- Probability pi_{i,j} that a key of frequency i is reported with token j (j = 0: not reported).
CREATE OR REPLACE TEMP MACRO dp_pws_pi_ij(frequency, token, epsilon DOUBLE, delta DOUBLE, tau DOUBLE := NULL,
                                          scheme VARCHAR := 'ppswor', power DOUBLE := 1.0) AS
    dp__pws_pi_ij(frequency, token, epsilon, delta, tau, scheme, power);

-- L(eps, delta) = (1/eps) ln((e^eps - 1 + 2 delta)/(delta (e^eps + 1))) ([PWS] eq. 4; docs/proofs/weighted_sample.md): pi* reaches 1 at 2L+1.
CREATE OR REPLACE TEMP MACRO dp_pws_L(epsilon DOUBLE, delta DOUBLE) AS dp__pws_L(epsilon, delta);

-- SbH release threshold T = 1 + ln(1/delta)/epsilon.
CREATE OR REPLACE TEMP MACRO dp_sbh_threshold(epsilon DOUBLE, delta DOUBLE) AS dp__sbh_threshold(epsilon, delta);

-- NON-PRIVATE threshold sample (Alg. 1): (key, frequency, q) of the keys with u_key < q_frequency, where
-- u_key = keyed hash of the key. Samples drawn with the same salt are coordinated (same u per key); salt
-- NULL draws a secret per-query salt from the secure noise source. The output contains exact frequencies:
-- it is NOT differentially private. Sanitize with dp_weighted_sample instead of publishing it.
-- Rows sorted by key (not a release: nothing binds or charges it).
CREATE OR REPLACE TEMP MACRO dp_threshold_sample(tbl VARCHAR, tau DOUBLE, scheme VARCHAR := 'ppswor',
        power DOUBLE := 1.0, key_col VARCHAR := 'key', freq_col VARCHAR := NULL, salt BIGINT := NULL) AS TABLE
WITH dp__cal AS MATERIALIZED (
    SELECT dp__pws_check_sampling(tau, scheme, power) AS ok, hash(coalesce(salt, dp__secret_salt())) AS s
    -- every parameter a constant, as in a release (sql/00_core/00_release.sql): the binder refuses any other
    WHERE (getvariable('dp__bind:' || tbl::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || tau::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || scheme::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || power::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || key_col::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || freq_col::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || salt::VARCHAR) IS NULL OR true)),
dp__freq AS (FROM dp__pws_frequencies(tbl, key_col := key_col, freq_col := freq_col))
SELECT key, frequency, q
FROM (SELECT key, frequency, dp__pws_q(frequency, tau, scheme, power) AS q,
             (hash(xor(hash(key), s)) >> 11)::DOUBLE / 9007199254740992.0 AS u
      FROM dp__freq CROSS JOIN dp__cal WHERE ok)
WHERE u < q
ORDER BY key;

-- (epsilon, delta)-DP (ELEMENT level) private weighted sample. Columns: key, token; rows sorted by key.
-- tau NULL: no sampling, i.e. a private histogram with the optimal key reporting probabilities pi*_i.
-- with_frequencies = false: keys only (Alg. 3), token is NULL. true: each key with a sanitized frequency
-- token j in 1..frequency drawn with probability pi_{i,j} (Alg. 4 / App. B); estimate with
-- dp_weighted_sample_estimate. Sampling and sanitizing are one draw per key from the connection's noise
-- source; the probability tables are computed once per call in Python.
-- The body of dp_weighted_sample (sql/00_core/00_release.sql: the generated wrapper binds, checks, charges and
-- sorts); dp__pws_spec checks all parameters and the frequency range the tables can serve.
-- dpsql:body dp__body_weighted_sample
WITH dp__cal AS (
    SELECT dp__pws_spec(epsilon, delta, tau, scheme, power, with_frequencies) AS spec),
dp__freq AS MATERIALIZED (FROM dp__pws_frequencies(tbl, key_col := key_col, freq_col := freq_col)),
-- one pass: t = token (with_frequencies) or 1/0 (keys only; token NULL), 0 = not reported
SELECT key, CASE WHEN with_frequencies THEN t END AS token
FROM (SELECT key, dp__pws_sanitize(frequency, spec) AS t
      FROM dp__freq CROSS JOIN dp__cal)
WHERE t > 0;

-- Per-key estimates of g(frequency) from a sample of dp_weighted_sample(..., with_frequencies := true)
-- (sample_tbl: a table or view with columns key_col, token_col; dp_weighted_sample's key, token by default),
-- drawn with the SAME epsilon, delta, tau, scheme, power.
-- g: 'count' (g(i) = 1) or 'identity' (g(i) = i). estimator: 'ml', 'biased_down' (never over-estimates in
-- expectation), 'unbiased' (signed, huge variance). The estimate of sum_x L(x) g(w_x) is
-- SELECT sum(estimate) FROM dp_weighted_sample_estimate(...) WHERE <predicate L on key>.
-- Post-processing of the private sample: no further privacy cost. Rows sorted by key.
CREATE OR REPLACE TEMP MACRO dp_weighted_sample_estimate(sample_tbl VARCHAR, epsilon DOUBLE, delta DOUBLE,
        tau DOUBLE := NULL, scheme VARCHAR := 'ppswor', power DOUBLE := 1.0, g VARCHAR := 'count',
        estimator VARCHAR := 'ml', key_col VARCHAR := 'key', token_col VARCHAR := 'token') AS TABLE
WITH dp__cal AS (
    SELECT dp__pws_check(epsilon, delta, tau, scheme, power) AND dp__pws_check_estimate(g, estimator) AS ok
    -- every parameter a constant, as in a release (sql/00_core/00_release.sql): the binder refuses any other
    WHERE (getvariable('dp__bind:' || sample_tbl::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || epsilon::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || delta::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || tau::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || scheme::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || power::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || g::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || estimator::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || key_col::VARCHAR) IS NULL OR true) AND (getvariable('dp__bind:' || token_col::VARCHAR) IS NULL OR true)),
dp__sample AS (
    SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower(key_col) OR c = 'dp__absent')) AS key,
           coalesce(*COLUMNS(lambda c: lower(c) = lower(token_col) OR c = 'dp__absent')) AS token
    FROM (SELECT *, NULL AS dp__absent FROM query_table(sample_tbl)
          WHERE dp__check_column_list(sample_tbl, ['key_col', 'token_col'], [key_col, token_col])))
SELECT key, token, dp__pws_estimate(token, epsilon, delta, tau, scheme, power, g, estimator) AS estimate
FROM dp__sample CROSS JOIN dp__cal WHERE ok
ORDER BY key, token;

-- Stability-based histogram baseline (ELEMENT level (epsilon, delta)-DP): each key's frequency plus
-- discrete Laplace noise of scale 1/epsilon on a grid, released as (key, noisy_frequency) iff >= T; rows
-- sorted by key.
-- The noise is granular, the only mode (noise := 'granular', the default; 'continuous' is refused): the integer
-- frequency plus g * DLap(1/(epsilon g)) on the grid g = granularity (a power of two <= 1, so counts are on the
-- grid; NULL = the largest power of two <= (1/epsilon)/2^16, at most 1). A one-element change moves the frequency
-- by 1/g steps: pmf ratio <= exp(g (1/g) epsilon) = e^epsilon, exactly. T = the smallest grid point with
-- P[1 + g DLap >= T] <= delta/2 (dp_discrete_laplace_threshold), so a new key (frequency 1) passes with
-- probability <= delta/2. noisy_frequency and T are exact multiples of g, so the released doubles carry no
-- floating-point leak (Mironov 2012): dp__sbh_noisy adds frequency and noise exactly (a frequency beyond 2^52 g
-- gets the correctly rounded exact sum, still a multiple of g), so no frequency makes the noise step fail.
-- Floating-point Laplace (the paper's; continuous noise) was removed: its low bits reveal the frequency.
-- tau given: sampled-SbH, the released pairs are then sampled with q evaluated at the noisy frequency
-- (post-processing); inclusion_probability = that q (1 without sampling); estimate g(w) by
-- g(noisy_frequency) / inclusion_probability.
-- The body of dp_sbh_histogram (sql/00_core/00_release.sql); dp__sbh_granularity checks the PWS parameters, the
-- noise mode, the grid against the noise scale.
-- dpsql:body dp__body_sbh_histogram
WITH dp__cal AS (
    SELECT 1.0 / epsilon AS scale, g, dp__discrete_laplace_threshold(1.0 / epsilon, g, delta / 2, 1.0) AS T
    FROM (SELECT dp__sbh_granularity(epsilon, delta, tau, scheme, power, noise, granularity) AS g)),
dp__freq AS MATERIALIZED (FROM dp__pws_frequencies(tbl, key_col := key_col, freq_col := freq_col)),
-- z: one draw per key. Below 2^52 grid steps the double sum is exact; dp__sbh_noisy (exact, in integers) runs
-- only on the rows beyond (CASE evaluates a branch on its rows only), which saves a UDF call per vector.
dp__noisy AS MATERIALIZED (
    SELECT key, CASE WHEN frequency < 4503599627370496.0 * g AND abs(z) < 4503599627370496.0 * g THEN frequency + z
                     ELSE dp__sbh_noisy(frequency, z, g) END AS w, T
    FROM (SELECT key, frequency, dp_granular_laplace_noise(scale, g) AS z, g, T
          FROM dp__freq CROSS JOIN dp__cal)),
dp__released AS MATERIALIZED (
    SELECT key, w, CASE WHEN tau IS NULL THEN 1.0 ELSE dp__pws_q(w, tau, scheme, power) END AS q
    FROM dp__noisy WHERE w >= T)
SELECT key, w AS noisy_frequency, q AS inclusion_probability
FROM dp__released
WHERE tau IS NULL OR dp__bernoulli(q);
