"""The workers' event writer putting events off the critical path, and padding that lets host
work overlap the emulated GPU's compute."""

from __future__ import annotations

import json
import time

from testbed.trace.clock import now_ns
from testbed.trace.events import EventWriter
from testbed.train.padding import Padder


def kinds(path) -> list[str]:
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


def test_a_deferred_event_is_written_later_and_before_the_next_written_one(tmp_path):
    path = tmp_path / "w0.jsonl"
    ev = EventWriter(path, worker=0)
    ev.defer("recv_wait", 1, 2, microbatch=0)
    assert kinds(path) == []  # not yet: its operation has not started
    ev.write("forward", 3, 4)
    assert kinds(path) == ["recv_wait", "forward"]  # in the order they were traced
    ev.defer("prefill", 5, 6)
    ev.defer("recv_wait", 6, 7)
    ev.write_deferred()
    ev.write_deferred()  # nothing left: written once
    ev.defer("send_wait", 8, 9)
    ev.close()  # closing writes what is still deferred
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["recv_wait", "forward", "prefill", "recv_wait", "send_wait"]
    assert rows[0] == {"worker": 0, "kind": "recv_wait", "start_ns": 1, "end_ns": 2, "microbatch": 0}


def test_host_work_meanwhile_is_not_counted_as_the_operations_real_compute():
    padder = Padder({"forward": 30.0}, enabled=True)
    done = []
    t0 = now_ns()
    real, padded = padder.finish("forward", t0, meanwhile=lambda: (time.sleep(0.01), done.append(1)))
    assert done == [1] and real < 10_000_000  # measured before the 10 ms of host work
    assert padded == 30_000_000 and now_ns() - t0 >= 30_000_000  # padded to its target
    unpadded = Padder({"forward": 30.0}, enabled=False)
    real, padded = unpadded.finish("forward", now_ns(), meanwhile=lambda: done.append(2))
    assert done == [1, 2] and padded == real


def test_events_written_and_deferred_from_two_threads_are_all_kept_whole_and_in_order(tmp_path):
    """The worker's thread writes while its filling thread defers (``EventWriter`` is shared): every
    event ends up on a line of its own, once, each thread's in the order it traced them (the race
    the writer's lock closes, which CPython's interpreter lock hides here: the next test)."""
    import threading

    path = tmp_path / "w0.jsonl"
    ev = EventWriter(path, worker=0)
    n = 4000
    start = threading.Barrier(2)

    def filling() -> None:
        start.wait()
        for i in range(n):
            ev.defer("prefill", i, i + 1, seq=i)

    t = threading.Thread(target=filling)
    t.start()
    start.wait()
    for i in range(n):
        ev.write("forward", i, i + 1, seq=i)
    t.join()
    ev.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 2 * n
    for kind in ("prefill", "forward"):
        assert [r["seq"] for r in rows if r["kind"] == kind] == list(range(n))


def test_a_row_deferred_while_the_deferred_rows_are_written_is_kept(tmp_path):
    """The race the writer's lock closes, made certain: another thread defers a row just as the
    deferred rows have been written and their list is about to be cleared. With the lock it
    waits and its row is written later; without it, the row would be cleared unwritten."""
    import threading

    path = tmp_path / "w0.jsonl"
    ev = EventWriter(path, worker=0)

    class RacedList(list):
        raced = False

        def clear(self) -> None:
            if not self.raced:
                self.raced = True
                t = threading.Thread(target=ev.defer, args=("prefill", 5, 6), kwargs={"seq": 2})
                t.start()
                t.join(0.2)  # with the lock held by the writer it cannot append before the clear
            super().clear()

    ev._deferred = RacedList()
    ev.defer("recv_wait", 1, 2, seq=0)
    ev.write("forward", 3, 4, seq=1)
    for _ in range(100):  # the racing thread appends once the writer lets go of the lock
        if ev._deferred:
            break
        time.sleep(0.01)
    ev.close()
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == [0, 1, 2]
