"""The Agent service: per-job observation ingestion, model fitting and batch-size tuning."""
