"""The driver's apply processes (`pgcdc.pipeline._appliers`), real processes: where a table's
work goes, what comes back, and how they end. The batches they apply to real targets are the
pipeline tests' (`tests/spark`): every batch the driver keeps goes through them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc.pipeline._appliers import ApplierPool
from pgcdc.pipeline._dispatch import DispatchError
from pgcdc.pipeline._work import TableWork
from pgcdc.targets import TargetSpec
from pgcdc.types.catalog import TypeDescriptions


@pytest.fixture
def pool() -> Iterator[ApplierPool]:
    with ApplierPool(2) as pool:
        yield pool


def work(tmp_path: Path, table: str, changes: int = 0) -> TableWork:
    """`table`'s work with no spooled changes: its mirror is opened, and nothing written."""
    spec = TargetSpec(str(tmp_path / table), "mirror")
    return TableWork(table, (spec,), (), TypeDescriptions(), "app", "", changes=changes)


def pids(pool: ApplierPool) -> list[int]:
    return [applier.process.pid for applier in pool._appliers]


def test_each_table_stays_with_one_process_and_a_new_one_goes_to_the_least_busy(
    pool: ApplierPool, tmp_path: Path
) -> None:
    works = [work(tmp_path, "public.a", 5), work(tmp_path, "public.b", 50)]
    outcomes = pool.apply(works)
    assert [o.table for o in outcomes] == ["public.a", "public.b"]  # the works' order
    assert [o.applied for o in outcomes] == [{"public.a mirror": 0}, {"public.b mirror": 0}]
    assert all(o.error is None for o in outcomes)
    assert {pool.pin("public.a"), pool.pin("public.b")} == {0, 1}  # the larger pinned first
    assert pool.pin("public.b") == 0
    first = pool.pin("public.a")
    for _ in range(3):
        pool.apply([work(tmp_path, "public.a")])
        assert pool.pin("public.a") == first
    pool._appliers[0].seconds, pool._appliers[1].seconds = 5.0, 1.0
    assert pool.pin("public.c") == 1
    pool._appliers[1].seconds = 9.0
    assert pool.pin("public.d") == 0
    assert pool.pin("public.c") == 1  # pinned for good


def test_maintenance_is_asked_of_every_process(pool: ApplierPool, tmp_path: Path) -> None:
    assert pool.maintain() is False  # nothing open
    pool.apply([work(tmp_path, "public.a"), work(tmp_path, "public.b")])
    assert pool.maintain() is False  # open, nothing due


def test_tables_read_ahead_are_pinned_and_a_target_that_cannot_be_is_left_to_its_batch(
    pool: ApplierPool, tmp_path: Path
) -> None:
    """`warm` opens each table's targets in the process its batches will go to; a target
    that cannot be read is not the warm-up's error but its first batch's."""
    (tmp_path / "public.b").write_text("not a table")
    pool.warm([work(tmp_path, "public.a"), work(tmp_path, "public.b")])
    assert {pool.pin("public.a"), pool.pin("public.b")} == {0, 1}
    (outcome,) = pool.apply([work(tmp_path, "public.b", 1)])
    assert outcome.error is not None and "public.b" in outcome.error


def test_tables_read_ahead_one_by_one_spread_over_the_processes(
    pool: ApplierPool, tmp_path: Path
) -> None:
    """A read-ahead is charged to its process: tables read ahead one after the other after
    a first batch (the heartbeat's, say) do not all go to the process that did not apply it
    (they did, when only apply time counted: every table of a run in one process)."""
    pool.apply([work(tmp_path, "public.a", 5)])
    assert pool.pin("public.a") == 0
    pool._appliers[0].seconds, pool._appliers[1].seconds = 1e-9, 0.0  # a took next to nothing
    pool.warm([work(tmp_path, "public.b")])
    assert pool.pin("public.b") == 1 and pool._appliers[1].seconds > 1e-9
    pool.warm([work(tmp_path, "public.c")])
    assert pool.pin("public.c") == 0


def test_ctrl_c_is_the_driver_s_to_decide(pool: ApplierPool, tmp_path: Path) -> None:
    """SIGINT reaches the whole process group; the processes go on (the driver finishes the
    batch in progress, then ends them)."""
    pool.apply([work(tmp_path, "public.a")])
    for pid in pids(pool):
        os.kill(pid, signal.SIGINT)
    time.sleep(0.3)
    assert [o.table for o in pool.apply([work(tmp_path, "public.a")])] == ["public.a"]


def test_a_process_that_ends_is_one_line(pool: ApplierPool, tmp_path: Path) -> None:
    pool.apply([work(tmp_path, "public.a"), work(tmp_path, "public.b", 1)])
    victim = pool.pin("public.a")
    pid = pids(pool)[victim]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(DispatchError) as raised:
        pool.apply([work(tmp_path, "public.a"), work(tmp_path, "public.b")])
    assert str(raised.value).startswith(
        f"apply process {victim} (pid {pid}) ended (exit status -9): "
    )
    assert "\n" not in str(raised.value)


def test_an_error_outside_the_tables_is_one_line(pool: ApplierPool) -> None:
    """A table's own error is in its outcome (the pipeline tests'); anything else the process
    answers with one line, and serves on."""
    applier = pool._appliers[0]
    applier.send("apply", None)
    with pytest.raises(DispatchError, match=r"^apply process 0: TypeError: .*not iterable$"):
        applier.receive()
    applier.send("vacuum", None)
    with pytest.raises(DispatchError, match=r"^apply process 0: unknown command 'vacuum'$"):
        applier.receive()
    assert pool.maintain() is False


def test_close_ends_them(tmp_path: Path) -> None:
    pool = ApplierPool(3)
    assert pool.processes == 3
    pool.apply([work(tmp_path, "public.a")])
    processes = [applier.process for applier in pool._appliers]
    pool.close()
    assert [p.returncode for p in processes] == [0, 0, 0]
    pool.close()  # twice is fine


def test_they_end_with_the_driver_s_process(tmp_path: Path) -> None:
    """A driver killed (SIGKILL, or a crash) leaves no process that could write on to its
    targets: each ends as soon as the driver's process has, even in the middle of a command."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from pgcdc.pipeline._appliers import ApplierPool
        pool = ApplierPool(2)
        pool.maintain()  # both started and serving
        print(*[a.process.pid for a in pool._appliers], flush=True)
        time.sleep(60)
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    children = [int(pid) for pid in driver.stdout.readline().split()]
    assert len(children) == 2 and all(_alive(pid) for pid in children)
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not reaped by its parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_run_gives_its_pool_back_for_the_next_run_of_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting processes costs their imports: the next run gets them again, having forgotten
    their targets, unless it asks for another number or the environment changed."""
    first = ApplierPool.lease(2)
    try:
        started = pids(first)
        first.apply([work(tmp_path, "public.a", 5), work(tmp_path, "public.b", 5)])
        first.give_back()
        again = ApplierPool.lease(2)
        assert again is first and pids(again) == started
        assert again.pin("public.z") == 0  # the pins went with the run
        assert again.maintain() is False
        other = ApplierPool.lease(3)  # another number: a pool of its own
        assert other is not first and other.processes == 3
        other.give_back()
        again.give_back()  # at most one waits: the other one is closed
        assert other.processes == 0
        monkeypatch.setenv("PGCDC_TEST_APPLIERS", "changed")
        changed = ApplierPool.lease(2)  # not the environment the processes have
        assert changed is not first and first.processes == 0  # closed, not left waiting
        changed.close()
    finally:
        first.close()


def test_a_pool_whose_process_failed_is_not_given_back(tmp_path: Path) -> None:
    pool = ApplierPool.lease(2)
    processes = [applier.process for applier in pool._appliers]
    os.kill(processes[1].pid, signal.SIGKILL)
    with pytest.raises(DispatchError):
        pool.maintain()
    pool.give_back()
    assert all(p.returncode is not None for p in processes)
    fresh = ApplierPool.lease(2)
    try:
        assert fresh is not pool
    finally:
        fresh.close()
