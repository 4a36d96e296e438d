"""``make bench-async``'s pure parts: the job of each run, the order of the cells, the summary."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench import async_convergence as bench
from elasticps.api.modes import TrainingMode
from elasticps.api.parsing import parse_job
from elasticps.api.spec import StalenessCompensation

ROOT = Path(__file__).resolve().parents[2]


def test_every_mode_derives_a_job_that_parses_with_its_settings() -> None:
    document = yaml.safe_load((ROOT / "examples" / "mnist.yaml").read_text())
    for mode in bench.MODES:
        for workers, ps in bench.WORKERS.items():
            job = bench.derive(document, mode, 0.05, workers, 7, 60_000, 2)
            parsed = parse_job(job)
            training = parsed.spec.training
            assert (training.learning_rate, training.seed, training.num_epochs) == (0.05, 7, 2)
            assert (parsed.spec.worker.replicas, parsed.spec.ps.replicas) == (workers, ps)
            assert training.checkpoint_steps == 0 and not parsed.spec.output
            mode_of = TrainingMode.of(training)
            assert mode_of.pull_every == mode.training.get("getModelFrequency", 1)
            uncompensated = mode.training.get("stalenessCompensation") == "none"
            assert (mode_of.compensation is StalenessCompensation.NONE) is uncompensated
            # About 8 evaluations an epoch: sync makes one version per round of every worker.
            per_version = workers if mode.key == "sync" else 1
            assert training.evaluation_steps == round(60_000 / 64 / per_version / 8)
    assert "seed" not in document["spec"].get("training", {})  # the document is left as it was


def test_each_seed_starts_one_cell_further() -> None:
    cells = [("peer", 2, m) for m in bench.MODES[:3]]
    assert [c[2].key for c in bench.cells_in_order(0, cells)] == ["sync", "async-none", "async"]
    assert [c[2].key for c in bench.cells_in_order(1, cells)] == ["async-none", "async", "sync"]
    assert bench.cells_in_order(3, cells) == cells


def test_the_summary_counts_reached_thresholds_and_compares_updates_with_uncompensated() -> None:
    runs = [
        {"setting": "peer", "workers": 2, "mode": "async-none", "test_accuracy": 0.1135, "time_to_97_s": None,
         "time_to_98_s": None, "updates_per_s_epoch2": 20.0, "wall_s": 90.0},
        {"setting": "peer", "workers": 2, "mode": "async-none", "test_accuracy": 0.985, "time_to_97_s": 40.0,
         "time_to_98_s": 60.0, "updates_per_s_epoch2": 22.0, "wall_s": 88.0},
        {"setting": "peer", "workers": 2, "mode": "async", "test_accuracy": 0.986, "time_to_97_s": 30.0,
         "time_to_98_s": 50.0, "updates_per_s_epoch2": 20.0, "wall_s": 85.0},
        {"setting": "peer", "workers": 2, "mode": "async", "failed": "boom"},
    ]  # fmt: skip
    summary = bench.aggregate(runs)
    plain, default = summary["peer/2/async-none"], summary["peer/2/async"]
    assert (plain["runs"], plain["reached_97"], plain["reached_98"]) == (2, 1, 1)
    assert plain["min_accuracy"] == 0.1135 and plain["median_time_to_98_s"] == 60.0
    assert (default["runs"], default["failed"], default["reached_98"]) == (2, 1, 1)
    assert default["updates_vs_uncompensated"] == 20.0 / 21.0
    table = bench.table({"date": "2026-11-28", "runs": runs, "epochs": 2, "seeds": "1-2",
                         "settings": {"peer": 0.05}, "summary": summary})  # fmt: skip
    assert "| peer | 2 (1) | async (default: momentumCorrection) | 2 (1 failed) | 1/1 | 1/1 |" in table


def test_seeds_are_written_as_ranges() -> None:
    assert bench._seed_text([1, 2, 3, 4, 5, 8, 10, 11]) == "1-5, 8, 10-11"
    assert bench._seed_text([]) == "none"
