-- Calibration functions of dpsql (see dpsql/core/calibration.py for formulas and references).
-- Thin named-parameter wrappers around pure Python UDFs; with constant arguments
-- DuckDB evaluates them once, while planning.

-- Smallest sigma of an (epsilon, delta)-DP Gaussian mechanism with l2 sensitivity
-- `sensitivity` (analytic Gaussian mechanism, Balle & Wang 2018).
CREATE OR REPLACE TEMP MACRO dp_gaussian_sigma(epsilon DOUBLE, delta DOUBLE, sensitivity DOUBLE := 1.0) AS
    dp__gaussian_sigma(epsilon, delta, sensitivity);

-- Granular noise (dpsql/core/calibration.py, "Granular noise"): values rounded to a grid g = 2^-k plus integer
-- noise times g. The grid: `granularity` if given (a power of two, <= max_granularity), else the largest
-- power of two <= scale / 2^16.
CREATE OR REPLACE TEMP MACRO dp_granularity(scale DOUBLE, granularity DOUBLE := NULL, max_granularity DOUBLE := NULL) AS
    dp__granularity(scale, granularity, max_granularity);

-- Sensitivity after rounding to the grid: floor(sensitivity/g) steps if the values are on the grid already
-- (on_grid, e.g. integer counts with g <= 1), else floor(sensitivity/g) + coordinates steps (each rounded
-- coordinate moves by <= g/2), times g.
CREATE OR REPLACE TEMP MACRO dp_rounded_sensitivity(sensitivity DOUBLE, granularity DOUBLE, coordinates DOUBLE := 1,
                                                    on_grid BOOLEAN := false) AS
    dp__rounded_sensitivity(sensitivity, granularity, coordinates, on_grid);

-- Scale b of g * DLap(b/g) (pmf prop. to exp(-|z| g/b)) that is exactly epsilon-DP: b = rounded l1 sensitivity / epsilon.
CREATE OR REPLACE TEMP MACRO dp_discrete_laplace_scale(epsilon DOUBLE, sensitivity DOUBLE := 1.0,
        granularity DOUBLE := NULL, coordinates DOUBLE := 1, on_grid BOOLEAN := false) AS
    dp__discrete_laplace_scale(epsilon, sensitivity, granularity, coordinates, on_grid);

-- Smallest grid point rho = base + g m with P[base + g DLap(scale/g) >= rho] <= delta_novel.
CREATE OR REPLACE TEMP MACRO dp_discrete_laplace_threshold(scale DOUBLE, granularity DOUBLE, delta_novel DOUBLE,
                                                           base DOUBLE := 1.0) AS
    dp__discrete_laplace_threshold(scale, granularity, delta_novel, base);

-- Sigma of g * N_Z(0, (sigma/g)^2) on ONE rounded value that is (epsilon, delta)-DP, checked with the exact
-- delta of the discrete Gaussian (Canonne, Kamath & Steinke 2020, Thm 7) and bisected to meet it.
CREATE OR REPLACE TEMP MACRO dp_discrete_gaussian_sigma(epsilon DOUBLE, delta DOUBLE, sensitivity DOUBLE := 1.0,
        granularity DOUBLE := NULL, on_grid BOOLEAN := false) AS
    dp__discrete_gaussian_sigma(epsilon, delta, sensitivity, granularity, on_grid);

-- Exact delta(epsilon) of that mechanism.
CREATE OR REPLACE TEMP MACRO dp_discrete_gaussian_delta(sigma DOUBLE, epsilon DOUBLE, sensitivity DOUBLE := 1.0,
        granularity DOUBLE := 1.0, on_grid BOOLEAN := false) AS
    dp__discrete_gaussian_delta(sigma, epsilon, sensitivity, granularity, on_grid);
