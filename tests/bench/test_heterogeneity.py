"""bench.heterogeneity: the jobs each (mode, slowdown) runs, the figures of a run, medians and verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import heterogeneity_jobs as jobs
from bench.heterogeneity import pairs_in_order, run_figures, staleness_figures, time_to, updates_per_s
from bench.heterogeneity_report import adaptive_lines, aggregate, earlier_runs, staleness_shares, table, verdict_lines
from elasticps.api.modes import TrainingMode
from elasticps.api.parsing import parse_job

ROOT = Path(__file__).resolve().parents[2]


def example() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "mnist.yaml").read_text())
    return document


@pytest.mark.parametrize("mode", jobs.MODES, ids=lambda m: m.key)
@pytest.mark.parametrize("slowdown", jobs.SLOWDOWNS, ids=lambda s: s.key)
def test_every_pair_is_a_job_that_parses_with_its_mode_and_slowdown(mode: jobs.Mode, slowdown: jobs.Slowdown) -> None:
    document = example()
    derived = jobs.derive(document, mode, slowdown, records=60_000, epochs=2)
    job = parse_job(derived)
    training = job.spec.training
    assert (job.spec.ps.replicas, job.spec.worker.replicas) == (jobs.PS_REPLICAS, jobs.WORKERS)
    assert training.slowdown == slowdown.text and training.num_epochs == 2
    assert job.spec.output == "" and training.checkpoint_steps == 0
    assert 1 <= training.evaluation_steps
    assert TrainingMode.of(training).problems() == []
    assert document == example()  # the given document is left as it was


def test_each_mode_is_what_its_name_says() -> None:
    def label(key: str) -> str:
        derived = jobs.derive(example(), jobs.MODE_BY_KEY[key], jobs.SLOWDOWNS[0], records=60_000)
        return TrainingMode.of(parse_job(derived).spec.training).label

    assert [label(k) for k in ("sync", "sync-backup", "async", "async-lr", "ssp4")] == [
        "Sync", "Sync", "Async", "Async+StalenessLR", "Async+SSP4",
    ]
    assert [label(k) for k in ("localsgd2", "localsgd4", "localsgd8", "localsgd-adaptive")] == [
        "LocalSGD2", "LocalSGD4", "LocalSGD8", "LocalSGDAdaptive",
    ]
    backup = jobs.derive(example(), jobs.MODE_BY_KEY["sync-backup"], jobs.SLOWDOWNS[0], records=60_000)
    assert backup["spec"]["training"]["gradsToWait"] == jobs.WORKERS - 1


def test_the_decentralized_modes_run_without_ps_with_their_rules() -> None:
    from elasticps.api.modes import mode_label

    def job(key: str) -> Any:
        return parse_job(jobs.derive(example(), jobs.MODE_BY_KEY[key], jobs.SLOWDOWN_BY_KEY["straggler4"], records=60_000))

    labels = {k: mode_label(job(k).spec) for k in ("hop", "hop-backup1", "hop-stale5", "hop-skip2", "hop-skip10", "allreduce")}
    assert labels == {
        "hop": "Decentralized", "hop-backup1": "Decentralized-backup1", "hop-stale5": "Decentralized-stale5",
        "hop-skip2": "Decentralized-backup1-skip2", "hop-skip10": "Decentralized-backup1-skip10",
        "allreduce": "Decentralized",
    }
    assert all(not job(k).uses_ps for k in labels)
    assert job("allreduce").spec.decentralized.graph == "complete" and job("hop").spec.decentralized.graph == "ring"
    # a skip of 10 needs neighbours up to 11 iterations ahead: the tokens allow 12
    assert job("hop-skip10").spec.decentralized.max_iteration_gap > 10


def test_evaluations_come_about_eight_times_an_epoch_in_each_modes_versions() -> None:
    # 60,000 records / 64 = 937.5 minibatches an epoch.
    assert jobs.evaluation_steps(jobs.MODE_BY_KEY["sync"], 60_000, 64) == round(937.5 / 4 / 8)
    assert jobs.evaluation_steps(jobs.MODE_BY_KEY["async"], 60_000, 64) == round(937.5 / 8)
    assert jobs.evaluation_steps(jobs.MODE_BY_KEY["localsgd8"], 60_000, 64) == round(937.5 / 32 / 8)


def test_every_pair_runs_once_per_repetition_starting_further_along() -> None:
    modes, slowdowns = jobs.MODES[:2], jobs.SLOWDOWNS[:2]
    first, second = pairs_in_order(0, slowdowns, modes), pairs_in_order(1, slowdowns, modes)
    assert sorted(map(str, first)) == sorted(map(str, second)) and len(first) == 4
    assert second[0] == first[1]


def sample(t: float, version: int, accuracy: float | None = None, k: int = 0) -> dict[str, Any]:
    return {"t": t, "model_version": version, "accuracy": accuracy, "local_steps": k}


def test_figures_of_a_run_from_its_timeline() -> None:
    samples = [
        sample(5.0, 1, None, 1),
        sample(10.0, 100, 0.95, 1),
        sample(20.0, 200, 0.972, 4),
        sample(30.0, 300, 0.972, 4),
        sample(40.0, 400, 0.981, 3),
    ]
    measured = {
        "samples": list(reversed(samples)),
        "epochs": [{"ended_s": 20.0, "tensor_bytes": 900}, {"ended_s": 40.0, "tensor_bytes": 300}],
        "wall_s": 41.0, "test_accuracy": 0.981, "tensor_bytes_epoch2": 300, "examples_per_s_epoch2": 3000.0,
        "gradients_rejected": 0, "first_step_s": 4.0, "staleness": [[0, 0, 6], [1, 1, 3], [2, 2, 1], [3, None, 0]],
    }
    got = run_figures(measured)
    assert (got["stale_share"], got["staleness_p90"]) == (0.4, 1.0)
    assert got["training_to_98_s"] == 36.0
    assert (got["time_to_97_s"], got["time_to_98_s"]) == (20.0, 40.0)
    assert got["updates_per_s_epoch2"] == pytest.approx(200 / 20)
    assert got["accuracy_curve"] == [(10.0, 0.95), (20.0, 0.972), (40.0, 0.981)]
    assert got["local_steps_curve"] == [(5.0, 1.0), (20.0, 4.0), (40.0, 3.0)]
    assert got["tensor_bytes_per_epoch"] == [900, 300]
    assert time_to(samples, 0.99) is None
    assert updates_per_s(samples[:1], {"ended_s": 40.0}, 20.0) is None


def cell(slowdown: str, mode: str, to98: float | None, repetition: int = 1) -> dict[str, Any]:
    return {
        "slowdown": slowdown, "mode": mode, "repetition": repetition, "time_to_97_s": to98, "time_to_98_s": to98,
        "test_accuracy": 0.98, "updates_per_s_epoch2": 10.0, "tensor_bytes_epoch2": 2e6, "wall_s": 50.0,
        "accuracy_curve": [], "local_steps_curve": [], "stale_share": 0.25, "staleness_p90": 2.0,
        "staleness": [[0, 0, 3], [1, 1, 1]], "training_to_98_s": None if to98 is None else to98 - 10.0,
    }


def test_medians_rank_a_run_that_never_got_there_last() -> None:
    runs = [cell("none", "sync", 40.0), cell("none", "sync", None, 2), cell("none", "sync", 30.0, 3)]
    assert aggregate(runs)["none"]["sync"]["time_to_98_s"] == 40.0
    runs[0] = cell("none", "sync", None)
    assert aggregate(runs)["none"]["sync"]["time_to_98_s"] is None  # two of three never did
    runs.append({"slowdown": "none", "mode": "sync", "repetition": 4, "failed": "boom"})
    assert aggregate(runs)["none"]["sync"]["runs"] == 3


def test_the_straggler_verdict_names_the_best_mode_and_the_speedup() -> None:
    runs = [cell("straggler4", "sync", 120.0), cell("straggler4", "localsgd4", 50.0), cell("straggler4", "async", None)]
    doc: dict[str, Any] = {
        "date": "today", "runtime_s": 1.0, "workers": 4, "ps": 1, "epochs": 2, "repeats": 1,
        "modes": {"sync": "sync", "localsgd4": "LocalSGD K=4", "async": "async"},
        "slowdowns": {"straggler4": "worker 0 4x slower"}, "summary": aggregate(runs), "runs": runs,
    }
    assert verdict_lines(doc) == [
        "worker 0 4x slower: LocalSGD K=4 reaches 98% in 50.0 s, sync in 120.0 s: 2.40x (ok: at least 2x); "
        "from the first training step 40.0 s and 110.0 s: 2.75x",
        "worker 0 4x slower: adaptive LocalSGD reaches 98% in never; the best fixed K, LocalSGD K=4, in 50.0 s "
        "(its runs 50.0 s to 50.0 s) (MISSED: within that spread or faster)",
    ]
    text = table(doc)
    assert "| async | never | never |" in text and "| LocalSGD K=4 | 50.0 | 50.0 |" in text
    assert "| 2 | 25% | 2 | 1 |" in text  # tensor MB, stale pushes, staleness p90, runs


def test_staleness_percentiles_and_shares_count_every_push() -> None:
    buckets = [[0, 0, 90], [1, 1, 0], [2, 2, 5], [3, 4, 4], [5, None, 1]]
    assert staleness_figures(buckets) == {"stale_share": 0.1, "staleness_p90": 0.0}
    assert staleness_figures([[0, 0, 1], [1, 1, 0], [2, None, 9]]) == {"stale_share": 0.9, "staleness_p90": 2.0}
    assert staleness_figures([[0, 0, 0], [1, None, 0]]) == {"stale_share": None, "staleness_p90": None}
    runs = [{"staleness": buckets}, {"staleness": [[0, 0, 0], [1, 1, 100], [2, 2, 0], [3, 4, 0], [5, None, 0]]}]
    labels, shares = staleness_shares(runs)
    assert labels == ["0", "1", "2", "3-4", "5+"]
    assert shares == [0.45, 0.5, 0.025, 0.02, 0.005]


def test_merge_keeps_only_the_runs_of_pairs_not_run_again(tmp_path: Path) -> None:
    results = tmp_path / "heterogeneity.json"
    runs = [cell("none", "sync", 40.0), cell("straggler4", "sync", 90.0), cell("straggler4", "async", 60.0)]
    results.write_text(json.dumps({
        "modes": {"sync": "sync", "async": "async"},
        "slowdowns": {"none": "no slowdown", "straggler4": "worker 0 4x slower"},
        "runs": runs,
    }))
    kept = earlier_runs([jobs.MODE_BY_KEY["sync"]], [jobs.SLOWDOWN_BY_KEY["straggler4"]], results)
    assert kept["runs"] == [runs[0], runs[2]]
    assert kept["modes"] == {"sync": "sync", "async": "async"}
    assert kept["slowdowns"] == {"none": "no slowdown", "straggler4": "worker 0 4x slower"}
    assert earlier_runs(jobs.MODES, jobs.SLOWDOWNS, results)["runs"] == []
    assert earlier_runs(jobs.MODES, jobs.SLOWDOWNS, tmp_path / "none.json")["runs"] == []


def test_adaptive_is_judged_against_the_spread_of_the_best_fixed_k() -> None:
    runs = [
        cell("none", "localsgd2", 40.0), cell("none", "localsgd2", 44.0, 2), cell("none", "localsgd2", 52.0, 3),
        cell("none", "localsgd4", 45.0), cell("none", "localsgd8", None),
        cell("none", "localsgd-adaptive", 50.0), cell("none", "localsgd-adaptive", 60.0, 2),
        cell("none", "localsgd-adaptive", 47.0, 3),
    ]
    doc: dict[str, Any] = {
        "modes": {"localsgd2": "LocalSGD K=2", "localsgd4": "LocalSGD K=4", "localsgd8": "LocalSGD K=8"},
        "slowdowns": {"none": "no slowdown"}, "summary": aggregate(runs), "runs": runs,
    }
    assert adaptive_lines(doc) == [
        "no slowdown: adaptive LocalSGD reaches 98% in 50.0 s; the best fixed K, LocalSGD K=2, in 44.0 s "
        "(its runs 40.0 s to 52.0 s) (ok: within that spread or faster)"
    ]
    runs[-1] = cell("none", "localsgd-adaptive", 70.0, 3)  # median 60.0, past K=2's slowest run
    doc["summary"] = aggregate(runs)
    assert adaptive_lines(doc)[0].endswith("(MISSED: within that spread or faster)")


def test_hop_lines_name_issue_16s_figures_and_marks() -> None:
    from bench.heterogeneity_report import hop_lines

    def cell(**figures: float) -> dict[str, Any]:
        return {"runs": 3, **figures}

    doc = {"summary": {
        "random6": {"hop": cell(updates_per_s_epoch2=2.0), "hop-backup1": cell(updates_per_s_epoch2=3.0)},
        "none": {"hop": cell(updates_per_s_epoch2=4.0), "hop-skip10": cell(updates_per_s_epoch2=4.0)},
        "straggler4": {"hop": cell(updates_per_s_epoch2=1.0, time_to_97_s=60.0),
                       "hop-skip10": cell(updates_per_s_epoch2=3.0, time_to_97_s=50.0)},
    }}
    lines = hop_lines(doc)
    assert lines[0] == ("random 6x: decentralized with 1 backup worker 3.00 iterations/s, standard 2.00: 1.50x "
                        "(ok: at least 1.3x)")
    assert lines[1].endswith("in 50.0 s, standard decentralized in 60.0 s: 1.20x (MISSED: at least 1.5x)")
    assert "standard, takes 4.00x as long" in lines[2] and "MISSED" not in lines[2]
    assert "skipping (max jump 10), takes 1.33x as long" in lines[3] and lines[3].endswith("(ok: at most 1.5x)")
    assert hop_lines({"summary": {}}) == []
