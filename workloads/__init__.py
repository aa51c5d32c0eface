"""Workloads: the request schema, real traces, arrival processes, length distributions."""

from .schema import COLUMNS, REQUIRED, from_records, validate

__all__ = ["COLUMNS", "REQUIRED", "from_records", "validate"]
