"""How large the driver's next batch may be, given what waits in the spool."""

from __future__ import annotations

from pgcdc.pipeline._batch import JOB_BACKLOG, batch_limit


def test_a_small_backlog_is_cut_into_batches_the_driver_applies() -> None:
    """A few batches' worth waiting (a slow batch under a live load) stays with the driver,
    whose targets are open; a real backlog goes in batches up to the limit (Spark jobs)."""
    inline = 50_000
    for pending in (0, 1, inline, inline + 1, JOB_BACKLOG * inline):
        assert batch_limit(pending, inline, 1_000_000) == inline
        assert batch_limit(pending, inline, None) == inline
        assert batch_limit(pending, inline, 10_000) == 10_000  # a smaller limit holds
    assert batch_limit(JOB_BACKLOG * inline + 1, inline, 1_000_000) == 1_000_000
    assert batch_limit(JOB_BACKLOG * inline + 1, inline, None) is None
    assert batch_limit(JOB_BACKLOG * inline + 1, inline, 10_000) == 10_000
