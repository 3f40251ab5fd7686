"""Free TCP ports for local servers (the dashboard, the trainer's rendezvous, test servers).

Ports come from below the OS's ephemeral range on purpose: a client that polls a port in that
range before its server listens can connect to itself (Linux TCP self-connect), read back its
own request, and hold the port so the server cannot bind it.
"""
from __future__ import annotations

import random
import socket

_FALLBACK_EPHEMERAL_LOW = 32768


def ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1, host: str = "127.0.0.1") -> int:
    """A base port with `count` consecutive ports free on host a moment ago."""
    rng = random.Random()
    low = ephemeral_low()
    for _ in range(200):
        base = rng.randrange(10000, low - count)
        if all(is_free(base + i, host) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)
