"""One real vLLM engine whose tool turns can be forced (`ForcedTurnsActor`), for the tool and environment tests
(tests/integration/test_agent_engine.py).

The random tiny model never writes a tool call by itself; the tests force the first turns through structured
outputs and check what the tools put back. Every such test needs the same engine and the same wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def forced_turns_engine(model_path: str, tools: tuple, max_model_len: int = 512, prompt_capacity: int = 8) -> Iterator:
    """A started EnginePool of one ForcedTurnsActor with `tools` (ToolSpecs); Ray is shut down afterwards."""
    import ray
    from helpers.forced_turns import ForcedTurnsActor

    from open_instruct import cluster
    from open_instruct.agents.settings import AgentSettings
    from open_instruct.generation.engine_setup import engine_settings
    from open_instruct.generation.pool import EnginePool
    from open_instruct.rewards import RewardSettings

    agent = AgentSettings(tool_specs=tools, max_model_len=max_model_len)
    settings = engine_settings(model_path=model_path, max_model_len=max_model_len, vllm_kv_cache_gib=0.25, agent=agent)
    cluster.init_ray(min_logical_cpus=3)
    actors = cluster.create_generation_actors(settings, 1, RewardSettings(), actor_class=ForcedTurnsActor)
    pool = EnginePool(actors, prompt_capacity=prompt_capacity)
    pool.start()
    try:
        yield pool
    finally:
        pool.shutdown()
        ray.shutdown()


def the_one_sample(pool, timeout_s: float):
    """The single completion a test submitted, polled until it arrives (a deadline, not a wait)."""
    got, deadline = [], time.monotonic() + timeout_s
    while not got:
        assert time.monotonic() < deadline, "the sample did not arrive"
        got = pool.poll(timeout_s=0.2)
    [completion] = got
    return completion
