"""The etcd layer: the only package that imports `aetcd`.

`client` dials etcd (plaintext or TLS with a client certificate), `kv` is the generic key-value
API every part of Pollux uses (typed reads, fenced transactions, watches, leases), `errors`
names every failure, and `maintenance` is the Maintenance service (status, compaction,
defragmentation, alarms). The typed cluster state on top is `pollux.service.store`.
"""
