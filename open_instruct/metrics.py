"""Per-step metrics the loop derives from what it trained and from the engines' counters (pure).

* `rollout_metrics`: what the trained samples looked like (reward, length, stop rate) and how
  stale they were (version lag per sample and per token, group latency).
* `async_steps_needed`: the least lookahead that keeps the learner fed (Little's law).
* `engine_window`: the engines' occupancy and throughput between two `EngineStats` snapshots.
* `ErrorWindow`: the share of recent training samples that failed, against --max_error_fraction.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from open_instruct.messages import Completion, EngineStats


def rollout_metrics(completions: Sequence[Completion], learner_version: int) -> dict[str, float]:
    """What the trained samples looked like: reward, length, stop rate, staleness."""
    n = max(1, len(completions))
    lags = [learner_version - c.min_version for c in completions]
    # Per token, a straggler updated in flight is mostly fresh even when its first tokens are old. Only
    # sampled tokens have a version: tool and environment output does not.
    token_lag = sum(learner_version * c.model_token_count - version_token_sum(c) for c in completions)
    tokens = sum(c.model_token_count for c in completions)
    latencies = group_latencies(completions)
    return {
        "objective/verifiable_reward": sum(c.reward for c in completions) / n,
        "objective/correct_rate": sum(1 for c in completions if c.reward > 0) / n,
        "val/sequence_lengths": sum(len(c.response_token_ids) for c in completions) / n,
        "val/sequence_lengths_min": float(min((len(c.response_token_ids) for c in completions), default=0)),
        "val/sequence_lengths_max": float(max((len(c.response_token_ids) for c in completions), default=0)),
        "val/stop_rate": sum(1 for c in completions if c.finish_reason == "stop") / n,
        "val/error_samples": float(sum(1 for c in completions if c.finish_reason == "error")),
        "staleness/version_lag_avg": sum(lags) / n,
        "staleness/version_lag_max": float(max(lags, default=0)),
        "staleness/multi_version_frac": sum(1 for c in completions if c.spans_versions) / n,
        "staleness/versions_spanned_max": float(max((c.versions_spanned for c in completions), default=0)),
        "staleness/token_lag_avg": token_lag / tokens if tokens else 0.0,
        "time/group_latency_s_avg": mean(latencies),
        "time/group_latency_s_max": max(latencies, default=0.0),
    }


def agent_metrics(completions: Sequence[Completion]) -> dict[str, float]:
    """Tool calls, errors, timeouts and runtime per tool, turns per sample, tool wait, environment metrics."""
    traces = [c.agent for c in completions if c.agent is not None]
    if not traces:
        return {}
    n = len(traces)
    calls = [call for trace in traces for call in trace.calls]
    out = {
        "agent/turns_per_sample": sum(t.turns for t in traces) / n,
        "agent/tool_wait_s_per_sample": sum(t.tool_wait_s for t in traces) / n,
        "agent/observation_tokens_per_sample": sum(t.observation_tokens for t in traces) / n,
        "agent/done_rate": sum(1 for t in traces if t.done) / n,
    }
    for name in sorted({call.name for call in calls}) + ["aggregate"]:
        mine = [call for call in calls if name in ("aggregate", call.name)]
        out |= {
            f"tools/{name}/calls_per_sample": len(mine) / n,
            f"tools/{name}/errors": float(sum(1 for call in mine if call.error is not None and not call.timed_out)),
            f"tools/{name}/timeouts": float(sum(1 for call in mine if call.timed_out)),
            f"tools/{name}/failure_rate": sum(1 for call in mine if not call.ok) / max(1, len(mine)),
            f"tools/{name}/runtime_s_avg": mean([call.runtime_s for call in mine]),
        }
    for key in sorted({key for t in traces for key in t.env_metrics}):
        values = [t.env_metrics[key] for t in traces if key in t.env_metrics]
        out[f"env/{key}"] = sum(values) / len(values)
    return out


def version_token_sum(completion: Completion) -> int:
    """Sum over response tokens of the weight version that generated each one."""
    spans = completion.version_spans
    covered = sum(s.end - s.start for s in spans)
    uncovered = completion.model_token_count - covered  # no spans reported: the admission version
    return sum(s.version * (s.end - s.start) for s in spans) + max(0, uncovered) * completion.admitted_version


def group_latencies(completions: Iterable[Completion]) -> list[float]:
    """Per prompt: from its admission to its last sample's finish (what the learner waits on)."""
    spans: dict[str, tuple[float, float]] = {}
    for c in completions:
        queued, finished = spans.get(c.prompt_id, (math.inf, -math.inf))
        spans[c.prompt_id] = (min(queued, c.queued_at), max(finished, c.finished_at))
    return [finished - queued for queued, finished in spans.values()]


def async_steps_needed(group_latency_s: float, busy_step_s: float) -> int:
    """The least --async_steps that lets the learner train a batch every `busy_step_s`.

    The feeder lets (async_steps + 1) batches of prompts be admitted and untrained. When the
    learner takes a batch, one batch of them is complete and, by Little's law, latency / step
    batches are still generating: async_steps + 1 >= latency / step + 1."""
    if busy_step_s <= 0 or group_latency_s <= 0:
        return 0
    return math.ceil(group_latency_s / busy_step_s - 1e-9)


def engine_window(now: list[EngineStats], before: list[EngineStats] | None, window_s: float) -> dict[str, float]:
    """Idle fraction and generated tokens/s of all engines between two snapshots (`before` None: since start)."""
    # A replaced engine starts its counters again: its old snapshot is no baseline.
    previous = [p if p and p.uptime_s <= s.uptime_s else None for s, p in zip(now, before or [None] * len(now))]
    uptime = sum(s.uptime_s - (p.uptime_s if p else 0.0) for s, p in zip(now, previous))
    idle = sum(s.idle_s - (p.idle_s if p else 0.0) for s, p in zip(now, previous))
    tokens = sum(s.generated_tokens - (p.generated_tokens if p else 0) for s, p in zip(now, previous))
    sample_s = sum(s.sample_s - (p.sample_s if p else 0.0) for s, p in zip(now, previous))
    parked_s = sum(s.parked_sample_s - (p.parked_sample_s if p else 0.0) for s, p in zip(now, previous))
    return {
        # Of the time samples spent in flight, the share they waited on tools (no engine slot held).
        "time/parked_on_tools_frac": parked_s / sample_s if sample_s > 0 else 0.0,
        "time/generation_idle_frac": idle / uptime if uptime > 0 else 0.0,
        "perf/generated_tokens_per_s": tokens / window_s if window_s > 0 else 0.0,
        "engines/preempted_requests_total": float(sum(s.preempted_requests for s in now)),
        "engines/recomputed_tokens_total": float(sum(s.recomputed_tokens for s in now)),
        "weight_sync/reprefilled_samples_total": float(sum(s.reprefilled_samples for s in now)),
        "weight_sync/reprefill_tokens_total": float(sum(s.reprefill_tokens for s in now)),
    }


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


@dataclass
class PromptOutcomes:
    """Admitted prompts that will not be trained, by fate, and the engine time spent on aborted samples.

    Every admitted prompt ends trained, requeued (admitted again under a new id), dropped (stale),
    filtered (zero reward spread, with --active_sampling), failed (every sample of a batch failed: it was
    set aside untrained) or untrained at the end of the run: the per-step ids go to the run log, so
    admitted = trained + requeued + dropped + filtered + failed + untrained can be checked prompt by prompt.
    """

    requeued: int = 0
    dropped: int = 0
    filtered: int = 0
    failed: int = 0
    aborted_samples: int = 0
    aborted_tokens: int = 0
    step_ids: dict[str, list[str]] = field(default_factory=dict)  # this step's ids by fate, until logged

    def record(self, fate: str, prompt_id: str) -> None:
        setattr(self, fate, getattr(self, fate) + 1)
        self.step_ids.setdefault(fate, []).append(prompt_id)

    def count_abort(self, completion: Completion) -> None:
        self.aborted_samples += 1
        self.aborted_tokens += len(completion.response_token_ids)

    def take_step_ids(self) -> dict[str, list[str]]:
        ids, self.step_ids = self.step_ids, {}
        return ids

    def totals(self) -> dict[str, int]:
        return {
            "requeued": self.requeued,
            "dropped": self.dropped,
            "filtered": self.filtered,
            "failed": self.failed,
            "aborted_samples": self.aborted_samples,
            "aborted_tokens": self.aborted_tokens,
        }

    def metrics(self) -> dict[str, float]:
        return {
            "offpolicy/requeued_prompts_total": float(self.requeued),
            "offpolicy/dropped_prompts_total": float(self.dropped),
            "batch/filtered_zero_std_prompts_total": float(self.filtered),
            "batch/failed_prompts_total": float(self.failed),
            "batch/refilled_prompts_total": float(self.requeued + self.dropped + self.filtered + self.failed),
            "offpolicy/aborted_samples_total": float(self.aborted_samples),
            "offpolicy/aborted_tokens_total": float(self.aborted_tokens),
        }


# ----------------------------------------------------------------------------- failed samples

# A verifier error names its sample ("sample <prompt>/<j>: verifier ..."): the same failure on two samples
# differs only there, so it is left out when failures are grouped and shown.
_SAMPLE_PREFIX = re.compile(r"^sample \S+: ")


def sample_error(completion: Completion) -> str | None:
    """Why a training sample failed, or None: the engine could not generate it (finish_reason "error"), or a
    verifier could not score it (`reward_errors`: its reward is a stand-in 0, not a judgement). An aborted
    sample was generating until it was cut on purpose, and a failed tool call is part of what the model did:
    neither is a failure."""
    if completion.finish_reason == "error":
        return completion.error or "no message"
    if completion.reward_errors:
        return _SAMPLE_PREFIX.sub("", completion.reward_errors[0])
    return None


def too_many_errors(errors: int, samples: int, max_fraction: float, min_samples: int) -> bool:
    """More than `max_fraction` of `samples` failed, judged only on `min_samples` or more (fewer are bad luck
    as often as a bug)."""
    return samples >= max(1, min_samples) and errors > max_fraction * samples


def common_errors(messages: Iterable[str], top: int = 3) -> str:
    """The most common failure messages with their counts. Messages that differ only in numbers (lengths,
    ids, ports) are one failure, shown by its first message."""
    groups: dict[str, list] = {}
    for message in messages:
        groups.setdefault(re.sub(r"\d+", "#", message), [0, message])[0] += 1
    ranked = sorted(groups.values(), key=lambda group: -group[0])
    shown = "; ".join(f"{message[:200]!r} ({count} sample{'s' * (count != 1)})" for count, message in ranked[:top])
    return shown + (f"; {len(ranked) - top} other messages" if len(ranked) > top else "")


class ErrorWindow:
    """The last `size` finished training samples, each failed (its message) or not, for --max_error_fraction.

    Counted as samples arrive, not as they are trained: a failed group can be filtered for zero reward spread
    or dropped for its age, and its failures must count all the same. So do the aborted samples of such a
    group (as not failed): leaving them out would leave its fast failures alone in the window. Eval samples
    are judged elsewhere (eval/errors)."""

    def __init__(self, size: int, max_fraction: float):
        self.size, self.max_fraction = size, max_fraction
        self.window: deque[str | None] = deque(maxlen=size)
        self.errors = 0

    def add(self, completions: Iterable[Completion]) -> None:
        for completion in completions:
            if completion.is_eval:
                continue
            if len(self.window) == self.size:
                self.errors -= int(self.window[0] is not None)  # leaves the window as this one enters
            message = sample_error(completion)
            self.window.append(message)
            self.errors += int(message is not None)

    @property
    def share(self) -> float:
        return self.errors / len(self.window) if self.window else 0.0

    def nothing_succeeded(self, step: int) -> str | None:
        """The run cannot learn, or None: the window is full and every sample in it failed."""
        if len(self.window) < self.size or self.errors < self.size:
            return None
        return (
            f"step {step}: all of the last {self.size} finished training samples failed (in the engines or their "
            f"verifiers), so the run has nothing to learn from; most common: {common_errors(self.window)}"
        )

    def cause(self, step: int) -> str | None:
        """Why the run must stop, or None: within the limit, or fewer than `size` samples finished yet."""
        if not too_many_errors(self.errors, len(self.window), self.max_fraction, self.size):
            return None
        return (
            f"step {step}: {self.errors} of the last {len(self.window)} finished training samples failed "
            f"({self.share:.1%}, more than --max_error_fraction {self.max_fraction}); most common: "
            f"{common_errors(message for message in self.window if message is not None)}"
        )
