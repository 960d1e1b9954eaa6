"""Pollux: co-adaptive deep-learning cluster scheduling that maximises goodput.

The core packages (`pollux.goodput`, `pollux.policy`, `pollux.sim`) are pure: plain dataclasses
and numpy arrays in, plain results out, no network or etcd I/O. Services live in their own
packages and depend on the core, never the reverse.
"""

__version__ = "0.1.0"
