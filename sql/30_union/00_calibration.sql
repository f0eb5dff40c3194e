-- The set-union family's calibration for SQL users: any method's noise scale and threshold at its
-- defaults (dpsql.union.calibrate), through pure Python UDFs evaluated once while planning.

-- Noise scale (Gaussian: standard deviation; Laplace: b) and threshold of a set-union method.
CREATE OR REPLACE TEMP MACRO dp_set_union_noise_scale(method VARCHAR, epsilon DOUBLE, delta DOUBLE,
                                                      max_items DOUBLE := 100) AS
    dp__set_union_scale(method, epsilon, delta, max_items);
CREATE OR REPLACE TEMP MACRO dp_set_union_threshold(method VARCHAR, epsilon DOUBLE, delta DOUBLE,
                                                    max_items DOUBLE := 100) AS
    dp__set_union_threshold(method, epsilon, delta, max_items);

