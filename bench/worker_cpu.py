"""The workers' CPU seconds per 1,000 training examples of one `elasticps run`, for any checkout.

    python -m bench.worker_cpu --repo DIR --job JOB.yaml --run_dir DIR

Runs ``DIR/.venv/bin/python -m elasticps run JOB`` in the checkout ``DIR`` (another tree, e.g. an
older commit in a git worktree, for a before/after in one sitting) and reads every worker process's
user + system CPU from ``/proc/PID/stat`` (their pid files in the run folder) every 0.1 s until the
run ends: their whole lives, TensorFlow's import, tracing and the final evaluation included. Prints
one JSON line: the workers' CPU seconds, per 1,000 training examples (the records the job reports
done), and the runner's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="the checkout to run (with its .venv)")
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--run_dir", type=Path, required=True, help="a new folder for the run")
    args = parser.parse_args(argv)
    python = args.repo / ".venv" / "bin" / "python"
    if not python.exists():
        parser.error(f"--repo: no {python}")
    env = {**os.environ, "PYTHONPATH": str(args.repo), "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen(
        [str(python), "-m", "elasticps", "run", str(args.job.resolve()), "--run_dir", str(args.run_dir.resolve())],
        cwd=args.repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    last: dict[int, float] = {}  # the latest reading of each worker process (a restarted one is another pid)
    while process.poll() is None:
        for pid_file in args.run_dir.glob("*-worker-*.pid"):
            try:
                pid = int(pid_file.read_text())
                last[pid] = cpu_seconds(pid)
            except (OSError, ValueError):
                pass  # not written yet, or the process just exited: its last reading stands
        time.sleep(0.1)
    output = process.stdout.read() if process.stdout else ""
    done = re.search(r"(\d+)/\d+ records trained", output)
    examples = int(done[1]) if done else 0
    total = sum(last.values())
    outcome = [line for line in output.splitlines() if " succeeded in " in line or " failed" in line]
    print(json.dumps({
        "repo": str(args.repo),
        "worker_processes": len(last),
        "worker_cpu_s": round(total, 2),
        "examples": examples,
        "worker_cpu_s_per_1000_examples": round(total / examples * 1000, 4) if examples else None,
        "outcome": outcome[-1] if outcome else output[-300:],
    }))
    return process.returncode


if __name__ == "__main__":
    raise SystemExit(main())
