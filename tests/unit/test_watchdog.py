"""The send watchdog around a learner's weight broadcast (`weights.watchdog`): a send that returns or fails by
itself passes through; one blocked in a collective trips it, and every later send fails at once instead of
entering the broken group. (Its abort of the group, on the real stack: test_weight_group_teardown.)"""

from __future__ import annotations

import threading
import time

import pytest

from open_instruct.weights.transport import WeightSyncError
from open_instruct.weights.watchdog import SendWatchdog


def test_the_watchdog_passes_a_send_through_and_its_errors_unchanged():
    watchdog = SendWatchdog()
    assert watchdog.run(lambda: 42, timeout_s=5, what="send") == 42

    def failing():
        raise ConnectionError("peer reset")

    with pytest.raises(ConnectionError, match="peer reset"):
        watchdog.run(failing, timeout_s=5, what="send")
    assert watchdog.broken is None  # a send that failed by itself left the collective: later sends may go


def test_a_send_blocked_in_a_collective_trips_the_watchdog_and_every_later_send_fails_at_once():
    released = threading.Event()
    calls = []

    def blocked_broadcast():  # what vLLM's NCCL broadcast does when an engine is gone: wait forever
        calls.append(1)
        released.wait()
        return 1

    watchdog = SendWatchdog()
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"'send' of version 3 on learner 0 did not finish within 1s"):
        watchdog.run(blocked_broadcast, timeout_s=1, what="weight sync step 'send' of version 3 on learner 0")
    assert time.monotonic() - started >= 1  # it waited out the timeout, then gave up on the send
    with pytest.raises(WeightSyncError, match="restart the run"):
        watchdog.run(blocked_broadcast, timeout_s=1, what="the next send")
    assert calls == [1]  # the second send never entered the broken group
    released.set()
