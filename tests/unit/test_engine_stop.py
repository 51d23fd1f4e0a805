"""An engine actor's abort stop, on a fake vLLM: the samples it finds running are cut, and so are those of a
request the pull loop had already taken off the prompt queue when the stop came. Both are delivered as
aborted, never lost and never left running: a stopping run waits for the pull loop to end."""

from __future__ import annotations

import asyncio

from helpers.fake_vllm import FakeVllm, fake_generation_actor

from open_instruct.generation.channels import LocalChannel
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
        while sum(actor.running_tokens().values()) < 2:  # both samples have their first token
            await asyncio.sleep(0)
        stopped = await actor.stop("abort")
        await asyncio.wait_for(loop, timeout=60)
        return stopped, results.get_all()

    stopped, delivered = asyncio.run(drive())
    assert stopped.in_flight_at_stop == 2
    completions = [m for m in delivered if isinstance(m, Completion)]
    assert sorted(c.sample_index for c in completions) == [0, 1]
    assert all(c.finish_reason == "abort" and len(c.response_token_ids) == 1 for c in completions)


def test_a_reprefill_pause_cuts_running_samples_and_continues_each_from_its_tokens(monkeypatch):
    """--inflight_update_kv reprefill: the sync's abort ends the running requests; after the resume each sample
    continues as a new request whose prompt is prompt + its tokens, and is delivered once, whole."""
    engine = FakeVllm(hang_after=1)
    actor = fake_generation_actor(monkeypatch, engine)

    async def drive():
        generating = asyncio.create_task(actor.generate([request("long")]))
        while sum(actor.running_tokens().values()) < 2:  # both samples have their first token
            await asyncio.sleep(0)
        await actor.pause("reprefill")
        actor.state.weight_version = 1  # what receive_weights would set
        await actor.resume()
        return await asyncio.wait_for(generating, timeout=60)  # only a failure waits this long

    completions = asyncio.run(drive())
    assert engine.pause_modes == ["abort"]
    assert sorted(c.sample_index for c in completions) == [0, 1]
    for c in completions:
        assert c.finish_reason == "stop" and c.response_token_ids == (0, 0, 1, 2) and c.continued_tokens == 0
        assert engine.prompts[f"long/{c.sample_index}/e0/r1"] == [1, 2, 3, 0]  # prompt + the kept token
    stats = actor.stats()
    assert stats.reprefilled_samples == 2 and stats.reprefill_tokens == 2 * (3 + 1)
    assert stats.generated_tokens == 2 * 4  # the kept token counted once


def test_a_keep_pause_leaves_running_samples_in_the_engine(monkeypatch):
    engine = FakeVllm()
    actor = fake_generation_actor(monkeypatch, engine)

    async def drive():
        await actor.pause("keep")
        await actor.resume()
        return await actor.generate([request("short")])

    completions = asyncio.run(drive())
    assert engine.pause_modes == ["keep"] and actor.stats().reprefilled_samples == 0
    assert all(c.response_token_ids == (0, 1, 2) for c in completions)
    assert set(engine.prompts) == {"short/0/e0", "short/1/e0"}  # no continuation request
