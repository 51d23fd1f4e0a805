"""The driver loop: prompts → engines → replay buffer → learners → weight sync → eval/checkpoint/log.

    for step in steps:
        admit prompts (staleness bound)        engines pull them and stream Completions back
        wait for a full batch of groups        learners wait only for the batch, never a whole rollout
        train one step on every rank           engines keep generating meanwhile
        sync the new weights in flight         running requests keep their KV cache
        evaluate / checkpoint / log when due

`TrainingLoop` owns the driver-side state (feeder, replay buffer, evaluation round) and reaches
everything else through its collaborators, given to its constructor: an engine pool, a learner
group, a weight sync, a clock and a run log (the `Protocol`s below say what each must do). The entry
point (`grpo_fast.run`) builds the Ray-backed ones (`cluster.Stack`); tests pass in-process fakes, and the simulator
passes simulated ones on a virtual clock, so all three exercise this same loop. Nothing here
imports Ray.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections.abc import Sequence
from typing import Protocol

from open_instruct import checkpoints
from open_instruct.config.core import Config
from open_instruct.config.derived import error_window, state_dir, state_save_every
from open_instruct.errors import UserError
from open_instruct.evaluation import EvalRound
from open_instruct.messages import Completion, EngineStats, PartialSample, PromptRequest, SamplingSettings, StepReport
from open_instruct.metrics import (
    ErrorWindow,
    PromptOutcomes,
    agent_metrics,
    async_steps_needed,
    engine_window,
    mean,
    rollout_metrics,
    sample_error,
)
from open_instruct.pacing import Pacing
from open_instruct.prompt_feeder import FeederState, PromptFeeder, record_prompts
from open_instruct.replay_buffer import AddResult, Group, ReplayBuffer
from open_instruct.staleness import MaxAge

logger = logging.getLogger(__name__)


class NoRewardSpread(UserError):
    """--active_sampling went a whole pass over the training prompts without one group it could train."""


class NothingGenerated(UserError):
    """Every one of the latest finished training samples failed (`metrics.ErrorWindow`, full): the run cannot
    learn from what it generates, whatever --max_error_fraction allows."""


class TooManyErrors(UserError):
    """More than --max_error_fraction of the latest finished training samples failed (`metrics.ErrorWindow`): a
    broken tool, environment, verifier or service, which training on the rest would hide until the run ends."""


def all_failed(groups: list[Group]) -> bool:
    """Every sample of the batch failed (`metrics.sample_error`): it has nothing to learn from."""
    completions = [c for g in groups for c in g.completions]
    return bool(completions) and all(sample_error(c) is not None for c in completions)


# ----------------------------------------------------------------------------- collaborators


class Engines(Protocol):
    """Generation: admitted prompts in, finished samples out (`generation.pool.EnginePool`)."""

    def start_loops(self) -> None: ...
    def submit(self, requests: list[PromptRequest]) -> None: ...
    def poll(self, timeout_s: float = 0.0) -> list[Completion]: ...  # waits up to timeout_s for the first
    def stats(self) -> list[EngineStats]: ...
    def pool_metrics(self) -> dict[str, float]: ...  # queue depths, engine restarts
    # 'finish', 'abort' (cut samples delivered as such) or 'interrupt' (cut samples kept: `partial_samples`).
    def stop(self, mode: str = "finish") -> list[Completion]: ...
    # Abort running samples whose first token is older than `min_version`, and every sample of
    # `prompt_ids`; they come back through `poll` as finish_reason "abort".
    def abort_stale(self, min_version: int, prompt_ids: list[str]) -> None: ...
    # The tokens so far of `prompt_id`'s undelivered samples (reported while running, or cut by an interrupt).
    def partial_samples(self, prompt_id: str) -> tuple[PartialSample, ...]: ...


class Learners(Protocol):
    """The learner ranks (`learner.group.LearnerGroup`); checkpoint calls are collectives."""

    def train_step(self, groups: list[Group], step: int) -> StepReport: ...
    def save_model(self, path: str) -> None: ...
    def save_state(self, directory: str) -> None: ...
    def load_state(self, directory: str) -> int: ...


class Weights(Protocol):
    """Loads a learner version into every engine (`weights.sync.WeightSync`); returns its metrics."""

    def sync(self, version: int, step_end_time: float | None = None) -> dict[str, float]: ...


class Clock(Protocol):
    def time(self) -> float: ...  # seconds; the wall clock, or a simulation's virtual time


class SystemClock:
    def time(self) -> float:
        return time.time()


class StopRequest:
    """SIGTERM / first Ctrl-C: finish the current step, save state, exit. A second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict = {}

    def install(self) -> StopRequest:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name
        logger.warning("%s received: finishing the current step, then saving state and stopping", self.reason)


class ZeroSpreadWatch:
    """--active_sampling trains only groups with reward spread, and only training moves the weights: after a
    whole pass over the prompts without one such group, the next pass samples the same policy, so the run ends
    there with the reason. Until then it says so every 4 steps' worth of groups (no step ends to show it)."""

    def __init__(self, num_prompts: int, per_step: int):
        self.num_prompts, self.per_step = num_prompts, per_step
        self.warn_every = 4 * per_step
        self.patience = max(num_prompts, self.warn_every)
        self._warnings = 0

    def check(self, streak: int, step: int) -> None:
        """`streak`: groups dropped for zero spread since the last one with spread (`ReplayBuffer.zero_std_streak`)."""
        if streak >= self.patience:
            raise NoRewardSpread(
                f"--active_sampling: {streak} groups in a row had zero reward spread (each prompt's samples got "
                f"equal rewards), a whole pass over the {self.num_prompts} training prompts, so step {step} cannot "
                "train and the policy cannot change; check the ground truths and verifiers against the answers "
                "(--save_traces keeps them), or drop --active_sampling"
            )
        warnings_due = streak // self.warn_every
        if warnings_due > self._warnings:
            logger.warning(
                "--active_sampling: the last %d groups had zero reward spread (each prompt's samples got equal "
                "rewards); step %d waits for %d groups with spread",
                streak,
                step,
                self.per_step,
            )
        self._warnings = warnings_due


def buffer_config(cfg: Config, pacing: Pacing) -> dict:
    """The replay buffer's rules and caps for this run (`ReplayBuffer(**buffer_config(cfg, pacing))`); the
    staleness bound is the pacing window's, read live."""
    return {
        "samples_per_prompt": cfg.generation.num_samples_per_prompt_rollout,
        "max_samples": cfg.replay_buffer_max_samples,
        "max_age": MaxAge.of(cfg.staleness_policy),
        "bound": lambda: pacing.window.current,
        "drop_zero_std": cfg.algorithm.active_sampling,
    }


# ----------------------------------------------------------------------------- the loop


class TrainingLoop:
    def __init__(
        self,
        cfg: Config,
        *,
        engines: Engines,
        learners: Learners,
        weights: Weights,
        clock: Clock,
        log,  # tracking.MemoryLog or RunLog
        train_rows: Sequence,
        eval_rows: Sequence = (),
        tokenizer=None,
        stop: StopRequest | None = None,
    ):
        self.cfg = cfg
        self.engines = engines
        self.learners = learners
        self.weights = weights
        self.clock = clock
        self.log = log
        self.eval_rows = list(eval_rows)
        self.tokenizer = tokenizer
        self.stop = stop or StopRequest()
        generation = cfg.generation
        self.num_steps, self.per_step = cfg.num_training_steps, generation.num_unique_prompts_rollout
        self.sampling = SamplingSettings.from_config(cfg)
        self.step, self.version, self.episodes = 0, 0, 0
        self.outcomes = PromptOutcomes()
        self.pacing = Pacing.from_config(cfg)
        self.buffer = ReplayBuffer(**buffer_config(self.cfg, self.pacing))
        self._resumed_rubrics = None  # set by _resume when the saved state has evolving rubrics
        feeder_state, requeue = self._resume()
        self.feeder = PromptFeeder(
            train_rows,
            prompts_per_step=self.per_step,
            samples_per_prompt=generation.num_samples_per_prompt_rollout,
            async_steps=self.pacing.lookahead.current,
            sampling=self.sampling,
            seed=cfg.run.seed,
            state=feeder_state,
            pass_rate_threshold=cfg.algorithm.no_resampling_pass_rate,
            order_seed=cfg.data.data_loader_seed,
        )
        self.untrained: dict[str, PromptRequest] = {r.prompt_id: r for r in requeue}  # admitted, not trained yet
        self.held_back: list[Completion] = []  # rejected by a full buffer; offered again
        self.eval_round: EvalRound | None = None
        self.traces = _trace_writer(cfg)
        self.rubrics = self._evolving_rubrics()
        self._last_engine_stats: list[EngineStats] | None = None
        self.spread_watch = ZeroSpreadWatch(len(train_rows), self.per_step)
        self.errors = ErrorWindow(error_window(cfg, self.num_steps - self.step), generation.max_error_fraction)
        # A resumed buffer's samples arrived before the stop: they count as they would have in one run.
        self.errors.add(c for group in self.buffer.state().groups for c in group.completions)

    def _evolving_rubrics(self):
        """--apply_evolving_rubric_reward: the rubric book (restored on resume), feeding the feeder's labels."""
        if not self.cfg.reward.apply_evolving_rubric_reward:
            return None
        from open_instruct.rewards.evolving_rubrics import EvolvingRubrics

        queries, overrides = self._resumed_rubrics or ({}, {})
        rubrics = EvolvingRubrics.from_config(self.cfg, queries)
        rubrics.overrides.update(overrides)
        self.feeder.ground_truth_overrides = rubrics.overrides
        return rubrics

    def _resume(self) -> tuple[FeederState, tuple[PromptRequest, ...]]:
        """Learner state, step, replay buffer and untrained prompts from --resume_from_checkpoint or
        --checkpoint_state_dir, if saved there."""
        resumed = checkpoints.latest_state(self.cfg.run.resume_from_checkpoint or state_dir(self.cfg))
        if resumed is None:
            return FeederState(), ()
        path, state = resumed
        self._resumed_rubrics = state.rubrics
        self.version = checkpoints.load_learners(self.learners, path)
        if self.version != state.version:
            raise RuntimeError(f"{path}: learner version {self.version} != driver version {state.version}")
        self.step, self.episodes = state.next_step, state.episodes
        self.outcomes = PromptOutcomes(**state.outcomes)  # {} in states saved before outcomes existed (migrate)
        self.buffer = ReplayBuffer.from_state(state.buffer, **buffer_config(self.cfg, self.pacing))
        logger.info(
            "resumed from %s: step %d, %d prompts re-queued, %d groups in the buffer",
            path,
            self.step,
            len(state.requeue),
            len(state.buffer.groups),
        )
        return state.feeder, state.requeue

    # -- the loop

    def run(self) -> dict:
        started = self.clock.time()
        self.log.start(self.num_steps, self.step)
        if self.version > 0:
            self.weights.sync(self.version)  # the engines start from the checkpoint's weights
        self.engines.start_loops()
        self.engines.submit(list(self.untrained.values()))
        if self.cfg.run.eval_on_step_0 and self.eval_rows and self.step == 0:
            self.start_eval()
        while self.step < self.num_steps and self.stop.reason is None:
            step_started = self.clock.time()
            self.admit()
            batch = self.wait_for_batch()
            if batch is None:  # stopped while the batch was incomplete: its samples wait in the state
                self.save_state_if_due()
                break
            groups, waited = batch
            if all_failed(groups):
                self.set_aside(groups)
                continue
            metrics = self.train(groups)
            metrics.update(self.sync_if_due(step_end=self.clock.time()))
            metrics.update(self.evaluate_if_due())
            metrics.update(self.timing(step_started, waited, metrics))
            self.log.step(self.step, metrics, [g.prompt_id for g in groups], self.outcomes.take_step_ids())
            self.step += 1
            self.checkpoint_if_due()
        return self.finish(self.clock.time() - started)

    def admit(self) -> None:
        self.feeder.async_steps = self.pacing.lookahead.current
        requests = self.feeder.admit(self.version, now=self.clock.time())
        for request in requests:
            self.untrained[request.prompt_id] = request
        if requests and self.cfg.run.save_admitted_prompts:
            record_prompts(self.cfg.run.save_admitted_prompts, requests)
        self.engines.submit(requests)

    def wait_for_batch(self) -> tuple[list[Group], float] | None:
        """Route arriving samples (eval → the eval round, training → the buffer) until a batch is ready.

        None when a stop request comes first: a preempted job has seconds, and the batch may need samples
        that run for minutes (or that cannot finish), so they are cut and kept for the resume instead."""
        started = self.clock.time()
        while True:
            self.receive(self.engines.poll(timeout_s=0.0 if self.buffer.ready(self.per_step) else 0.5))
            self.buffer.evict(self.version)
            self.settle_dropped()
            if self.buffer.ready(self.per_step):
                return self.buffer.take(self.per_step, self.version), self.clock.time() - started
            if self.stop.reason is not None:
                return None
            self.admit()  # replacements for dropped groups may be due

    def receive(self, completions: list[Completion]) -> None:
        self.errors.add(completions)  # held-back ones were counted when they arrived
        if (cause := self.errors.cause(self.step)) is not None:
            raise TooManyErrors(cause)
        offered, self.held_back = self.held_back + completions, []
        for completion in offered:
            if completion.is_eval:
                self.eval_round.add(completion)
            elif self.buffer.add(completion) is AddResult.REJECTED_FULL:
                self.held_back.append(completion)
            elif completion.finish_reason == "abort":
                self.outcomes.count_abort(completion)

    def settle_dropped(self) -> None:
        """Groups the buffer will not train: each is replaced (a refill) and its fate recorded, never lost."""
        for group in self.buffer.pop_dropped():
            self.untrained.pop(group.prompt_id, None)
            if group.reason == "zero_std":
                self._record_pass_rate(group.prompt_id, group.completions)
                self.feeder.grant_refill()
                self.outcomes.record("filtered", group.prompt_id)
            elif self.cfg.staleness_policy.action.requeues:  # (mask: no token of it was young enough)
                self.feeder.requeue(group.prompt_id)
                self.outcomes.record("requeued", group.prompt_id)
            else:
                self.feeder.grant_refill()
                self.outcomes.record("dropped", group.prompt_id)
        self.spread_watch.check(self.buffer.zero_std_streak, self.step)

    def set_aside(self, groups: list[Group]) -> None:
        """A batch whose every sample failed trains nothing, and it is no verdict on the run: with a long
        lookahead the first groups to complete can be the prompts an engine refused at once, while the rest
        still generate. Its groups get the fate "failed" and are replaced. The run ends once every sample in the
        error window failed (`NothingGenerated`), or sooner at --max_error_fraction (`TooManyErrors`)."""
        for group in groups:
            self.untrained.pop(group.prompt_id, None)
            self.feeder.grant_refill()
            self.outcomes.record("failed", group.prompt_id)
        if (cause := self.errors.nothing_succeeded(self.step)) is not None:
            raise NothingGenerated(cause)

    def abort_doomed(self) -> None:
        """Stop spending engine time on samples whose group can no longer be trained within the bound."""
        if self.cfg.staleness_policy.action.trains_late_groups:
            return  # late groups are trained (down-weighted, or on their young tokens): let them finish
        oldest_allowed = self.version - self.pacing.window.current
        if oldest_allowed > 0:
            self.engines.abort_stale(oldest_allowed, self.buffer.open_groups_older_than(oldest_allowed))

    def _record_pass_rate(self, prompt_id: str, completions) -> None:
        mean_reward = sum(c.reward for c in completions) / len(completions)
        self.feeder.record_pass_rate(prompt_id, mean_reward / self.cfg.reward.max_possible_reward)

    def train(self, groups: list[Group]) -> dict:
        report = self.learners.train_step(groups, self.step)
        completions = [c for g in groups for c in g.completions]
        requests = {g.prompt_id: self.untrained.get(g.prompt_id) for g in groups}
        rubric_metrics = self._evolve_rubrics(groups, requests)
        if self.traces is not None:
            self.traces.write(self.step, groups, requests, self.cfg.algorithm.advantage_normalization_type)
        self.version += 1
        for g in groups:
            self.untrained.pop(g.prompt_id, None)
            self._record_pass_rate(g.prompt_id, g.completions)
        self.abort_doomed()
        self.episodes += len(completions)
        self._trained_tokens = report.trained_tokens
        return {
            **report.metrics,
            **rollout_metrics(completions, self.version - 1),
            **agent_metrics(completions),
            **self.buffer.metrics(),
            **self.outcomes.metrics(),
            **rubric_metrics,
            "val/error_frac": self.errors.share,  # of the latest finished samples: what --max_error_fraction limits
            "data/solved_prompts": float(len(self.feeder.state.solved)),
            "episode": self.episodes,
            "perf/trained_tokens": float(report.trained_tokens),
            "policy/version": self.version,
        }

    def _evolve_rubrics(self, groups: list[Group], requests: dict) -> dict:
        if self.rubrics is None:
            return {}
        from open_instruct.rewards.evolving_rubrics import rubric_groups

        return self.rubrics.step(rubric_groups(groups, requests), self.step)

    def sync_if_due(self, step_end: float) -> dict:
        last = self.step + 1 == self.num_steps
        if (self.step + 1) % self.cfg.generation.weight_sync_every_steps == 0 or last:
            return self.weights.sync(self.version, step_end_time=step_end)
        return {}

    # -- evaluation

    def eval_due(self) -> bool:
        every = self.cfg.eval_every_steps
        return bool(self.eval_rows) and every > 0 and ((self.step + 1) % every == 0 or self.step + 1 == self.num_steps)

    def start_eval(self) -> None:
        sampling = dataclasses.replace(self.sampling, max_tokens=self.cfg.eval_response_length)
        generation = self.cfg.generation
        self.eval_round = EvalRound.build(
            self.eval_rows,
            self.step,
            sampling,
            self.cfg.run.seed,
            self.version,
            self.clock.time(),
            samples=generation.eval_pass_at_k,
            top_p=generation.eval_top_p,
            max_reward=self.cfg.reward.max_possible_reward,
        )
        self.engines.submit(self.eval_round.requests)

    def evaluate_if_due(self) -> dict:
        """Report a finished round; start one when due (after the previous one finished). The last step
        waits for its round, so a run always ends with an evaluation of its final policy."""
        metrics: dict = {}
        last = self.step + 1 == self.num_steps
        due = self.eval_due()
        if self.eval_round is not None and (self.eval_round.done or due):
            metrics = self.finish_eval()
        if due:
            self.start_eval()
            if last:
                metrics = self.finish_eval()
        return metrics

    def finish_eval(self) -> dict:
        while not self.eval_round.done:
            self.receive(self.engines.poll(timeout_s=0.5))
        metrics = self.eval_round.metrics()
        self.log.eval_round(self.step, metrics, self.eval_round.table(self.tokenizer))
        self.eval_round = None
        return metrics

    # -- timing and checkpoints

    def timing(self, step_started: float, waited: float, metrics: dict) -> dict:
        """The step's timing and pacing: the lookahead and the staleness window follow what it measured."""
        stats = self.engines.stats()
        step_s = self.clock.time() - step_started
        window = engine_window(stats, self._last_engine_stats, step_s)
        self._last_engine_stats = stats
        group_latency_s = metrics["time/group_latency_s_avg"]
        needed = async_steps_needed(group_latency_s, step_s - waited)
        self.pacing.advise(self.step, needed, waited / step_s if step_s > 0 else 0.0)
        pacing = self.pacing.update(group_latency_s, step_s - waited, waited, metrics)
        return {
            **window,
            **pacing,
            "scheduling/async_steps_needed": float(needed),
            "time/step_s": step_s,
            "perf/trained_tokens_per_s": self._trained_tokens / step_s if step_s > 0 else 0.0,
            "time/learner_wait_s": waited,
            "data/epoch": float(self.feeder.state.epoch),  # the pass over the training mix admission is in
            **self.engines.pool_metrics(),
        }

    def checkpoint_if_due(self) -> None:
        run = self.cfg.run
        if run.save_freq > 0 and self.step % run.save_freq == 0:
            checkpoints.save_model(
                self.learners, self.tokenizer, run.output_dir, self.step, run.keep_last_n_checkpoints
            )
        self.save_state_if_due()

    def save_state_if_due(self) -> None:
        """The resumable state at its interval, and always on a stop request."""
        run = self.cfg.run
        stopping = self.stop.reason is not None
        due = any(self.step % every == 0 for every in state_save_every(self.cfg))
        saved_in = state_dir(self.cfg)
        if saved_in and (due or stopping) and self.step < self.num_steps:
            if stopping:  # running samples are cut and kept whole in the state, to continue after the resume
                self.receive(self.engines.stop("interrupt"))
                self.settle_dropped()
            checkpoints.save_state(self.learners, saved_in, self.driver_state(), run.keep_last_n_checkpoints)

    def driver_state(self) -> checkpoints.DriverState:
        """Open groups keep their delivered samples; their prompts are re-queued for the missing ones only,
        each with what its engine had generated so far (continued after the resume, not generated again)."""
        buffer_state = self.buffer.state()
        delivered = {g.prompt_id: {c.sample_index for c in g.completions} for g in buffer_state.groups}
        requeue = []
        for prompt_id, request in self.untrained.items():
            if prompt_id in delivered and len(delivered[prompt_id]) == request.num_samples:
                continue  # complete: trained from the buffer after the resume
            missing = tuple(j for j in request.samples_to_generate() if j not in delivered.get(prompt_id, ()))
            partials = tuple(p for p in self.engines.partial_samples(prompt_id) if p.sample_index in missing)
            requeue.append(dataclasses.replace(request, sample_indices=missing, partials=partials))
        rubrics = (self.rubrics.book.queries, self.rubrics.overrides) if self.rubrics else None
        return checkpoints.DriverState(
            self.step,
            self.version,
            self.feeder.state,
            buffer_state,
            tuple(requeue),
            self.episodes,
            self.outcomes.totals(),
            rubrics,
        )

    def finish(self, elapsed: float) -> dict:
        run = self.cfg.run
        completed = self.step >= self.num_steps
        if completed and run.save_freq > 0 and self.step % run.save_freq != 0:  # the final model is always saved
            checkpoints.save_model(
                self.learners, self.tokenizer, run.output_dir, self.step, run.keep_last_n_checkpoints
            )
        leftover = sorted(self.untrained)
        self.engines.stop("abort")
        evals = self.log.evals
        buffer = self.buffer.metrics()
        summary = {
            "status": "completed" if completed else f"stopped by {self.stop.reason}",
            "steps_trained": self.step,
            "episodes": self.episodes,
            "policy_version": self.version,
            "elapsed_s": elapsed,
            "prompts_admitted": self.feeder.state.admitted,
            "prompts_admitted_untrained": len(leftover),
            "first_eval_reward": evals[0]["eval/verifiable_reward"] if evals else None,
            "last_eval_reward": evals[-1]["eval/verifiable_reward"] if evals else None,
            "multi_version_frac": mean(h.get("staleness/multi_version_frac", 0.0) for h in self.log.history),
            # < 1: training saw shorter samples than generation produced (dropping stragglers biases).
            "trained_to_generated_length_ratio": buffer["buffer/trained_to_generated_length_ratio"],
            # the same bias per token: response tokens of trained samples that the loss left out for their age
            "context_only_token_fraction": buffer["buffer/context_only_token_fraction"],
            "full_weight_token_age_max": buffer["buffer/full_weight_token_age_max"],
            # the window: the staleness bound, its action, and where the lookahead ended (it adapts with auto)
            "max_off_policy_steps": self.cfg.staleness_policy.flag_value,
            "off_policy_window_final": self.pacing.window.current,
            "off_policy_action": self.cfg.staleness_policy.action.value,
            "staleness_policy": self.cfg.staleness_policy.describe(),
            "async_steps_final": self.pacing.lookahead.current,
            **{f"prompts_{name}": count for name, count in self.outcomes.totals().items()},
        }
        self.log.finish(summary, leftover)
        return summary


def _trace_writer(cfg: Config):
    """--save_traces: a TraceWriter in --rollouts_save_path, else None."""
    if not cfg.run.save_traces:
        return None
    from open_instruct.traces import TraceWriter

    config = {
        f.name: dataclasses.asdict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name != "explicit_flags"
    }
    return TraceWriter(cfg.run.rollouts_save_path, cfg.run_name, config)
