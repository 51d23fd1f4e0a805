"""Channels between the roles: bounded FIFO queues with timeouts, depth, and a closed state.

`RayChannel` wraps `ray.util.queue.Queue` (an actor), usable from the driver (blocking calls)
and from async actors (`*_async` calls). `LocalChannel` is its in-process twin for unit
tests of the scheduling logic. Bounded queues give back-pressure: a producer that runs
ahead blocks instead of growing memory without limit.

A message crosses a RayChannel sealed: pickled once by its sender into bytes, which the queue actor holds
and hands on without looking inside, and unpickled once by its receiver. Left to Ray, the queue actor would
unpickle and pickle again every sample's token ids and logprobs (tuples of Python numbers, up to 16k of each
at long-reasoning lengths): one process doing that for every sample of the run was the first limit on how
many GPUs a driver serves (`benchmarks.driver_headroom`).
"""

from __future__ import annotations

import asyncio
import collections
import pickle
import time
from typing import Generic, TypeVar

T = TypeVar("T")


def seal(item) -> bytes:
    return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)


def unseal(sealed: bytes):
    return pickle.loads(sealed)


class ChannelTimeout(TimeoutError):
    pass


class RayChannel(Generic[T]):
    def __init__(self, maxsize: int = 0, name: str = "channel"):
        from ray.util.queue import Queue

        self.name = name
        self.maxsize = maxsize
        # num_cpus=0: the queue actor is bookkeeping and must never wait for a free core.
        self._queue = Queue(maxsize=maxsize, actor_options={"num_cpus": 0})

    # ---- driver side (blocking)

    def put(self, item: T, timeout: float | None = None) -> None:
        from ray.util.queue import Full

        try:
            self._queue.put(seal(item), block=True, timeout=timeout)
        except Full:
            raise ChannelTimeout(f"{self.name}: full for {timeout}s") from None

    def get(self, timeout: float | None = None) -> T:
        from ray.util.queue import Empty

        try:
            return unseal(self._queue.get(block=True, timeout=timeout))
        except Empty:
            raise ChannelTimeout(f"{self.name}: empty for {timeout}s") from None

    def get_all(self, max_items: int = 10_000) -> list[T]:
        """Whatever is there now, without waiting."""
        from ray.util.queue import Empty

        depth = self._queue.qsize()
        if not depth:
            return []
        try:
            return [unseal(sealed) for sealed in self._queue.get_nowait_batch(min(depth, max_items))]
        except Empty:  # another consumer took some since qsize: take what is left one by one
            items: list[T] = []
            while len(items) < max_items:
                try:
                    items.append(unseal(self._queue.get_nowait()))
                except Empty:
                    break
            return items

    def depth(self) -> int:
        return self._queue.qsize()

    # ---- actor side (async)

    async def put_async(self, item: T, timeout: float | None = None) -> None:
        from ray.util.queue import Full

        try:
            await self._queue.put_async(seal(item), block=True, timeout=timeout)
        except Full:
            raise ChannelTimeout(f"{self.name}: full for {timeout}s") from None

    async def get_async(self, timeout: float | None = None) -> T:
        from ray.util.queue import Empty

        try:
            return unseal(await self._queue.get_async(block=True, timeout=timeout))
        except Empty:
            raise ChannelTimeout(f"{self.name}: empty for {timeout}s") from None

    def close(self) -> None:
        self._queue.shutdown(force=True)


class LocalChannel(Generic[T]):
    """In-process channel with the same interface, for tests and simulations."""

    def __init__(self, maxsize: int = 0, name: str = "channel"):
        self.name = name
        self.maxsize = maxsize
        self._items: collections.deque[T] = collections.deque()

    def _full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    def put(self, item: T, timeout: float | None = None) -> None:
        if self._full():
            raise ChannelTimeout(f"{self.name}: full")
        self._items.append(item)

    def get(self, timeout: float | None = None) -> T:
        if not self._items:
            raise ChannelTimeout(f"{self.name}: empty")
        return self._items.popleft()

    def get_all(self, max_items: int = 10_000) -> list[T]:
        taken = []
        while self._items and len(taken) < max_items:
            taken.append(self._items.popleft())
        return taken

    def depth(self) -> int:
        return len(self._items)

    async def put_async(self, item: T, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._full():
            if deadline is not None and time.monotonic() > deadline:
                raise ChannelTimeout(f"{self.name}: full for {timeout}s")
            await asyncio.sleep(0.001)
        self._items.append(item)

    async def get_async(self, timeout: float | None = None) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._items:
            if deadline is not None and time.monotonic() > deadline:
                raise ChannelTimeout(f"{self.name}: empty for {timeout}s")
            await asyncio.sleep(0.001)
        return self._items.popleft()

    def close(self) -> None:
        self._items.clear()
