"""The learner's side of a sync's timeout: a send that overruns it is aborted, or else abandoned and remembered."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from open_instruct.weights.transport import WeightSyncError

T = TypeVar("T")

# After an abort, how long the send may take to return: NCCL's abort runs in a thread of vLLM's that it joins
# for 5 s, then the blocked broadcast sees the abort flag and its stream synchronize returns.
ABORT_GRACE_S = 30.0
# What a send freed by the abort says: the driver reads it as "this learner is free, its peers were stuck".
FREED = "its transfer group was aborted, which freed the send"


class SendWatchdog:
    """Bounds a learner's send by the sync timeout.

    vLLM's NCCL broadcast has no timeout: with an engine gone or stuck, the learner would block in it
    forever, and with it every later call on the learner actor. The send runs in a daemon thread. When it
    overruns, `abort` (the transport's `trainer_close` of the group it is sending on) is called: an aborted
    NCCL communicator ends the blocked broadcast, the thread returns, and the next sync forms a new group.
    A send that does not return within `abort_grace_s` of the abort is abandoned, still blocked: every later
    send fails at once (`broken`)."""

    def __init__(self, abort_grace_s: float = ABORT_GRACE_S) -> None:
        self.broken: str | None = None
        self.abort_grace_s = abort_grace_s
        self.aborts = 0  # sends freed by aborting their group

    def run(self, send: Callable[[], T], *, timeout_s: float, what: str, abort: Callable[[], None] | None = None) -> T:
        if self.broken is not None:
            raise WeightSyncError(self.broken)
        outcome: dict = {}

        def target() -> None:
            try:
                outcome["value"] = send()
            except BaseException as error:
                outcome["error"] = error

        thread = threading.Thread(target=target, name="weight-send", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if not thread.is_alive():
            if "error" in outcome:
                raise outcome["error"]
            return outcome["value"]
        overran = f"{what} did not finish within {timeout_s:.0f}s (a peer is gone or stuck)"
        abort_failed = ""
        if abort is not None:
            try:
                abort()
            except Exception as error:  # the send stays blocked: reported as abandoned below
                abort_failed = f" (the abort failed: {type(error).__name__}: {error})"
            else:
                thread.join(self.abort_grace_s)
        if abort is not None and not thread.is_alive():
            self.aborts += 1
            raise WeightSyncError(f"{overran}; {FREED}: the next sync forms a new group")
        self.broken = (
            f"{overran} and is still blocked in a collective{abort_failed}; it cannot be cancelled, so no weights "
            "can be sent from here: restart the run"
        )
        raise WeightSyncError(self.broken)
