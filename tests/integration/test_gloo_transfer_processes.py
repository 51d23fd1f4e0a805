"""gloo weight transfers between real processes: a send that fails in a 3-process group closes the learner's end,
so a receiver that comes late fails at once instead of waiting for the group's timeout. (An in-flight gloo update
that keeps the KV cache, between a real learner and a real engine, is proven token by token in
tests/integration/test_weight_sync.py.)"""

import os
import time

import torch

from open_instruct.learner.rendezvous import listening_socket
from open_instruct.weights import gloo as wt


def _transfer_party(rank: int, port: int, listener, peer_gone, trainer_done, results) -> None:
    """One process of a 3-rank transfer group: rank 0 the learner's end, 1 a live engine, 2 an engine that dies
    right after joining. Runs in a spawned process (each rank needs its own gloo sockets); rank 0's store adopts
    `listener`, the test's socket on `port`."""
    from datetime import timedelta

    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    from open_instruct.learner.weight_sender import WeightSender

    timeout = timedelta(seconds=120)
    if rank == 0:
        group = wt.trainer_init("127.0.0.1", port, 3, timeout.total_seconds(), listener)
    else:
        group = stateless_init_torch_distributed_process_group("127.0.0.1", port, rank, 3, "gloo", timeout=timeout)
    if rank == 2:
        os._exit(1)
    if rank == 1:
        trainer_done.wait(60)  # the engine asks for the weights only after the learner's send failed
        try:
            group.broadcast(torch.empty(1024, dtype=torch.uint8), 0).wait()
            results.put((rank, "received"))
        except RuntimeError as error:
            results.put((rank, str(error)))
        return
    learner = WeightSender(rank=0, gather_whole_model=False)
    learner.wire, learner.group = wt, group
    del group  # as in the learner: the sender holds the only reference
    assert peer_gone.wait(100), "rank 2 never exited"  # the test saw its process end
    try:
        wt.trainer_send_stream(learner.group, iter([("w", torch.ones(256))]), ["float32"], [[256]])
        results.put((rank, "sent"))
    except RuntimeError as error:
        learner.close_group(error)
        results.put((rank, f"closed after: {error}"))
        reported = error  # alive, with its traceback, as while Ray reports it  # noqa: F841
    trainer_done.set()
    time.sleep(300)  # the process (not the group) stays up while rank 1 receives


def test_a_failed_send_closes_the_trainer_end_so_a_late_receiver_fails_at_once():
    """The CI hang: an engine died as a sync began, learner rank 0's broadcast failed, and the surviving
    engine, posting its receive after that, waited for the group timeout (600 s). With the learner's end
    closed after the failure its receive fails at once: 'Connection closed', not 'Timed out'."""
    import multiprocessing
    import queue

    listener = listening_socket()  # sent to rank 0's process (multiprocessing passes a socket's descriptor)
    port = listener.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    peer_gone, trainer_done, results = context.Event(), context.Event(), context.Queue()
    listeners = [listener, None, None]
    parties = [
        context.Process(target=_transfer_party, args=(r, port, listeners[r], peer_gone, trainer_done, results))
        for r in range(3)
    ]
    for party in parties:
        party.start()
    parties[2].join(timeout=100)  # rank 2 exits right after joining the group
    peer_gone.set()
    try:
        outcome = dict(results.get(timeout=100) for _ in range(2))  # under the group's 120 s timeout
    except queue.Empty:
        outcome = {}
    finally:
        for party in parties:
            party.kill()
    assert outcome.get(0, "").startswith("closed after:"), outcome
    assert "Connection closed" in outcome.get(1, ""), outcome
