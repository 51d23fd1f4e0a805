"""Evaluation rounds on the eval mix, run by the same engines without stopping training.

A round's prompts go into the shared prompt queue (greedy, one sample each by default; with
--eval_pass_at_k n or --eval_top_p, n samples at the training temperature); their
Completions come back through the result queue mixed with training samples and are routed
here by `is_eval`. When the last one arrives the round reports `eval/*` metrics and a small
table of sample completions. Only one round is in flight at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from open_instruct.messages import Completion, PromptRequest, SamplingSettings
from open_instruct.prompt_feeder import make_request


def eval_sampling(train: SamplingSettings, top_p: float | None = None, sampled: bool = False) -> SamplingSettings:
    """Greedy decoding by default: eval reward then measures the policy, not the sampling noise. Sampled
    (pass@k needs several different samples): the training temperature, and `top_p` if given."""
    if not sampled:
        return replace(train, temperature=0.0, top_p=1.0)
    return replace(train, top_p=train.top_p if top_p is None else top_p)


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from n samples of which `correct` are correct: 1 - C(n - c, k) / C(n, k)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


@dataclass
class EvalRound:
    step: int
    requests: list[PromptRequest]
    completions: list[Completion] = field(default_factory=list)
    max_reward: float = 0.0  # a sample is correct for pass@k when its reward reaches this

    @classmethod
    def build(
        cls, rows, step: int, sampling: SamplingSettings, seed: int, version: int, now: float, **options
    ) -> EvalRound:
        """`options`: samples (--eval_pass_at_k), top_p (--eval_top_p), max_reward (a perfect sample's)."""
        samples, top_p = options.get("samples", 1), options.get("top_p")
        chosen = eval_sampling(sampling, top_p, sampled=samples > 1 or top_p is not None)
        requests = [
            make_request(
                row, f"eval{step}:{row.prompt_id}", chosen, samples, seed, version, is_eval=True, queued_at=now
            )
            for row in rows
        ]
        return cls(step, requests, max_reward=options.get("max_reward", 0.0))

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
            **self.pass_at_k_metrics(),
        }

    def pass_at_k_metrics(self) -> dict[str, float]:
        """eval/pass_at_{k} for k = 1, 2, 4, ... <= the samples per prompt, unbiased, averaged over prompts."""
        n = max((r.num_samples for r in self.requests), default=1)
        if n < 2:
            return {}
        by_prompt: dict[str, list[Completion]] = {}
        for c in self.completions:
            by_prompt.setdefault(c.prompt_id, []).append(c)
        ks = [k for k in (2**i for i in range(n.bit_length())) if k <= n] + ([n] if n & (n - 1) else [])
        out = {}
        for k in ks:
            scores = [pass_at_k(len(cs), sum(c.reward >= self.max_reward for c in cs), k) for cs in by_prompt.values()]
            out[f"eval/pass_at_{k}"] = sum(scores) / max(1, len(scores))
        return out

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
