"""Syncing new learner weights into running engines (the driver's half of the protocol).

One sync, for every engine at once (they share one transfer group, learner rank 0 = rank 0):

    pause(keep | wait) → receive_weights [start → update ∥ learners' send → finish(version)] → resume

`inflight=True` pauses in vLLM's "keep" mode without clearing the cache: running requests
keep their KV cache and continue with the new weights, and vLLM records the version switch
in each request's weight-version spans. `inflight=False` is the conservative baseline:
running requests first finish with the old weights ("wait"), then the update happens.

Every step has a timeout; a failure names the step and the engine or learner, and `resume`
is always attempted, so no engine is left paused. The first failure is the sync's error: a resume
that then times out is its consequence, noted after it (see `WeightSync._resume_after`). The
parties bound their own part too: a learner's send by the same timeout (`SendWatchdog`, which aborts
its group), and an engine whose update failed keeps its previous weights (`weights.reload`) and serves
on. Each re-form of the group frees the last one on both ends first (`WeightSender.open`,
`WeightReceiver.init_weight_transfer`). Which transport recovers from which failure: `WeightSync.sync`.
Tensors travel through the transfer group (`weights.gloo` on CPU, `weights.nccl` on GPU: the same five
calls; see `weights.transport`), metadata through Ray. `WeightSync` is a driver-side handle like
`EnginePool` and `LearnerGroup`: it starts their calls and waits on both sides at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

from open_instruct.config.generation import GenerationConfig
from open_instruct.messages import EnginePaused, WeightMetadata, WeightsReceived, WeightsSent
from open_instruct.weights.transport import WeightSyncError, transport
from open_instruct.weights.watchdog import ABORT_GRACE_S, FREED

# The driver waits this much longer than each party's own timeout, so that the party's error (which names
# the cause) arrives before the driver's own "timed out waiting for ..." does.
REPORT_GRACE_S = 30.0
# After the first failure of a step, how long the others may take to report theirs (see `root_cause`).
FAILURE_SETTLE_S = 5.0
# After a transfer failed on a learner, or over a transport whose receive has no timeout (NCCL), how long the
# engines may take to resume before the sync ends with that failure: over gloo they leave their receive at once
# (the learner closed its end of the group); over NCCL they never do, and `resume` waits behind the receive.
RESUME_AFTER_FAILURE_S = 30.0
# How a party says that another one left the transfer group: a consequence, not a cause.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


class RayWaiter:
    """How the driver waits on actor calls (`ray.wait`/`ray.get`) and reads the time; tests pass a fake."""

    now = staticmethod(time.monotonic)

    def wait(self, refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        import ray

        return ray.wait(refs, num_returns=num_returns, timeout=timeout)

    def get(self, ref):
        import ray

        return ray.get(ref)


@dataclass(frozen=True)
class SyncSettings:
    """How weights are synced: the transport placement chose, the engines' dtype, and the generation flags
    that shape a sync (--inflight_updates; --vllm_tensor_parallel_size ranks per engine in the group)."""

    backend: str  # one of TRANSPORTS
    dtype_name: str  # the engines' dtype: weights are cast to it before sending
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    bucket_bytes: int = 64 << 20
    timeout_s: float = 600.0  # per protocol step, and the transfer group's own collective timeout

    @classmethod
    def from_config(cls, cfg, backend: str, on_gpu: bool) -> SyncSettings:
        from open_instruct.config.derived import resolve_dtype

        dtype_name = resolve_dtype(cfg.model.dtype, cfg.model.model_dtype, on_gpu)
        return cls(backend, dtype_name, cfg.generation)


class WeightSync:
    """Connects learner rank 0 to every engine once, then syncs versions on demand."""

    def __init__(self, learners, engines, settings: SyncSettings, waiter=None):
        self.learners = learners  # LearnerGroup
        self.engines = engines  # EnginePool
        self.settings = settings
        self.waiter = waiter or RayWaiter()
        self.metadata: WeightMetadata | None = None
        self.syncs = 0
        self.version = 0  # the last version every engine loaded
        self.members: list[int] = []  # the engines in the transfer group as last connected
        self.membership_seen = -1  # the pool's `membership_changes` at that connect
        self._sending: dict = {}  # the learners' send calls of the broadcast in progress, by learner name

    def with_settings(self, **changes) -> WeightSync:
        """The same connected group with other settings (e.g. a benchmark switching `inflight` per mode)."""
        other = WeightSync(self.learners, self.engines, dataclasses.replace(self.settings, **changes), self.waiter)
        other.metadata, other.syncs, other.version = self.metadata, self.syncs, self.version
        other.members, other.membership_seen = self.members, self.membership_seen
        return other

    def rejoin(self) -> dict[str, float]:
        """Replacements join now instead of at the next sync (the pool asks when no engine is generating):
        every engine loads the learner's current weights, which re-forms the group with them. They are
        labelled with the version the learner holds, not the last one synced: with --weight_sync_every_steps
        above 1 the learner may have trained since, and it keeps no older weights to send. Before the first
        step the new engines already hold the starting weights: the group is re-formed, and nothing is sent."""
        trained = self.learners.policy_version()
        if trained > 0:
            return self.sync(trained)
        joining = self.engines.admit_replacements()
        metrics = self.connect()
        self.engines.start_serving(joining, self.version)
        return metrics

    def connect(self) -> dict[str, float]:
        """Rendezvous the transfer group with the member engines: they join while rank 0 opens it (they block
        on each other). A collective group cannot lose or take in a member, so it is formed anew whenever the
        members change (`sync`). A staged transport (shm, ipc) has no group: the same calls only set both
        ends up."""
        started = time.monotonic()
        wire = transport(self.settings.backend)
        host, port = self.learners.rendezvous_address(hold=wire.HOLDS_PORT)
        engine_ranks = self.settings.generation.vllm_tensor_parallel_size
        membership, members = self.engines.membership_changes, self.engines.member_ids()
        world_size = 1 + len(members) * engine_ranks
        refs = self.engines.start_join_weight_transfer(
            {
                engine_id: wire.worker_init_info(
                    host, port, world_size, self.settings.timeout_s, rank_offset=1 + k * engine_ranks
                )
                for k, engine_id in enumerate(members)
            }
        )
        refs |= self.learners.start_open_weight_transport(
            self.settings.backend, host, port, world_size, self.settings.timeout_s, every_rank=wire.EVERY_RANK_STAGES
        )
        self._get("init transfer group", refs)
        self.members, self.membership_seen = members, membership
        self.metadata = self.learners.weight_metadata(self.settings.dtype_name)
        group_size = 0.0 if wire.STAGED else float(world_size)
        return {"weight_sync/connect_s": time.monotonic() - started, "weight_sync/group_size": group_size}

    def sync(self, version: int, step_end_time: float | None = None) -> dict[str, float]:
        """Load `version` into every member engine; returns metrics. Engines are resumed whatever happens.

        Replacements that are ready join here: the group is re-formed with them, they are loaded with the
        others, then they serve. An engine that died since the last sync has left the members (the group is
        re-formed without it); one that dies during this sync fails it for the others (each step has its
        timeout), then it leaves and the sync runs once more, where the others could leave the transfer:

        ==================  =======================  ===========================  ==========================
        transport           learner dies mid-send    engine dies mid-receive      a step times out
        ==================  =======================  ===========================  ==========================
        gloo (CPU)          ends the sync at once    left out, synced again       ends the sync (the group
                            with the learner's       (the others' receive fails   timeout frees the others,
                            error; engines resume    at once)                     which resume)
        shm (CPU), ipc      ends the sync at once    left out, synced again       ends the sync; engines
        (GPU)               (nothing in flight)      (the others finish loading)  resume
        nccl (GPU)          ends the sync at once    left out; the engines left   the engines left in the
                            with the learner's       in the receive are replaced  receive are replaced once
                            error; engines stay in   once the learner's watchdog  the learner's watchdog
                            the receive: restart     aborted its group (after     aborted its group; the
                            (from a checkpoint)      the sync timeout); synced    others synced again
                                                     again
        ==================  =======================  ===========================  ==========================

        "Ends" means a `WeightSyncError` naming the first failure (step, actor, cause) within
        `FAILURE_SETTLE_S` + `RESUME_AFTER_FAILURE_S` of it over NCCL or after a learner's failure, never
        a later resume timeout. A learner whose send runs past its watchdog aborts its end of the group
        (`weights.watchdog`), which ends the send; only a send the abort does not end makes it refuse every
        later send. The engines' ends cannot be aborted from outside (their worker is inside the receive):
        over NCCL the engines left in it are killed and replaced like hung ones (`_resume_after`), once every
        learner's send is known to have ended; otherwise (a learner's own failure, a send the abort did not
        end) the run ends, naming them."""
        self.engines.check_engines()
        joining = self.engines.admit_replacements()
        try:
            metrics = self._attempt(version, step_end_time)
        except WeightSyncError as error:
            # `notice_dead` first: the engine whose death caused the failure leaves the members too.
            if not error.retry or not (self.engines.notice_dead() or error.replaced):
                raise
            metrics = self._attempt(version, step_end_time)
        self.engines.start_serving(joining, version)
        return metrics | {"weight_sync/engines": float(len(self.members)), "weight_sync/joined": float(len(joining))}

    def _attempt(self, version: int, step_end_time: float | None) -> dict[str, float]:
        if self.metadata is None:
            raise WeightSyncError("weight sync not connected: call connect() first")
        if not self.engines.member_ids():  # every engine is being replaced: they join when built (`rejoin`)
            return {}
        reconnected = {}
        if self.engines.membership_changes != self.membership_seen:  # an engine left, or a replacement joins
            reconnected = self.connect()
        return reconnected | self._sync_members(version, step_end_time)

    def _sync_members(self, version: int, step_end_time: float | None) -> dict[str, float]:
        if not transport(self.settings.backend).STAGED:
            return self._pause_transfer_resume(version, step_end_time, None)
        try:
            # Staging reads only the learners' weights: the engines go on generating meanwhile and pause
            # just to load them.
            started = time.monotonic()
            sent = self._get("stage", self._start_send(version), timeout_s=self.settings.timeout_s + REPORT_GRACE_S)
            stage_s = time.monotonic() - started
            metrics = self._pause_transfer_resume(version, step_end_time, sent)
        except BaseException:
            # Also after a failure: an engine that failed to load has stopped reading (it restored its weights).
            # The first failure stays the sync's error.
            with contextlib.suppress(WeightSyncError):
                self._get("release", self.learners.start_release_weights())
            raise
        self._get("release", self.learners.start_release_weights())
        return metrics | {"time/weight_sync_stage_s": stage_s}

    def _pause_transfer_resume(self, version: int, step_end_time: float | None, staged: list | None) -> dict:
        paused_at = time.monotonic()
        mode = self.settings.generation.inflight_update_kv if self.settings.generation.inflight_updates else "wait"
        pauses: list[EnginePaused] = []
        try:
            pauses = self._get("pause", self.engines.start_pause(mode))
            transfer_at = time.monotonic()
            reports = self._transfer(version, staged)
            transferred_at = time.monotonic()
        except BaseException as error:
            self._resume_after(error)
            raise
        # Each engine resumes once it has finished loading (the reload's post-processing included).
        resumed = self._get("resume", self.engines.start_resume(), timeout_s=2 * self.settings.timeout_s + 60)
        resumed_at = time.monotonic()
        self.syncs += 1
        self.version = version
        sent = [r for r in reports if isinstance(r, WeightsSent)]
        received = [r for r in reports if isinstance(r, WeightsReceived)]
        bytes_sent = sum(r.bytes_sent for r in sent)
        transfer_s = transferred_at - transfer_at
        metrics = {
            "time/weight_sync_pause_s": resumed_at - paused_at,  # engines frozen (or draining) this long
            "time/weight_sync_drain_s": transfer_at - paused_at,
            "time/weight_sync_transfer_s": transfer_s,
            "weight_sync/bytes": float(bytes_sent),
            "weight_sync/bandwidth_mb_s": bytes_sent / transfer_s / 1e6 if transfer_s > 0 else 0.0,
            "weight_sync/kept_requests": float(sum(p.kept_requests for p in pauses)),
            "weight_sync/engine_receive_s_max": max((r.receive_s for r in received), default=0.0),
            "weight_sync/version": float(version),
        }
        if step_end_time is not None:
            lags = [at - step_end_time for at in resumed]
            for i, lag in enumerate(lags):
                metrics[f"weight_sync/step_end_to_resume_s/engine_{i}"] = lag
            metrics["weight_sync/step_end_to_resume_s_max"] = max(lags)
        return metrics

    def _resume_after(self, failure: BaseException) -> None:
        """Resume every engine after `failure` of the pause or the transfer; `failure` stays the sync's error.

        After a failed transfer over gloo an engine may sit in the group's collective until the group
        timeout, then finishes the reload and resumes: waited for (`2 x timeout + 60`). A transfer that failed
        on a learner first, or any over NCCL (whose receive has no timeout), gets `RESUME_AFTER_FAILURE_S`:
        engines still receiving then are named in the error. Over NCCL those engines cannot leave the receive:
        once every learner's send has ended, freed by its watchdog's abort (waited for: at most the sync
        timeout and `ABORT_GRACE_S` after it began), they are replaced and the sync may run again (`replaced`);
        otherwise it is not retried (`retry`)."""
        in_transfer = getattr(failure, "step", None) == "transfer"
        sender_failed = in_transfer and (getattr(failure, "party", None) or "").startswith("learner")
        receive_can_hang = in_transfer and transport(self.settings.backend).RECEIVE_CAN_HANG
        timeout_s = RESUME_AFTER_FAILURE_S if sender_failed or receive_can_hang else 2 * self.settings.timeout_s + 60
        refs = self.engines.start_resume()
        names = {ref: name for name, ref in refs.items()}
        _, pending = self.waiter.wait(list(names), num_returns=len(names), timeout=timeout_s)
        late = [names[ref] for ref in pending]  # a failed resume is a dead engine: the pool replaces it
        where = " (still in the transfer's receive" if in_transfer else ""
        where += ", which has no timeout over NCCL)" if receive_can_hang else ")" if in_transfer else ""
        note = f"; then {', '.join(late)} did not resume within {timeout_s:.0f}s{where}: restart the run"
        if isinstance(failure, WeightSyncError):
            if receive_can_hang and late and self._learners_freed():
                # The learners' sends ended (their watchdog aborted the group): only the engines are stuck,
                # and a stuck engine is replaced like a hung one. The sync then runs again without them.
                self.engines.replace_stuck([int(name.split()[-1]) for name in late], f"{failure}")
                failure.replaced = tuple(late)
                failure.args = (f"{failure}; then {', '.join(late)} stayed in the transfer's receive: replaced",)
                return
            failure.retry = failure.retry and not late and not receive_can_hang
            if late:
                failure.args = (f"{failure}{note}",)
        elif late:
            failure.add_note(note[2:])

    def _learners_freed(self) -> bool:
        """Whether every learner's send of the failed broadcast has ended, none by a failure of its own: done,
        or freed by its watchdog's abort (`weights.watchdog.FREED`). Waits for their watchdogs, which answer
        within the sync timeout and the abort's grace of the send's start."""
        refs = list(self._sending.values())
        if not refs:
            return False
        _, pending = self.waiter.wait(refs, num_returns=len(refs), timeout=self.settings.timeout_s + ABORT_GRACE_S)
        if pending:
            return False
        for ref in refs:
            try:
                self.waiter.get(ref)
            except Exception as error:
                if FREED not in str(error):
                    return False
        return True

    def _start_send(self, version: int) -> dict:
        return self.learners.start_send_weights(
            self.metadata, self.settings.bucket_bytes, version, self.settings.timeout_s
        )

    def _transfer(self, version: int, staged: list | None) -> list:
        """The weights' way into the paused engines: a broadcast they receive concurrently, or the update
        info of what the learners staged (`staged`: their reports). Returns the learners' and engines' reports."""
        md = self.metadata
        wire = transport(self.settings.backend)
        self._sending = {}
        if staged is None:
            info = wire.update_info(
                list(md.names), list(md.dtype_names), [list(x) for x in md.shapes], self.settings.bucket_bytes
            )
            self._sending = self._start_send(version)
            refs = self.engines.start_receive_weights(info, version, self.settings.timeout_s) | self._sending
            return self._get("transfer", refs, timeout_s=self.settings.timeout_s + REPORT_GRACE_S)
        info = wire.merge_staged([report.staged for report in staged])
        loading = self.engines.start_receive_weights(info, version, self.settings.timeout_s)
        return staged + self._get("transfer", loading, timeout_s=self.settings.timeout_s + REPORT_GRACE_S)

    def _get(self, step: str, refs: dict, timeout_s: float | None = None) -> list:
        """Results in `refs` order. A failure is raised without waiting for the rest (its peers may be blocked
        in the transfer group waiting for it), after a short settle for the failure that caused it: see
        `root_cause`. A timeout names the actors still pending."""
        waiter = self.waiter
        names = {ref: name for name, ref in refs.items()}
        timeout_s = timeout_s or self.settings.timeout_s
        deadline = waiter.now() + timeout_s
        pending = list(names)
        failures: list[tuple[str, BaseException]] = []
        while pending and not failures:
            done, pending = waiter.wait(pending, num_returns=1, timeout=max(0.0, deadline - waiter.now()))
            if not done:
                late = ", ".join(names[r] for r in pending)
                message = f"weight sync step '{step}' timed out after {timeout_s:.0f}s waiting for {late}"
                raise WeightSyncError.of(message, step)
            failures += _failures(done, names, waiter)
        if failures:
            done, _ = waiter.wait(pending, num_returns=len(pending), timeout=FAILURE_SETTLE_S) if pending else ([], [])
            name, error = root_cause(failures + _failures(done, names, waiter))
            reason = str(error).strip().splitlines()[-1][:300] if str(error).strip() else ""
            message = f"weight sync step '{step}' failed on {name}: {type(error).__name__}: {reason}"
            raise WeightSyncError.of(message, step, name) from error
        return [waiter.get(ref) for ref in refs.values()]


def _failures(done: list, names: dict, waiter) -> list[tuple[str, BaseException]]:
    failures = []
    for ref in done:
        try:
            waiter.get(ref)
        except Exception as error:
            failures.append((names[ref], error))
    return failures


def root_cause(failures: list[tuple[str, BaseException]]) -> tuple[str, BaseException]:
    """The failure that says why a step failed. When one party fails (an engine died, the learner refused a
    weight), the learner closes its end of the group and the others fail with a lost connection, often
    sooner than the cause reaches the driver: those are reported only when nothing else failed."""
    causes = [(name, error) for name, error in failures if not any(gone in str(error) for gone in _PEER_GONE)]
    return (causes or failures)[0]
