"""Private weighted sampling (PWS, Cohen et al. [PWS]): private samples, private histograms, estimates.

PRIVACY UNIT: ONE ELEMENT, NOT ONE USER. Every mechanism of this family is (epsilon, delta)-DP with
respect to adding or removing ONE ELEMENT (one row of an event table), i.e. datasets whose
key->frequency vectors satisfy ``||w - w'||_1 = 1``. A user who contributes many rows is NOT protected
as a whole; use the user-level mechanisms (:mod:`dpsql.union`) for that.

Modules, one concern each: :mod:`~dpsql.pws.params` (parameters and their checks),
:mod:`~dpsql.pws.keys` (threshold sampling, key reporting probabilities),
:mod:`~dpsql.pws.tokens` (frequency tokens), :mod:`~dpsql.pws.sanitizer` (the ``weighted_sample``
mechanism), :mod:`~dpsql.pws.sbh` (the ``sbh_histogram`` mechanism), :mod:`~dpsql.pws.estimators`
(post-processing estimates), :mod:`~dpsql.pws.udfs` (DuckDB UDFs) and :mod:`~dpsql.pws.api` (Python
release function).

Release path (``dpsql.core.release``): every macro checks that each parameter is a constant and validates
all of them, including the frequency range the tables can serve (:func:`check_frequency_range`) and the
SbH grid against its noise scale (:func:`sbh_granularity`), before the ledger charge; rows come out
sorted by key; an error raised once the data is read names a column, never a value. Released numbers
(SbH) carry granular noise only: exact multiples of the grid.
"""
from __future__ import annotations

from functools import partial

from dpsql.core.calibration import check_granularity
from dpsql.core.mechanism import EXAMPLE_USER_ITEMS, REQUIRED, AuditCase, Example, Mechanism, Param
from dpsql.pws.api import weighted_sample
from dpsql.pws.estimators import (_coefficients, estimator_coefficients, estimator_moments,
                                  sum_estimate_error)
from dpsql.pws.keys import (KeyTable, L_value, _first_q_one, key_probabilities, key_probabilities_recursion,
                            key_table, lemma_3_2, optimal_key_probabilities, ppswor_two_piece,
                            sampling_probabilities)
from dpsql.pws.params import (ESTIMATORS, GS, MAX_FREQUENCY_CELLS, MAX_FREQUENCY_ROWS, MAX_KEY_CHECK,
                              MAX_PI_LOOKUP, MAX_UNBIASED_TOKEN, SCHEMES, check_power, check_pws_epsilon,
                              check_pws_parameters, check_scheme, check_tau)
from dpsql.pws.sanitizer import (SANITIZER_KERNEL, SANITIZER_KERNELS, _draw_tokens, _grown, _report_keys,
                                 _spec_params, check_frequency_range, numba_available, sanitize_keys,
                                 sanitize_tokens, sanitizer_spec)
from dpsql.pws.sbh import (SBH_NOISE_MODES, check_sbh_noise, sbh_calibration, sbh_expectation, sbh_granularity,
                           sbh_moments_numeric, sbh_mse, sbh_noisy_values, sbh_report_probability,
                           sbh_threshold)
from dpsql.pws.tokens import (FrequencyTable, frequency_rows_reference, frequency_table,
                              optimal_frequency_probability)
from dpsql.pws.udfs import udfs
from dpsql.core.validation import check_delta, check_identifier, check_table_name

__all__ = [
    "SCHEMES", "GS", "ESTIMATORS", "check_pws_parameters", "L_value", "sampling_probabilities",
    "key_probabilities", "key_probabilities_recursion", "optimal_key_probabilities", "ppswor_two_piece",
    "KeyTable", "key_table", "FrequencyTable", "frequency_table", "frequency_rows_reference",
    "optimal_frequency_probability", "estimator_coefficients", "estimator_moments", "sum_estimate_error",
    "sbh_threshold", "sbh_report_probability", "sbh_expectation", "sbh_mse", "sbh_moments_numeric",
    "sanitize_keys", "sanitize_tokens", "sanitizer_spec", "check_frequency_range", "check_sbh_noise",
    "sbh_granularity", "sbh_calibration", "sbh_noisy_values", "udfs", "weighted_sample", "MECHANISMS",
]

# The parameters both PWS releases share, in SQL order after tbl.
_PWS_PARAMS = (
    Param("tbl", "VARCHAR", REQUIRED, check_table_name, "the private table (one row = one element)"),
    Param("epsilon", "DOUBLE", REQUIRED, check_pws_epsilon, "privacy parameter, 0 < epsilon <= 700"),
    Param("delta", "DOUBLE", REQUIRED, check_delta, "privacy parameter, 0 < delta < 1"),
    Param("tau", "DOUBLE", None, check_tau, "sampling threshold; NULL: no sampling"),
    Param("scheme", "VARCHAR", "ppswor", check_scheme, "'ppswor' or 'priority'"),
    Param("power", "DOUBLE", 1.0, check_power, "sampling weight f(i) = i^power"),
)
_KEY_FREQ = (
    Param("key_col", "VARCHAR", "key", partial(check_identifier, "key_col"), "the key column"),
    Param("freq_col", "VARCHAR", None, partial(check_identifier, "freq_col"),
          "the frequency column of an aggregated table; NULL: one row per element"),
)


def _check_with_frequencies(value: object) -> bool:
    from dpsql.core.errors import ParameterError

    if not isinstance(value, bool):
        raise ParameterError(f"with_frequencies must be true or false (got {value!r})")
    return value


# The examples' values: the key is the item, the frequency a whole number per row (the user id).
_EXAMPLE_ARGS = {"tbl": "'t'", "epsilon": "1.0", "delta": "1e-5", "tau": "0.5", "scheme": "'ppswor'", "power": "1.0",
                 "key_col": "'item'", "freq_col": "'user_id'"}

MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="weighted_sample", family="pws", macro="dp_weighted_sample", unit="element",
        params=(*_PWS_PARAMS,
                Param("with_frequencies", "BOOLEAN", False, _check_with_frequencies,
                      "also release a sanitized frequency token per key"),
                *_KEY_FREQ),
        description="private weighted sample: keys (and frequency tokens) reported with the largest "
                    "probabilities that keep (epsilon, delta)-DP for one element",
        proof="weighted_sample", sql="70_pws/pws.sql",
        example=Example.of(EXAMPLE_USER_ITEMS, ("key",), **_EXAMPLE_ARGS, with_frequencies="true"),
        audit=(AuditCase("element_sample", name="pws_weighted_sample", note="element level"),)),
    Mechanism(
        name="sbh_histogram", family="pws", macro="dp_sbh_histogram", unit="element",
        params=(*_PWS_PARAMS, *_KEY_FREQ,
                Param("noise", "VARCHAR", "granular", check_sbh_noise, "'granular' (the only mode)"),
                Param("granularity", "DOUBLE", None, check_granularity,
                      "grid of the noise, a power of two <= 1; NULL: chosen from 1/epsilon")),
        description="stability-based histogram: frequency + granular discrete Laplace, released above a "
                    "threshold (optionally sampled after the noise)",
        proof="sbh_histogram", calibrate=sbh_calibration, sql="70_pws/pws.sql",
        example=Example.of(EXAMPLE_USER_ITEMS, ("key",), **_EXAMPLE_ARGS, noise="'granular'", granularity="0.5"),
        audit=(AuditCase("element_histogram", note="element level"),)),
)
