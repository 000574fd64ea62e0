"""Offline replay: readers (one per log format), the report, the rollback timeline."""
