"""The engine's side of a weight sync: pause (KV cache kept), receive, resume. A collaborator of
`GenerationActor` over the engine's declared state (`engine_state.EngineState`), kept apart because it is one
protocol with its own failure rules (see `weights.sync`)."""

from __future__ import annotations

import asyncio
import logging
import time

from open_instruct.generation.engine_state import EngineState
from open_instruct.messages import EnginePaused, WeightsReceived

logger = logging.getLogger(__name__)


class WeightReceiver:
    def __init__(self, state: EngineState):
        self.state = state
        self.joined = False  # in a weight-transfer group (left before joining the next one)

    async def pause(self, mode: str = "keep") -> EnginePaused:
        """Stop admitting requests and freeze the engine for a weight sync.

        'keep': running requests stay in the engine with their KV cache and continue with the
        new weights after `resume` (in-flight update). 'wait': running requests first finish
        with the current weights (the conservative baseline). 'reprefill': running requests are
        aborted; each sample keeps its tokens and logprobs and continues after `resume` as a new
        request, prompt + those tokens prefilled under the new weights (the abort / re-prefill
        approach of verl, AReaL and slime, to compare with 'keep'). The cache is never cleared: new
        requests are salted with the new version, so none reuses a block of the old weights.
        """
        if mode not in ("keep", "wait", "reprefill"):
            raise ValueError(f"pause mode must be 'keep', 'wait' or 'reprefill', got {mode!r}")
        state = self.state
        started = time.monotonic()
        state.set_paused(True)
        state.resumed.clear()
        running = len(state.progress)
        if mode == "reprefill":
            state.reprefill_epoch += 1  # before the abort: its streams end under the new epoch
        await state.engine.pause_generation(mode="abort" if mode == "reprefill" else mode, clear_cache=False)
        return EnginePaused(state.engine_id, time.monotonic() - started, running, len(state.progress))

    async def init_weight_transfer(self, init_info: dict) -> dict:
        """Join the trainer's weight-transfer group (concurrently with the trainer's own init), leaving the one
        it was in first: the group is formed anew whenever the pool's members change, and vLLM's init would
        otherwise overwrite the old group without freeing it (an NCCL communicator has no `__del__`)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        started = time.monotonic()
        if self.joined:
            self.joined = False
            try:
                await self.state.engine.shutdown_weight_transfer_engine()
            except RuntimeError as error:
                # vLLM refuses while an update it never finished is open (its driver-side wait timed out); our
                # engines' own init leaves the old group too (`weights.*_engine`), so the join goes on.
                logger.warning("engine %s: leaving the old weight-transfer group: %s", self.state.engine_id, error)
        await self.state.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
        self.joined = True
        return {"engine_id": self.state.engine_id, "init_s": time.monotonic() - started}

    async def receive_weights(self, update_info: dict, version: int, timeout_s: float = 600.0) -> WeightsReceived:
        """start → update (concurrently with the trainer's broadcast) → finish(version), engine paused.

        Each step has its own timeout and a failure names it; after a failed transfer the engine
        keeps serving its previous weights (see `weights.reload.RestoringReload`).
        """
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        state = self.state
        if not state.paused:
            raise RuntimeError(f"engine {state.engine_id}: receive_weights called while not paused")
        started = time.monotonic()
        step = "start_weight_update"
        state.weights_settled.clear()
        try:
            await asyncio.wait_for(state.engine.start_weight_update(), timeout_s)
            step = "update_weights"
            # A failed update ends vLLM's update session itself (our gloo and nccl engines restore the old
            # weights first), so `finish` runs only after a complete transfer.
            await asyncio.wait_for(
                state.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info)), timeout_s
            )
            step = "finish_weight_update"
            await asyncio.wait_for(state.engine.finish_weight_update(weight_version=str(version)), timeout_s)
        except Exception as error:
            raise RuntimeError(
                f"engine {state.engine_id}: weight sync step '{step}' failed: {type(error).__name__}: {error}"
            ) from error
        finally:
            state.weights_settled.set()
        state.weight_version = version
        state.counters.weight_updates += 1
        return WeightsReceived(state.engine_id, version, time.monotonic() - started)

    async def resume(self) -> float:
        """Resume generation; returns the wall-clock time it resumed (for step-end-to-resume lag).

        After a failed sync the driver resumes every engine at once, while one may still be receiving or
        restoring its previous weights: decoding then would run on layers still on the meta device (seen
        as an EngineCore crash), so the resume waits for the receive to end first."""
        state = self.state
        await state.weights_settled.wait()
        await state.engine.resume_generation()
        state.set_paused(False)
        state.resumed.set()
        state.room.set()
        return time.time()
