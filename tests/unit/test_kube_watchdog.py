"""The operator's retries of the API server and its watchdog over kopf's watchers (largebatch.kube.watchdog),
on real asyncio tasks named as kopf names them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kopf._core.reactor import running

from largebatch.kube import watchdog


@given(st.floats(min_value=0.5, max_value=7200))
def test_the_tries_last_as_long_as_asked_kopfs_first_then_30_s_at_a_time(total):
    waits = watchdog.backoffs(total)
    assert abs(sum(waits) - total) < 1e-6
    assert all(0 < wait <= watchdog.LONGEST_BACKOFF for wait in waits)
    full = waits[:-1]  # the last one is cut short to land on `total`
    assert full == [*watchdog.KOPF_BACKOFFS, *[watchdog.LONGEST_BACKOFF] * len(full)][: len(full)]


@given(st.floats(min_value=0.5, max_value=7200), st.floats(min_value=0.01, max_value=1))
def test_scaled_tries_are_kopfs_waits_times_the_scale_and_last_as_long(total, scale):
    waits = watchdog.backoffs(total, scale)
    assert abs(sum(waits) - total) < 1e-6
    full = waits[:-1]
    expected = [wait * scale for wait in [*watchdog.KOPF_BACKOFFS, *[watchdog.LONGEST_BACKOFF] * len(full)]]
    assert full == pytest.approx(expected[: len(full)])


def test_ten_minutes_by_default_outlasting_kopfs_54_s():
    assert sum(watchdog.backoffs(watchdog.RETRY_SECONDS)) == 600 > sum(watchdog.KOPF_BACKOFFS) == 54


async def _watched(failing: bool) -> watchdog.Watchdog:
    """Two tasks named as kopf names its watchers, seen by a watchdog; then the second fails (or not) and
    both are cancelled, as kopf cancels its watchers when it stops."""
    dog = watchdog.Watchdog()
    fail = asyncio.Event()

    async def watch(name: str) -> None:
        await fail.wait()
        raise RuntimeError(f"403 Forbidden for {name}")

    tasks = [asyncio.create_task(watch(name), name=f"watcher for {name}") for name in ("jobs", "pods")]
    await asyncio.sleep(0)  # both started
    dog.scan()
    if failing:
        tasks[0].cancel()
        fail.set()
    else:
        for task in tasks:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)  # the done callbacks run
    return dog


def test_a_watcher_that_fails_stops_the_operator_and_says_which():
    dog = asyncio.run(_watched(failing=True))
    assert dog.deadline.is_alive()  # the process's exit, should kopf not stop in time
    dog.deadline.cancel()
    assert dog.stop.is_set()
    assert dog.failure == "watcher for pods failed: RuntimeError('403 Forbidden for pods')"


def test_watchers_that_kopf_cancels_stop_nothing():
    dog = asyncio.run(_watched(failing=False))
    assert not dog.stop.is_set() and dog.failure is None and dog.deadline is None


async def _left_at_exit(close: bool) -> tuple[set[str], bool]:
    """kopf's own stop-flag checker stopped by SIGTERM, then the cleanup handler (or not): the tasks still
    running, which kopf waits 5 s for at its exit before it cancels them, and whether the process's exit
    deadline is armed (then cancelled: it would end this process)."""
    dog = watchdog.Watchdog()
    dog.start()
    signalled = asyncio.get_running_loop().create_future()
    checker = asyncio.create_task(running.stop_flag_checker(signal_flag=signalled, stop_flag=dog.stop))
    await asyncio.sleep(0)
    signalled.set_result(signal.SIGTERM)
    await checker
    if close:
        dog.close()
    for _ in range(3):  # the cancelled and woken tasks run to their end
        await asyncio.sleep(0)
    left = {task.get_name() for task in asyncio.all_tasks() if task is not asyncio.current_task()}
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()
    armed = dog.deadline is not None and dog.deadline.is_alive()
    if dog.deadline is not None:
        dog.deadline.cancel()
    return left, armed


def test_closed_at_exit_the_watchdog_leaves_kopf_no_task_to_wait_for_and_a_deadline_for_its_stop():
    left, armed = asyncio.run(_left_at_exit(close=False))
    assert left and not armed  # kopf's "stop-flag waiter" (kopf 1.45), and ours
    assert asyncio.run(_left_at_exit(close=True)) == (set(), True)
    assert watchdog.CLOSE_SECONDS < 30  # a pod's default grace period: the log says why, not a SIGKILL


def test_a_stop_kopf_does_not_finish_ends_the_process_with_the_status_of_its_cause():
    """The deadline's exit in a child process (it ends the process it runs in): 0 for a stop asked for,
    1 for a failed watcher, each with its reason in the log."""
    script = (
        "import logging, sys, time\n"
        "from largebatch.kube import watchdog\n"
        "logging.basicConfig()\n"
        "dog = watchdog.Watchdog()\n"
        "dog.failure = sys.argv[1] or None\n"
        "dog._arm(0.1)\n"
        "time.sleep(60)\n"
    )
    for failure, status, said in (("", 0, "it was asked to stop"), ("watcher for pods failed", 1, "kopf's watcher")):
        ended = subprocess.run([sys.executable, "-c", script, failure], capture_output=True, text=True, timeout=60)
        assert ended.returncode == status and f"exiting now: {said}" in ended.stderr, ended.stderr
