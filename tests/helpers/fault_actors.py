"""Fault injection: engine actors that fail on purpose, the way real engines were seen to fail, so the recovery
paths run on the real stack (tests/integration/test_engine_faults.py; the fault benchmark kills a real engine
by pid instead). Each fails once (a marker file), so its replacement lives."""

from __future__ import annotations

import sys

import ray.cloudpickle

from open_instruct.generation.actor import GenerationActor
from open_instruct.messages import Completion, PromptRequest

# Ray's workers import a class the driver pickled by reference by its module name, and they have the repository
# root on their path but not tests/: this module's classes travel by value instead.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DiesInWeightSyncActor(GenerationActor):
    """Fault injection: engine `victim` ends its process when asked to receive weight version `at_version`,
    once (it leaves `marker` behind, so its replacement lives). The learner is then broadcasting into a group
    with a dead member: the case a weight sync must survive without hanging. The other engines ask for that
    version a few seconds late, after the learner's broadcast has failed (what a loaded machine did in CI):
    a receive that waits for a failed collective must not wait for the group timeout."""

    def __init__(self, engine_id, settings, reward_settings=None, reward_workers=1, fault=(0, 2, "")):
        super().__init__(engine_id, settings, reward_settings, reward_workers)
        self.victim, self.at_version, self.marker = fault
        self._late_once = True

    async def receive_weights(self, update_info: dict, version: int, timeout_s: float = 600.0):
        import asyncio
        import os
        from pathlib import Path

        if version == self.at_version and self.engine_id == self.victim and not Path(self.marker).exists():
            Path(self.marker).touch()
            os._exit(1)
        if version == self.at_version and self.engine_id != self.victim and self._late_once:
            self._late_once = False
            self.state.weights_settled.clear()  # as the receive does first: a resume waits for it to end
            await asyncio.sleep(5.0)
        return await super().receive_weights(update_info, version, timeout_s)


class StallsActor(GenerationActor):
    """Fault injection: engine `victim` stops producing tokens once it has completed `after_samples` samples:
    its new samples wait forever while the actor still answers calls, as when the engine below hangs. Only
    --engine_hang_timeout_s can find it. Once (the `marker` file), so its replacement works."""

    def __init__(self, engine_id, settings, reward_settings=None, reward_workers=1, fault=(0, 8, "")):
        super().__init__(engine_id, settings, reward_settings, reward_workers)
        self.victim, self.after_samples, self.marker = fault

    async def generate_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        import asyncio
        from pathlib import Path

        completed = self.state.counters.completed_samples
        due = self.engine_id == self.victim and completed >= self.after_samples and not request.is_eval
        if due and (not Path(self.marker).exists() or Path(self.marker).read_text() == str(id(self))):
            Path(self.marker).write_text(str(id(self)))
            await asyncio.Event().wait()
        return await super().generate_sample(request, sample_index)
