"""``make bench-kills``: kill -9 a PS at random moments of a local job; every run must end Succeeded.

    python -m bench.end_kills [--runs 20] [--window_every 4] [--seed 1] [--timeout 420] [--no_write]

Each run is one ``elasticps run`` of the same small job (2 PS + 4 workers, sync, an MLP on 12,000
generated records in minibatches of 16, 2 epochs, a PS checkpoint every 20 versions, a final
evaluation of 20,000 records), and one PS is killed with SIGKILL once: PS 0 (the coordinator's
host) in odd runs, PS 1 in even ones. Most runs kill when the job's records done first reach a
fraction of the total drawn uniformly from [0, 1); every ``--window_every``-th run kills in the
window after the last training task (every record of every epoch trained, the job not finished:
the final evaluation and export), where a restart from an older checkpoint puts records back into
a queue whose workers may have left. A run passes when ``elasticps run`` exits 0 with the job
Succeeded and each record counted exactly once per epoch; one still running ``--timeout`` seconds
after its kill is a hang (stopped and counted). Writes ``bench/results/end_kills.json``, the
``end-kills`` region of ``docs/reliability.md`` and ``docs/img/end-kills.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.doc_regions import write_region

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "end_kills.json"
DOC = ROOT / "docs" / "reliability.md"
PLOT = ROOT / "docs" / "img" / "end-kills.png"
REGION = "end-kills"
RECORDS = 12_000
VALIDATION = 20_000
EPOCHS = 2


def write_data(directory: Path) -> tuple[Path, Path]:
    """A linearly separable two-class problem, as the end-to-end tests make theirs."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(RECORDS + VALIDATION, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) > 0).astype(np.int64)
    train, validation = directory / "train.npz", directory / "validation.npz"
    np.savez(train, x=x[:RECORDS], y=y[:RECORDS])
    np.savez(validation, x=x[RECORDS:], y=y[RECORDS:])
    return train, validation


def job(train: Path, validation: Path) -> dict[str, Any]:
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "kills"},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.mlp"},
            "data": {"reader": "npz", "training": str(train), "validation": str(validation)},
            "training": {"minibatchSize": 16, "recordsPerTask": 400, "numEpochs": EPOCHS, "checkpointSteps": 20},
            "ps": {"replicas": 2},
            "worker": {"replicas": 4},
            "runPolicy": {"backoffLimit": 3},
        },
    }


def plan(runs: int, window_every: int, seed: int) -> list[dict[str, Any]]:
    """Each run's victim and moment (a fraction of the records, or the window after the last task). Pure."""
    draws = random.Random(seed)
    out = []
    for index in range(runs):
        window = window_every > 0 and index % window_every == window_every - 1
        out.append({
            "run": index + 1,
            "victim": f"kills-ps-{index % 2}",
            "moment": "after the last task" if window else round(draws.random(), 3),
        })  # fmt: skip
    return out


class _Coordinator:
    """PS 0's coordinator, asked for the job's status: one channel, opened once its port is written
    (polled every 50 ms until the kill; a channel per poll would be 20 connections a second)."""

    def __init__(self, run_dir: Path) -> None:
        self._port = run_dir / "ps-0.port"  # PS 0's gRPC port, which serves the coordinator
        self._client: Any = None

    def status(self) -> Any:
        from elasticps.coordinator.client import CoordinatorClient
        from elasticps.local.fleet import observer_token

        if self._client is None:
            text = self._port.read_text().strip() if self._port.exists() else ""
            if not text:
                return None
            self._client = CoordinatorClient(f"127.0.0.1:{int(text)}", worker="bench", token=observer_token(self._port.parent))
        try:
            return self._client.status(timeout_s=1.0)
        except Exception:  # noqa: BLE001 - PS 0 starting, or just killed
            return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def one_run(work: Path, document: dict[str, Any], victim: str, moment: Any, timeout_s: float) -> dict[str, Any]:
    job_file, run_dir, result_file = work / "job.yaml", work / "run", work / "result.json"
    job_file.write_text(yaml.safe_dump(document))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = time.monotonic()
    with (work / "run.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "elasticps", "run", str(job_file), "--run_dir", str(run_dir),
             "--result_file", str(result_file)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        total = RECORDS * EPOCHS
        killed_at: dict[str, Any] = {}
        coordinator = _Coordinator(run_dir)
        while process.poll() is None and not killed_at:
            status = coordinator.status()
            if status is not None and status.records_total:
                done = status.records_done
                due = done >= total and not status.finished if moment == "after the last task" else done >= moment * total
                if due or status.finished:
                    if status.finished:
                        killed_at = {"missed": "the job finished before its moment"}
                        break
                    os.kill(int((run_dir / f"{victim}.pid").read_text()), signal.SIGKILL)
                    killed_at = {"t": time.monotonic() - started, "records_done": done, "version": status.model_version}
            time.sleep(0.05)
        coordinator.close()
        kill_t = killed_at.get("t", time.monotonic() - started)
        try:
            code = process.wait(timeout=max(1.0, timeout_s - (time.monotonic() - started - kill_t)))
            hung = False
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            code, hung = process.returncode, True
    ended = time.monotonic() - started
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    counted = result.get("epoch_records")
    return {
        **killed_at,
        "exit_code": code,
        "hung": hung,
        "succeeded": bool(result.get("succeeded")),
        "epoch_records": counted,
        "counted_once": counted == [RECORDS] * EPOCHS,
        "wall_s": round(ended, 1),
        "after_kill_s": round(ended - kill_t, 1),
        "rollbacks": "every shard and the task ledger rolled back" in _logs(run_dir),
        "restarts": result.get("restarts"),
    }


def _logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in run_dir.glob("*.log")) if run_dir.exists() else ""


def passed(run: dict[str, Any]) -> bool:
    """Killed as planned, then Succeeded with every record once per epoch, not hung."""
    killed = "t" in run
    return bool(killed and run["exit_code"] == 0 and run["succeeded"] and run["counted_once"] and not run["hung"])


def table(doc: dict[str, Any]) -> str:
    runs = doc["runs"]
    window = [r for r in runs if r["moment"] == "after the last task"]
    ok = sum(passed(r) for r in runs)
    lines = [
        f"Generated by `make bench-kills` (`bench/end_kills.py`) on {doc['date'][:10]}: {len(runs)} runs of a local job "
        f"(2 PS + 4 workers, sync, {RECORDS:,} records x {EPOCHS} epochs, a checkpoint every 20 versions), one PS "
        f"killed with SIGKILL in each: **{ok} of {len(runs)} Succeeded with every record counted once per epoch**, "
        f"{sum(r['hung'] for r in runs)} hung; {sum(passed(r) for r in window)} of {len(window)} kills in the window "
        "after the last task passed. Every run is in [`bench/results/end_kills.json`](../bench/results/end_kills.json).",
        "",
        "| run | victim | moment (records done / total) | killed at (s) | version | exit | Succeeded | records per epoch "
        "| rolled back | after the kill (s) |",
        "|---:|---|---|---:|---:|---:|---|---|---|---:|",
    ]
    for r in runs:
        moment = r["moment"] if isinstance(r["moment"], str) else f"{r['moment']:.3f}"
        lines.append(
            f"| {r['run']} | {r['victim']} | {moment} | {r.get('t', 0):.1f} | {r.get('version', '-')} | {r['exit_code']} "
            f"| {'yes' if r['succeeded'] else 'NO'}{' (hung)' if r['hung'] else ''} | {r['epoch_records']} "
            f"| {'yes' if r['rollbacks'] else 'no'} | {r['after_kill_s']:.1f} |"
        )
    lines += ["", "![the time each run took after its kill, against when the kill came](img/end-kills.png)"]
    return "\n".join(lines)


def plot(doc: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for victim, marker in (("kills-ps-0", "o"), ("kills-ps-1", "s")):
        runs = [r for r in doc["runs"] if r["victim"] == victim and "t" in r]
        axis.scatter([r["t"] for r in runs], [r["after_kill_s"] for r in runs], marker=marker,
                     c=["tab:green" if passed(r) else "tab:red" for r in runs], label=victim)  # fmt: skip
    axis.set_xlabel("the kill, seconds after `elasticps run` started")
    axis.set_ylabel("seconds from the kill to the job's end")
    axis.set_title("kill -9 of a PS at random moments (green: Succeeded, every record once)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(PLOT, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--window_every", type=int, default=4, help="every n-th run kills after the last task (0: none)")
    parser.add_argument("--seed", type=int, default=1, help="draws the moments")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds after the kill that make a hang")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.window_every < 0 or args.timeout <= 0:
        parser.error("--runs >= 1, --window_every >= 0, --timeout > 0")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="elasticps-kills-") as tmp:
        train, validation = write_data(Path(tmp))
        document = job(train, validation)
        for planned in plan(args.runs, args.window_every, args.seed):
            work = Path(tmp) / f"run-{planned['run']}"
            work.mkdir()
            run = {**planned, **one_run(work, document, planned["victim"], planned["moment"], args.timeout)}
            runs.append(run)
            print(
                f"[{run['run']}/{args.runs}] {run['victim']} at {run['moment']}: "
                f"{'PASS' if passed(run) else 'FAIL'} (killed at version {run.get('version', 'never')}, "
                f"exit {run['exit_code']}, records {run['epoch_records']}, "
                f"{run['after_kill_s']} s after the kill{', HUNG' if run['hung'] else ''})",
                flush=True,
            )
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "seed": args.seed, "runs": runs}
    print(table(doc))
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(doc, indent=1))
        write_region(DOC, REGION, "## PS kills at random moments, the end of a job included\n\n" + table(doc))
        plot(doc)
    return 0 if all(passed(r) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
