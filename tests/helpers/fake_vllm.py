"""A GenerationActor on an in-process stand-in of vLLM's AsyncLLM, for unit tests of the actor's own logic
(its pull loop, stop, bookkeeping): no engine process, no model."""

from __future__ import annotations

import asyncio
import sys
import types


class FakeVllm:
    """Three outputs per request, growing by one token each; with `hang_after` outputs, waits there until
    cancelled instead (a sample that is certainly running when the test acts)."""

    def __init__(self, hang_after: int | None = None):
        self.hang_after = hang_after

    async def generate(self, prompt, params, request_id: str):
        for n in (1, 2, 3):
            await asyncio.sleep(0)
            out = types.SimpleNamespace(
                token_ids=list(range(n)),
                logprobs=None,
                finish_reason="stop" if n == 3 else None,
                stop_reason=None,
                text="abc"[:n],
            )
            yield types.SimpleNamespace(outputs=[out])
            if n == self.hang_after:
                await asyncio.Event().wait()


def fake_generation_actor(monkeypatch, engine: FakeVllm | None = None):
    """A GenerationActor on `engine` (default: a FakeVllm that finishes every request); the two vLLM modules
    it imports per sample are stubbed in-process."""
    from open_instruct.generation.actor import GenerationActor
    from open_instruct.generation.engine_setup import engine_settings

    monkeypatch.setitem(sys.modules, "vllm.inputs", types.SimpleNamespace(tokens_input=lambda ids, **_: ids))
    monkeypatch.setitem(
        sys.modules, "vllm.v1.engine.exceptions", types.SimpleNamespace(EngineDeadError=type("Dead", (Exception,), {}))
    )
    actor = GenerationActor(0, engine_settings("unused", 64, partial_report_tokens=1))
    actor.engine, actor.toolbox, actor.target_concurrency = engine or FakeVllm(), types.SimpleNamespace(tools={}), 16
    actor.sampling_params = lambda request, sample_index, turn: None
    return actor
