"""The server's call threads (mm_agent/guard.py): kept between calls, never taken away by a stuck call, and
ended when idle."""

from __future__ import annotations

import threading
import time

from mm_agent.guard import _Threads


def _run(pool: _Threads, fn: object) -> threading.Event:
    done = threading.Event()

    def job() -> None:
        fn()  # type: ignore[operator]
        done.set()

    pool.submit(job)
    return done


def test_a_finished_thread_takes_the_next_call() -> None:
    pool = _Threads(idle_s=5.0)
    seen: list[int] = []
    for _ in range(20):
        assert _run(pool, lambda: seen.append(threading.get_ident())).wait(5)
        time.sleep(0.005)  # the thread marks itself free after the job
    assert len(set(seen)) == 1, "sequential calls reuse one thread"


def test_a_stuck_call_does_not_hold_up_the_next() -> None:
    pool = _Threads(idle_s=5.0)
    release = threading.Event()
    stuck = _run(pool, lambda: release.wait(10))
    quick = _run(pool, lambda: None)
    assert quick.wait(2), "a new thread serves the call while the first one is stuck"
    assert not stuck.is_set()
    release.set()
    assert stuck.wait(5)


def test_idle_threads_end_and_calls_still_run_after() -> None:
    pool = _Threads(idle_s=0.2)
    before = {t.ident for t in threading.enumerate() if t.name == "mm-agent-call"}
    assert _run(pool, lambda: None).wait(5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = {t.ident for t in threading.enumerate() if t.name == "mm-agent-call"} - before
        if not alive:
            break
        time.sleep(0.05)
    assert not alive, "an idle thread ends after idle_s"
    assert _run(pool, lambda: None).wait(5), "a call after that starts a fresh thread"
