"""The worker's own CPU, for the line it logs at exit: CPU seconds per 1,000 training examples.

``worker/main.py`` reads :func:`cpu_seconds` at start-up and when the first training task begins
(``training.py`` marks it), and logs :func:`cpu_line` at the end: the figure over the whole life
(TensorFlow's import and the first traces included) and from the first task on (the steady cost of
training). Every thread of the process counts: the gradient computation's thread pools as much as
the pushes and pulls. Evaluation tasks are included; only training examples are counted.
"""

from __future__ import annotations

import resource


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_thousand(seconds: float, examples: int) -> float | None:
    """Seconds per 1,000 examples; None without examples."""
    return seconds / examples * 1000 if examples > 0 else None


def cpu_line(name: str, total_s: float, since_first_task_s: float | None, examples: int) -> str:
    """One line: the CPU of the whole life and from the first training task on, each per 1,000 examples."""

    def rate(seconds: float) -> str:
        value = per_thousand(seconds, examples)
        return "-" if value is None else f"{value:.3f}"

    line = f"{name} cpu: {total_s:.1f} s for {examples} training examples ({rate(total_s)} s per 1,000)"
    if since_first_task_s is not None:
        line += f"; from the first task {since_first_task_s:.1f} s ({rate(since_first_task_s)} s per 1,000)"
    return line
