"""Counting deliveries of a Kafka record, so that a poison message ends on eval.dlq instead of
being redelivered forever.

A handler that fails is redelivered at once (NACK_ON_ERROR), and one that runs past the
poll interval loses its group membership, so its commit fails and the batch comes back:
either way a record that always fails, or always takes too long, would loop without end.
The consumer counts the deliveries of each record by (topic, partition, offset); one
delivered more than `limit` times is dead-lettered on arrival instead of processed.

The counts live in the consumer's process (bounded: the oldest are forgotten first) and
are never reset by a handler that succeeds, because a handler that succeeded after the
poll interval still loses its commit. A record that was committed is never delivered
again, so its count is simply forgotten in time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

CAPACITY = 100_000  # records remembered; far more than a consumer holds uncommitted


class DeliveryCounter:
    def __init__(self, limit: int, capacity: int = CAPACITY) -> None:
        if limit < 1:
            raise ValueError("a record must be delivered at least once")
        self.limit = limit
        self.capacity = capacity
        self._counts: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._errors: dict[tuple[str, int, int], str] = {}  # the last failure of a counted record

    def count(self, record: Any) -> int:
        """This delivery's number for `record` (1 the first time)."""
        key = _key(record)
        n = self._counts.pop(key, 0) + 1
        self._counts[key] = n
        while len(self._counts) > self.capacity:
            self._errors.pop(self._counts.popitem(last=False)[0], None)
        return n

    def failed(self, record: Any, error: BaseException) -> None:
        if _key(record) in self._counts:
            self._errors[_key(record)] = f"{type(error).__name__}: {error}"[:500]

    def why(self, record: Any, deliveries: int) -> str:
        """The error of a dead letter for a record delivered `deliveries` times."""
        last = self._errors.get(_key(record))
        return (
            f"delivered {deliveries} times without completing (failed or ran past the poll interval"
            f" each time); last error: {last or 'none seen (ran past the poll interval?)'}"
        )

    def split(self, records: Iterable[Any]) -> tuple[list[tuple[Any, int]], list[tuple[Any, int]]]:
        """(records to process, records delivered more than `limit` times), each with its
        delivery number."""
        keep: list[tuple[Any, int]] = []
        worn: list[tuple[Any, int]] = []
        for record in records:
            n = self.count(record)
            (worn if n > self.limit else keep).append((record, n))
        return keep, worn


def _key(record: Any) -> tuple[str, int, int]:
    return (record.topic, record.partition, record.offset)
