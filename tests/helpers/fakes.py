"""In-process fakes of the training loop's collaborators, on a virtual clock (no Ray, vLLM or DeepSpeed).

`ScriptedEngines` finishes each sample a scripted time after its prompt was submitted, with a
scripted length and reward; prompts and results travel on `LocalChannel`s and the real
`DeliveryLedger` raises on any duplicate or unknown sample. `stop("interrupt")` keeps the running
samples' tokens so far as partial samples, and a request carrying partials continues them (its
Completion starts with the kept tokens and spans), as the real engine pool does. `FakeLearners` and `FakeWeightSync`
record what the loop asked of them. Time only moves when the loop waits: a poll with a timeout
moves the clock to the next finish, a learner step and a weight sync by their fixed costs.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from open_instruct.config.core import parse_config
from open_instruct.data.dataset import PromptRow
from open_instruct.generation.channels import LocalChannel
from open_instruct.generation.ledger import DeliveryLedger
from open_instruct.messages import Completion, EngineStats, PartialSample, PromptRequest, StepReport, VersionSpan
from open_instruct.staleness import oldest_trained_version


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def time(self) -> float:
        return self.now


@dataclass(frozen=True)
class Script:
    """What one sample will be: its response length, seconds from submission to finish, reward, and how it
    failed, if it did (in the engine: finish_reason "error"; in its verifier: `reward_error`)."""

    length: int = 4
    latency_s: float = 1.0
    reward: float = 1.0
    finish_reason: str = "stop"
    reward_error: str | None = None  # a verifier that could not score it (RewardScorer's message format)


def alternating_rewards(request: PromptRequest, sample_index: int) -> Script:
    """Every group has reward spread (zero-std groups would be filtered by the real learner group)."""
    return Script(reward=float(sample_index % 2))


class ScriptedEngines:
    def __init__(self, clock: FakeClock, script: Callable[[PromptRequest, int], Script] = alternating_rewards):
        self.clock, self.script = clock, script
        self.prompts: LocalChannel[PromptRequest] = LocalChannel(name="prompt queue")
        self.results: LocalChannel[Completion] = LocalChannel(name="result queue")
        self.ledger = DeliveryLedger()
        self.submitted: list[tuple[float, PromptRequest]] = []  # (clock, request) in submission order
        self.versions: list[tuple[float, int]] = [(-math.inf, 0)]  # (from time, weight version)
        self.stopped: str | None = None
        self.aborts: list[tuple[float, int, list[str]]] = []  # (clock, min_version, prompt ids) per call
        self._running: list[tuple[float, int, PromptRequest, int, float, Script]] = []
        self._order = 0
        self.partials: dict[tuple[str, int], PartialSample] = {}  # cut by stop("interrupt")
        self.continued_samples = 0

    # -- the loop's side

    def start_loops(self) -> None:
        self.started_at = self.clock.now

    def submit(self, requests: list[PromptRequest]) -> None:
        for request in requests:
            self.ledger.admit(request)
            self.continued_samples += len(request.partials)
            self.prompts.put(request)
            self.submitted.append((self.clock.now, request))
        for request in self.prompts.get_all():  # unbounded engines: everything starts at once
            for j in request.samples_to_generate():
                script = self.script(request, j)
                self._order += 1
                heapq.heappush(
                    self._running, (self.clock.now + script.latency_s, self._order, request, j, self.clock.now, script)
                )

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        self._deliver_due()
        if not self.results.depth() and timeout_s > 0:
            next_finish = self._running[0][0] if self._running else math.inf
            self.clock.now = max(self.clock.now, min(self.clock.now + timeout_s, next_finish))
            self._deliver_due()
        return self.results.get_all()

    def stats(self) -> list[EngineStats]:
        uptime = self.clock.now - self.started_at
        return [EngineStats(0, 8, len(self._running), 0, 0.0, 0, 0, 0, uptime, 0.0, 0.0, 0.0, 0, self.versions[-1][1])]

    def pool_metrics(self) -> dict[str, float]:
        return {
            "queue/prompt_depth": self.prompts.depth(),
            "queue/result_depth": self.results.depth(),
            "engines/continued_samples_total": float(self.continued_samples),
        }

    def stop(self, mode: str = "finish") -> list[Completion]:
        self.stopped = mode
        self._deliver_due()
        if mode == "interrupt":
            for finished, _, request, j, started, script in self._running:
                if not request.is_eval:
                    done = int(script.length * (self.clock.now - started) / (finished - started))
                    kept = request.partial_of(j)
                    tokens = (kept.token_ids if kept else ()) + tuple(range(7, 7 + done))
                    spans = (kept.version_spans if kept else ()) + self._spans(started, self.clock.now, done)
                    self.partials[(request.prompt_id, j)] = PartialSample(j, tokens, (-1.0,) * len(tokens), spans)
            self._running = []
        return self.results.get_all()

    def partial_samples(self, prompt_id: str) -> tuple[PartialSample, ...]:
        return tuple(p for (pid, _), p in sorted(self.partials.items()) if pid == prompt_id)

    def abort_stale(self, min_version: int, prompt_ids: list[str]) -> None:
        """As the real engines: running samples whose first token is older than `min_version`, and every
        sample of `prompt_ids`, end now with what they generated so far (finish_reason "abort")."""
        doomed = set(prompt_ids)
        self.aborts.append((self.clock.now, min_version, sorted(doomed)))
        keep = []
        for finished, order, request, j, started, script in self._running:
            stale = self._version_at(started) < min_version or request.prompt_id in doomed
            if stale and not request.is_eval:
                done = int(script.length * (self.clock.now - started) / (finished - started))
                partial = Script(done, script.latency_s, 0.0, "abort")
                self._deliver(request, j, started, self.clock.now, partial)
            else:
                keep.append((finished, order, request, j, started, script))
        heapq.heapify(keep)
        self._running = keep

    # -- the weight sync's side

    def load_version(self, version: int) -> None:
        self.versions.append((self.clock.now, version))

    # -- helpers

    @property
    def admitted_ids(self) -> list[str]:
        return [r.prompt_id for _, r in self.submitted if not r.is_eval]

    def _deliver_due(self) -> None:
        while self._running and self._running[0][0] <= self.clock.now:
            finished, _, request, j, started, script = heapq.heappop(self._running)
            self._deliver(request, j, started, finished, script)

    def _deliver(self, request: PromptRequest, j: int, started: float, finished: float, script: Script) -> None:
        kept = request.partial_of(j) or PartialSample(j, (), (), ())
        n, rest = len(kept.token_ids), max(script.length - len(kept.token_ids), 0)  # only the rest is generated
        spans = tuple(VersionSpan(s.version, s.start + n, s.end + n) for s in self._spans(started, finished, rest))
        completion = Completion(
            prompt_id=request.prompt_id,
            sample_index=j,
            prompt_token_ids=request.prompt_token_ids,
            response_token_ids=kept.token_ids + tuple(range(7 + n, 7 + n + rest)),
            behaviour_logprobs=kept.logprobs + (-1.0,) * rest,
            finish_reason=script.finish_reason,  # type: ignore[arg-type]
            error="scripted engine failure" if script.finish_reason == "error" else None,
            version_spans=kept.version_spans + spans,
            continued_tokens=n,
            admitted_version=request.admitted_version,
            engine_id=0,
            reward=script.reward,
            reward_errors=(f"sample {request.prompt_id}/{j}: verifier 'gsm8k': {script.reward_error}",)
            if script.reward_error
            else (),
            is_eval=request.is_eval,
            queued_at=request.queued_at,
            started_at=started,
            finished_at=finished,
        )
        self.ledger.deliver(completion)
        self.results.put(completion)

    def _version_at(self, t: float) -> int:
        return max((v for at, v in self.versions if at <= t), default=0)

    def _spans(self, started: float, finished: float, length: int) -> tuple[VersionSpan, ...]:
        """Tokens are generated at an even pace; a weight sync mid-sample splits its spans (in flight)."""
        spans, start = [], 0
        version = self._version_at(started)
        for t, v in self.versions:
            if started < t < finished:
                cut = int(length * (t - started) / (finished - started))
                if cut > start:
                    spans.append(VersionSpan(version, start, cut))
                    start = cut
                version = v
        if length > start:
            spans.append(VersionSpan(version, start, length))
        return tuple(spans)


class FakeLearners:
    """Records every batch; `on_step(step)` lets a test act mid-run (e.g. request a stop); `health(lag)` gives
    the step's off-policy metrics from the oldest trained token's lag (none: the step reports none)."""

    def __init__(
        self,
        clock: FakeClock,
        step_s: float = 2.0,
        on_step: Callable[[int], None] | None = None,
        health: Callable[[int], dict] | None = None,
    ):
        self.clock, self.step_s, self.on_step, self.health = clock, step_s, on_step, health
        self.trained: list[list] = []  # groups of each step
        self.version = 0

    def train_step(self, groups, step: int) -> StepReport:
        started = self.clock.now
        self.clock.now += self.step_s
        self.trained.append(list(groups))
        self.version += 1
        if self.on_step is not None:
            self.on_step(step)
        tokens = sum(len(c.response_token_ids) for g in groups for c in g.completions)
        metrics = {"learner/step_s": self.step_s, "loss/policy_avg": 0.0}
        if self.health is not None:
            oldest = [oldest_trained_version(c, g.trained_from_version) for g in groups for c in g.completions]
            metrics |= self.health(step - min(v for v in oldest if v is not None))
        return StepReport(metrics, tokens, started, self.clock.now)

    @property
    def trained_ids(self) -> list[str]:
        return [g.prompt_id for groups in self.trained for g in groups]

    def save_model(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "version.txt").write_text(str(self.version))

    def save_state(self, directory: str) -> None:
        (Path(directory) / "learner.json").write_text(json.dumps({"version": self.version}))

    def load_state(self, directory: str) -> int:
        self.version = json.loads((Path(directory) / "learner.json").read_text())["version"]
        return self.version


class FakeWeightSync:
    def __init__(self, clock: FakeClock, engines: ScriptedEngines, pause_s: float = 0.1):
        self.clock, self.engines, self.pause_s = clock, engines, pause_s
        self.synced: list[int] = []

    def sync(self, version: int, step_end_time: float | None = None) -> dict[str, float]:
        self.clock.now += self.pause_s
        self.engines.load_version(version)
        self.synced.append(version)
        return {"time/weight_sync_pause_s": self.pause_s, "weight_sync/version": float(version)}


# ----------------------------------------------------------------------------- building a loop


def rows(count: int, split: str = "train") -> list[PromptRow]:
    return [PromptRow(f"fake:{split}", i, (1, 2, 3 + i % 5), ("7",), ("gsm8k",)) for i in range(count)]


def config(*flags: str, steps: int = 4, prompts: int = 2, samples: int = 2):
    """A parsed config for a small run (the real parser: flags as a user writes them)."""
    return parse_config(
        [
            "--num_unique_prompts_rollout",
            str(prompts),
            "--num_samples_per_prompt_rollout",
            str(samples),
            "--total_episodes",
            str(steps * prompts * samples),
            "--num_evals",
            "0",
            "--save_freq",
            "0",
            *flags,
        ]
    )


@dataclass
class Run:
    """A TrainingLoop with fakes, ready to `run()`; the fakes stay reachable for assertions."""

    loop: object
    clock: FakeClock
    engines: ScriptedEngines
    learners: FakeLearners
    sync: FakeWeightSync
    log: object


def build(
    cfg,
    train_rows=None,
    eval_rows=(),
    script=alternating_rewards,
    step_s: float = 2.0,
    on_step=None,
    stop=None,
    health=None,
) -> Run:
    from open_instruct.orchestrator import TrainingLoop
    from open_instruct.tracking import MemoryLog

    clock = FakeClock()
    engines = ScriptedEngines(clock, script)
    learners = FakeLearners(clock, step_s, on_step, health)
    sync = FakeWeightSync(clock, engines)
    log = MemoryLog()
    loop = TrainingLoop(
        cfg,
        engines=engines,
        learners=learners,
        weights=sync,
        clock=clock,
        log=log,
        train_rows=train_rows if train_rows is not None else rows(64),
        eval_rows=eval_rows,
        stop=stop,
    )
    return Run(loop, clock, engines, learners, sync, log)
