"""Weight-transfer groups are torn down, not overwritten: whenever the pool's members change the group is formed
anew, and each re-form must free what the last one held on both ends (learner rank 0's `WeightSender`, the
engine's `WeightReceiver` and transfer engine). On CPU: the real gloo group re-formed N times with the file
descriptors (sockets) and live process groups of both sides counted, the shm stager re-opened N times with the
staged files counted, both in an interpreter of their own (a thread left by an earlier test in the same worker
may open a descriptor while they count). NCCL without a GPU: the calls made on an in-process stand-in of vLLM's
communicator, in order, and a send blocked in a broadcast freed by aborting its group."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest
import torch

from open_instruct.generation.engine_state import EngineState
from open_instruct.generation.weight_receive import WeightReceiver
from open_instruct.learner.rendezvous import HeldPort
from open_instruct.learner.weight_sender import WeightSender
from open_instruct.weights import nccl, shm
from open_instruct.weights.transport import WeightSyncError
from open_instruct.weights.watchdog import SendWatchdog

REFORMS = 6


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class FakeVllmConfig:
    def __init__(self):
        from vllm.config import ParallelConfig

        self.parallel_config = ParallelConfig()
        self.model_config = None


def transfer_engine(backend: str):
    """The transport's engine side as vLLM's worker builds it (the worker extension's module imported, then
    vLLM's factory), on a model it never loads into."""
    import importlib

    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from open_instruct.weights.transport import transport

    wire = transport(backend)
    importlib.import_module(wire.WORKER_EXTENSION.rsplit(".", 1)[0])
    return WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend=wire.ENGINE_BACKEND), FakeVllmConfig(), torch.device("cpu"), torch.nn.Linear(2, 2)
    )


class WorkerStandIn:
    """vLLM's AsyncLLM as the receiver calls it, forwarding to one worker's transfer engine the way vLLM's
    `Worker.init_weight_transfer_engine` / `shutdown_weight_transfer_engine` do; records the calls."""

    def __init__(self, transfer):
        self.transfer = transfer
        self.calls: list[str] = []

    async def init_weight_transfer_engine(self, request) -> None:
        self.calls.append("init")
        self.transfer.init_transfer_engine(self.transfer.parse_init_info(request.init_info))

    async def shutdown_weight_transfer_engine(self) -> None:
        self.calls.append("shutdown")
        self.transfer.shutdown()


def reform(sender: WeightSender, receiver: WeightReceiver, backend: str) -> None:
    """One re-form: learner rank 0 opens the group while the engine joins it (they block on each other), then one
    broadcast proves the group works."""
    from open_instruct.weights.transport import transport

    held = HeldPort()  # as learner rank 0 holds it: the store adopts the listening socket
    port = held.hold()
    info = transport(backend).worker_init_info("127.0.0.1", port, 2, 60.0)
    opened: list[BaseException] = []

    def learner() -> None:
        try:
            sender.open(backend, "127.0.0.1", port, 2, 60.0, held.take(port))
            sender.group.broadcast(torch.arange(4.0), 0).wait()
        except BaseException as error:
            opened.append(error)

    thread = threading.Thread(target=learner)
    thread.start()
    asyncio.run(receiver.init_weight_transfer(info))
    received = torch.zeros(4)
    receiver.state.engine.transfer.group.broadcast(received, 0).wait()
    thread.join()
    assert not opened, opened
    assert torch.equal(received, torch.arange(4.0))


def gloo_reforms_counted() -> dict:
    """The gloo group re-formed REFORMS times; what each side still holds, counted."""
    engine = WorkerStandIn(transfer_engine("gloo"))
    receiver = WeightReceiver(EngineState(engine_id=0, settings=None, engine=engine))
    sender = WeightSender(rank=0, gather_whole_model=False)
    reform(sender, receiver, "gloo")  # the first group sets up what gloo keeps for the process's life
    gc.collect()
    before = open_fds()
    groups = []
    for _ in range(REFORMS):
        reform(sender, receiver, "gloo")
        groups.append((weakref.ref(sender.group), weakref.ref(engine.transfer.group)))
    gc.collect()
    counted = {
        "descriptors_left": open_fds() - before,
        "earlier_groups_alive": [(learner() is not None, worker() is not None) for learner, worker in groups[:-1]],
        "calls": engine.calls,
    }
    sender.close()
    engine.transfer.shutdown()
    gc.collect()
    counted["last_group_alive"] = [groups[-1][0]() is not None, groups[-1][1]() is not None]
    counted["descriptors_after_close"] = open_fds() - before
    return counted


def staged_files() -> list[str]:
    import tempfile

    prefix = f"{shm.FILE_PREFIX}{os.getpid()}-"
    directories = ("/dev/shm", tempfile.gettempdir())
    return [name for directory in directories for name in os.listdir(directory) if name.startswith(prefix)]


def mapped_staged_files() -> list[str]:
    with open("/proc/self/maps") as maps:
        return [line for line in maps if shm.FILE_PREFIX in line]


def shm_reopens_counted() -> dict:
    """The shm stager re-opened REFORMS times, each time in the middle of a sync (staged, never released)."""
    sender = WeightSender(rank=0, gather_whole_model=False)
    before = (open_fds(), staged_files())
    weights = [("w", torch.arange(6.0).view(2, 3))]
    staged_at_each_open = []
    for version in range(REFORMS):
        sender.open("shm", "127.0.0.1", 0, 2, 60.0)
        staged_at_each_open.append(staged_files())
        shm.trainer_stage(sender.group, iter(weights), ["w"], ["float32"], [[2, 3]], f"v{version}")
        staged_at_each_open.append(len(staged_files()))
    sender.close()
    return {
        "staged_at_each_open": staged_at_each_open,
        "descriptors_left": open_fds() - before[0],
        "staged_left": sorted(set(staged_files()) - set(before[1])),
        "mapped_left": mapped_staged_files(),
    }


@pytest.fixture(scope="module")
def counted_alone(tmp_path_factory) -> dict:
    """Both counts, taken in a fresh interpreter that runs nothing else."""
    out = tmp_path_factory.mktemp("counted") / "counted.json"
    program = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "import test_weight_group_teardown as t; "
        "counted = {'gloo': t.gloo_reforms_counted(), 'shm': t.shm_reopens_counted()}; "
        f"open({str(out)!r}, 'w').write(json.dumps(counted))"
    )
    finished = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_gloo_group_reformed_n_times_leaves_sockets_and_groups_flat_on_both_sides(counted_alone):
    gloo = counted_alone["gloo"]
    assert gloo["descriptors_left"] == 0, f"{gloo['descriptors_left']} descriptors left after {REFORMS} re-forms"
    # Every earlier group is gone on both ends; only the current one lived until closed.
    assert gloo["earlier_groups_alive"] == [[False, False]] * (REFORMS - 1)
    assert gloo["calls"] == ["init"] + ["shutdown", "init"] * REFORMS  # the receiver left each group before joining
    assert gloo["last_group_alive"] == [False, False]
    assert gloo["descriptors_after_close"] < 0  # the last group's sockets closed too


def test_the_shm_stager_reopened_n_times_leaves_no_staged_file_and_no_mapping(counted_alone):
    """A re-form in the middle of a sync (staged, never released) must not leave the file in /dev/shm."""
    shm_counts = counted_alone["shm"]
    # Each open found no file (the previous stager's unreleased one went with it); each stage made one.
    assert shm_counts["staged_at_each_open"] == [[], 1] * REFORMS
    assert shm_counts["descriptors_left"] == 0
    assert shm_counts["staged_left"] == [] and shm_counts["mapped_left"] == []


class FakeCommunicator:
    """vLLM's `PyNcclCommunicator` as far as its teardown goes: `destroy()` is `ncclCommAbort`, which ends a
    broadcast blocked on a gone peer with an error; `group` holds the rendezvous store."""

    def __init__(self, calls: list[str], name: str):
        self.calls, self.name = calls, name
        self.group = object()
        self.aborted = threading.Event()

    def broadcast(self, tensor, src, stream=None) -> None:
        self.calls.append(f"{self.name}.broadcast")
        self.aborted.wait()  # a peer is gone: only an abort ends it
        self.calls.append(f"{self.name}.broadcast aborted")
        raise RuntimeError("NCCL error: the communicator was aborted")

    def destroy(self) -> None:
        self.calls.append(f"{self.name}.destroy")
        self.aborted.set()


def test_learner_rank_0_destroys_its_nccl_communicator_before_a_reform():
    calls: list[str] = []
    sender = WeightSender(rank=0, gather_whole_model=False)
    sender.wire, sender.group = nccl, FakeCommunicator(calls, "old")
    old = sender.group
    # No CUDA here, so opening the new communicator fails: after the old one was destroyed, never before.
    with pytest.raises(RuntimeError, match="accelerator"):
        sender.open("nccl", "127.0.0.1", free_port(), 2, 60.0)
    assert calls == ["old.destroy"] and old.group is None and sender.group is None
    sender.close()  # nothing left to close
    assert calls == ["old.destroy"]


def test_an_engine_leaves_its_nccl_group_before_joining_the_next():
    from open_instruct.weights.nccl_engine import RestoringNCCLWeightTransferEngine

    calls: list[str] = []
    transfer = transfer_engine("nccl")
    assert isinstance(transfer, RestoringNCCLWeightTransferEngine)
    transfer.model_update_group = FakeCommunicator(calls, "old")
    info = transfer.parse_init_info(nccl.worker_init_info("127.0.0.1", free_port(), 2, 60.0))
    with pytest.raises(RuntimeError, match="accelerator"):  # joining needs CUDA: it fails after the teardown
        transfer.init_transfer_engine(info)
    assert calls == ["old.destroy"] and transfer.model_update_group is None
    transfer.shutdown()  # idempotent, as vLLM's shutdown_weight_transfer_engine may come again
    assert calls == ["old.destroy"]


def test_the_receiver_asks_vllm_to_leave_the_nccl_group_before_it_rejoins():
    calls: list[str] = []
    transfer = transfer_engine("nccl")
    engine = WorkerStandIn(transfer)
    receiver = WeightReceiver(EngineState(engine_id=3, settings=None, engine=engine))
    receiver.joined, transfer.model_update_group = True, FakeCommunicator(calls, "old")  # an earlier join
    with pytest.raises(RuntimeError, match="accelerator"):  # joining needs CUDA: it fails after the teardown
        asyncio.run(receiver.init_weight_transfer(nccl.worker_init_info("127.0.0.1", free_port(), 2, 60.0)))
    assert engine.calls == ["shutdown", "init"] and calls == ["old.destroy"] and not receiver.joined


def test_a_send_blocked_in_a_broadcast_is_freed_by_aborting_its_group_and_the_next_sync_may_send():
    calls: list[str] = []
    sender = WeightSender(rank=0, gather_whole_model=False)
    sender.wire, sender.group = nccl, FakeCommunicator(calls, "group")
    group = sender.group
    with pytest.raises(WeightSyncError, match="aborted, which freed the send: the next sync forms a new group"):
        sender.watchdog.run(lambda: group.broadcast(None, 0), timeout_s=1, what="send", abort=sender.close)
    assert calls == ["group.broadcast", "group.destroy", "group.broadcast aborted"]
    assert sender.watchdog.broken is None and sender.watchdog.aborts == 1 and sender.group is None
    assert sender.watchdog.run(lambda: 7, timeout_s=5, what="the next send") == 7


def test_a_send_an_abort_cannot_free_still_breaks_the_watchdog():
    released = threading.Event()
    aborts: list[int] = []
    watchdog = SendWatchdog(abort_grace_s=0.5)
    with pytest.raises(WeightSyncError, match=r"still blocked in a collective; .* restart the run"):
        watchdog.run(released.wait, timeout_s=1, what="send", abort=lambda: aborts.append(1))
    assert aborts == [1] and watchdog.broken is not None
    with pytest.raises(WeightSyncError, match="restart the run"):
        watchdog.run(lambda: 7, timeout_s=5, what="the next send")
    released.set()
