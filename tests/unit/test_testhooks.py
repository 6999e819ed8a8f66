"""Test-only crash points (FAULT_INJECT): parsed once, fire at the N-th pass."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evalstream.common.testhooks import CrashPoints


def test_crash_point_exits_at_the_nth_pass_only() -> None:
    code = (
        "from evalstream.common.testhooks import CrashPoints\n"
        "c = CrashPoints('a=3, b=1')\n"
        "for n in range(1, 5):\n"
        "    c.reach('other')\n"
        "    print('pass', n, flush=True)\n"
        "    c.reach('a')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 137
    assert out.stdout.split("\n")[:-1] == ["pass 1", "pass 2", "pass 3"]


def test_no_crash_points_by_default_and_bad_ones_refused() -> None:
    CrashPoints("").reach("aggregator_exit_after_write")  # returns: nothing configured
    assert CrashPoints(" x=2 ,").after == {"x": 2}
    for bad in ("x", "x=0", "x=two", "=3"):
        with pytest.raises(ValueError, match="FAULT_INJECT"):
            CrashPoints(bad)


def test_failing_items_are_named_beside_crash_points() -> None:
    hooks = CrashPoints("worker_fail_item=q-7, aggregator_exit_after_write=2,worker_fail_item=q-9")
    assert hooks.failing_items == {"q-7", "q-9"}
    assert hooks.after == {"aggregator_exit_after_write": 2}
    hooks.fail_on_items(["q-1", "q-2"], "shard s1")  # none of them: returns
    with pytest.raises(RuntimeError, match="injected fault: shard s2 holds a failing item"):
        hooks.fail_on_items(["q-1", "q-9"], "shard s2")
    CrashPoints("").fail_on_items(["q-7"], "shard s3")  # nothing configured: returns
