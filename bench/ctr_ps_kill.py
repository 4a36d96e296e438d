"""The Criteo DeepFM job with a PS killed mid-training (issue 17): does every row come back?

    python -m bench.ctr_ps_kill [--at_version 19] [--checkpoint_steps 5]

Runs ``examples/criteo-deepfm.yaml`` through ``elasticps run`` with checkpoints every
``checkpoint_steps`` versions, sends SIGKILL to ps-1 once the job's model version reaches
``at_version``, and waits for the job. Prints the job's last lines, the rows the restarted shard
took back (its log) against the ids its checkpoint of that version holds (the file, read back),
and the rows each shard holds at the end. Nothing is written outside a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
from elasticps.ps import checkpoint

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "criteo-deepfm.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at_version", type=int, default=19)
    parser.add_argument("--checkpoint_steps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="elasticps-ctr-kill-") as work:
        job = Path(work) / "job.yaml"
        job.write_text(JOB.read_text().replace(
            "    evaluationSteps: 0\n",
            f"    evaluationSteps: 0\n    checkpointSteps: {args.checkpoint_steps}\n    keepCheckpointMax: 1000\n"))
        run_dir = Path(work) / "run"
        process = subprocess.Popen([sys.executable, "-m", "elasticps", "run", str(job), "--run_dir", str(run_dir)],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while not (run_dir / "ps-0.port").exists():
            time.sleep(0.2)
        status = CoordinatorClient(f"127.0.0.1:{(run_dir / 'ps-0.port').read_text().strip()}", worker="bench", token=observer_token(run_dir))
        while True:
            try:
                version = status.status().model_version
                if version >= args.at_version:
                    break
            except Exception:  # PS 0 still starting
                pass
            time.sleep(0.1)
        os.kill(int((run_dir / "criteo-deepfm-ps-1.pid").read_text()), signal.SIGKILL)
        print(f"ps-1 killed (SIGKILL) at version {version}", flush=True)
        output, _ = process.communicate(timeout=900)
        status.close()
        print("\n".join(line for line in output.splitlines() if "oneDNN" not in line and "absl" not in line)[-1200:])
        log = (run_dir / "criteo-deepfm-ps-1.log").read_text()
        resumed = re.search(r"resumes at version (\d+), embedding rows held: (\{.*?\})", log)
        if resumed is None:
            raise SystemExit("ps-1 did not resume from a checkpoint")
        saved = checkpoint.load(checkpoint.path_of(run_dir / "checkpoints" / "ps-1", int(resumed[1]))).arrays
        in_file = {key.split("/")[1]: len(value) for key, value in saved.items() if key.endswith("/ids")}
        print(f"ps-1 resumed at version {resumed[1]} holding {resumed[2]}; its checkpoint holds {in_file}")
        for shard in (0, 1):
            stop = re.findall(r"stops at version .*", (run_dir / f"criteo-deepfm-ps-{shard}.log").read_text())
            print(f"ps-{shard} {stop[-1] if stop else 'logged no stop line'}")


if __name__ == "__main__":
    main()
