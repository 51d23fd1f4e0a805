"""Benchmark workloads: heavy-tailed response lengths, tool calls and environment turns, applied inside the engines.

A benchmark must compare modes on the *same* samples, so a sample's shape is a function of its
id (`ShapedWorkload`), not of the random model. `ShapedGenerationActor` is the engine actor with the
workload applied through `GenerationActor.generate_sample` and its `sampling_params` hook:

* every sample gets its exact length (ignore_eos);
* with `tool_latency_s`, turn one ends halfway with a real `<wait>ID</wait>` call (forced through
  structured outputs) that the production multi-turn path sends to `LatencyToolServer` over HTTP; the
  server answers after an exponentially distributed wait seeded by the sample id, as an API would;
* with `env_calls`, the sample plays guess_number: that many forced `<guess>N</guess>` turns, each
  answered by the real environment, then the rest of its length.

Nothing about workloads travels on the core's messages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from open_instruct.generation.actor import GenerationActor
from open_instruct.messages import AgentRequest, Completion, EnvSpec, PromptRequest

WAIT_TOOL = "wait"  # the call name the tool workload's http tool is configured with


def capped_lognormal(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    """One heavy-tailed response length: lognormal around `median`, rounded, clamped to [1, cap]."""
    return max(1, min(cap, round(median * rng.lognormvariate(0.0, sigma))))


def lognormal_lengths(count: int, median: int, sigma: float, cap: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [capped_lognormal(rng, median, sigma, cap) for _ in range(count)]


def _seeded(key: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big"))


@dataclasses.dataclass(frozen=True)
class ShapedWorkload:
    name: str
    median_tokens: int
    sigma: float
    max_tokens: int
    tool_latency_s: float = 0.0  # mean wait of one real tool call at each sample's halfway point; 0 = none
    env_calls: int = 0  # guess_number turns per sample; 0 = none

    def length(self, sample_id: str) -> int:
        """The exact response length (model tokens) of sample `sample_id` ("<prompt id>/<sample index>")."""
        return capped_lognormal(_seeded(f"{self.name}/{sample_id}"), self.median_tokens, self.sigma, self.max_tokens)

    @property
    def calls(self) -> int:
        return self.env_calls or int(self.tool_latency_s > 0)

    def segments(self, sample_id: str) -> list[int]:
        """Model tokens of each turn before its call (and of the last turn): the length split evenly."""
        total, parts = self.length(sample_id), self.calls + 1
        return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]

    def call_text(self, sample_id: str, turn: int) -> str:
        if self.env_calls:
            return f"<guess>{100 - turn}</guess>"  # the secret is <= 50: every guess misses, every sample plays on
        return f"<{WAIT_TOOL}>{sample_id}</{WAIT_TOOL}>"


def run_config(args, response_length: int, flags: dict, extra_argv: tuple[str, ...] = ()):
    """The grpo_fast configuration of a benchmark's training run: `args.steps` steps of `args.prompts` x
    `args.samples` samples of the embedded model, no KL, a constant small learning rate, no evals or
    checkpoints; `flags` (name -> value) add to or override these."""
    from open_instruct.config.core import parse_config

    common = {
        # The settings docs/results/'s numbers were measured with (open-instruct's defaults: 42, 0.272).
        "seed": 1,
        "clip_higher": 0.2,
        "num_unique_prompts_rollout": args.prompts,
        "num_samples_per_prompt_rollout": args.samples,
        "total_episodes": args.steps * args.prompts * args.samples,
        "response_length": response_length,
        "max_prompt_token_length": 64,
        "pack_length": response_length + 64,
        "beta": 0,
        "learning_rate": 1e-5,
        "lr_scheduler_type": "constant",
        "num_evals": 0,
        "save_freq": 0,
        "vllm_kv_cache_gib": 0.5,
    }
    argv = [token for name, value in {**common, **flags}.items() for token in (f"--{name}", str(value))]
    return parse_config([*argv, *extra_argv])


class ShapedGenerationActor(GenerationActor):
    """GenerationActor with a `ShapedWorkload` applied to every sample (pass it to `cluster.Stack`)."""

    def __init__(self, engine_id, settings, reward_settings=None, reward_workers=1, workload=None, running=0):
        super().__init__(engine_id, settings, reward_settings, reward_workers)
        self.workload: ShapedWorkload | None = workload
        self.running = running

    def _derive_target(self) -> int:
        """`running` samples at once when given: more than fit in the KV cache at full length, as a scheduler
        that admits on typical lengths would run; vLLM preempts when the long ones outgrow the cache."""
        return self.running or super()._derive_target()

    def set_workload(self, workload: ShapedWorkload | None) -> None:
        self.workload = workload

    async def generate_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        w = self.workload
        if w is None:
            return await super().generate_sample(request, sample_index)
        sample_id = f"{request.prompt_id}/{sample_index}"
        multi_turn = w.calls > 0 and min(w.segments(sample_id)) > 0
        # Multi-turn samples keep --response_length as their budget (calls and observations take room too);
        # `sampling_params` gives each turn its exact length.
        max_tokens = request.sampling.max_tokens if multi_turn else w.length(sample_id)
        exact = dataclasses.replace(request.sampling, max_tokens=max_tokens, ignore_eos=True, stop_strings=())
        request = dataclasses.replace(request, sampling=exact)
        if not multi_turn:
            return await self.engine_request(request, sample_index)
        if w.env_calls:
            secret = 1 + w.length(sample_id) % 50
            env = EnvSpec("guess_number", (("number", secret),))
            # After its last call the sample answers in one more turn: the rest of its length.
            request = dataclasses.replace(request, agent=AgentRequest(envs=(env,), max_steps=w.env_calls))
        return await self.multi_turn_sample(request, sample_index)

    def sampling_params(self, request: PromptRequest, sample_index: int, turn: int):
        from vllm.sampling_params import StructuredOutputsParams

        params = super().sampling_params(request, sample_index, turn)
        w = self.workload
        if w is None or not w.calls:
            return params
        sample_id = f"{request.prompt_id}/{sample_index}"
        segments = w.segments(sample_id)
        if min(segments) == 0:  # too short to split: generate_sample made it a single-turn sample
            return params
        if turn >= len(segments) - 1:
            params.max_tokens = min(params.max_tokens, segments[-1])
            return params
        # Filler of the exact length (the tokenizer spells a-z one token per letter), then the call; the
        # grammar ends the turn with EOS, so ignore_eos must be off for it.
        regex = f"[a-z]{{{segments[turn]}}}" + re.escape(w.call_text(sample_id, turn))
        params.ignore_eos = False
        params.structured_outputs = StructuredOutputsParams(regex=regex)
        return params


class LatencyToolServer:
    """An HTTP JSON service that answers `{"query": sample id}` after an exponential wait seeded by the id."""

    def __init__(self, mean_s: float):
        mean = mean_s

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                query = json.loads(self.rfile.read(int(self.headers["Content-Length"]))).get("query", "")
                wait = _seeded(query).expovariate(1.0 / mean) if mean > 0 else 0.0
                time.sleep(wait)
                body = json.dumps({"result": f"waited {wait:.2f} s"}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller stopped waiting: its sample was aborted when a mode's run ended

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def tool_flags(self) -> list[str]:
        """grpo_fast flags that configure the `wait` tool against this server."""
        config = {"url": self.url, "result_key": "result", "timeout": 600, "max_retries": 0}
        return ["--tools", "http", "--tool_call_names", WAIT_TOOL, "--tool_configs", json.dumps(config)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
