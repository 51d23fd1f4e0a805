"""Bringing a failed engine back while the others keep generating and the learner keeps training.

A replacement goes through three phases, none of which the driver waits for:

1. reaping: the old engine's processes (the actor, vLLM's EngineCore and its workers, recorded when it
   started) are confirmed gone on their node, SIGKILLed by pid when they are not (`process_reaper`).
2. starting: a new actor with the same index and placement builds its vLLM engine.
3. ready: it waits to join the pool at the next weight sync, which re-forms the transfer group with it and
   loads the current weights into it with everyone else's; only then does it pull prompts.

The reaper is `process_reaper.end_processes`; `Replacements` is the driver's record, advanced by each
`EnginePool.poll`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from open_instruct.messages import EngineStarted

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # a replacement whose vLLM engine takes longer to build has failed


@dataclasses.dataclass
class Replacement:
    """One engine's way back; times are wall-clock seconds (what the fault benchmark reports)."""

    engine_id: int
    noticed_at: float  # the failure was noticed
    reaping: object = None  # the reaper's answer (a Ray ObjectRef), None when there was nothing to reap
    reaped: dict = dataclasses.field(default_factory=dict)  # end_processes's answer
    actor: object = None  # the new actor, once the old processes are gone
    starting: object = None  # its start's answer (ObjectRef)
    start_began: float = 0.0
    info: EngineStarted | None = None
    ready_at: float | None = None  # its engine is built: it joins at the next weight sync
    serving_at: float | None = None  # it has the current weights and pulls prompts

    @property
    def phase(self) -> str:
        if self.serving_at is not None:
            return "serving"
        if self.info is not None:
            return "ready"
        return "starting" if self.actor is not None else "reaping"


class Replacements:
    """The engines on their way back. `respawn(engine_id)` makes a new actor (not started) in the old one's
    place; `reap(old)` starts `end_processes` on the old engine's node and returns its ObjectRef (None: the
    processes are not known, nothing to wait for). `advance` moves each one on as far as it can without waiting."""

    def __init__(self, respawn: Callable[[int], object], reap: Callable[[EngineStarted], object] | None = None):
        self.respawn = respawn
        self.reap = reap
        self.pending: dict[int, Replacement] = {}
        self.history: list[Replacement] = []

    def __len__(self) -> int:
        return len(self.pending)

    def begin(self, engine_id: int, old: EngineStarted | None) -> Replacement:
        replacement = Replacement(engine_id, time.time())
        if self.reap is not None and old is not None and old.processes:
            replacement.reaping = self.reap(old)
        self.pending[engine_id] = replacement
        self.history.append(replacement)
        return replacement

    def advance(self) -> dict[int, BaseException]:
        """Move every pending replacement on; returns the ones whose new engine failed to start, with why
        (they leave `pending`: the pool counts that as a new failure of the engine)."""
        import ray

        failed: dict[int, BaseException] = {}
        for engine_id, r in list(self.pending.items()):
            if r.phase == "reaping" and (r.reaping is None or _done(r.reaping)):
                self._spawn(r)
            if r.phase == "starting" and _done(r.starting):
                try:
                    r.info = ray.get(r.starting)
                except Exception as error:
                    failed[engine_id] = error
                    _kill(r.actor)
                    continue
                r.ready_at = time.time()
                logger.info(
                    "engine %d's replacement is ready %.1f s after the failure (%s); it joins at the next weight sync",
                    engine_id,
                    r.ready_at - r.noticed_at,
                    _reap_summary(r.reaped),
                )
            elif r.phase == "starting" and time.monotonic() - r.start_began > START_TIMEOUT_S:
                failed[engine_id] = TimeoutError(f"the replacement's engine did not start in {START_TIMEOUT_S:.0f} s")
                _kill(r.actor)
        for engine_id in failed:
            self.pending.pop(engine_id)
        return failed

    def _spawn(self, r: Replacement) -> None:
        import ray

        if r.reaping is not None:
            try:
                r.reaped = ray.get(r.reaping)
            except Exception as error:  # its node is gone, and the processes with it
                r.reaped = {"unknown": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            if r.reaped.get("alive"):
                # Started anyway: on a CPU the new engine only shares the cores; on a GPU vLLM says it lacks memory.
                logger.error("engine %d: old processes %s survived SIGKILL", r.engine_id, r.reaped["alive"])
        r.actor = self.respawn(r.engine_id)
        r.starting = r.actor.start.remote()
        r.start_began = time.monotonic()

    def ready(self) -> list[Replacement]:
        return [r for r in self.pending.values() if r.phase == "ready"]

    def serving(self, engine_id: int) -> Replacement:
        r = self.pending.pop(engine_id)
        r.serving_at = time.time()
        return r

    def abandon(self) -> int:
        """The run ends: kills the actors of replacements still under way; how many there were."""
        actors = [r.actor for r in self.pending.values() if r.actor is not None]
        self.pending.clear()
        for actor in actors:
            _kill(actor)
        return len(actors)


def _kill(actor) -> None:
    import contextlib

    import ray

    with contextlib.suppress(Exception):  # already gone
        ray.kill(actor)


def _done(ref) -> bool:
    import ray

    ready, _ = ray.wait([ref], num_returns=1, timeout=0)
    return bool(ready)


def _reap_summary(reaped: dict) -> str:
    if not reaped:
        return "no old processes known"
    if "unknown" in reaped:
        return f"old processes not checked: {reaped['unknown']}"
    return f"old processes gone: exited {reaped['exited']}, killed {reaped['killed']}"
