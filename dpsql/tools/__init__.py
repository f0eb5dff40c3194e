"""Tools around the mechanisms: the audit, NON-PRIVATE evaluation metrics, the demo."""
