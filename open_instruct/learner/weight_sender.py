"""The learner's end of a weight sync (`WeightSender`): the transport it opened, and sending what the learner
syncs (every parameter, or with --use_peft the adapter's) within a watchdog. The actor's Ray methods
(`open_weight_transport`, `send_weights`, `release_weights`) delegate here; the engines' end is
`generation.weight_receive`.
"""

from __future__ import annotations

import socket
import time

from open_instruct.messages import WeightMetadata, WeightsSent
from open_instruct.weights.transport import WeightSyncError
from open_instruct.weights.watchdog import SendWatchdog


def weight_metadata(named: list, dtype_name: str, checkpoint_names=None) -> WeightMetadata:
    """Names and full shapes in send order, without gathering (ZeRO-3 keeps `ds_shape`); with `checkpoint_names`
    (a `weights.checkpoint_names.CheckpointNames`) the checkpoint's names and shapes each parameter is sent as."""
    names, dtypes, shapes = [], [], []
    for name, param in named:
        shape = tuple(int(d) for d in getattr(param, "ds_shape", param.shape))
        dtype = dtype_name if param.is_floating_point() else str(param.dtype).removeprefix("torch.")
        for sent_name, sent_shape in checkpoint_names.entries(name, shape) if checkpoint_names else [(name, shape)]:
            names.append(sent_name)
            dtypes.append(dtype)
            shapes.append(sent_shape)
    return WeightMetadata(tuple(names), tuple(dtypes), tuple(shapes))


def _gathered(named: list, metadata: WeightMetadata, zero3: bool, whole: bool, copy: bool, checkpoint_names):
    """(name, tensor) in send order, in the metadata's dtypes: each parameter whole (under ZeRO-3 gathered: all at
    once with `whole`, --gather_whole_model, fast but a whole model of extra memory; else one parameter at a time,
    peak extra memory one parameter plus one bucket), as its checkpoint's tensors with `checkpoint_names`; `copy`:
    tensors that share a gathered parameter's memory are copied (the gather frees it on exit)."""
    import deepspeed
    import torch

    dtype_names = iter(metadata.dtype_names)  # one per tensor sent, as `weight_metadata` listed them
    with deepspeed.zero.GatheredParameters([p for _, p in named], enabled=whole):
        for name, param in named:
            with deepspeed.zero.GatheredParameters([param], enabled=zero3 and not whole):
                pieces = checkpoint_names.tensors(name, param.detach()) if checkpoint_names else None
                for sent_name, piece in pieces or [(name, param.detach())]:
                    tensor = piece.to(getattr(torch, next(dtype_names)))
                    shared = tensor.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
                    yield sent_name, tensor.clone() if copy and shared else tensor


def _rank_0_aborts() -> None:
    """A non-sending rank's abort: nothing of its own to abort (see `WeightSender.send`)."""


class WeightSender:
    def __init__(self, rank: int, gather_whole_model: bool):
        self.rank = rank
        self.gather_whole_model = gather_whole_model  # --gather_whole_model (ZeRO-3)
        self.watchdog = SendWatchdog()
        self.wire = None  # the weight transport's module, once opened (rank 0, or every rank for ipc)
        self.group = None

    def open(
        self,
        backend: str,
        host: str,
        port: int,
        world_size: int,
        timeout_s: float,
        listener: socket.socket | None = None,
    ) -> int:
        """Open the trainer end of the weight transport: rank 0 of the engines' transfer group (its store adopts
        `listener`, the socket held on `port`), or, for a staged transport, the stager (on every rank for `ipc`:
        each engine maps its own GPU's learner)."""
        from open_instruct.weights.transport import transport

        wire = transport(backend)
        if self.rank != 0 and not wire.EVERY_RANK_STAGES:
            raise RuntimeError(f"learner rank {self.rank} asked to open the {backend} transport: only rank 0 sends")
        self.close()  # a re-form (the members changed): the old group's resources go before the new one's come
        self.wire = wire
        self.group = wire.trainer_init(host, port, world_size, timeout_s, listener)
        return world_size

    def close(self) -> None:
        """Free the transport's trainer end (a communicator, a process group, a staged file or handles)."""
        group, self.group = self.group, None
        if group is not None:
            self.wire.trainer_close(group)

    def send(
        self,
        named: list,
        zero3: bool,
        metadata: WeightMetadata,
        bucket_bytes: int,
        version: int,
        timeout_s: float,
        checkpoint_names=None,
    ) -> WeightsSent:
        """Every rank: walk `named` (under ZeRO-3 gathered whole or one at a time, see --gather_whole_model);
        rank 0 broadcasts them bucket by bucket, or a staged transport's ranks stage them (see `release`).
        Raises `WeightSyncError` when that takes longer than `timeout_s` (see `SendWatchdog`), and at once on
        every call after that."""
        started = time.monotonic()
        wire = self.wire
        # Staged handles point into the tensors themselves; a ZeRO-3 gather frees its whole copy on exit.
        copy = zero3 and wire is not None and wire.KEEPS_REFERENCES

        def send() -> tuple[int, dict | None]:
            tensors = _gathered(named, metadata, zero3, zero3 and self.gather_whole_model, copy, checkpoint_names)
            try:
                if wire is None:  # not a sender: it only joins the ZeRO-3 gathers (below)
                    return 0, None
                if wire.STAGED:
                    info, staged = wire.trainer_stage(
                        self.group, tensors, metadata.names, metadata.dtype_names, metadata.shapes, f"v{version}"
                    )
                    return staged, info
                if self.group is None:
                    raise WeightSyncError(f"learner {self.rank}: the transfer group was closed after a failed send")
                sent = wire.trainer_send_stream(
                    self.group, tensors, metadata.dtype_names, metadata.shapes, bucket_bytes
                )
                return sent, None
            finally:
                if zero3:  # every rank walks the whole sequence of gathers, also after a failed send
                    for _ in tensors:
                        pass

        what = f"weight sync step 'send' of version {version} on learner {self.rank}"
        try:
            # Over a group, an overrun send is freed by aborting the group (NCCL's receive has no timeout). The
            # other ranks wait in ZeRO-3 gathers behind rank 0's send: its abort frees them too, so they wait for it.
            abort = self.close if wire is not None and not wire.STAGED else _rank_0_aborts if zero3 else None
            sent, staged = self.watchdog.run(send, timeout_s=timeout_s, what=what, abort=abort)
        except Exception as error:
            if wire is not None and not wire.STAGED and self.watchdog.broken is None:
                self.close_group(error)
            raise
        return WeightsSent(self.rank, sent, time.monotonic() - started, staged)

    def close_group(self, error: BaseException) -> None:
        """After a failed send. An engine that posts its receive after rank 0's broadcast failed would wait
        for it until the group timeout (gloo delivers nothing of a failed collective); once our end's
        sockets are closed its receive fails at once, and it restores its weights and serves on. The group
        is formed anew by the next connect (`WeightSync.rejoin` after an engine is replaced)."""
        import traceback

        group, self.group = self.group, None
        traceback.clear_frames(error.__traceback__)  # the failed send's frames still hold the group
        if group is not None:
            self.wire.trainer_close(group)

    def release(self) -> None:
        """A staged transport's sync is over (every engine loaded, or failed): free what was staged."""
        wire = self.wire
        if wire is not None and wire.STAGED:
            wire.trainer_release(self.group)
