"""How lumion-hil's ring communicator fails (instruments/emulators/ring.py): one exception per
way NCCL and PyTorch report a failure, each ``str()`` the lines they print for it."""

from __future__ import annotations


class CommError(RuntimeError):
    """A communicator failure; ``str()`` is what NCCL and PyTorch print for it (one or more lines)."""


class InitTimeout(CommError):
    """Not every rank joined the rendezvous in time (or the store was never reached)."""


class CollectiveTimeout(CommError):
    """A collective's socket operation did not complete within the timeout (PyTorch's watchdog)."""


class PeerClosed(CommError):
    """A peer closed its connection: its process exited or failed."""


class NetworkError(CommError):
    """Any other socket failure: no interface reaches a peer, a refused handshake, an errno."""
