"""One gRPC target for an etcd cluster of several members.

etcd's clients fail over between members; aetcd dials one ``host:port``. gRPC itself fails
over between the addresses of one target (``ipv4:a:p,b:p``, pick-first: a call after the
connected member dies goes to the next one that answers), so several endpoints are resolved to
addresses and written as one such target. aetcd joins its `host` and `port` with a colon,
hence the split at the last one.
"""

from __future__ import annotations

import ipaddress
import socket


class EndpointError(ValueError):
    """An endpoint list that cannot be dialled, with what to fix."""


def split_endpoints(endpoints: str) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` as [(host, port)]; IPv6 hosts in brackets (``[::1]:2379``).

    Raises:
        EndpointError: An empty list or an entry that is not host:port.
    """
    out = []
    for entry in (e.strip() for e in endpoints.split(",")):
        host, _, port = entry.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise EndpointError(f"etcd endpoint {entry!r} is not host:port")
        out.append((host, int(port)))
    return out


def aetcd_address(endpoints: str) -> tuple[str, int]:
    """The (host, port) to give aetcd.Client for one endpoint or a comma-separated list.

    Raises:
        EndpointError: A malformed entry, or a host name that does not resolve.
    """
    members = split_endpoints(endpoints)
    if len(members) == 1:
        return members[0]
    addresses: list[tuple[str, int]] = []
    for host, port in members:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            raise EndpointError(f"etcd endpoint {host}:{port}: {error.strerror}") from error
        addresses.extend((str(info[4][0]), port) for info in infos)
    ipv4 = [(a, p) for a, p in dict.fromkeys(addresses) if ipaddress.ip_address(a).version == 4]
    chosen = ipv4 or [(f"[{a}]", p) for a, p in dict.fromkeys(addresses)]
    scheme = "ipv4" if ipv4 else "ipv6"
    *head, (last_host, last_port) = chosen
    joined = ",".join(f"{a}:{p}" for a, p in head)
    return f"{scheme}:{joined},{last_host}", last_port
