"""How large the driver's next batch may be, and who applies it, given what waits in the spool."""

from __future__ import annotations

from pgcdc.pipeline._batch import batch_bounds


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
