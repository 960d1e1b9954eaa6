"""The SchedulerService RPCs by concern; `pollux.scheduler.servicer` joins them in one servicer.

`base` holds what every concern shares (the store, the mirror, the caller's job lookup, leader
hints); `job_writes` submits, cancels and deletes; `job_reads` gets, lists and pages jobs and
timelines; `streams` serves WatchJobs and StreamLogs; `cluster` answers ClusterStatus, Explain
and EstimateJob. Each is a class over `ServicerBase` that can be built and tested alone.
"""
