"""An engine actor's abort stop, on a fake vLLM: the samples it finds running are cut, and so are those of a
request the pull loop had already taken off the prompt queue when the stop came. Both are delivered as
aborted, never lost and never left running: a stopping run waits for the pull loop to end."""

from __future__ import annotations

import asyncio

from helpers.fake_vllm import FakeVllm, fake_generation_actor

from open_instruct.generation.queues import LocalChannel
from open_instruct.messages import Completion, PromptRequest, PromptStarted, SamplingSettings


def request(prompt_id: str) -> PromptRequest:
    return PromptRequest(prompt_id, (1, 2, 3), ("7",), ("gsm8k",), SamplingSettings(max_tokens=8), 2, 0, 0)


class GatedResults(LocalChannel):
    """A result channel that holds the pull loop inside its announcement of a prompt until `gate` opens."""

    def __init__(self):
        super().__init__(name="results")
        self.announcing, self.gate = asyncio.Event(), asyncio.Event()

    async def put_async(self, item, timeout=None):
        if isinstance(item, PromptStarted):
            self.announcing.set()
            await self.gate.wait()
        await super().put_async(item, timeout)


def test_an_abort_stop_cuts_a_request_the_pull_loop_took_before_the_stop(monkeypatch):
    actor = fake_generation_actor(monkeypatch, FakeVllm(hang_after=1))  # a sample never ends by itself

    async def drive():
        prompts, results = LocalChannel(name="prompts"), GatedResults()
        loop = asyncio.create_task(actor.run(prompts, results))
        await prompts.put_async(request("taken"))
        await results.announcing.wait()  # the loop holds the request; no sample of it runs yet
        stopped = await actor.stop("abort")
        results.gate.set()
        ended = await asyncio.wait_for(loop, timeout=60)  # only a failure waits this long
        return stopped, ended, results.get_all()

    stopped, ended, delivered = asyncio.run(drive())
    assert stopped.in_flight_at_stop == 0 and ended.prompts_pulled == 1
    completions = [m for m in delivered if isinstance(m, Completion)]
    assert sorted(c.sample_index for c in completions) == [0, 1]
    assert all(c.prompt_id == "taken" and c.finish_reason == "abort" for c in completions)


def test_an_abort_stop_cuts_running_samples_and_delivers_their_tokens(monkeypatch):
    actor = fake_generation_actor(monkeypatch, FakeVllm(hang_after=1))

    async def drive():
        prompts, results = LocalChannel(name="prompts"), LocalChannel(name="results")
        loop = asyncio.create_task(actor.run(prompts, results))
        await prompts.put_async(request("running"))
        while sum(actor._progress.values()) < 2:  # both samples have their first token
            await asyncio.sleep(0)
        stopped = await actor.stop("abort")
        await asyncio.wait_for(loop, timeout=60)
        return stopped, results.get_all()

    stopped, delivered = asyncio.run(drive())
    assert stopped.in_flight_at_stop == 2
    completions = [m for m in delivered if isinstance(m, Completion)]
    assert sorted(c.sample_index for c in completions) == [0, 1]
    assert all(c.finish_reason == "abort" and len(c.response_token_ids) == 1 for c in completions)
