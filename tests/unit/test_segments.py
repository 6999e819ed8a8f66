"""The spans of a segment a window reads from the database: what it does not hold itself."""

from __future__ import annotations

from evalstream.aggregator import objects


def test_the_spans_are_the_segment_less_the_ordinals_held() -> None:
    assert objects.spans_without(0, 10, []) == [(0, 10)]
    assert objects.spans_without(0, 10, range(10)) == []
    assert objects.spans_without(0, 10, [0, 1, 2]) == [(3, 10)]
    assert objects.spans_without(0, 10, [9, 4, 5]) == [(0, 4), (6, 9)]
    # ordinals of other segments are not this one's business
    assert objects.spans_without(10, 20, [3, 10, 25]) == [(11, 20)]


def test_a_segment_held_in_too_many_pieces_is_read_whole() -> None:
    limit = objects.MAX_READ_SPANS
    assert len(objects.spans_without(0, 1000, range(1, 2 * limit - 2, 2)) or []) == limit
    assert objects.spans_without(0, 1000, range(1, 2 * limit, 2)) is None
