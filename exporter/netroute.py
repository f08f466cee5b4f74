"""Which network interface routes to an address: one netlink RTM_GETROUTE.

This is what `ip route get ADDR` asks the kernel. It is written against the
socket module rather than pyroute2 because importing pyroute2 costs ~12 MiB of
resident memory, a third of the exporter's budget; the tests check the answers
against pyroute2 and iproute2 inside a network namespace.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import logging
import socket
import struct
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# linux/netlink.h, linux/rtnetlink.h
NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTA_DST = 1
RTA_OIF = 4
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTATTR = struct.Struct("=HH")  # len, type
_seq = itertools.count(1)


def _align(n: int) -> int:
    return (n + 3) & ~3


def build_request(address: ipaddress.IPv4Address | ipaddress.IPv6Address, seq: int) -> bytes:
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    dst = address.packed
    attr = _RTATTR.pack(_RTATTR.size + len(dst), RTA_DST) + dst
    body = _RTMSG.pack(family, address.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + attr
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, seq, 0) + body


def parse_reply(data: bytes, seq: int) -> int | None:
    """The output interface index of the route in a kernel reply; None for 'no route'."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, msg_seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        body = offset + _NLMSGHDR.size
        if msg_seq == seq and kind == NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, body)
            if error:
                log.debug("RTM_GETROUTE: %s", errno.errorcode.get(-error, error))
            return None
        if msg_seq == seq and kind == RTM_NEWROUTE:
            attr = body + _RTMSG.size
            end = offset + length
            while attr + _RTATTR.size <= end:
                attr_len, attr_type = _RTATTR.unpack_from(data, attr)
                if attr_len < _RTATTR.size:
                    break
                if attr_type == RTA_OIF:
                    return struct.unpack_from("=I", data, attr + _RTATTR.size)[0]
                attr += _align(attr_len)
            return None
        offset += _align(length)
    return None


def route_device(address: str) -> str | None:
    """The interface the kernel would use to reach `address`, or None (no route, not an IP)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None  # a host name: resolving it would put DNS on the scrape path
    seq = next(_seq)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
            sock.settimeout(1.0)
            sock.bind((0, 0))
            sock.send(build_request(ip, seq))
            index = parse_reply(sock.recv(65536), seq)
        return socket.if_indextoname(index) if index is not None else None
    except OSError as err:
        log.debug("route lookup for %s failed: %s", address, err)
        return None


class CachedLookup:
    """Routes change rarely; look each address up at most once per `ttl` seconds."""

    def __init__(self, lookup: Callable[[str], str | None], ttl: float = 60.0) -> None:
        self._lookup = lookup
        self._ttl = ttl
        self._cache: dict[str, tuple[float, str | None]] = {}

    def __call__(self, address: str) -> str | None:
        now = time.monotonic()
        hit = self._cache.get(address)
        if hit is not None and now < hit[0]:
            return hit[1]
        device = self._lookup(address)
        # Spread expiries over [ttl, 1.5 ttl) so many mounts don't refresh in one scrape.
        jitter = (hash(address) % 1000) / 2000 * self._ttl
        self._cache[address] = (now + self._ttl + jitter, device)
        return device
