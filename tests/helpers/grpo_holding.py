"""`python tests/helpers/grpo_holding.py [grpo_fast flags]`: grpo_fast.py whose engines hold every training
sample admitted at policy version HOLD_FROM_VERSION or later once it has a few tokens, until the run is stopped.

It makes "a sample is running when SIGTERM arrives" a certainty instead of a matter of timing: the steps
before the hold train normally, the next step can never complete, and the stop finds its samples running
with their first tokens (which the resumed run must continue, not regenerate)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from open_instruct import grpo_fast
from open_instruct.generation.actor import GenerationActor

HOLD_AFTER_OUTPUTS = 4  # engine outputs (one or more tokens each) a held sample gets before it waits
# Read here, in the driver: the class travels to the engine actors pickled by value, with this constant.
HOLD_FROM_VERSION = int(os.environ.get("HOLD_FROM_VERSION", "2"))


class HoldingEngine(GenerationActor):
    async def _engine_stream(self, request, sample_index, part, turn, kept):
        held = request.admitted_version >= HOLD_FROM_VERSION and not request.is_eval
        outputs = 0
        async with contextlib.aclosing(super()._engine_stream(request, sample_index, part, turn, kept)) as stream:
            async for output in stream:
                yield output
                outputs += 1
                if held and outputs >= HOLD_AFTER_OUTPUTS:
                    await asyncio.Event().wait()  # until the stop cancels this sample


if __name__ == "__main__":
    sys.exit(grpo_fast.main(engine_class=HoldingEngine))
