"""The port rank 0's groups meet on (the learners' process group, the engines' weight-transfer group), held open
from the moment rank 0 names it until the store serving the group takes the socket over.

A port found free and then closed can be taken by any process before the store binds it (another run's
rendezvous, an outgoing connection's ephemeral port); the group then fails to form with EADDRINUSE. A listening
socket queues the peers that connect early, so the store's first accepts find them waiting."""

from __future__ import annotations

import socket


def listening_socket() -> socket.socket:
    """A socket listening on a port the OS picks (`getsockname()[1]`), for a store to adopt."""
    held = socket.socket()
    held.bind(("", 0))
    held.listen()
    return held


class HeldPort:
    """Rank 0's port between naming it and forming a group on it: at most one listening socket, named by `hold`
    and handed over by `take`."""

    def __init__(self) -> None:
        self._socket: socket.socket | None = None

    def hold(self) -> int:
        """Listen on a port the OS picks (closing one held and never taken) and return it."""
        self.release()
        self._socket = listening_socket()
        return self._socket.getsockname()[1]

    def take(self, port: int) -> socket.socket | None:
        """The socket listening on `port`, now the caller's (a store adopts it); None if `port` is not held."""
        held, self._socket = self._socket, None
        if held is not None and held.getsockname()[1] == port:
            return held
        if held is not None:
            held.close()
        return None

    def release(self) -> None:
        held, self._socket = self._socket, None
        if held is not None:
            held.close()
