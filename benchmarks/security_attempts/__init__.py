"""The security check's attempts (benchmarks/security_check.py runs them), grouped by concern.

`session` is what they share (the target, the check's own credentials, the recorded
outcomes); `transport`, `tokens`, `ownership`, `job_credentials`, `terminal`, `bounds` and
`replica_files` each try one kind of door. Relative imports: the package is
`benchmarks.security_attempts` when imported, `security_attempts` when the check runs as a
script.
"""
