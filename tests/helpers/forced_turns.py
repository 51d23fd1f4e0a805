"""An engine actor whose first turns are forced through structured outputs (`ForcedTurnsActor`): the random tiny
model never writes a tool call or an answer by itself, so the tool, environment and launch-script tests make it
write one. `forced_engine.py` starts one such engine on its own; the training tests pass the class to
`grpo_fast.run(engine_class=...)`."""

from __future__ import annotations

import re
import sys

import ray.cloudpickle

from open_instruct.generation.actor import GenerationActor
from open_instruct.messages import PromptRequest

# Ray's workers import a class the driver pickled by reference by its module name, and they have the repository
# root on their path but not tests/: this module's classes travel by value instead.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# In a forced regex: the request's label (its first verifier's, escaped), so a forced answer can be right.
GROUND_TRUTH = "<ground_truth>"


class ForcedTurnsActor(GenerationActor):
    """GenerationActor whose first turns (of any sample, single- or multi-turn) are forced to match given regexes.

    A random tiny model never writes a tool call by itself; structured outputs (a regex such as
    `<code>print\\(1\\)</code>`) make turn k write a match of `forced_turns[k]`, through the real
    sampler, parser, tools and observation path. Later turns sample freely. A forced turn may also be a
    tuple of regexes, one per sample index (sample i writes the (i mod n)-th): with `GROUND_TRUTH` in one
    and a wrong answer in another, every group has reward spread, which --active_sampling trains on."""

    def __init__(self, engine_id, settings, reward_settings=None, reward_workers=1, forced_turns=()):
        super().__init__(engine_id, settings, reward_settings, reward_workers)
        self.forced_turns: tuple[str | tuple[str, ...], ...] = tuple(forced_turns)

    def set_forced_turns(self, forced_turns: tuple[str | tuple[str, ...], ...]) -> None:
        self.forced_turns = tuple(forced_turns)

    def sampling_params(self, request: PromptRequest, sample_index: int, turn: int):
        from vllm.sampling_params import StructuredOutputsParams

        params = super().sampling_params(request, sample_index, turn)
        if turn < len(self.forced_turns):
            params.structured_outputs = StructuredOutputsParams(
                regex=forced_regex(self.forced_turns[turn], request, sample_index)
            )
        return params


def forced_regex(forced: str | tuple[str, ...], request: PromptRequest, sample_index: int) -> str:
    """The regex sample `sample_index` of `request` is forced to write for one turn (see ForcedTurnsActor)."""
    regex = forced if isinstance(forced, str) else forced[sample_index % len(forced)]
    label = request.ground_truths[0] if request.ground_truths else ""
    if isinstance(label, (list, tuple)):
        label = label[0] if label else ""
    return regex.replace(GROUND_TRUTH, re.escape(str(label)))
