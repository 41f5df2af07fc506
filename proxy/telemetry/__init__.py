"""Beside the data path: the per-request record, metrics, access logs and traces."""
