"""Real ``elasticps ps`` processes of one async job on 127.0.0.1, for benchmarks and tests that drive
the PS with the real ``PSClient`` and no worker: their addresses, the bytes each shard's Prometheus
counter says it received, and a stop. Used by ``bench/shard_bytes.py`` and
``tests/e2e/test_split_processes.py``."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PSProcesses:
    """``count`` PS shards, async, reading the npz records ``train``; port files go in ``directory``."""

    def __init__(self, count: int, directory: Path, train: Path) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.metrics = [free_port() for _ in range(count)]
        self.addresses = [f"127.0.0.1:{port}" for port in self.ports]
        self.processes: list[subprocess.Popen[bytes]] = []  # PS count-1 first, PS 0 last
        try:
            for shard in reversed(range(count)):  # PS 0 (the coordinator) last: the others are up
                port_file = directory / f"ps-{count}-{shard}.port"
                port_file.unlink(missing_ok=True)
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "elasticps", "ps", "--host=127.0.0.1", f"--port={self.ports[shard]}",
                         f"--port_file={port_file}", f"--metrics_port={self.metrics[shard]}", f"--ps_id={shard}",
                         f"--num_ps={count}", f"--ps_addrs={','.join(self.addresses)}", "--use_async",
                         "--data_reader=npz", f"--training_data={train}"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                )
                deadline = time.monotonic() + START_TIMEOUT_S
                while not port_file.exists():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"PS {shard} of {count} did not start in {START_TIMEOUT_S:.0f} s")
                    time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def pids(self) -> list[int]:
        """In shard order."""
        return [process.pid for process in reversed(self.processes)]

    def bytes_received(self) -> list[float]:
        """Each shard's ``elasticps_ps_tensor_bytes_received`` counter, in shard order."""
        found = []
        for shard, port in enumerate(self.metrics):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                text = response.read().decode()
            match = re.search(rf'elasticps_ps_tensor_bytes_received_total{{shard="{shard}"}} (\S+)', text)
            if match is None:
                raise RuntimeError(f"PS {shard}: no tensor bytes counter in its metrics:\n{text}")
            found.append(float(match[1]))
        return found

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=30)
