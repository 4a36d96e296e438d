"""``bench.peer``'s pure parts: the jobs it derives, the figures it reads from coordinator answers,
its medians, ratios and verdicts, its doc section, and the doc regions that keep each benchmark's
section apart (the runs themselves are ``python -m bench.peer``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import doc_regions, peer_jobs, peer_report
from bench.peer import data_problem, round_order
from bench.peer_timeline import IncompleteRun, Sample, figures
from elasticps.api.parsing import load_job_file

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mnist-async.yaml"


def example() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return loaded


# ---- jobs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "use_async", "staleness"),
    [("sync", False, False), ("async", True, False), ("async+lr", True, True)],
)
def test_each_elasticps_system_gets_its_mode_on_one_ps_and_two_workers(key: str, use_async: bool, staleness: bool, tmp_path: Path) -> None:
    derived = peer_jobs.derive(example(), peer_jobs.BY_KEY[key], epochs=2)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(derived))
    spec = load_job_file(path).spec  # what `elasticps run` will read
    assert (spec.ps.replicas, spec.worker.replicas) == (1, 2)
    assert (spec.training.use_async, spec.training.lr_staleness_modulation) == (use_async, staleness)
    assert (spec.training.evaluation_steps, spec.training.checkpoint_steps, spec.output) == (0, 0, "")
    assert (spec.training.minibatch_size, spec.training.learning_rate, spec.training.num_epochs) == (64, 0.0, 2)  # 0: the model's 0.05
    assert spec.model.model_def == "elasticps.backends.keras.zoo.mnist_cnn"


def test_derive_leaves_the_document_alone_and_the_peer_keeps_the_jobs_mode() -> None:
    document = example()
    derived = peer_jobs.derive(document, peer_jobs.PEER, epochs=3)
    assert document == example()
    assert "output" in document["spec"] and "output" not in derived["spec"]
    assert derived["spec"]["training"]["numEpochs"] == 3
    assert derived["spec"]["training"]["useAsync"] is True  # the example's, untouched for the peer
    assert derived["metadata"]["name"] == "mnist-async-bench-peer"
    assert peer_jobs.derive(document, peer_jobs.ASYNC_LR)["metadata"]["name"] == "mnist-async-bench-async-lr"


def test_every_system_shares_the_settings_of_the_job() -> None:
    assert peer_jobs.settings(peer_jobs.derive(example(), peer_jobs.SYNC)) == {
        "model_def": "elasticps.backends.keras.zoo.mnist_cnn",
        "training": "../shared/data/mnist/train",
        "validation": "../shared/data/mnist/t10k",
        "minibatch": 64,
        "learning_rate": 0.0,  # the model's own (0.05), as the peer's
        "num_epochs": 2,
        "records_per_task": 2048,
        "ps": 1,
        "workers": 2,
    }


def test_rounds_rotate_the_order_of_the_systems() -> None:
    keys = [[s.key for s in round_order(r)] for r in range(5)]
    assert keys[0] == ["peer", "sync", "async", "async+lr"]
    assert keys[1] == ["sync", "async", "async+lr", "peer"]
    assert keys[4] == keys[0]


def test_records_that_cannot_be_read_are_one_line_before_any_run(tmp_path: Path) -> None:
    assert data_problem(example()) is None  # run from the repository, as `make bench-peer` does
    document = example()
    document["spec"]["data"]["training"] = str(tmp_path / "absent")
    problem = data_problem(document)
    assert problem is not None and "absent" in problem and "\n" not in problem


# ---- timeline --------------------------------------------------------------------------------------
def sample(t: float, done: int, version: int, finished: bool = False, cpu: float | None = None) -> Sample:
    return Sample(t=t, records_done=done, records_total=120_000, model_version=version, finished=finished, cpu_s=cpu)


def test_first_step_epochs_and_wall_from_the_answers() -> None:
    samples = [
        sample(1.0, 0, 0),
        sample(6.0, 0, 0),
        sample(7.0, 0, 1),  # the first update
        sample(20.0, 55_296, 900),
        sample(22.0, 62_048, 980),  # past 1 epoch: a task of epoch 2 already reported
        sample(40.0, 120_000, 1876),  # training done
        sample(41.5, 120_000, 1876, finished=True),  # final evaluation done
        sample(42.0, 120_000, 1876, finished=True),
    ]
    got = figures(list(reversed(samples)), num_epochs=2)
    assert (got["first_step_s"], got["wall_s"], got["examples"]) == (7.0, 41.5, 120_000)
    assert [e["records"] for e in got["epochs"]] == [62_048, 57_952]
    assert got["epochs"][0]["seconds"] == 15.0
    assert got["examples_per_s_epoch2"] == pytest.approx(57_952 / 18.0)
    assert got["evaluation_s"] == pytest.approx(1.5)
    assert got["cpu_s_per_1000_examples_epoch2"] is None  # no CPU read


def test_cpu_of_each_epoch_from_the_samples_at_its_ends() -> None:
    samples = [
        sample(7.0, 0, 1, cpu=20.0),
        sample(22.0, 60_000, 980, cpu=50.0),
        sample(40.0, 120_000, 1876, cpu=86.0),
        sample(41.0, 120_000, 1876, finished=True, cpu=None),  # a process had exited
    ]
    got = figures(samples, num_epochs=2)
    assert [e["cpu_s"] for e in got["epochs"]] == [30.0, 36.0]
    assert got["cpu_s_per_1000_examples_epoch2"] == pytest.approx(0.6)
    assert got["wall_s"] == 41.0


def test_tensor_bytes_of_each_epoch_from_the_samples_at_its_ends() -> None:
    def moved(t: float, done: int, version: int, total: int | None, finished: bool = False) -> Sample:
        return Sample(t, done, 120_000, version, finished, tensor_bytes=total)

    samples = [
        moved(7.0, 0, 1, 1_000),
        moved(22.0, 60_000, 980, 41_000),
        moved(40.0, 120_000, 1876, 51_000),
        moved(41.0, 120_000, 1876, None, finished=True),  # a shard had stopped answering
    ]
    got = figures(samples, num_epochs=2)
    assert [e["tensor_bytes"] for e in got["epochs"]] == [40_000, 10_000]
    assert got["tensor_bytes_epoch2"] == 10_000
    samples[1] = moved(22.0, 60_000, 980, None)
    assert figures(samples, num_epochs=2)["tensor_bytes_epoch2"] is None


@pytest.mark.parametrize(
    ("samples", "missing"),
    [
        ([], "no answer"),
        ([sample(1.0, 0, 0, finished=True)], "first update"),
        ([sample(1.0, 0, 1), sample(2.0, 60_000, 5), sample(3.0, 100_000, 9, finished=True)], "120000 records"),
        ([sample(1.0, 0, 1), sample(2.0, 60_000, 5), sample(3.0, 120_000, 9)], "finished"),
    ],
)
def test_a_run_the_answers_do_not_show_complete_is_an_error(samples: list[Sample], missing: str) -> None:
    with pytest.raises(IncompleteRun, match=missing):
        figures(samples, num_epochs=2)


# ---- report ----------------------------------------------------------------------------------------
def run(system: str, wall: float, ex: float, acc: float, first: float = 10.0, cpu: float = 0.5) -> dict[str, Any]:
    return {
        "system": system, "wall_s": wall, "examples_per_s_epoch2": ex, "test_accuracy": acc,
        "first_step_s": first, "cpu_s_per_1000_examples": cpu,
    }


RUNS = [
    run("peer", 35.0, 5000.0, 0.984), run("peer", 36.0, 5100.0, 0.983), run("peer", 40.0, 4000.0, 0.985),
    run("sync", 40.0, 5000.0, 0.980), run("sync", 41.0, 5200.0, 0.981), run("sync", 30.0, 4900.0, 0.979),
    run("async", 33.0, 6000.0, 0.986), run("async", 31.0, 6100.0, 0.987), run("async", 32.0, 5900.0, 0.986),
    run("async+lr", 29.0, 6200.0, 0.987), run("async+lr", 30.0, 6300.0, 0.986), run("async+lr", 31.0, 6100.0, 0.988),
]


def test_medians_and_ranges_per_system() -> None:
    summary = peer_report.aggregate(RUNS)
    assert summary["peer"]["wall_s"] == {"median": 36.0, "min": 35.0, "max": 40.0}
    assert summary["sync"]["examples_per_s_epoch2"] == {"median": 5000.0, "min": 4900.0, "max": 5200.0}
    assert summary["async+lr"]["runs"]["median"] == 3
    assert peer_report.ratio(summary, "async+lr", "wall_s") == pytest.approx(30.0 / 36.0)
    assert peer_report.ratio(summary, "missing", "wall_s") is None


def test_verdicts_against_the_issues_targets() -> None:
    verdicts = peer_report.verdicts(peer_report.aggregate(RUNS))
    by = {(v["system"], v["metric"]): v for v in verdicts}
    # 6200 / 5000 = 1.24 >= 1.2; 30 / 36 = 0.83 <= 0.85; 0.987 >= 0.984; sync 5000 / 5000 = 1.0 >= 1.0
    assert all(v["pass"] for v in verdicts), verdicts
    assert by[("async+lr", "examples_per_s_epoch2")]["ratio"] == pytest.approx(1.24)
    assert peer_report.verdict_line(by[("async+lr", "test_accuracy")]).endswith("PASS (0.9870 vs 0.9840)")
    slower = [r if r["system"] != "async+lr" else {**r, "wall_s": r["wall_s"] + 2.0, "test_accuracy": 0.9} for r in RUNS]
    missed = {(v["system"], v["metric"]): v["pass"] for v in peer_report.verdicts(peer_report.aggregate(slower))}
    assert missed == {
        ("async+lr", "examples_per_s_epoch2"): True,
        ("async+lr", "wall_s"): False,  # 32 / 36 = 0.89
        ("async+lr", "test_accuracy"): False,
        ("sync", "examples_per_s_epoch2"): True,
    }


def test_without_the_peer_no_target_passes() -> None:
    verdicts = peer_report.verdicts(peer_report.aggregate([r for r in RUNS if r["system"] != "peer"]))
    assert not any(v["pass"] for v in verdicts)
    assert all("n/a" in peer_report.verdict_line(v) for v in verdicts)


def test_doc_section_has_a_row_per_system_the_ratios_and_the_verdicts() -> None:
    summary = peer_report.aggregate(RUNS)
    doc = {
        "date": "2026-11-24T08:00:00+00:00", "runtime_s": 600.0, "repeats": 3,
        "settings": peer_jobs.settings(peer_jobs.derive(example(), peer_jobs.PEER)),
        "machine": {"cpus_usable": 2}, "load_average": {"before": [1.0], "after": [2.0]},
        "summary": summary, "runs": [{**r, "steps_per_execution": 10, "tensorflow": "2.x"} for r in RUNS],
    }
    text = peer_report.markdown(doc, "img/peer.png", "bench/results/peer.json")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "system" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| " + s.label for s in peer_jobs.SYSTEMS]
    assert "| 30.0 (29.0-31.0) | 0.83 | 6,200 (6,100-6,300) | 1.24 |" in text
    assert all(row.count(" | ") == 9 for row in rows)  # every column, "-" where runs lack the figure
    assert "| - |" in rows[0]  # no CPU of epoch 2 in these runs
    assert "PASS (1.24x)" in text and "MISS" not in text
    assert "steps per scheduled function" in text and "1 round(s) only" not in text
    assert "1 round(s) only" in peer_report.markdown({**doc, "repeats": 1}, "img/peer.png", "r.json")
    assert not any(math.isnan(v["ratio"]) for v in peer_report.verdicts(summary))


# ---- doc regions -----------------------------------------------------------------------------------
def test_a_region_is_replaced_in_place_and_other_text_kept() -> None:
    text = "# Title\n\n<!-- a:begin -->\nold\n<!-- a:end -->\n\n## Hand-written\nkept\n"
    replaced = doc_regions.replace_region(text, "a", "new\n")
    assert replaced == "# Title\n\n<!-- a:begin -->\nnew\n<!-- a:end -->\n\n## Hand-written\nkept\n"
    assert doc_regions.replace_region(replaced, "a", "new") == replaced


def test_a_new_region_goes_at_the_end_or_the_top() -> None:
    text = "<!-- a:begin -->\nA\n<!-- a:end -->\n\n## Hand-written\n"
    assert doc_regions.replace_region(text, "b", "B").endswith("## Hand-written\n\n<!-- b:begin -->\nB\n<!-- b:end -->\n")
    assert doc_regions.replace_region("rest\n", "c", "C", at_top=True) == "<!-- c:begin -->\nC\n<!-- c:end -->\n\nrest\n"
    assert doc_regions.replace_region("", "c", "C") == "<!-- c:begin -->\nC\n<!-- c:end -->\n"
    with pytest.raises(ValueError, match="without"):
        doc_regions.replace_region("<!-- a:begin -->\nA\n", "a", "B")


def test_the_benchmarks_doc_keeps_the_data_path_region_apart(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text((REPO / "docs" / "benchmarks.md").read_text())
    doc_regions.write_region(doc, "peer", "## peer section")
    doc_regions.write_region(doc, "datapath", "# Benchmarks\n\nregenerated", at_top=True)
    text = doc.read_text()
    assert text.startswith("<!-- datapath:begin -->\n# Benchmarks\n\nregenerated\n<!-- datapath:end -->")
    assert "## Elastic sync training (issue 11)" in text and "## peer section" in text
    assert text.count("<!-- peer:begin -->") == 1
