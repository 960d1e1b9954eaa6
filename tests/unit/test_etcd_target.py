"""Several etcd members as one gRPC target (pollux.service.etcd_target)."""

from __future__ import annotations

import pytest

from pollux.service.config import EtcdConfig
from pollux.service.etcd_target import EndpointError, aetcd_address, split_endpoints


def test_one_endpoint_is_dialled_as_is() -> None:
    assert aetcd_address("etcd.internal:2379") == ("etcd.internal", 2379)


def test_several_members_become_one_failover_target_split_at_the_last_colon() -> None:
    host, port = aetcd_address("127.0.0.1:2379, 127.0.0.2:2379,localhost:32379")
    assert f"{host}:{port}" == "ipv4:127.0.0.1:2379,127.0.0.2:2379,127.0.0.1:32379"


def test_ipv6_members_get_the_ipv6_scheme() -> None:
    host, port = aetcd_address("[::1]:2379,[::1]:2380")
    assert f"{host}:{port}" == "ipv6:[::1]:2379,[::1]:2380"


@pytest.mark.parametrize("bad", ["", "host", "host:", "host:0", "a:1,,b:2", "a:99999"])
def test_malformed_lists_are_refused_with_the_entry(bad: str) -> None:
    with pytest.raises(EndpointError, match="is not host:port"):
        split_endpoints(bad)
    assert any("endpoint" in p for p in EtcdConfig(endpoint=bad).problems())


def test_an_unresolvable_member_names_itself() -> None:
    with pytest.raises(EndpointError, match=r"no-such-host\.invalid:2379"):
        aetcd_address("127.0.0.1:2379,no-such-host.invalid:2379")
