"""The learner's side of a sync's timeout: a send that cannot be cancelled is abandoned, and remembered."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from open_instruct.weights.transport import WeightSyncError

T = TypeVar("T")


class SendWatchdog:
    """Bounds a learner's send by the sync timeout, and fails every later send at once after a trip.

    vLLM's NCCL broadcast has no timeout: with an engine gone or stuck, the learner would block in it
    forever, and with it every later call on the learner actor. The send runs in a daemon thread that
    is abandoned when it overruns. A collective cannot be cancelled (vLLM does not abort the NCCL
    communicator), so that thread stays blocked and the group stays unusable: hence `broken`.
    """

    def __init__(self) -> None:
        self.broken: str | None = None

    def run(self, send: Callable[[], T], *, timeout_s: float, what: str) -> T:
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
        if thread.is_alive():
            self.broken = (
                f"{what} did not finish within {timeout_s:.0f}s and is still blocked in a collective (a peer is "
                "gone or stuck); collectives cannot be cancelled, so no weights can be sent from here: restart the run"
            )
            raise WeightSyncError(self.broken)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
