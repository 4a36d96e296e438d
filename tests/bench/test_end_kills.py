"""``make bench-kills``'s plan: victims alternate, every n-th kill lands after the last task."""

from __future__ import annotations

from pathlib import Path

from bench import end_kills
from elasticps.api.parsing import parse_job


def test_the_plan_alternates_victims_and_puts_every_fourth_kill_after_the_last_task() -> None:
    runs = end_kills.plan(20, 4, seed=1)
    assert [r["victim"] for r in runs] == ["kills-ps-0", "kills-ps-1"] * 10
    window = [r["run"] for r in runs if r["moment"] == "after the last task"]
    assert window == [4, 8, 12, 16, 20]
    fractions = [r["moment"] for r in runs if r["run"] not in window]
    assert len(fractions) == 15 and all(0.0 <= f < 1.0 for f in fractions)
    assert len(set(fractions)) == 15  # drawn, not one moment
    assert end_kills.plan(20, 4, seed=1) == runs  # the seed fixes them


def test_the_job_parses_with_two_ps_and_checkpoints(tmp_path: Path) -> None:
    parsed = parse_job(end_kills.job(tmp_path / "train.npz", tmp_path / "validation.npz"))
    assert (parsed.spec.ps.replicas, parsed.spec.worker.replicas) == (2, 4)
    assert parsed.spec.training.checkpoint_steps == 20


def test_a_run_passes_only_succeeded_counted_once_and_not_hung() -> None:
    good = {"t": 12.5, "exit_code": 0, "succeeded": True, "counted_once": True, "hung": False}
    assert end_kills.passed(good)
    assert not end_kills.passed({k: v for k, v in good.items() if k != "t"})  # never killed: no test at all
    for key, bad in (("exit_code", 1), ("succeeded", False), ("counted_once", False), ("hung", True)):
        assert not end_kills.passed({**good, key: bad})
