"""The core: what every release needs, knowing no mechanism by name.

Declarations (``mechanism``) and their registry (``registry``, which discovers the family packages at
run time, so no core module imports a family); registration on a DuckDB connection
(``registration``); the release path every releasing macro is generated from (``release``) and the
one runner the front ends share (``runner``); the building blocks: errors, parameter validation,
noise, calibration, accounting, the privacy-budget ledger and the scopes a release reads, keys by
identity, per-connection state, UDF declarations, and the one reader of SQL text (``sqltext``).
"""
