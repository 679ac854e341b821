"""The listening socket of a server command (``serve``, ``trace --web``), bound before anything slow loads."""

from __future__ import annotations

import socket

from core.errors import InvalidParamsError


def bind_listener(host: str, port: int, shared: bool = False) -> socket.socket:
    """The listening socket, bound before anything slow: a port in use or a bad host is a usage error.
    ``shared``: every API process binds one to the same port (SO_REUSEPORT), and the kernel spreads new
    connections over them by their addresses; one socket accepted by all would let whichever process wakes
    first take a whole burst of connections."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections made before the server runs wait in the backlog, not refused
    except OSError as exc:
        raise InvalidParamsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
