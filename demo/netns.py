"""A simulated node's network namespace, and the way into it from the host.

Inside: lo, and stor0 (10.20.0.2/16, a veth whose peer is also inside) so that route lookups to
the NFS server name stor0, the storage interface of the sysfs fixture. Nothing links it to the
host, so no address of the demo's is ever on the host, and demos side by side never collide: the
node's exporters listen on the namespace's own 127.0.0.1, and a Forwarder on the host's 127.0.0.1
(a free port) carries each connection in, from a thread that joins the namespace (setns) to connect.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000  # sched.h
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Namespace:
    name: str


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


@contextlib.contextmanager
def node_namespace(index: int) -> Iterator[Namespace]:
    name = f"gpunode-demo-{index}-{uuid.uuid4().hex[:6]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", "stor0", "type", "veth", "peer", "name", "peer0")
        _ip("-n", name, "addr", "add", "10.20.0.2/16", "dev", "stor0")
        for dev in ("peer0", "stor0"):
            _ip("-n", name, "link", "set", dev, "up")
        yield Namespace(name)
    finally:
        # Deleting the namespace deletes its veths.
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _join(namespace: str) -> None:
    """Move the calling thread (only it) into the namespace."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {namespace}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(1 << 16):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Forwarder:
    """127.0.0.1:<free port> on the host to 127.0.0.1:port inside a namespace; `with` starts and stops it."""

    def __init__(self, namespace: str, port: int) -> None:
        self.namespace, self.target = namespace, port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Forwarder:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        try:
            _join(self.namespace)  # this thread's sockets are made inside; it ends with the connection
            inside = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        except OSError:
            client.close()
            return
        inside.settimeout(None)
        back = threading.Thread(target=_pump, args=(inside, client), daemon=True)
        back.start()
        _pump(client, inside)
        back.join()
        client.close()
        inside.close()
