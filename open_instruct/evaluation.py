"""Evaluation rounds on the eval mix, run by the same engines without stopping training.

A round's prompts go into the shared prompt queue (greedy, one sample each); their
Completions come back through the result queue mixed with training samples and are routed
here by `is_eval`. When the last one arrives the round reports `eval/*` metrics and a small
table of sample completions. Only one round is in flight at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from open_instruct.messages import Completion, PromptRequest, SamplingSettings
from open_instruct.prompt_feeder import make_request


def eval_sampling(train: SamplingSettings) -> SamplingSettings:
    """Greedy decoding: eval reward then measures the policy, not the sampling noise."""
    return replace(train, temperature=0.0, top_p=1.0)


@dataclass
class EvalRound:
    step: int
    requests: list[PromptRequest]
    completions: list[Completion] = field(default_factory=list)

    @classmethod
    def build(cls, rows, step: int, sampling: SamplingSettings, seed: int, version: int, now: float) -> EvalRound:
        greedy = eval_sampling(sampling)
        requests = [
            make_request(row, f"eval{step}:{row.prompt_id}", greedy, 1, seed, version, is_eval=True, queued_at=now)
            for row in rows
        ]
        return cls(step, requests)

    @property
    def done(self) -> bool:
        return len(self.completions) >= sum(r.num_samples for r in self.requests)

    def add(self, completion: Completion) -> None:
        self.completions.append(completion)

    def metrics(self) -> dict[str, float]:
        count = max(1, len(self.completions))
        return {
            "eval/verifiable_reward": sum(c.reward for c in self.completions) / count,
            "eval/correct_rate": sum(1 for c in self.completions if c.reward > 0) / count,
            "eval/stop_rate": sum(1 for c in self.completions if c.finish_reason == "stop") / count,
            "eval/sequence_lengths": sum(len(c.response_token_ids) for c in self.completions) / count,
            "eval/errors": float(sum(1 for c in self.completions if c.finish_reason == "error")),
            "eval/samples": float(len(self.completions)),
            "eval/started_at_step": float(self.step),
        }

    def table(self, tokenizer, rows: int = 8) -> list[dict]:
        """A few prompt / response / reward rows for eyeballing (wandb table, eval_samples.jsonl)."""
        shown = sorted(self.completions, key=lambda c: c.prompt_id)[:rows]

        def prompt_text(ids) -> str:
            return tokenizer.decode(ids, skip_special_tokens=False) if tokenizer is not None else str(list(ids))

        return [
            {
                "prompt": prompt_text(c.prompt_token_ids)[-300:],
                "response": c.response_text[:500],
                "reward": c.reward,
                "finish_reason": c.finish_reason,
            }
            for c in shown
        ]
