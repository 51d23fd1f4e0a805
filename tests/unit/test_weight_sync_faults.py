"""Which error a failed weight sync ends with, and when: the driver's waits on fake actor calls and a virtual
clock (`WeightSync`'s `waiter`), no Ray. A call either answers at a scripted time or never (an engine
blocked in vLLM's NCCL receive, which has no timeout, and its `resume` queued behind it)."""

from __future__ import annotations

import pytest

from open_instruct.messages import EnginePaused, WeightMetadata, WeightsReceived, WeightsSent
from open_instruct.weights import sync as weight_sync
from open_instruct.weights.sync import SyncSettings, WeightSync
from open_instruct.weights.transport import WeightSyncError

TIMEOUT_S = 600.0
NEVER = None


class Call:
    def __init__(self, at: float | None, value=None, error: BaseException | None = None):
        self.at, self.value, self.error = at, value, error


class VirtualWaiter:
    """`ray.wait`/`ray.get` on `Call`s: time moves only when the driver waits."""

    def __init__(self):
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def wait(self, refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        answering = sorted((c.at, i) for i, c in enumerate(refs) if c.at is not None and c.at <= self.clock + timeout)
        if len(answering) >= num_returns:
            self.clock = max(self.clock, answering[num_returns - 1][0])
        else:
            self.clock += timeout
        done = [c for c in refs if c.at is not None and c.at <= self.clock]
        return done, [c for c in refs if c not in done]

    def get(self, call: Call):
        assert call.at is not None and call.at <= self.clock, "ray.get of a call that has not answered"
        if call.error is not None:
            raise call.error
        return call.value


class Engines:
    """Two member engines; `receive` and `resume` say when each answers (relative to the call) and how.
    `ready`: replacements built and waiting to join (`EnginePool.admit_replacements`)."""

    def __init__(self, waiter: VirtualWaiter, receive: list[Call], resume: list[Call]):
        self.waiter, self.receive, self.resume = waiter, receive, resume
        self.members, self.ready = [0, 1], []
        self.membership_changes = 0
        self.asked_for_dead = 0
        self.joins: list[dict] = []  # each connect's init infos, by engine id
        self.served: list[tuple[list[int], int]] = []
        self.dead: list[int] = []  # members that died: `notice_dead` finds them
        self.stuck: list[int] = []  # members replaced because they stayed in a receive

    def _started(self, calls: list[Call]) -> dict[str, Call]:
        now = self.waiter.clock
        return {
            f"engine {i}": Call(None if c.at is None else now + c.at, c.value, c.error)
            for i, c in zip(self.members, calls, strict=False)
        }

    def check_engines(self) -> None:
        pass

    def member_ids(self) -> list[int]:
        return sorted(self.members)

    def admit_replacements(self) -> list[int]:
        joining, self.ready = self.ready, []
        self.members += joining
        self.membership_changes += len(joining)
        return joining

    def start_serving(self, engine_ids: list[int], version: int) -> None:
        self.served.append((engine_ids, version))

    def notice_dead(self) -> int:
        self.asked_for_dead += 1
        gone = [i for i in self.members if i in self.dead]
        self._leave(gone)
        return len(gone)

    def replace_stuck(self, engine_ids: list[int], why: str) -> None:
        self.stuck += engine_ids
        self._leave(engine_ids)

    def _leave(self, engine_ids: list[int]) -> None:
        self.members = [i for i in self.members if i not in engine_ids]
        self.membership_changes += len(engine_ids)

    def start_join_weight_transfer(self, init_infos: dict[int, dict]) -> dict[str, Call]:
        self.joins.append(init_infos)
        return {f"engine {i}": Call(self.waiter.clock + 0.1, {}) for i in init_infos}

    def start_pause(self, mode: str) -> dict[str, Call]:
        return self._started([Call(0.1, EnginePaused(0, 0.1, 0, 0))] * len(self.members))

    def start_receive_weights(self, info: dict, version: int, timeout_s: float) -> dict[str, Call]:
        return self._started(self.receive)

    def start_resume(self) -> dict[str, Call]:
        return self._started(self.resume)


class Learners:
    def __init__(self, waiter: VirtualWaiter, send: Call):
        self.waiter, self.send = waiter, send
        self.opened: list[int] = []  # the world size of each group rank 0 opened
        self.held: list[bool] = []  # whether rank 0 held each rendezvous port for the group's store
        self.trained = 0  # the policy version the learners hold

    def policy_version(self) -> int:
        return self.trained

    def rendezvous_address(self, hold: bool = True) -> tuple[str, int]:
        self.held.append(hold)
        return "127.0.0.1", 29500

    def start_open_weight_transport(self, backend, host, port, world_size, timeout_s, every_rank=False) -> dict:
        self.opened.append(world_size)
        return {"learner 0": Call(self.waiter.clock + 0.1, None)}

    def weight_metadata(self, dtype_name: str) -> WeightMetadata:
        return WeightMetadata(names=("w",), dtype_names=(dtype_name,), shapes=((2,),))

    def start_send_weights(self, metadata, bucket_bytes: int, version: int, timeout_s: float) -> dict[str, Call]:
        send = self.send.pop(0) if isinstance(self.send, list) else self.send  # a list: one call per sync
        at = None if send.at is None else self.waiter.clock + send.at
        return {"learner 0": Call(at, send.value, send.error)}


def make_sync(
    backend: str, send: Call | list[Call], receive: list[Call], resume: list[Call]
) -> tuple[WeightSync, Engines]:
    waiter = VirtualWaiter()
    engines = Engines(waiter, receive, resume)
    sync = WeightSync(Learners(waiter, send), engines, SyncSettings(backend, "float32", timeout_s=TIMEOUT_S), waiter)
    sync.metadata = WeightMetadata(names=("w",), dtype_names=("float32",), shapes=((2,),))
    sync.members, sync.membership_seen = [0, 1], 0  # connected with both engines
    return sync, engines


REFUSED = ValueError("weight 0 (model.embed_tokens.weight) has shape (8, 4), the engines expect (1,)")
CLOSED = RuntimeError("Worker failed with error '[pair.cc:553] Connection closed by peer [127.0.0.1]:4515'")
DIED = RuntimeError("ActorDiedError: The actor died unexpectedly before finishing this task.")
RESUMED = Call(0.1, 1.0)


def test_a_learner_failure_first_ends_the_sync_with_it_while_nccl_engines_stay_blocked():
    """The learner refuses at t=3; both engines sit in the NCCL receive for good, their resume queued
    behind it. The sync ends with the learner's error within the settle and resume margins (not after
    `2 x timeout + 60` s as a resume timeout), names the engines left blocked, and is not retried."""
    sync, engines = make_sync("nccl", Call(3.0, error=REFUSED), [Call(NEVER)] * 2, [Call(NEVER)] * 2)
    with pytest.raises(WeightSyncError) as raised:
        sync.sync(1)
    error = raised.value
    assert str(error).startswith("weight sync step 'transfer' failed on learner 0: ValueError: weight 0"), error
    assert "engine 0, engine 1 did not resume" in str(error) and "restart the run" in str(error)
    assert "'resume' timed out" not in str(error)
    assert (error.step, error.party, error.retry) == ("transfer", "learner 0", False)
    assert sync.waiter.clock <= 3.0 + 0.1 + weight_sync.FAILURE_SETTLE_S + weight_sync.RESUME_AFTER_FAILURE_S
    assert sync.waiter.clock < TIMEOUT_S  # one-sided: far below any step timeout
    assert engines.asked_for_dead == 0 and sync.version == 0


def test_over_gloo_a_learner_failure_wins_over_the_engines_lost_connections_and_they_resume():
    """The learner closes its end: the engines' receives fail at once with a lost connection (a consequence)
    and they resume. The sync ends with the learner's error, without a note, and may be retried."""
    receive = [Call(0.5, error=CLOSED), Call(0.2, error=CLOSED)]
    sync, engines = make_sync("gloo", Call(1.0, error=REFUSED), receive, [RESUMED] * 2)
    with pytest.raises(
        WeightSyncError, match=r"^weight sync step 'transfer' failed on learner 0: ValueError"
    ) as raised:
        sync.sync(1)
    assert "resume" not in str(raised.value) and raised.value.retry
    assert engines.asked_for_dead == 1  # asked whether an engine died: none did, so the error stands


def test_an_engine_failure_then_a_resume_timeout_ends_with_the_engine_failure():
    """Engine 1 dies mid-receive; engine 0 never leaves the receive (its resume never answers), and neither
    does the learner's send (its actor lost). Over gloo the driver waits the long resume bound, then still
    reports the engine's death first; over NCCL it waits the short margin, then for the learner's watchdog,
    and does not retry (with the learner not freed, replacing engine 0 could not help)."""
    nccl_bound = weight_sync.RESUME_AFTER_FAILURE_S
    for backend, bound in (("gloo", 2 * TIMEOUT_S + 60), ("nccl", nccl_bound)):
        receive = [Call(NEVER), Call(2.0, error=DIED)]
        sync, _ = make_sync(backend, Call(NEVER), receive, [Call(NEVER), Call(0.1, error=DIED)])
        with pytest.raises(WeightSyncError) as raised:
            sync.sync(1)
        message = str(raised.value)
        assert message.startswith("weight sync step 'transfer' failed on engine 1: RuntimeError: ActorDiedError")
        assert f"engine 0 did not resume within {bound:.0f}s" in message, message
        assert raised.value.retry is False
        waited_for_the_learner = TIMEOUT_S + weight_sync.ABORT_GRACE_S if backend == "nccl" else 0
        assert sync.waiter.clock <= 2.1 + weight_sync.FAILURE_SETTLE_S + bound + waited_for_the_learner


def test_a_dead_engine_over_nccl_is_not_replaced_and_synced_again():
    """Both engines die mid-receive over NCCL: none is left in the receive, but no learner's send answers, so
    the group is not known to be free and syncing again cannot succeed."""
    sync, engines = make_sync("nccl", Call(NEVER), [Call(2.0, error=DIED)] * 2, [Call(0.1, error=DIED)] * 2)
    with pytest.raises(WeightSyncError, match="failed on engine 0") as raised:
        sync.sync(1)
    assert raised.value.retry is False and engines.asked_for_dead == 0


def test_a_sync_that_goes_through_waits_for_every_party():
    received = [Call(1.0, WeightsReceived(0, 1, 0.9)), Call(1.5, WeightsReceived(1, 1, 1.4))]
    sync, _ = make_sync("nccl", Call(1.2, WeightsSent(0, 8, 1.1)), received, [RESUMED] * 2)
    metrics = sync.sync(1)
    assert sync.version == 1 and metrics["weight_sync/bytes"] == 8.0
    assert metrics["weight_sync/engine_receive_s_max"] == 1.4


def test_rank_0_holds_the_port_for_a_group_whose_store_adopts_it_and_releases_it_for_one_that_binds_it():
    """gloo's store adopts the held socket; vLLM's NCCL trainer_init binds the port itself, so the port is released
    before the engines join; the staged transports form no group."""
    for backend, held in (("gloo", True), ("nccl", False), ("shm", False)):
        sync, _ = make_sync(backend, Call(1.2, WeightsSent(0, 8, 1.1)), [], [])
        sync.connect()
        assert sync.learners.held == [held], backend


def test_a_sync_after_an_engine_died_reforms_the_group_without_it_and_loads_only_the_living():
    received = [Call(1.0, WeightsReceived(0, 1, 0.9))]
    sync, engines = make_sync("gloo", Call(1.2, WeightsSent(0, 8, 1.1)), received, [RESUMED])
    engines.members, engines.membership_changes = [0], 1  # engine 1 died; its replacement is still starting
    metrics = sync.sync(1)
    assert sync.learners.opened == [2] and list(engines.joins[-1]) == [0]  # learner + engine 0
    assert engines.joins[-1][0]["rank_offset"] == 1
    assert sync.members == [0] and sync.version == 1 and metrics["weight_sync/engines"] == 1


def test_a_ready_replacement_joins_the_group_and_is_loaded_with_the_others_before_it_serves():
    received = [Call(1.0, WeightsReceived(i, 1, 0.9)) for i in (0, 2)]
    sync, engines = make_sync("gloo", Call(1.2, WeightsSent(0, 8, 1.1)), received, [RESUMED] * 2)
    engines.members, engines.ready = [0], [1]  # engine 1 died, and its replacement is ready before any sync
    engines.membership_changes = 1
    metrics = sync.sync(3)
    assert sync.learners.opened == [3] and engines.joins[-1].keys() == {0, 1}
    assert sorted(info["rank_offset"] for info in engines.joins[-1].values()) == [1, 2]
    assert engines.served == [([1], 3)] and metrics["weight_sync/joined"] == 1
    assert sync.sync(4) and len(engines.joins) == 1  # the same members: the group stays


def test_a_replacement_whose_first_sync_fails_does_not_serve():
    sync, engines = make_sync("gloo", Call(1.0, error=REFUSED), [Call(0.5, error=CLOSED)] * 2, [RESUMED] * 2)
    engines.members, engines.ready = [0], [1]
    with pytest.raises(WeightSyncError, match="failed on learner 0"):
        sync.sync(3)
    assert engines.served == []


def test_a_rejoin_labels_the_weights_with_the_version_the_learner_holds_not_the_last_synced():
    """--weight_sync_every_steps 2: version 2 was synced, the learner has trained step 3 since, and every
    engine died. The replacement's join sends the learner's weights, which are version 3, so they say 3."""
    received = [Call(1.0, WeightsReceived(1, 3, 0.9))]
    sync, engines = make_sync("gloo", Call(1.2, WeightsSent(0, 8, 1.1)), received, [RESUMED])
    sync.version, sync.learners.trained = 2, 3
    engines.members, engines.ready, engines.membership_changes = [], [1], 2
    sync.rejoin()
    assert sync.version == 3 and engines.served == [([1], 3)]


def test_a_rejoin_before_the_first_step_reforms_the_group_and_sends_nothing():
    sync, engines = make_sync("gloo", Call(NEVER), [], [])
    engines.members, engines.ready, engines.membership_changes = [0], [1], 1
    metrics = sync.rejoin()
    assert engines.joins[-1].keys() == {0, 1} and sync.learners.opened == [3]
    assert engines.served == [([1], 0)] and sync.version == 0 and "weight_sync/bytes" not in metrics


FREED = WeightSyncError(
    f"weight sync step 'send' of version 1 on learner 0 did not finish within 600s; {weight_sync.FREED}: the next "
    "sync forms a new group"
)


def test_an_engine_left_in_the_nccl_receive_is_replaced_once_the_learners_watchdog_freed_its_send():
    """Engine 1 dies mid-receive; engine 0 stays in the receive. The learner's watchdog aborts its group at the
    sync timeout, which frees its send: engine 0 is replaced (not the run restarted), engine 1 leaves as dead,
    and the sync ends with no member left to load (the replacements join when built, `rejoin`)."""
    receive = [Call(NEVER), Call(2.0, error=DIED)]
    sync, engines = make_sync("nccl", Call(TIMEOUT_S + 2, error=FREED), receive, [Call(NEVER), Call(0.1, error=DIED)])
    engines.dead = [1]
    assert sync.sync(1)["weight_sync/engines"] == 2.0  # as last connected: nothing was re-formed since
    assert engines.stuck == [0] and engines.members == [] and engines.asked_for_dead == 1
    assert sync.version == 0 and sync.learners.opened == []
    assert sync.waiter.clock <= TIMEOUT_S + 2 + 0.1


def test_engines_left_in_the_nccl_receive_by_a_timeout_are_replaced_and_the_survivor_synced_again():
    """Engine 1 hangs in the receive; the learner's watchdog frees its send at the timeout; engine 1 is
    replaced, and the sync runs again with engine 0 alone, in a group formed anew."""
    receive = [Call(1.0, WeightsReceived(0, 1, 0.9)), Call(NEVER)]
    sends = [Call(TIMEOUT_S + 2, error=FREED), Call(1.0, WeightsSent(0, 8, 1.0))]  # the second sync's goes through
    sync, engines = make_sync("nccl", sends, receive, [RESUMED, Call(NEVER)])
    metrics = sync.sync(1)
    assert engines.stuck == [1] and engines.members == [0] and sync.learners.opened == [2]
    assert sync.version == 1 and metrics["weight_sync/engines"] == 1.0


def test_engines_are_not_replaced_when_the_learners_send_failed_by_itself_or_stays_blocked():
    """A refused weight (the learner's own failure) would fail again in any group; a send its abort did not
    free leaves the learner refusing sends: either way the run ends as before, naming the engines."""
    broken = WeightSyncError("weight sync step 'send' ... is still blocked in a collective; ... restart the run")
    for send in (Call(3.0, error=REFUSED), Call(TIMEOUT_S + 2, error=broken)):
        sync, engines = make_sync("nccl", send, [Call(NEVER)] * 2, [Call(NEVER)] * 2)
        with pytest.raises(WeightSyncError, match=r"engine 0, engine 1 did not resume .* restart the run") as raised:
            sync.sync(1)
        assert raised.value.retry is False and engines.stuck == [] and raised.value.replaced == ()
