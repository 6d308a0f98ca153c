"""Fakes shared by the bus tests: a tracer whose outbox items are lists of batch sizes, and a
subscriber that records what it is given (optionally slow, failing or held at a gate)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np

from polyprof.base.events import EventBatch
from polyprof.hooks.components import Subscriber, Tracer


def make_batch(source: str, seq: int, size: int) -> EventBatch:
    return EventBatch.build(
        source,
        {
            "kind": np.zeros(size, np.int8),
            "name": np.full(size, -1, np.int32),
            "start_ns": np.arange(size, dtype=np.int64) + seq * 1_000_000,
            "dur_ns": np.ones(size, np.int64),
            "correlation_id": np.full(size, seq, np.int64),
        },
    )


class FakeTracer(Tracer):
    """Outbox items are lists of batch sizes; decode turns one item into that many batches.

    ``produced`` lists every batch decode yielded, in order: what subscribers must see.
    """

    def __init__(self, name: str, *, failures: dict[int, Exception] | None = None) -> None:
        super().__init__()
        self.name = name
        self.failures = failures or {}
        self.produced: list[EventBatch] = []
        self.decode_threads: set[int] = set()
        self.decode_loops: set[int] = set()
        self._items = 0
        self._seq = 0

    def start(self) -> None:
        self.outbox.reopen()

    def stop(self) -> None:
        self.outbox.close()

    def put(self, sizes: list[int]) -> None:
        self.outbox.put(list(sizes))

    def decode(self, item: list[int]) -> Iterator[EventBatch]:
        self.decode_threads.add(threading.get_ident())
        try:
            self.decode_loops.add(id(asyncio.get_running_loop()))
        except RuntimeError:
            pass
        index = self._items
        self._items += 1
        for size in item:
            if index in self.failures:
                raise self.failures[index]
            batch = make_batch(self.name, self._seq, size)
            self._seq += 1
            self.produced.append(batch)
            yield batch


class RecordingSubscriber(Subscriber):
    def __init__(
        self,
        name: str = "recorder",
        *,
        delay_s: float = 0.0,
        fail_every: int = 0,
        gate: threading.Event | None = None,
    ) -> None:
        self.name = name
        self.delay_s = delay_s
        self.fail_every = fail_every
        self.gate = gate
        self.batches: list[EventBatch] = []
        self.calls: list[str] = []
        self.threads: set[int] = set()
        self.finished = 0

    def consume(self, batch: EventBatch) -> None:
        self.threads.add(threading.get_ident())
        if self.gate is not None:
            self.gate.wait(10)
        if self.delay_s:
            time.sleep(self.delay_s)
        self.batches.append(batch)
        self.calls.append("consume")
        if self.fail_every and len(self.batches) % self.fail_every == 0:
            if len(self.batches) == self.fail_every:
                raise RuntimeError("first failure")
            raise ValueError(f"bad batch {len(self.batches)}")

    def finish(self) -> None:
        self.threads.add(threading.get_ident())
        self.calls.append("finish")
        self.finished += 1

    def from_source(self, source: str) -> list[EventBatch]:
        return [b for b in self.batches if b.source == source]


def same_batches(got: list[EventBatch], expected: list[EventBatch]) -> bool:
    """Exactly these batch objects, each once, in this order."""
    return len(got) == len(expected) and all(a is b for a, b in zip(got, expected))
