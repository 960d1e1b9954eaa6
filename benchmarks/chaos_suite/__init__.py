"""The fault suite's parts (benchmarks/chaos.py runs them): each usable and testable alone.

`tally` counts what must not happen and prints the figures, `jobs` submits the suite's jobs
through failovers and follows their states, `inject` injects each fault and undoes it, and
`checks` waits for recovery and looks for leaked replicas, overlapping generations and
corrupted checkpoints. Relative imports: the package is `benchmarks.chaos_suite` when
imported, `chaos_suite` when chaos.py runs as a script.
"""
