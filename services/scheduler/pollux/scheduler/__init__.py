"""The Scheduler service: cluster-wide allocation with leader election and fenced writes."""
