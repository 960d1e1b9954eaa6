"""The parts of `pollux-up`'s `LocalCluster` (pollux.service.local_cluster), each usable alone.

`procs` starts service processes on loopback ports, `pki` keeps a secure cluster's CA,
certificates and admin token, `etcd` runs and watches the etcd members, and `workdir` lays out
the work directory with the modes job uids need.
"""
