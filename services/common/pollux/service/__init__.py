"""Shared plumbing of the Pollux services: etcd store, leader election, config, logging, servers."""
