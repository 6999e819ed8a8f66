"""A large JSON Lines file checked by child processes (scan.scan_dataset with processes > 1).

The parent reads the file in blocks of whole lines (BLOCK_BYTES) and hands each to a child
of a process pool, with at most IN_FLIGHT_PER_PROCESS blocks per child in flight: the file is
never held whole, so memory stays flat. A child checks its block's records as one pass does
(scan.Scanner: each record's problems and hashes) and returns what it found (scan.Part).
The parent takes the parts in file order: their problems and warnings, the set checks'
arrays appended (unknown fields counted record by record, as one pass counts them), the
items' JSON to the sink while no problem has been found before them. The set-wide checks
(duplicate ids, conflicting answers) then run in the parent, as after one pass.

The pool lives as long as the process that made it (the producer starts its children with
its lifespan and keeps them from one job to the next). A child that dies (out of memory)
fails the check with CheckingFailed, no verdict on the dataset (the producer's job is then
retried as any failed job is); the next check starts a new pool. A child whose parent is gone exits.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import BinaryIO

from evalstream.common.datasets.formats import Records, jsonl_records
from evalstream.common.datasets.problems import Report
from evalstream.common.datasets.scan import ItemSink, Part, PartChecks, Scanner

BLOCK_BYTES = 256 * 1024  # lines per child task: a few thousand short items
IN_FLIGHT_PER_PROCESS = 2  # blocks handed to a child ahead of the one it is on
PARENT_CHECK_S = 1.0  # how often a child looks whether its parent is still there

_pools: dict[int, ProcessPoolExecutor] = {}
_pools_lock = threading.Lock()


class CheckingFailed(RuntimeError):
    """A checking process died: the dataset was not checked (no verdict on it)."""


@dataclass(frozen=True)
class Block:
    first_line: int
    data: bytes
    humaneval: bool
    max_item_bytes: int
    keep_items: bool  # a sink wants the items' JSON


def check_block(block: Block) -> Part:
    """A block's records checked, in a child process."""
    report = Report()
    checks = PartChecks()
    scanner = Scanner(report, block.humaneval, block.max_item_bytes, checks)
    items = []
    for line, record in jsonl_records(io.BytesIO(block.data), report, block.first_line):
        encoded = scanner.record(line, record)
        if encoded is not None and block.keep_items:
            items.append((line, encoded))
    return Part(report.problems, report.warnings, checks, scanner.count, items)


def blocks(stream: BinaryIO, first_line: int, size: int) -> Iterator[tuple[int, bytes]]:
    """(number of its first line, whole lines) from `stream`'s position on, about `size`
    bytes each (a longer line is one block); the last line may lack its newline."""
    line, rest = first_line, b""
    while data := stream.read(size):
        data = rest + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # no line ends in it yet
            rest = data
            continue
        yield line, data[:cut]
        line += data.count(b"\n", 0, cut)
        rest = data[cut:]
    if rest:
        yield line, rest


def pool(processes: int) -> ProcessPoolExecutor:
    """This process's pool of `processes` children (started as fresh interpreters: the
    caller may hold threads and sockets, which a fork would copy)."""
    with _pools_lock:  # the producer's start-up and its first job may both ask
        if processes not in _pools:
            _pools[processes] = ProcessPoolExecutor(
                processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_exit_with_parent,
                initargs=(os.getpid(),),
            )
        return _pools[processes]


def _exit_with_parent(parent: int) -> None:
    """Runs in each child as it starts: the child exits once the process that made it is
    gone (killed with -9, that one could not stop its children, which would wait for blocks
    for ever)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def start(processes: int) -> None:
    """Starts the pool's children now (each imports the checks once, about a second), so
    that the first large dataset does not wait for them."""
    if processes > 1:
        executor = pool(processes)
        try:
            for ready in [executor.submit(_ready) for _ in range(processes)]:
                ready.result()
        except BrokenProcessPool:
            _drop(processes, executor)  # the first large dataset starts a new one
            raise


def _drop(processes: int, executor: ProcessPoolExecutor) -> None:
    """A broken pool stopped and forgotten, unless another took its place meanwhile."""
    executor.shutdown(wait=False, cancel_futures=True)
    with _pools_lock:
        if _pools.get(processes) is executor:
            del _pools[processes]


def close() -> None:
    """Stops every pool this process made."""
    with _pools_lock:
        closing = list(_pools.values())
        _pools.clear()
    for executor in closing:
        executor.shutdown(cancel_futures=True)


def _ready() -> None:
    """A task that does nothing: its child is up."""


def scan_in_parts(
    stream: BinaryIO, records: Records, scanner: Scanner, sink: ItemSink | None, processes: int
) -> None:
    """`records` (as open_records gave them) checked into `scanner`: the first record here
    (it told the format), the lines after it by blocks in child processes."""
    first = next(records, None)
    if first is None:
        return
    report = scanner.report
    encoded = scanner.record(*first)
    if encoded is not None and sink is not None and not report.problems:
        sink(encoded)

    def take(part: Part) -> None:
        blocked = bool(report.problems)
        report.problems += part.problems
        report.warnings += part.warnings
        scanner.checks.extend(part)
        scanner.count += part.count
        if sink is None or blocked:
            return
        stop = min((p.line for p in part.problems if p.line is not None), default=None)
        for line, item in part.items:
            if stop is not None and line > stop:
                return
            sink(item)

    executor = pool(processes)
    in_flight: deque[Future[Part]] = deque()
    try:
        # the stream is just past the first record's line (records reads a line at a time)
        for first_line, data in blocks(stream, first[0] + 1, BLOCK_BYTES):
            block = Block(first_line, data, scanner.humaneval, scanner.max_item_bytes, sink is not None)
            in_flight.append(executor.submit(check_block, block))
            if len(in_flight) >= processes * IN_FLIGHT_PER_PROCESS:
                take(in_flight.popleft().result())
        while in_flight:
            take(in_flight.popleft().result())
    except BrokenProcessPool as exc:
        _drop(processes, executor)
        # not the dataset's fault as far as anyone knows (memory may have run short beside
        # other work): the caller's failure, retried as one (the producer's job is redelivered)
        raise CheckingFailed(f"a process checking the dataset died ({exc})") from exc
    finally:
        for future in in_flight:
            future.cancel()
