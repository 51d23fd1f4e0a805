"""The driver loop: prompts → engines → replay buffer → learners → weight sync → eval/checkpoint/log.

    for step in steps:
        admit prompts (staleness bound)        engines pull them and stream Completions back
        wait for a full batch of groups        learners wait only for the batch, never a whole rollout
        train one step on every rank           engines keep generating meanwhile
        push the new weights in flight         running requests keep their KV cache
        evaluate / checkpoint / log when due

`TrainingLoop` owns the driver-side state (feeder, replay buffer, evaluation round, logs);
`Stack` owns the actors (Ray, engines, learners, weight sync) and always tears them down.
This module is the only caller of `ray.get` in the training path, besides the pool and sync
helpers it drives.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from open_instruct.config import Config
from open_instruct.embedded_default import EMBEDDED_DATASET_NAME, EMBEDDED_MODEL_NAME, STOP_STRING
from open_instruct.generation import EngineSettings
from open_instruct.messages import Completion, SamplingSettings
from open_instruct.rewards import VerifierSettings
from open_instruct.rewards.scoring import RewardSettings

logger = logging.getLogger(__name__)


def describe_sources(cfg: Config) -> str:
    if cfg.uses_embedded_default:
        return (
            f"using the embedded default: model {EMBEDDED_MODEL_NAME} and dataset {EMBEDDED_DATASET_NAME} "
            "(no --model_name_or_path / --dataset_mixer_list given; built on first use)"
        )
    model = cfg.model.model_name_or_path or EMBEDDED_MODEL_NAME
    data = " ".join(cfg.data.dataset_mixer_list) or EMBEDDED_DATASET_NAME
    return f"model {model}; training mix {data}"


# ----------------------------------------------------------------------------- settings from the config


def train_data_config(cfg: Config):
    d = cfg.data
    if d.dataset_mixer_list:
        return d
    return dataclasses.replace(d, dataset_mixer_list=[EMBEDDED_DATASET_NAME, "1.0"], dataset_mixer_list_splits=["train"])


def eval_data_config(cfg: Config):
    """The eval mix, falling back to the training mix (or the embedded eval split)."""
    d = cfg.data
    if d.dataset_mixer_eval_list:
        return d
    return dataclasses.replace(
        d,
        dataset_mixer_eval_list=d.dataset_mixer_list or [EMBEDDED_DATASET_NAME, "1.0"],
        dataset_mixer_eval_list_splits=["test"],
    )


def sampling_settings(cfg: Config) -> SamplingSettings:
    stop_strings = tuple(cfg.generation.stop_strings) or ((STOP_STRING,) if cfg.uses_embedded_default else ())
    return SamplingSettings(
        max_tokens=cfg.generation.response_length,
        temperature=cfg.generation.temperature,
        top_p=cfg.generation.vllm_top_p,
        stop_strings=stop_strings,
        include_stop_str_in_output=cfg.generation.include_stop_str_in_output,
    )


def reward_settings(cfg: Config) -> RewardSettings:
    return RewardSettings(
        apply_verifiable_reward=cfg.reward.apply_verifiable_reward,
        verification_reward=cfg.reward.verification_reward,
        non_stop_penalty=cfg.reward.non_stop_penalty,
        non_stop_penalty_value=cfg.reward.non_stop_penalty_value,
        format_reward=cfg.reward.format_reward,
        remap_verifier=cfg.remap_verifier,
        # A code verifier call may legitimately take its HTTP client's full timeout.
        verifier_timeout_s=max(30.0, min(300.0, 10 * cfg.reward.code_max_execution_time)) + 10,
        verifier=VerifierSettings(
            code_api_url=cfg.reward.code_api_url,
            code_max_execution_time=cfg.reward.code_max_execution_time,
            code_pass_rate_reward_threshold=cfg.reward.code_pass_rate_reward_threshold,
            ifeval_require_all=cfg.reward.ifeval_reward_mode == "all",
        ),
    )


def engine_settings(cfg: Config, model_path: str) -> EngineSettings:
    return EngineSettings(
        model_path=model_path,
        max_model_len=cfg.data.max_prompt_token_length + cfg.generation.response_length,
        seed=cfg.experiment.seed,
        tensor_parallel_size=cfg.generation.vllm_tensor_parallel_size,
        gpu_memory_utilization=cfg.generation.vllm_gpu_memory_utilization,
        enable_prefix_caching=cfg.generation.vllm_enable_prefix_caching,
        enforce_eager=cfg.generation.vllm_enforce_eager,
        kv_cache_gib=cfg.generation.vllm_kv_cache_gib,
    )


def learner_settings(cfg: Config, model_path: str):
    from open_instruct.learner import LearnerSettings

    a, lr = cfg.algorithm, cfg.learner
    return LearnerSettings(
        model_path=model_path,
        deepspeed_stage=lr.deepspeed_stage,
        learning_rate=lr.learning_rate,
        lr_scheduler_type=lr.lr_scheduler_type,
        warm_up_steps=lr.warm_up_steps,
        total_steps=max(1, cfg.num_training_steps),
        weight_decay=lr.weight_decay,
        max_grad_norm=lr.max_grad_norm,
        micro_batch_size=lr.per_device_train_batch_size,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        num_epochs=a.num_epochs,
        num_mini_batches=a.num_mini_batches,
        beta=a.beta,
        kl_estimator=cfg.kl_estimator,
        clip_lower=a.clip_lower,
        clip_higher=a.clip_higher,
        loss_denominator=cfg.loss_denominator,
        importance_ratio_cap=a.truncated_importance_sampling_ratio_cap,
        importance_sampling_mode=a.importance_sampling_mode,
        temperature=cfg.generation.temperature or 1.0,
        seed=cfg.experiment.seed,
    )


# ----------------------------------------------------------------------------- stopping


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


# ----------------------------------------------------------------------------- actors


class Stack:
    """Ray + engines + learners + weight sync for one run; `close` leaves no actor behind."""

    def __init__(self, cfg: Config, model_path: str):
        from open_instruct import cluster
        from open_instruct.engine_pool import EnginePool
        from open_instruct.generation import transfer_backend
        from open_instruct.weight_sync import SyncSettings, WeightSync

        g = cfg.generation
        self.pool = self.learners = self.sync = None
        cluster.init_ray(min_logical_cpus=g.vllm_num_engines + cfg.world_size + 1)
        placement = cluster.gpu_placement(g.vllm_num_engines, g.vllm_tensor_parallel_size, cfg.world_size)
        settings = engine_settings(cfg, model_path)
        engines = cluster.create_generation_actors(
            settings, g.vllm_num_engines, reward_settings(cfg), gpus_per_engine=placement.gpus_per_engine
        )
        outstanding = (g.async_steps + 2) * g.num_unique_prompts_rollout
        self.pool = EnginePool(engines, prompt_capacity=outstanding + 4096)
        self.learners = cluster.create_learner_group(
            learner_settings(cfg, model_path), cfg.learner.num_learners_per_node, gpus_per_learner=placement.gpus_per_learner
        )
        # Engines and learners build concurrently (each takes tens of seconds).
        with ThreadPoolExecutor(max_workers=2) as threads:
            engines_ready = threads.submit(self.pool.start_engines)
            learner_info = cluster.setup_learner_group(self.learners)
            engine_info = engines_ready.result()
        logger.info("engines: %s; learners: %s", engine_info, learner_info)
        import torch

        self.sync = WeightSync(
            self.learners,
            engines,
            SyncSettings(
                backend=transfer_backend(settings),
                dtype_name="bfloat16" if torch.cuda.is_available() else "float32",
                inflight=g.inflight_updates,
                engine_ranks=g.vllm_tensor_parallel_size,
            ),
        )
        logger.info("weight transfer group ready: %s", self.sync.connect())

    def close(self) -> None:
        import ray

        if self.pool is not None:
            self.pool.shutdown()
        for learner in self.learners or []:
            try:
                ray.kill(learner)
            except Exception:  # already gone
                pass
        ray.shutdown()


# ----------------------------------------------------------------------------- the loop


class TrainingLoop:
    def __init__(self, cfg: Config, stack: Stack, tokenizer, train_rows, eval_rows, stop: StopRequest,
                 shape_request=None):
        """`shape_request` (benchmarks) may rewrite each admitted PromptRequest, e.g. its length."""
        from open_instruct import checkpoints
        from open_instruct.prompt_feeder import PromptFeeder
        from open_instruct.replay_buffer import ReplayBuffer
        from open_instruct.tracking import RunLog

        g = cfg.generation
        self.cfg, self.stack, self.tokenizer, self.eval_rows, self.stop = cfg, stack, tokenizer, eval_rows, stop
        self.pool, self.sync = stack.pool, stack.sync
        self.shape_request = shape_request
        self.timeline: list[tuple[str, float, float]] | None = None  # benchmarks: (actor, start, end) wall times
        self.num_steps = cfg.num_training_steps
        self.per_step = g.num_unique_prompts_rollout
        self.sampling = sampling_settings(cfg)
        buffer_config = dict(
            samples_per_prompt=g.num_samples_per_prompt_rollout,
            max_samples=(g.async_steps + 2) * self.per_step * g.num_samples_per_prompt_rollout,
            seed=cfg.experiment.seed,
        )
        resumed = checkpoints.latest_state(cfg.experiment.checkpoint_state_dir)
        self.step, self.version, self.episodes = 0, 0, 0
        feeder_state, requeue = None, ()
        self.buffer = ReplayBuffer(**buffer_config)
        if resumed is not None:
            path, state = resumed
            self.version = checkpoints.load_learners(stack.learners, path)
            if self.version != state.version:
                raise RuntimeError(f"{path}: learner version {self.version} != driver version {state.version}")
            self.step, self.episodes, feeder_state, requeue = state.next_step, state.episodes, state.feeder, state.requeue
            self.buffer = ReplayBuffer.from_state(state.buffer, **buffer_config)
            logger.info("resumed from %s: step %d, %d prompts re-queued, %d groups in the buffer",
                        path, self.step, len(requeue), len(state.buffer.groups))
        self.feeder = PromptFeeder(
            train_rows, prompts_per_step=self.per_step, samples_per_prompt=g.num_samples_per_prompt_rollout,
            async_steps=g.async_steps, sampling=self.sampling, seed=cfg.experiment.seed,
            **({"state": feeder_state} if feeder_state else {}),
        )
        self.untrained = {r.prompt_id: r for r in requeue}  # admitted training prompts not trained yet
        self.held_back: list[Completion] = []  # rejected by a full buffer; offered again
        self.eval_round = None
        self.log = RunLog(cfg, self.num_steps, start_step=self.step)
        self._last_engine_stats = None
        self._advised = False

    # -- the loop

    def run(self) -> dict:
        started = time.monotonic()
        if self.version > 0:
            self.sync.push(self.version)  # the engines start from the checkpoint's weights
        self.pool.start_loops()
        self.pool.submit(list(self.untrained.values()))
        if self.cfg.experiment.eval_on_step_0 and self.eval_rows and self.step == 0:
            self.start_eval()
        while self.step < self.num_steps and self.stop.reason is None:
            step_started = time.monotonic()
            self.admit()
            groups, waited = self.wait_for_batch()
            metrics = self.train(groups)
            step_end = time.time()
            if (self.step + 1) % self.cfg.generation.weight_sync_every_steps == 0 or self.step + 1 == self.num_steps:
                metrics.update(self.sync.push(self.version, step_end_time=step_end))
                if self.timeline is not None:
                    self.timeline.append(("weight sync", step_end, time.time()))
            metrics.update(self.evaluate_if_due())
            metrics.update(self.timing(step_started, waited, metrics["time/group_latency_s_avg"]))
            self.log.step(self.step, metrics, [g.prompt_id for g in groups])
            self.step += 1
            self.checkpoint_if_due()
        return self.finish(time.monotonic() - started)

    def admit(self) -> None:
        requests = self.feeder.admit(self.version)
        if self.shape_request is not None:
            requests = [self.shape_request(r) for r in requests]
        for request in requests:
            self.untrained[request.prompt_id] = request
        if requests and self.cfg.experiment.save_admitted_prompts:
            record_prompts(self.cfg.experiment.save_admitted_prompts, requests)
        self.pool.submit(requests)

    def wait_for_batch(self):
        """Route arriving samples (eval → the eval round, training → the buffer) until a batch is ready."""
        started = time.monotonic()
        while True:
            self.receive(self.pool.poll(timeout_s=0.0 if self.buffer.ready(self.per_step) else 0.5))
            self.buffer.evict(self.version)
            if self.buffer.ready(self.per_step):
                return self.buffer.take(self.per_step, self.version), time.monotonic() - started
            self.admit()  # evictions may have freed admission room

    def receive(self, completions: list[Completion]) -> None:
        from open_instruct.replay_buffer import AddResult

        offered, self.held_back = self.held_back + completions, []
        for completion in offered:
            if completion.is_eval:
                self.eval_round.add(completion)
            elif self.buffer.add(completion) is AddResult.REJECTED_FULL:
                self.held_back.append(completion)

    def train(self, groups) -> dict:
        import ray

        from open_instruct.batching import BatchSettings, assemble

        a = self.cfg.algorithm
        settings = BatchSettings(
            pack_length=self.cfg.learner.pack_length, pad_token_id=self.tokenizer.pad_token_id,
            world_size=self.cfg.world_size, micro_batch_size=self.cfg.learner.per_device_train_batch_size,
            num_mini_batches=a.num_mini_batches, advantage_normalization=a.advantage_normalization_type,
            filter_zero_std=a.filter_zero_std_samples, mask_truncated=a.mask_truncated_completions,
        )
        batches, stats = assemble(groups, self.step, settings)
        self._trained_tokens = stats.trained_tokens
        train_started = time.time()
        per_rank = ray.get([learner.train_step.remote(b) for learner, b in zip(self.stack.learners, batches)])
        completions = [c for g in groups for c in g.completions]
        if self.timeline is not None:
            self.timeline.append(("learner", train_started, time.time()))
            self.timeline += [(f"engine {c.engine_id}", c.started_at, c.finished_at) for c in completions]
        self.version += 1
        for g in groups:
            self.untrained.pop(g.prompt_id, None)
        self.episodes += len(completions)
        return {**_rank_mean(per_rank), **rollout_metrics(completions, self.version - 1), **self.buffer.metrics(),
                "episode": self.episodes, "batch/groups_filtered_zero_std": stats.groups_filtered_zero_std,
                "batch/samples_masked": stats.samples_masked, "batch/packed_rows": stats.packed_rows,
                "perf/trained_tokens": stats.trained_tokens, "policy/version": self.version}

    # -- evaluation

    def eval_due(self) -> bool:
        every = self.cfg.eval_every_steps
        return bool(self.eval_rows) and every > 0 and ((self.step + 1) % every == 0 or self.step + 1 == self.num_steps)

    def start_eval(self) -> None:
        from open_instruct.evaluation import EvalRound

        self.eval_round = EvalRound.build(self.eval_rows, self.step, self.sampling, self.cfg.experiment.seed, self.version)
        self.pool.submit(self.eval_round.requests)

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
            self.receive(self.pool.poll(timeout_s=0.5))
        metrics = self.eval_round.metrics()
        self.log.eval_round(self.step, metrics, self.eval_round.table(self.tokenizer))
        self.eval_round = None
        return metrics

    # -- timing and checkpoints

    def timing(self, step_started: float, waited: float, group_latency_s: float) -> dict:
        stats = self.pool.stats()
        previous = self._last_engine_stats or [None] * len(stats)
        uptime = sum(s.uptime_s - (p.uptime_s if p else 0.0) for s, p in zip(stats, previous))
        idle = sum(s.idle_s - (p.idle_s if p else 0.0) for s, p in zip(stats, previous))
        tokens = sum(s.generated_tokens - (p.generated_tokens if p else 0) for s, p in zip(stats, previous))
        self._last_engine_stats = stats
        step_s = time.monotonic() - step_started
        needed = async_steps_needed(group_latency_s, step_s - waited)
        self._advise_async_steps(needed, waited / step_s if step_s > 0 else 0.0)
        return {
            "scheduling/async_steps_needed": float(needed),
            "time/step_s": step_s,
            "perf/trained_tokens_per_s": self._trained_tokens / step_s if step_s > 0 else 0.0,
            "time/learner_wait_s": waited,
            "time/generation_idle_frac": idle / uptime if uptime > 0 else 0.0,
            "perf/generated_tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
            "engines/preempted_requests_total": float(sum(s.preempted_requests for s in stats)),
            **self.pool.queue_depths(),
        }

    def _advise_async_steps(self, needed: int, wait_frac: float) -> None:
        """Once per run: say when the learner starves because groups outlast the lookahead."""
        g = self.cfg.generation
        if self._advised or g.async_steps == 0 or self.step < g.async_steps + 2 or wait_frac < 0.25 \
                or needed <= g.async_steps:
            return
        self._advised = True
        logger.warning(
            "the learner waited %.0f%% of step %d: a group takes about %d training steps from admission "
            "to its last sample, more than --async_steps %d lets run ahead; at least --async_steps %d is "
            "needed to keep the learner fed (more samples in flight slow each group down, so check "
            "scheduling/async_steps_needed again; the price is staleness: staleness/token_lag_avg)",
            100 * wait_frac, self.step, needed, g.async_steps, needed)

    def checkpoint_if_due(self) -> None:
        from open_instruct import checkpoints

        e = self.cfg.experiment
        if e.save_freq > 0 and self.step % e.save_freq == 0:
            checkpoints.save_model(self.stack.learners, self.tokenizer, e.output_dir, self.step, e.keep_last_n_checkpoints)
        stopping = self.stop.reason is not None
        due = e.checkpoint_state_freq > 0 and self.step % e.checkpoint_state_freq == 0
        if e.checkpoint_state_dir and (due or stopping) and self.step < self.num_steps:
            checkpoints.save_state(self.stack.learners, e.checkpoint_state_dir, self.driver_state())

    def driver_state(self):
        from open_instruct.checkpoints import DriverState

        buffer_state = self.buffer.state()
        complete = dataclasses.replace(buffer_state, groups=tuple(g for g in buffer_state.groups if g.seq is not None))
        in_buffer = {g.prompt_id for g in complete.groups}
        requeue = tuple(r for pid, r in self.untrained.items() if pid not in in_buffer)
        return DriverState(self.step, self.version, self.feeder.state, complete, requeue, self.episodes)

    def finish(self, elapsed: float) -> dict:
        from open_instruct import checkpoints

        e = self.cfg.experiment
        completed = self.step >= self.num_steps
        if completed and e.save_freq > 0 and self.step % e.save_freq != 0:  # the final model is always saved
            checkpoints.save_model(self.stack.learners, self.tokenizer, e.output_dir, self.step, e.keep_last_n_checkpoints)
        leftover = sorted(self.untrained)
        self.pool.stop("abort")
        evals = self.log.evals
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
            "multi_version_frac": _mean(h.get("staleness/multi_version_frac", 0.0) for h in self.log.history),
        }
        (self.log.out / "untrained_prompts.json").write_text(json.dumps(leftover))
        self.log.finish(summary)
        return summary


def record_prompts(path: str, requests) -> None:
    """One JSON line per admitted prompt: what a replay benchmark needs to regenerate it."""
    with open(path, "a") as f:
        for r in requests:
            f.write(json.dumps({
                "prompt_id": r.prompt_id, "prompt_token_ids": list(r.prompt_token_ids), "num_samples": r.num_samples,
                "seed": r.seed, "admitted_version": r.admitted_version, "queued_at": r.queued_at,
                "sampling": dataclasses.asdict(r.sampling),
            }) + "\n")


def rollout_metrics(completions: list[Completion], learner_version: int) -> dict[str, float]:
    """What the trained samples looked like: reward, length, stop rate, staleness."""
    n = max(1, len(completions))
    lags = [learner_version - c.min_version for c in completions]
    # Per token, a straggler updated in flight is mostly fresh even when its first tokens are old.
    token_lag = sum(learner_version * len(c.response_token_ids) - _version_token_sum(c) for c in completions)
    tokens = sum(len(c.response_token_ids) for c in completions)
    latencies = _group_latencies(completions)
    return {
        "objective/verifiable_reward": sum(c.reward for c in completions) / n,
        "objective/correct_rate": sum(1 for c in completions if c.reward > 0) / n,
        "val/sequence_lengths": sum(len(c.response_token_ids) for c in completions) / n,
        "val/stop_rate": sum(1 for c in completions if c.finish_reason == "stop") / n,
        "val/error_samples": float(sum(1 for c in completions if c.finish_reason == "error")),
        "staleness/version_lag_avg": sum(lags) / n,
        "staleness/version_lag_max": float(max(lags, default=0)),
        "staleness/multi_version_frac": sum(1 for c in completions if c.spans_versions) / n,
        "staleness/token_lag_avg": token_lag / tokens if tokens else 0.0,
        "time/group_latency_s_avg": _mean(latencies),
        "time/group_latency_s_max": max(latencies, default=0.0),
    }


def _version_token_sum(completion: Completion) -> int:
    """Sum over response tokens of the weight version that generated each one."""
    spans = completion.version_spans
    covered = sum(s.end - s.start for s in spans)
    uncovered = len(completion.response_token_ids) - covered  # no spans reported: the admission version
    return sum(s.version * (s.end - s.start) for s in spans) + max(0, uncovered) * completion.admitted_version


def _group_latencies(completions: list[Completion]) -> list[float]:
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


def _rank_mean(per_rank: list[dict]) -> dict[str, float]:
    keys = [k for k in per_rank[0] if k != "learner/rank"]
    return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


# ----------------------------------------------------------------------------- entry


def run(cfg: Config) -> dict:
    from open_instruct import data
    from open_instruct.models import load_tokenizer, resolve_model_path

    model_path = resolve_model_path(cfg.model.model_name_or_path)
    tokenizer = load_tokenizer(cfg.model)
    seed = cfg.experiment.seed
    train = data.load_prompt_dataset(train_data_config(cfg), cfg.model, tokenizer, "train", cfg.remap_verifier, seed=seed)
    logger.info("training data:\n%s", train.report.summary())
    evaluation = data.load_prompt_dataset(eval_data_config(cfg), cfg.model, tokenizer, "eval", cfg.remap_verifier, seed=seed)
    logger.info("evaluation data:\n%s", evaluation.report.summary())
    stop = StopRequest()
    stack = None
    try:
        stack = Stack(cfg, model_path)
        stop.install()  # after ray.init, whose core worker installs its own (fatal) SIGTERM handler
        return TrainingLoop(cfg, stack, tokenizer, train.prompts, evaluation.prompts, stop).run()
    finally:
        stop.uninstall()
        if stack is not None:
            stack.close()
        else:
            import ray

            ray.shutdown()
