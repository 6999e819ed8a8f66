"""The pure helpers of the benchmarks (bench/harness/pure.py, bench/harness/data.py, bench/harness/interference.py);
the benchmarks themselves are not part of the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness import data, interference, pure

# /proc/<pid>/stat of a process whose name has spaces and parentheses in it
STAT = (
    "4242 (evalstream (worker) x) S 17 4242 4242 0 -1 4194560 51234 0 12 0 "
    "1500 250 30 7 20 0 9 0 123456 3221225472 40000 18446744073709551615 "
    "1 1 0 0 0 0 0 16781312 16386 0 0 0 17 1 0 0 0 0 0"
)

STATUS = """Name:\tpython
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t 1200000 kB
VmHWM:\t  65432 kB
VmRSS:\t  60000 kB
Threads:\t9
"""


def test_parse_proc_stat_counts_fields_after_the_command_name() -> None:
    st = pure.parse_proc_stat(STAT)
    assert st == {"ppid": 17, "utime": 1500, "stime": 250, "cutime": 30, "cstime": 7}


def test_parse_status_kib() -> None:
    assert pure.parse_status_kib(STATUS, "VmHWM") == 65432
    assert pure.parse_status_kib(STATUS, "VmRSS") == 60000
    assert pure.parse_status_kib(STATUS, "VmSwap") is None
    assert pure.parse_status_kib(STATUS, "Threads") == 9


def test_cpu_model_and_memory() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\nflags\t: fpu\n"
    assert pure.cpu_model(cpuinfo) == "AMD EPYC 9R14"
    assert pure.mem_total_bytes("MemTotal:       24683652 kB\nMemFree: 1 kB\n") == 24683652 * 1024
    assert pure.mem_total_bytes("") is None


def test_git_commit_reads_loose_packed_and_detached_heads(tmp_path: Path) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    assert pure.git_commit(git) is None  # neither a loose nor a packed ref yet
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/main\n")
    assert pure.git_commit(git) == sha
    other = "f" * 40
    (git / "refs" / "heads" / "main").write_text(other + "\n")
    assert pure.git_commit(git) == other  # a loose ref wins over the packed one
    (git / "HEAD").write_text(sha + "\n")
    assert pure.git_commit(git) == sha
    assert pure.git_commit(tmp_path / "nowhere") is None


def test_summarize_and_ratios() -> None:
    s = pure.summarize([3.0, 1.0, 2.0])
    assert s["median"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0 and s["n"] == 3
    assert s["values"] == [3.0, 1.0, 2.0]
    assert pure.summarize([1.0, 2.0])["median"] == 1.5
    assert pure.summarize([])["median"] is None
    assert pure.ratios([2.0, 9.0], [1.0, 3.0]) == [2.0, 3.0]
    assert pure.ratios([1.0], [0.0]) == []  # a zero denominator is left out, not a crash
    with pytest.raises(ValueError):
        pure.ratios([1.0], [1.0, 2.0])


METRICS = """# HELP evalstream_batch_size Items per engine batch
# TYPE evalstream_batch_size histogram
evalstream_batch_size_bucket{le="1.0"} 0.0
evalstream_batch_size_bucket{le="+Inf"} 3.0
evalstream_batch_size_count 3.0
evalstream_batch_size_sum 57.0
evalstream_tokens_total{direction="in"} 1200.0
evalstream_tokens_total{direction="out"} 240.0
evalstream_stage_latency_seconds_count{stage="queue_wait"} 2.0
evalstream_stage_latency_seconds_count{stage="engine"} 3.0
odd_total{a="x,y",b="say \\"hi\\""} 1.5
process_cpu_seconds_total 4.2
"""


def test_parse_prometheus_and_metric_sum() -> None:
    m = pure.parse_prometheus(METRICS)
    assert m[("evalstream_batch_size_count", ())] == 3.0
    assert m[("evalstream_batch_size_bucket", (("le", "+Inf"),))] == 3.0
    assert m[("odd_total", (("a", "x,y"), ("b", 'say "hi"')))] == 1.5
    assert pure.metric_sum(m, "evalstream_tokens_total") == 1440.0
    assert pure.metric_sum(m, "evalstream_tokens_total", direction="out") == 240.0
    assert pure.metric_sum(m, "evalstream_stage_latency_seconds_count", stage="queue_wait") == 2.0
    assert pure.metric_sum(m, "evalstream_engine_requests_total") == 0.0
    assert pure.metric_sum(m, "process_cpu_seconds_total") == 4.2


def test_padding_stats() -> None:
    # one batch [2, 4]: 8 positions, 2 padded; one batch [3]: none padded
    p = pure.padding_stats([[2, 4], [3]])
    assert p["padding_ratio"] == pytest.approx(2 / 11)
    assert p["mean_batch_padding_ratio"] == pytest.approx((0.25 + 0.0) / 2)
    assert pure.padding_stats([])["padding_ratio"] == 0.0


def test_fixed_batches() -> None:
    assert pure.fixed_batches(5, 2) == [[0, 1], [2, 3], [4]]
    assert pure.fixed_batches(3, 8) == [[0, 1, 2]]
    assert pure.fixed_batches(0, 4) == []
    with pytest.raises(ValueError):
        pure.fixed_batches(3, 0)


def test_fmt_num() -> None:
    assert pure.fmt_num(None) == "–"
    assert pure.fmt_num(0) == "0"
    assert pure.fmt_num(12345.6) == "12,346"
    assert pure.fmt_num(0.91234) == "0.912"
    assert pure.fmt_num(2.5) == "2.5"


def test_render_table_escapes_cells_and_marks_misses() -> None:
    rows = [
        pure.goal_row("1", "engine", "≥ 0.90", "0.95", True),
        pure.goal_row("2", "a|b", "≥ 2×", "1.1×", False, "note\nwith a line break"),
        pure.goal_row("3", "info", "–", "x", None),
    ]
    table = pure.render_table(rows).splitlines()
    assert table[0].startswith("| # | benchmark |")
    assert table[2] == "| 1 | engine | ≥ 0.90 | 0.95 | yes |  |"
    assert table[3] == "| 2 | a\\|b | ≥ 2× | 1.1× | **no** | note with a line break |"
    assert table[4].endswith("| – |  |")


def test_replace_between_keeps_everything_outside_the_markers() -> None:
    text = "# Title\n\nintro\n<!-- s -->\nold table\n<!-- e -->\ntail\n"
    out = pure.replace_between(text, "<!-- s -->", "<!-- e -->", "new\ntable\n")
    assert out == "# Title\n\nintro\n<!-- s -->\nnew\ntable\n<!-- e -->\ntail\n"
    assert pure.replace_between(out, "<!-- s -->", "<!-- e -->", "new\ntable") == out  # idempotent
    with pytest.raises(ValueError):
        pure.replace_between("no markers", "<!-- s -->", "<!-- e -->", "x")


def test_arithmetic_rows_are_distinct_and_deterministic() -> None:
    rows = data.arithmetic_rows(300, seed=7)
    assert len({r["question"] for r in rows}) == 300  # no item answered from the cache by another
    assert len({r["id"] for r in rows}) == 300
    assert rows == data.arithmetic_rows(300, seed=7)
    assert rows != data.arithmetic_rows(300, seed=8)
    assert all(str(eval(r["question"][8:-1])) == r["answer"] for r in rows)
    assert len({r["question"] for r in data.arithmetic_rows(5000, seed=1)}) == 5000  # beyond two digits


def test_parse_cpu_busy_ticks() -> None:
    stat = "cpu  100 5 50 1000 20 3 2 7 0 0\ncpu0 50 2 25 500 10 1 1 3 0 0\n"
    assert interference.parse_cpu_busy_ticks(stat) == 100 + 5 + 50 + 3 + 2 + 7


def test_headline_prefers_repeats_under_the_same_outside_load() -> None:
    values = [1.0, 3.4, 1.1, 0.9]
    foreign = [(0.1, 0.2), (0.1, 1.5), (0.3, 0.3), (0.6, 0.5)]
    assert interference.quiet_pairs(foreign) == [0, 2, 3]
    h = interference.headline(values, foreign)
    assert h["median"] == 1.0 and h["of_repeats"] == [0, 2, 3] and not h["noisy"]
    assert h["all_repeats"]["median"] == 1.05
    noisy = interference.headline([1.0, 3.0], [(0.0, 1.0), (0.0, 1.0)])
    assert noisy["noisy"] and noisy["median"] == 2.0 and noisy["of_repeats"] == [0, 1]


def test_the_ceiling_reports_each_repeats_machine_control_beside_its_rate() -> None:
    from bench.pipeline_ceiling import controls_note, median_of, run_rate

    repeats = [
        {"run": {"items_per_s": r}, "control_us": c} for r, c in ((9000, 7.1), (11000, 6.2), (10000, 6.6))
    ]
    median = median_of(repeats, run_rate)
    assert median["run"]["items_per_s"] == 10000 and median["control_us"] == 6.6
    assert median["repeats"] == [9000, 11000, 10000] and median["controls"] == [7.1, 6.2, 6.6]
    assert controls_note(median) == "7.10 / 6.20 / 6.60"
