"""How large the driver's next batch may be, who applies it, given what waits in the spool,
and how its tables are grouped into tasks."""

from __future__ import annotations

from pgcdc.pipeline._batch import batch_bounds
from pgcdc.pipeline._work import TableWork, group_work
from pgcdc.types.catalog import TypeDescriptions


def test_what_waits_up_to_the_driver_s_share_is_one_batch_the_driver_applies() -> None:
    """A slow batch under a live load leaves more waiting: the next batch takes it all and
    stays with the driver, whose targets are open; only a larger backlog goes to Spark jobs
    in batches up to the limit."""
    inline = 100_000
    for pending in (0, 1, 5_000, inline):
        assert batch_bounds(pending, inline, 1_000_000) == (inline, True)
        assert batch_bounds(pending, inline, None) == (inline, True)
        assert batch_bounds(pending, inline, 10_000) == (10_000, True)  # a smaller limit holds
    assert batch_bounds(inline + 1, inline, 1_000_000) == (1_000_000, False)
    assert batch_bounds(inline + 1, inline, None) == (None, False)
    assert batch_bounds(inline + 1, inline, 10_000) == (10_000, False)


def test_no_driver_share_sends_every_batch_to_a_job() -> None:
    assert batch_bounds(1, 0, 1_000_000) == (1_000_000, False)
    assert batch_bounds(0, 0, 1_000_000) == (1_000_000, False)  # what arrives meanwhile


def _work(table: str, changes: int) -> TableWork:
    return TableWork(table, (), (), TypeDescriptions(), "app", "", changes=changes)


def _loads(groups: list[list[TableWork]], cost: dict[str, float]) -> list[float]:
    return sorted(sum(w.changes * cost[w.table] for w in group) for group in groups)


def test_tables_are_grouped_by_what_they_cost_not_by_their_changes_alone() -> None:
    """The shares of the sustained benchmark's tables and their measured costs: a wide table
    with large texts costs about eight times a narrow one per change. By changes alone, the
    group holding it ends long after the other; by cost, the two end together."""
    works = [
        _work("big", 300),
        _work("line_items", 280),
        _work("orders", 220),
        _work("counters", 100),
        _work("wide", 100),
        _work("heartbeat", 1),
    ]
    cost = {"big": 11.0, "line_items": 13.0, "orders": 13.0, "counters": 20.0, "wide": 85.0}
    cost["heartbeat"] = 5000.0  # its fixed cost, over one change
    blind = _loads(group_work(works, 2), cost)
    weighed = _loads(group_work(works, 2, cost), cost)
    total = sum(w.changes * cost[w.table] for w in works)
    assert blind[1] > 0.65 * total  # one group does two thirds of the work
    assert weighed[1] < 0.55 * total
    assert sorted(w.table for g in group_work(works, 2, cost) for w in g) == sorted(
        w.table for w in works
    )
    # a table not measured yet counts at the median cost of those that were
    fresh = [*works, _work("new", 1000)]
    grouped = group_work(fresh, 2, cost)
    assert grouped[0][0].table == "new"  # the largest load goes first
    assert len(group_work(works, 10, cost)) == len(works)  # a group per table at most
