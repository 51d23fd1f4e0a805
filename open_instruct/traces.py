"""--save_traces: every trained rollout on disk, one JSON line each, in shards of 10,000 records.

Files in --rollouts_save_path: `<run_name>_metadata.jsonl` (one line per run start: the run name, the
time and the whole config) and `<run_name>_rollouts_NNNNNN.jsonl`. A record is:

    step, prompt_id, sample_index, prompt_token_ids, response_token_ids, response_text,
    reward, advantage (group-relative, as trained; 0 for groups the zero-std filter drops),
    finish_reason, verifier_names, ground_truths, verifier_scores, reward_errors,
    behaviour_logprobs (null for tool/environment output), version_spans [[version, start, end]],
    admitted_version, engine_id, continued_tokens (response tokens kept from an interrupted attempt: an
    engine died, or the run stopped and resumed), observation_spans [[start, end]] and tool_calls
    [{name, ok, timed_out, runtime_s, output_chars, error}] (multi-turn samples; else empty).

`read_traces` yields the records back (shard order, then write order).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from open_instruct.advantages import group_advantages

SHARD_RECORDS = 10_000


class TraceWriter:
    def __init__(self, directory: str, run_name: str, config: dict, shard_records: int = SHARD_RECORDS):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.run_name, self.shard_records = run_name, shard_records
        existing = sorted(self.directory.glob(f"{run_name}_rollouts_*.jsonl"))
        # A resumed run appends after the shards it already wrote.
        self.shard = len(existing) - 1 if existing else 0
        self.in_shard = len(existing[-1].read_text().splitlines()) if existing else 0
        with open(self.directory / f"{run_name}_metadata.jsonl", "a") as f:
            f.write(json.dumps({"run_name": run_name, "started_at": time.time(), "config": config}, default=str) + "\n")

    def write(self, step: int, groups: Sequence, requests: dict, normalization: str) -> int:
        """Append one record per sample of `groups` (replay-buffer groups; `requests` by prompt id, for the
        labels); returns the records written so far."""
        records = [
            _record(step, completion, float(advantage), requests.get(group.prompt_id))
            for group in groups
            for completion, advantage in zip(group.completions, _advantages(group, normalization))
        ]
        while records:
            room = self.shard_records - self.in_shard
            if room <= 0:
                self.shard, self.in_shard = self.shard + 1, 0
                continue
            chunk, records = records[:room], records[room:]
            with open(self._path(self.shard), "a") as f:
                f.writelines(json.dumps(r, default=str) + "\n" for r in chunk)
            self.in_shard += len(chunk)
        return self.shard * self.shard_records + self.in_shard

    def _path(self, shard: int) -> Path:
        return self.directory / f"{self.run_name}_rollouts_{shard:06d}.jsonl"


def _advantages(group, normalization: str) -> list[float]:
    rewards = torch.tensor([[c.reward for c in group.completions]], dtype=torch.float64)
    return group_advantages(rewards, normalization)[0].tolist()


def _record(step: int, c, advantage: float, request) -> dict:
    agent = c.agent
    return {
        "step": step,
        "prompt_id": c.prompt_id,
        "sample_index": c.sample_index,
        "prompt_token_ids": list(c.prompt_token_ids),
        "response_token_ids": list(c.response_token_ids),
        "response_text": c.response_text,
        "reward": c.reward,
        "advantage": advantage,
        "finish_reason": c.finish_reason,
        "verifier_names": list(request.verifier_names) if request else [],
        "ground_truths": list(request.ground_truths) if request else [],
        "verifier_scores": dict(c.verifier_scores),
        "reward_errors": list(c.reward_errors),
        "behaviour_logprobs": [None if math.isnan(x) else x for x in c.behaviour_logprobs],
        "version_spans": [[s.version, s.start, s.end] for s in c.version_spans],
        "admitted_version": c.admitted_version,
        "engine_id": c.engine_id,
        "continued_tokens": c.continued_tokens,
        "observation_spans": [list(span) for span in agent.observation_spans] if agent else [],
        "tool_calls": [dataclasses.asdict(call) for call in agent.calls] if agent else [],
    }


def read_traces(directory: str, run_name: str) -> Iterator[dict]:
    for path in sorted(Path(directory).glob(f"{run_name}_rollouts_*.jsonl")):
        with open(path) as f:
            yield from (json.loads(line) for line in f if line.strip())
