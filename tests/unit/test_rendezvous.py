"""`HeldPort`: rank 0 keeps the port it names bound until a store adopts the socket, so no other process can take
it in between (the race that once failed a learner group with EADDRINUSE), and peers that connect early wait."""

import errno
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch.distributed as dist

from open_instruct.learner.rendezvous import HeldPort


def test_a_held_port_cannot_be_bound_by_anyone_else():
    held = HeldPort()
    port = held.hold()
    with socket.socket() as other, pytest.raises(OSError) as raised:
        other.bind(("", port))
    assert raised.value.errno == errno.EADDRINUSE
    held.release()


def test_a_store_adopts_the_held_socket_and_serves_a_peer_that_connected_first():
    held = HeldPort()
    port = held.hold()
    early = socket.create_connection(("127.0.0.1", port), timeout=10)  # queued by the held socket's backlog
    early.close()
    store = dist.TCPStore(
        "127.0.0.1", port, 2, is_master=True, wait_for_workers=False, master_listen_fd=held.take(port).detach()
    )
    peer = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))
    peer.set("from", "peer")
    assert store.get("from") == b"peer"
    assert held.take(port) is None  # handed over once


def test_a_port_not_held_is_not_handed_over_and_a_stale_hold_is_closed():
    held = HeldPort()
    first = held.hold()
    second = held.hold()  # names a new port; the first is free again
    with socket.socket() as other:
        other.bind(("", first))
    assert held.take(first) is None  # not the held port: the held one is closed, nothing is handed over
    with socket.socket() as other:
        other.bind(("", second))


def test_learner_process_group_forms_through_the_held_port():
    """`init_distributed` (its own process: a process group is per process) on a held port, world size 1."""
    code = textwrap.dedent(
        """
        import torch, torch.distributed as dist
        from open_instruct.learner.deepspeed_setup import init_distributed
        from open_instruct.learner.rendezvous import HeldPort

        held = HeldPort()
        port = held.hold()
        init_distributed(0, 1, "127.0.0.1", port, 1, held.take(port))
        t = torch.ones(3)
        dist.all_reduce(t)
        print(dist.get_world_size(), t.tolist())
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "1 [1.0, 1.0, 1.0]"
