"""`python tests/helpers/grpo_holding.py [grpo_fast flags]`: grpo_fast.py whose engines hold every training
sample admitted at policy version HOLD_FROM_VERSION or later once it has a few tokens: until the run is
stopped, or until the file HOLD_RELEASE_FILE exists when that is set. An engine holding a sample says so
with an empty file named by its process id in HOLD_MARK_DIR, when set.

It makes "a sample is running when SIGTERM (or SIGKILL) arrives" a certainty instead of a matter of timing:
the steps before the hold train normally, the next step cannot complete while the hold lasts, and the fault
finds samples running with their first tokens (which must be continued, not regenerated)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

from open_instruct import grpo_fast
from open_instruct.generation.actor import GenerationActor
from open_instruct.generation.sample_requests import SampleRequests

HOLD_AFTER_OUTPUTS = 4  # engine outputs (one or more tokens each) a held sample gets before it waits
# Read here, in the driver: the class travels to the engine actors pickled by value, with this constant.
HOLD_FROM_VERSION = int(os.environ.get("HOLD_FROM_VERSION", "2"))
HOLD_RELEASE_FILE = os.environ.get("HOLD_RELEASE_FILE", "")
HOLD_MARK_DIR = os.environ.get("HOLD_MARK_DIR", "")


class HoldingRequests(SampleRequests):
    async def outputs(self, request, sample_index, part, turn, kept, attempt=0):
        held = request.admitted_version >= HOLD_FROM_VERSION and not request.is_eval
        outputs = 0
        stream = super().outputs(request, sample_index, part, turn, kept, attempt)
        async with contextlib.aclosing(stream):
            async for output in stream:
                yield output
                outputs += 1
                if held and outputs == HOLD_AFTER_OUTPUTS:
                    await _hold()


class HoldingEngine(GenerationActor):
    requests_class = HoldingRequests


async def _hold() -> None:
    """Until the release file appears (polled: another process creates it), or forever: until cancelled."""
    if HOLD_MARK_DIR:
        Path(HOLD_MARK_DIR, str(os.getpid())).touch()
    if not HOLD_RELEASE_FILE:
        await asyncio.Event().wait()
    while not Path(HOLD_RELEASE_FILE).exists():
        await asyncio.sleep(0.05)


if __name__ == "__main__":
    sys.exit(grpo_fast.main(engine_class=HoldingEngine))
