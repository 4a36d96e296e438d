"""``make bench-peer``: elasticps against TensorFlow's ParameterServerStrategy on one job.

    python -m bench.peer [--job examples/mnist-async.yaml] [--repeats 3] [--epochs N] [--no_write]

Four systems on one TrainingJob (``bench.peer_jobs``: 1 PS + 2 workers, same model, data,
minibatch, optimizer, learning rate and epochs, evaluation only at the end): the peer
(``bench.peer_tf``: ParameterServerStrategy + ClusterCoordinator), elasticps sync, async, and async
with the staleness-aware learning rate. Each round runs every system once, as a child process
measured alike (``bench.peer_runs``), the order rotated by one each round; a line per run.

Writes ``bench/results/peer.json`` (every run), the section ``peer`` of ``docs/benchmarks.md`` and
``docs/img/peer.png`` (``bench.peer_report``), and prints the medians and the issue's targets.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import doc_regions, peer_jobs, peer_report
from bench.peer_runs import RunFailed, run_elasticps, run_peer
from bench.peer_timeline import IncompleteRun

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "peer.json"
DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "img" / "peer.png"
REGION = "peer"


def round_order(round_index: int, systems: tuple[peer_jobs.System, ...] = peer_jobs.SYSTEMS) -> list[peer_jobs.System]:
    """Round 0: the peer, sync, async, async+lr; each later round starts one further along."""
    shift = round_index % len(systems)
    return list(systems[shift:] + systems[:shift])


def data_problem(document: dict[str, Any]) -> str | None:
    """Why the job's records cannot be read (one line), or None: checked once, before any run."""
    from elasticps.api.parsing import SpecError, load_job_file
    from elasticps.data.readers import DataError, count_records

    with tempfile.TemporaryDirectory(prefix="elasticps-peer-check-") as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(yaml.safe_dump(peer_jobs.derive(document, peer_jobs.ASYNC)))
        try:
            count_records(load_job_file(path).spec.data)
        except (SpecError, DataError) as err:
            return " ".join(str(err).split())
    return None


def run_one(system: peer_jobs.System, document: dict[str, Any], epochs: int, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True)
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(peer_jobs.derive(document, system, epochs), sort_keys=False))
    if system.use_async is None:
        return run_peer(job, work)
    return run_elasticps(job, work, epochs)


def progress_line(round_index: int, rounds: int, system: peer_jobs.System, run: dict[str, Any]) -> str:
    ex = run.get("examples_per_s_epoch2")
    cpu2 = run.get("cpu_s_per_1000_examples_epoch2")
    return (
        f"round {round_index + 1}/{rounds} {system.label}: wall {run['wall_s']:.1f} s, first step "
        f"{run['first_step_s']:.1f} s, epoch 2 {'-' if ex is None else f'{ex:,.0f}'} examples/s, "
        f"CPU {run['cpu_s_per_1000_examples']:.2f} s/1,000 examples (epoch 2 {'-' if cpu2 is None else f'{cpu2:.2f}'}), "
        f"accuracy {run['test_accuracy']:.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--job", type=Path, default=ROOT / "examples" / "mnist-async.yaml")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; every system runs once per round")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of every run (examples/s of epoch 2 need 2)")
    parser.add_argument(
        "--systems", default=",".join(s.key for s in peer_jobs.SYSTEMS),
        help="comma-separated subset of " + ", ".join(s.key for s in peer_jobs.SYSTEMS),
    )
    parser.add_argument("--no_write", action="store_true", help="print only: no results file, doc or plot")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (examples/s are measured in epoch 2)")
    try:
        systems = tuple(peer_jobs.BY_KEY[k.strip()] for k in args.systems.split(",") if k.strip())
    except KeyError as err:
        parser.error(f"--systems: unknown {err}")
    document = yaml.safe_load(args.job.read_text())
    os.chdir(ROOT)  # the runs start here: the job's relative data paths are relative to the repository
    problem = data_problem(document)
    if problem:
        print(f"bench.peer: {args.job}: {problem}", file=sys.stderr)
        return 2
    started = time.monotonic()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="elasticps-peer-") as tmp:
        for r in range(args.repeats):
            for system in round_order(r, systems):
                try:
                    run = run_one(system, document, args.epochs, Path(tmp) / f"{r}-{system.key.replace('+', '-')}")
                except (RunFailed, IncompleteRun) as err:
                    failures.append(f"round {r + 1} {system.label}: {err}")
                    print(f"round {r + 1}/{args.repeats} {system.label}: FAILED: {err}", flush=True)
                    continue
                runs.append({"round": r + 1, "system": system.key, **run})
                print(progress_line(r, args.repeats, system, run), flush=True)
    summary = peer_report.aggregate(runs)
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "runtime_s": round(time.monotonic() - started, 1),
        "repeats": args.repeats,
        "job": str(args.job),
        "settings": {**peer_jobs.settings(peer_jobs.derive(document, peer_jobs.PEER, args.epochs))},
        "machine": {"cpus_usable": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]},
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "summary": summary,
        "verdicts": peer_report.verdicts(summary),
        "failures": failures,
        "runs": runs,
    }
    for line in peer_report.console_lines(summary):
        print(line)
    complete = not failures and {s.key for s in peer_jobs.SYSTEMS} <= set(summary)
    if args.no_write:
        pass
    elif not complete:
        print("not every system has a run: nothing written")
    else:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
        peer_report.plot(doc, PLOT)
        doc_regions.write_region(
            DOC, REGION,
            peer_report.markdown(doc, PLOT.relative_to(DOC.parent).as_posix(), RESULTS.relative_to(ROOT).as_posix()),
        )
        print(f"wrote {RESULTS.relative_to(ROOT)}, {DOC.relative_to(ROOT)} (section {REGION}), {PLOT.relative_to(ROOT)}")
    print(f"bench.peer took {time.monotonic() - started:.0f} s")
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
