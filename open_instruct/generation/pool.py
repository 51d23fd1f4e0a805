"""Driver-side handle on the generation engines: shared channels, delivery ledger, failure detection.

The orchestrator talks to generation only through `EnginePool`: `submit` admitted prompts,
`poll` for finished samples, `stats` for occupancy, `stop` at the end; the weight sync uses
its `start_*` calls, which return Ray object refs by engine name instead of waiting. Every
engine runs its streaming loop (`GenerationActor.run`) as one long Ray call; that call's
ObjectRef resolves only when the loop ends, so an engine process that dies is noticed at
the next `poll` (within a fraction of a second), and the prompts it had pulled are named.

With a `respawn` (the Stack gives one, within --max_engine_restarts) a dead engine is replaced
instead of ending the run, and nobody waits for that: the samples it had not delivered go back to the
prompt queue at once (only the missing sample indices, so nothing is generated twice, each with the tokens
it had reported so far, so it continues instead of starting over), the engine leaves the weight sync's
members, and its replacement starts in the background (`generation.replacement`: the old processes
confirmed gone first). The other engines keep generating and the learner keeps training; the next weight
sync re-forms the transfer group with the new engine, loads the current weights into it with the others,
and then it pulls prompts (`admit_replacements`, `start_serving`). An engine that is alive but hung (no
answer, or no token with samples running, for --engine_hang_timeout_s) is killed and replaced the same way.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from open_instruct.generation.channels import RayChannel
from open_instruct.generation.faults import HangWatch, PartialSamples, Resubmission
from open_instruct.generation.ledger import DeliveryLedger
from open_instruct.generation.replacement import Replacement, Replacements
from open_instruct.messages import (
    Completion,
    EngineStarted,
    EngineStats,
    EngineStopped,
    PartialSample,
    PromptRequest,
    PromptStarted,
    SampleProgress,
)
from open_instruct.weights import shm_sweep

logger = logging.getLogger(__name__)


class EngineFailure(RuntimeError):
    """An engine's loop ended with an error; carries the prompts it had in flight."""

    def __init__(self, engine_id: int, cause: BaseException, in_flight: list[str]):
        shown = ", ".join(in_flight[:10]) + (" ..." if len(in_flight) > 10 else "")
        super().__init__(
            f"generation engine {engine_id} failed: {type(cause).__name__}: {str(cause).splitlines()[0][:300]}; "
            f"{len(in_flight)} prompts were in flight on it: [{shown}]"
        )
        self.engine_id = engine_id
        self.cause = cause
        self.in_flight = in_flight


class EnginePool:
    def __init__(
        self,
        actors: list,
        prompt_capacity: int,
        result_capacity: int = 0,
        respawn: Callable[[int], object] | None = None,
        rejoin: Callable[[], dict] | None = None,
        max_restarts: int = 0,
        hang_timeout_s: float = 0.0,
        reap: Callable[[EngineStarted], object] | None = None,
    ):
        self.actors = actors  # by engine id; a failed engine's stays until its replacement joins
        # respawn(engine_id): a new actor (not started) with that engine's id and placement; reap(old): its
        # processes confirmed gone (`replacement.Replacements`); rejoin(): the weight sync admits the ready
        # replacements and loads the current weights now (WeightSync.rejoin), for when no engine is serving.
        self.replacing = Replacements(respawn, reap) if respawn is not None else None
        self.rejoin = rejoin
        self.members: set[int] = set(range(len(actors)))  # the engines the weight sync loads
        self.membership_changes = 0  # the weight sync re-forms its group when this moved
        self.max_restarts = max_restarts
        self.restarts = 0
        self.duplicate_samples = 0  # generated twice after a resubmission (see Resubmission.look_for_unannounced)
        self.prompts: RayChannel[PromptRequest] = RayChannel(prompt_capacity, name="prompt queue")
        self.results: RayChannel = RayChannel(result_capacity, name="result queue")
        self.ledger = DeliveryLedger()
        self._loops: dict = {}  # ObjectRef of each engine's run() -> engine id
        self._carried: list[Completion] = []  # drained while reporting a failure; returned by the next poll
        self.start_info: list[EngineStarted] = []
        self.partials = PartialSamples()
        self.resubmission = Resubmission(self.prompts, self.ledger, self.partials)
        self.hangs = HangWatch(hang_timeout_s)
        self.hung_engines = 0
        self._hangs_checked_at = float("-inf")
        self._interrupting = False  # stop("interrupt") in progress: cut samples are kept, not delivered

    @property
    def num_engines(self) -> int:
        return len(self.actors)

    def member_ids(self) -> list[int]:
        return sorted(self.members)

    @property
    def replacements(self) -> list[Replacement]:
        """Every replacement begun, in order, with its times (what a fault cost)."""
        return self.replacing.history if self.replacing is not None else []

    def start(self, timeout_s: float = 600) -> list[EngineStarted]:
        info = self.start_engines(timeout_s)
        self.start_loops()
        return info

    def start_engines(self, timeout_s: float = 600) -> list[EngineStarted]:
        """Build every vLLM engine (in parallel); they pull nothing until `start_loops`."""
        import ray

        self.start_info = ray.get([actor.start.remote() for actor in self.actors], timeout=timeout_s)
        return self.start_info

    def start_loops(self) -> None:
        self._loops = {actor.run.remote(self.prompts, self.results): i for i, actor in enumerate(self.actors)}

    def submit(self, requests: list[PromptRequest], timeout_s: float = 60) -> None:
        for request in requests:
            self.ledger.admit(request)
            self.resubmission.admitted(request)
            self.partials.count(request, request.partials)  # a resumed run's interrupted samples
            self.prompts.put(request, timeout=timeout_s)

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        """Finished samples so far (waiting up to timeout_s for the first); raises EngineFailure."""
        self._watch()
        messages = self.results.get_all()
        if not messages and timeout_s > 0:
            deadline = time.monotonic() + timeout_s
            while not messages and time.monotonic() < deadline:
                time.sleep(0.02)
                self._watch()
                messages = self.results.get_all()
        completions, self._carried = self._carried + self._record(messages), []
        return completions

    def _watch(self) -> None:
        """Failures noticed, replacements moved on, unannounced prompts decided: none of it waits."""
        self.check_engines()
        self.check_hangs()
        self._advance_replacements()
        if self.resubmission.decision_due():
            self._drain_results()  # announcements that came meanwhile
            self.resubmission.resubmit_unannounced()
        # With no engine generating, no step ends and no weight sync comes: a ready replacement joins now.
        if self.rejoin is not None and not self._loops and self._replacements_waiting():
            self.rejoin()

    def _replacements_waiting(self) -> bool:
        return self.replacing is not None and any(r.engine_id not in self.members for r in self.replacing.ready())

    def check_engines(self) -> None:
        import ray

        if not self._loops:
            return
        done, _ = ray.wait(list(self._loops), num_returns=len(self._loops), timeout=0)
        for ref in done:
            engine_id = self._loops.pop(ref)
            try:
                ray.get(ref)
            except Exception as error:  # a dead actor or an engine error: replace it, or report it
                self._engine_failed(engine_id, error)
                continue
            logger.info("engine %d's loop ended", engine_id)

    def check_hangs(self) -> None:
        """Probe the engines now and then (their `stats`, never waited on); replace those `HangWatch` finds hung."""
        import ray

        now = time.monotonic()
        # poll() calls this every 20 ms while it waits; probes go out every few seconds, so checking their
        # answers a few times a second is enough.
        if self.hangs.timeout_s <= 0 or now - self._hangs_checked_at < 0.25:
            return
        self._hangs_checked_at = now
        pending = self.hangs.pending()
        if pending:
            ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=0)
            for engine_id, ref in pending.items():
                if ref not in ready:
                    continue
                try:
                    stats: EngineStats = ray.get(ref)
                except Exception:  # it died: its loop's end reports that (check_engines)
                    self.hangs.forget(engine_id)
                    continue
                self.hangs.answered_stats(engine_id, stats)
        for engine_id, why in self.hangs.hung(now).items():
            self.hung_engines += 1
            self._engine_failed(engine_id, TimeoutError(f"engine {engine_id} hung: {why}"))
        for engine_id in sorted(set(self._loops.values())):
            if self.hangs.probe_due(engine_id, now):
                self.hangs.probe_sent(engine_id, self.actors[engine_id].stats.remote(), now)

    def replace_stuck(self, engine_ids: list[int], why: str) -> None:
        """Members stuck in a weight receive that cannot end (NCCL's has no timeout): replaced like hung ones."""
        for engine_id in sorted(set(engine_ids) & self.members):  # counted in `restarts`, not `hung_engines`
            self._engine_failed(engine_id, TimeoutError(f"engine {engine_id} stuck in a weight receive: {why}"))

    def notice_dead(self, wait_s: float = 3.0) -> int:
        """After a weight sync failed (was an engine lost, or is it a real sync failure?): wait up to `wait_s`
        for Ray to report members that died; they leave the members, their replacement begins. Returns how many."""
        before = self.restarts
        self._check_joining(wait_s)
        deadline = time.monotonic() + wait_s
        self.check_engines()
        while self.restarts == before and self._loops and time.monotonic() < deadline:
            time.sleep(0.1)
            self.check_engines()
        return self.restarts - before

    def _check_joining(self, timeout_s: float) -> None:
        """Members with no loop (replacements joining) have no ObjectRef that ends when they die: ask them."""
        import ray

        joining = self.members - set(self._loops.values())
        refs = {engine_id: self.actors[engine_id].stats.remote() for engine_id in sorted(joining)}
        for engine_id, ref in refs.items():
            try:
                ray.get(ref, timeout=timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
                self._engine_failed(engine_id, error)

    def _engine_failed(self, engine_id: int, error: BaseException) -> None:
        """Begin its replacement within the restart budget (see the module doc); past it raise `EngineFailure`."""
        import ray

        self._drain_results()  # samples it finished before dying count as delivered
        self.hangs.forget(engine_id)
        failure = EngineFailure(engine_id, error, self.ledger.in_flight(engine_id))
        if self.replacing is None:
            raise failure from error
        if self.restarts >= self.max_restarts:
            budget = RuntimeError(f"--max_engine_restarts {self.max_restarts} used up; last failure: {failure}")
            raise EngineFailure(engine_id, budget, failure.in_flight) from error
        self.restarts += 1
        logger.warning("%s; replacing it (restart %d of %d)", failure, self.restarts, self.max_restarts)
        for ref, loop_engine in list(self._loops.items()):
            if loop_engine == engine_id:
                del self._loops[ref]
        self.members.discard(engine_id)
        self.membership_changes += 1
        with contextlib.suppress(Exception):  # hung rather than dead: make sure it is gone
            ray.kill(self.actors[engine_id])
        self.resubmission.resubmit(failure.in_flight)
        self.resubmission.look_for_unannounced()
        self.replacing.begin(engine_id, self.start_info[engine_id] if engine_id < len(self.start_info) else None)

    def _advance_replacements(self) -> None:
        if self.replacing is None or not len(self.replacing):
            return
        for engine_id, error in self.replacing.advance().items():
            first_line = str(error).splitlines()[0][:300] if str(error) else ""
            self._engine_failed(engine_id, RuntimeError(f"its replacement failed to start: {first_line}"))

    def admit_replacements(self) -> list[int]:
        """The replacements whose engine is built become members: the weight sync about to run re-forms its
        group with them and loads them with the others (`WeightSync.push`), then `start_serving`."""
        if self.replacing is None:
            return []
        self._advance_replacements()
        joining = []
        for r in self.replacing.ready():
            if r.engine_id not in self.members:
                self.actors[r.engine_id], self.start_info[r.engine_id] = r.actor, r.info
                self.members.add(r.engine_id)
                self.membership_changes += 1
                joining.append(r.engine_id)
        return joining

    def start_serving(self, engine_ids: list[int], version: int) -> None:
        """Admitted replacements that the weight sync loaded at `version` pull prompts from now on."""
        for engine_id in engine_ids:
            if engine_id not in self.members:  # it died while joining: replaced once more
                continue
            r = self.replacing.serving(engine_id)
            self._loops[self.actors[engine_id].run.remote(self.prompts, self.results)] = engine_id
            logger.info(
                "engine %d replaced (%s); it joined at weight version %d, %.1f s after the failure",
                engine_id,
                r.info,
                version,
                r.serving_at - r.noticed_at,
            )
        if engine_ids:
            shm_sweep.sweep()  # the killed engines' vLLM message queues in /dev/shm, once no process maps them

    def _drain_results(self) -> None:
        """Take in everything already queued, so in-flight lists are complete; completions are kept
        for the next `poll` (work finished before a failure is not lost)."""
        self._carried += self._record(self.results.get_all())

    def _record(self, messages: list) -> list[Completion]:
        completions = []
        for message in messages:
            if isinstance(message, PromptStarted):
                self.ledger.started(message.prompt_id, message.engine_id)
            elif isinstance(message, SampleProgress):
                self.partials.report(message)
            elif self._is_duplicate(message):
                self.duplicate_samples += 1
            elif self._interrupting and message.finish_reason == "abort" and not message.is_eval:
                self.partials.interrupted(message)  # for the resume state: continued by the next run
            else:
                if self.ledger.deliver(message):
                    self.resubmission.completed(message.prompt_id)
                self.partials.delivered(message.prompt_id, message.sample_index)
                completions.append(message)
        return completions

    def _is_duplicate(self, completion: Completion) -> bool:
        """A second copy of a sample resubmitted after its engine failed (see `Resubmission`)."""
        return completion.prompt_id in self.ledger.reassigned and self.ledger.has(
            completion.prompt_id, completion.sample_index
        )

    def partial_samples(self, prompt_id: str) -> tuple[PartialSample, ...]:
        """What is kept of `prompt_id`'s undelivered samples (for the resume state)."""
        return self.partials.of_prompt(prompt_id)

    # -- weight sync (the members only): refs by engine name, awaited by WeightSync together with the learners'

    def _start_all(self, method: str, *args) -> dict[str, object]:
        return {f"engine {i}": getattr(self.actors[i], method).remote(*args) for i in self.member_ids()}

    def start_pause(self, mode: str) -> dict[str, object]:
        return self._start_all("pause", mode)

    def start_receive_weights(self, update_info: dict, version: int, timeout_s: float) -> dict[str, object]:
        return self._start_all("receive_weights", update_info, version, timeout_s)

    def start_resume(self) -> dict[str, object]:
        return self._start_all("resume")

    def start_join_weight_transfer(self, init_infos: dict[int, dict]) -> dict[str, object]:
        """Engine i joins the transfer group with `init_infos[i]` (its ranks in the group)."""
        return {f"engine {i}": self.actors[i].init_weight_transfer.remote(info) for i, info in init_infos.items()}

    # -- direct calls (benchmarks, calibration)

    def call_all(self, method: str, *args, timeout_s: float = 600) -> list:
        """Call `method` on every member engine (`member_ids` order) and wait for their replies (e.g.
        `reset_stats`).

        An engine that died surfaces as `EngineFailure` naming it and its in-flight prompts, whichever
        call notices first (a poll, a stats call, an abort); with a replacement coming it is left out of
        the replies instead."""
        import ray

        if self.hangs.timeout_s > 0:  # a hung engine must not hold the driver longer than a hang takes to call
            timeout_s = min(timeout_s, self.hangs.timeout_s)
        refs = {engine_id: getattr(self.actors[engine_id], method).remote(*args) for engine_id in self.member_ids()}
        replies = []
        for engine_id, ref in refs.items():
            try:
                replies.append(ray.get(ref, timeout=timeout_s))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:  # gone, or hung
                if isinstance(error, ray.exceptions.GetTimeoutError):
                    self.hung_engines += 1
                    error = TimeoutError(f"engine {engine_id} hung: no answer to {method} for {timeout_s:g} s")
                self._engine_failed(engine_id, error)  # raises unless a replacement is coming
        return replies

    def generate(
        self, requests: list[PromptRequest], engine_index: int = 0, timeout_s: float = 600
    ) -> list[Completion]:
        """Fixed-batch generation on one engine, outside the streaming loop (baselines, calibration)."""
        import ray

        return ray.get(self.actors[engine_index].generate.remote(requests), timeout=timeout_s)

    def stats(self) -> list[EngineStats]:
        return self.call_all("stats")

    def abort_stale(self, min_version: int, prompt_ids: list[str]) -> int:
        """Abort running samples whose first token predates `min_version`, and all samples of `prompt_ids`
        (they come back through `poll` as finish_reason "abort"); returns how many were aborted."""
        return sum(self.call_all("abort_stale", min_version, prompt_ids))

    def pool_metrics(self) -> dict[str, float]:
        return {
            "queue/prompt_depth": self.prompts.depth(),
            "queue/result_depth": self.results.depth(),
            "engines/restarts_total": float(self.restarts),
            "engines/resubmitted_samples_total": float(self.resubmission.samples),
            "engines/duplicate_samples_dropped_total": float(self.duplicate_samples),
            "engines/hung_total": float(self.hung_engines),
            "engines/last_replacement_s": self._last_replacement_s(),
            "engines/replacing": float(len(self.replacing or ())),
            "engines/serving": float(len(set(self._loops.values()))),
            **self.partials.metrics(),
        }

    def _last_replacement_s(self) -> float:
        """Failure noticed -> the replacement pulls prompts (built, and loaded at a weight sync; nobody waited)."""
        served = [r for r in self.replacements if r.serving_at is not None]
        return served[-1].serving_at - served[-1].noticed_at if served else 0.0

    def stop(self, mode: str = "finish", timeout_s: float = 600) -> list[Completion]:
        """Stop every engine; returns the samples delivered meanwhile. 'finish' lets running samples end,
        'abort' cuts them and delivers them as they are (finish_reason "abort"), 'interrupt' cuts them and
        keeps their tokens as partial samples instead (`partial_samples`: a stopping run saves them)."""
        import ray

        if mode not in ("finish", "abort", "interrupt"):
            raise ValueError(f"stop mode must be finish, abort or interrupt, got {mode!r}")
        self._interrupting = mode == "interrupt"
        engine_mode = "abort" if mode == "interrupt" else mode
        self._abandon_replacements()
        serving = sorted(set(self._loops.values()))
        reports: list[EngineStopped] = ray.get(
            [self.actors[i].stop.remote(engine_mode) for i in serving], timeout=timeout_s
        )
        ray.get(list(self._loops), timeout=timeout_s)
        self._loops = {}
        for r in reports:
            logger.info(
                "engine %d stopped (%s): %d samples were in flight; it completed %d samples, at weight version %d",
                r.engine_id,
                r.mode,
                r.in_flight_at_stop,
                r.completed_samples,
                r.weight_version,
            )
        completions = self.poll()
        self._interrupting = False
        # Prompts no engine pulled would wait in the queue for the next `start_loops`, which would generate
        # them for a run that has ended (a benchmark runs its modes on one pool); the stopping run still
        # holds them as untrained (a stopped run saves them).
        never_started = self.prompts.get_all()
        if never_started:
            logger.info("%d prompts in the queue were never started", len(never_started))
        return completions

    def _abandon_replacements(self) -> None:
        if self.replacing is not None and self.replacing.abandon():
            logger.info("the run ends with an engine replacement still starting: it is stopped")

    def shutdown(self) -> None:
        import ray

        self._abandon_replacements()
        for actor in self.actors:
            try:
                ray.get(actor.shutdown.remote(), timeout=60)
            except Exception as error:  # already dead: nothing to shut down
                logger.info("engine shutdown: %s", type(error).__name__)
            finally:
                ray.kill(actor)
        for channel in (self.prompts, self.results):
            with contextlib.suppress(Exception):  # channel actor gone with the cluster
                channel.close()
