"""A GenerationActor on an in-process stand-in of vLLM's AsyncLLM, for unit tests of the actor's own logic
(its pull loop, stop, bookkeeping): no engine process, no model."""

from __future__ import annotations

import asyncio
import sys
import types


class FakeVllm:
    """Three outputs per request, growing by one token each; with `hang_after` outputs, a first attempt waits
    there until cancelled, or until an abort pause (a reprefill sync) ends it with finish_reason "abort" and
    its tokens so far (a sample that is certainly running when the test acts). Records every request's
    prompt and every pause's mode."""

    def __init__(self, hang_after: int | None = None):
        self.hang_after = hang_after
        self.prompts: dict[str, list[int]] = {}
        self.pause_modes: list[str] = []
        self._cut: dict[str, asyncio.Event] = {}

    async def generate(self, prompt, params, request_id: str, lora_request=None):
        assert lora_request is None  # these engines serve no adapter
        self.prompts[request_id] = list(prompt)
        cut = self._cut[request_id] = asyncio.Event()
        try:
            for n in (1, 2, 3):
                await asyncio.sleep(0)
                yield _output(n, "stop" if n == 3 else None)
                if n == self.hang_after and "/r" not in request_id:  # "/r<k>": a continuation after a cut
                    await cut.wait()
                    yield _output(n, "abort")
                    return
        finally:
            self._cut.pop(request_id, None)

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.pause_modes.append(mode)
        if mode == "abort":
            for cut in self._cut.values():
                cut.set()

    async def resume_generation(self) -> None:
        pass


def _output(tokens: int, finish_reason: str | None):
    sample = types.SimpleNamespace(
        token_ids=list(range(tokens)), logprobs=None, finish_reason=finish_reason, stop_reason=None, text="abc"[:tokens]
    )
    return types.SimpleNamespace(outputs=[sample], metrics=None)  # as vLLM's RequestOutput when stats are off


def fake_generation_actor(monkeypatch, engine: FakeVllm | None = None):
    """A GenerationActor on `engine` (default: a FakeVllm that finishes every request); the two vLLM modules
    it imports per sample are stubbed in-process."""
    from open_instruct.generation.actor import GenerationActor
    from open_instruct.generation.engine_setup import engine_settings

    monkeypatch.setitem(sys.modules, "vllm.inputs", types.SimpleNamespace(tokens_input=lambda ids, **_: ids))
    monkeypatch.setitem(
        sys.modules, "vllm.v1.engine.exceptions", types.SimpleNamespace(EngineDeadError=type("Dead", (Exception,), {}))
    )

    class OnFakeVllm(GenerationActor):
        def sampling_params(self, request, sample_index, turn):
            return None  # the fake engine reads none

    actor = OnFakeVllm(0, engine_settings("unused", 64, partial_report_tokens=1))
    actor.state.engine, actor.state.target_concurrency = engine or FakeVllm(), 16
    actor.toolbox = types.SimpleNamespace(tools={})
    # Joining a continued sample decodes its tokens: one character per token id is enough here.
    actor.state.tokenizer = types.SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "".join(map(str, ids)))
    return actor
