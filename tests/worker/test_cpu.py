"""The worker's exit line: its CPU per 1,000 training examples."""

from __future__ import annotations

from elasticps.worker.cpu import cpu_line, cpu_seconds, per_thousand


def test_the_line_gives_the_whole_life_and_the_steady_part_per_thousand_examples() -> None:
    line = cpu_line("worker-0", 30.0, 24.0, 60_000)
    assert line == (
        "worker-0 cpu: 30.0 s for 60000 training examples (0.500 s per 1,000); "
        "from the first task 24.0 s (0.400 s per 1,000)"
    )


def test_without_examples_or_a_first_task_the_line_says_so() -> None:
    assert per_thousand(5.0, 0) is None
    assert cpu_line("worker-1", 5.0, None, 0) == "worker-1 cpu: 5.0 s for 0 training examples (- s per 1,000)"


def test_cpu_seconds_grow_with_work() -> None:
    before = cpu_seconds()
    total = 0
    while cpu_seconds() <= before:  # at most a clock tick of busy work
        total += sum(range(10_000))
    assert cpu_seconds() > before >= 0
