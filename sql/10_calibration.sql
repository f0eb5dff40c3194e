-- Calibration functions of dpsql (see dpsql/calibration.py for formulas and references).
-- Thin named-parameter wrappers around pure Python UDFs; with constant arguments
-- DuckDB evaluates them once, while planning.

-- Smallest sigma of an (epsilon, delta)-DP Gaussian mechanism with l2 sensitivity
-- `sensitivity` (analytic Gaussian mechanism, Balle & Wang 2018).
CREATE OR REPLACE TEMP MACRO dp_gaussian_sigma(epsilon DOUBLE, delta DOUBLE, sensitivity DOUBLE := 1.0) AS
    dp__gaussian_sigma(epsilon, delta, sensitivity);

-- Release threshold of Weighted Gaussian / WGM / Basic at total budget (epsilon, delta):
-- sigma = dp_gaussian_sigma(epsilon, delta/2),
-- rho = max_{t <= max_items} 1/sqrt(t) + sigma * PhiInv((1 - delta/2)^(1/t))   (Gopi et al. 2020, Thm 5.1).
CREATE OR REPLACE TEMP MACRO dp_gaussian_threshold(epsilon DOUBLE, delta DOUBLE, max_items DOUBLE := 100) AS
    dp__gaussian_threshold(epsilon, delta, max_items);

-- Release threshold of Weighted Laplace at total budget (epsilon, delta), noise Lap(1/epsilon):
-- rho = max_{t <= max_items} 1/t + (1/epsilon) * ln(1 / (2 (1 - (1 - delta)^(1/t))))   (Gopi et al. 2020, Thm 4.1).
CREATE OR REPLACE TEMP MACRO dp_laplace_threshold(epsilon DOUBLE, delta DOUBLE, max_items DOUBLE := 100) AS
    dp__laplace_threshold(epsilon, delta, max_items);

-- Noise scale (Gaussian: standard deviation; Laplace: b) and threshold of a set-union method.
CREATE OR REPLACE TEMP MACRO dp_set_union_noise_scale(method VARCHAR, epsilon DOUBLE := 1.0, delta DOUBLE := 1e-5,
                                                      max_items DOUBLE := 100) AS
    dp__set_union_scale(method, epsilon, delta, max_items);
CREATE OR REPLACE TEMP MACRO dp_set_union_threshold(method VARCHAR, epsilon DOUBLE := 1.0, delta DOUBLE := 1e-5,
                                                    max_items DOUBLE := 100) AS
    dp__set_union_threshold(method, epsilon, delta, max_items);
