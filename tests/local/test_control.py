"""``elasticps scale``'s channel to a running ``elasticps run``: the runner file that says a run is there,
the request file, the runner's watcher, and the command's errors (one line, exit 2, the problem named).
Real files, real processes for the pid checks; no runner."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import job_builders

from elasticps import cli
from elasticps.local import control
from elasticps.local.control import ControlError, Request, Watcher
from elasticps.local.progress import Progress
from elasticps.local.runner import LocalRunner


def test_a_request_reaches_the_watcher_once_and_the_last_one_wins(tmp_path: Path) -> None:
    control.claim(tmp_path, "tj")
    watcher = Watcher(tmp_path)
    assert watcher.poll() is None  # nothing asked yet
    assert control.request(tmp_path, 4) == control.Runner(os.getpid(), "tj")
    assert watcher.poll() == Request(worker_replicas=4)
    assert watcher.poll() is None  # unchanged: not read again
    control.request(tmp_path, 1)
    control.request(tmp_path, 3)
    assert watcher.poll() == Request(worker_replicas=3)


def test_a_new_run_drops_a_request_an_old_run_left(tmp_path: Path) -> None:
    control.claim(tmp_path, "tj")
    control.request(tmp_path, 4)
    control.release(tmp_path)
    control.claim(tmp_path, "tj")
    assert Watcher(tmp_path).poll() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a readable JSON request"),
        ('{"workers": 2}', 'expected {"worker_replicas": N}'),
        ('{"worker_replicas": "2"}', "worker_replicas: must be an integer, got '2'"),
        ('{"worker_replicas": true}', "worker_replicas: must be an integer, got True"),
        ('{"worker_replicas": -1}', "worker_replicas: must be >= 0, got -1"),
        ('{"worker_replicas": 10001}', "worker_replicas: must be <= 10000, got 10001"),
    ],
)
def test_a_malformed_request_is_reported_once(tmp_path: Path, text: str, message: str) -> None:
    watcher = Watcher(tmp_path)
    (tmp_path / control.CONTROL_FILE).write_text(text)
    with pytest.raises(ControlError, match="control.json") as caught:
        watcher.poll()
    assert message in str(caught.value)
    assert watcher.poll() is None  # said once, until the file changes


def test_no_active_run_when_the_pid_file_is_missing_or_its_process_gone(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="no such run directory"):
        control.active_runner(tmp_path / "absent")
    with pytest.raises(ControlError, match=r"no run is active in .* \(no runner.json"):
        control.active_runner(tmp_path)
    (tmp_path / control.RUNNER_FILE).write_text("1234\n")
    with pytest.raises(ControlError, match=r"runner.json is not a runner's: 1234"):
        control.active_runner(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / control.RUNNER_FILE).write_text(json.dumps({"pid": gone.pid, "job": "tj"}))
    with pytest.raises(ControlError, match=f"its runner, pid {gone.pid}, is gone"):
        control.active_runner(tmp_path)
    assert not (tmp_path / control.CONTROL_FILE).exists()


def scale(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(["scale", *args])
    except SystemExit as exit_:  # argparse's own usage errors
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("workers", "message"),
    [("-1", "--workers: must be >= 0, got -1"), ("10001", "--workers: must be <= 10000, got 10001"),
     ("two", "argument --workers: invalid int value: 'two'"), ("2.5", "invalid int value: '2.5'")],
)
def test_scale_refuses_a_bad_count_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: str, message: str
) -> None:
    control.claim(tmp_path, "tj")
    code, out, err = scale(capsys, str(tmp_path), "--workers", workers)
    assert code == cli.EXIT_USAGE and out == "" and message in err and "Traceback" not in err
    assert not (tmp_path / control.CONTROL_FILE).exists()


def test_scale_without_a_run_is_exit_2_naming_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = scale(capsys, str(tmp_path / "absent"), "--workers", "2")
    assert code == cli.EXIT_USAGE and err == f"elasticps scale: error: {tmp_path / 'absent'}: no such run directory\n"
    (tmp_path / "result.json").write_text("{}")  # a run that ended: no runner.json any more
    code, _, err = scale(capsys, str(tmp_path), "--workers", "2")
    assert code == cli.EXIT_USAGE and f"no run is active in {tmp_path}" in err


def test_scale_writes_the_request_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    control.claim(tmp_path, "tj")
    code, out, _ = scale(capsys, str(tmp_path), "--workers", "4")
    assert code == 0 and out == f"asked job tj (elasticps run, pid {os.getpid()}, in {tmp_path}) for 4 workers\n"
    assert json.loads((tmp_path / control.CONTROL_FILE).read_text()) == {"worker_replicas": 4}


def test_the_runner_turns_a_request_into_its_spec_and_says_so(tmp_path: Path) -> None:
    job = job_builders.make_job({"ps": {"replicas": 1}, "worker": {"replicas": 2}}, name="tj")
    output = io.StringIO()
    runner = LocalRunner(job, tmp_path, Progress("tj", stream=output))
    control.claim(tmp_path, "tj")
    control.request(tmp_path, 4)
    runner._read_control()
    assert runner.job.spec.worker.replicas == 4 and runner.job.spec.ps == job.spec.ps
    control.request(tmp_path, 4)
    runner._read_control()
    (tmp_path / control.CONTROL_FILE).write_text('{"worker_replicas": -3}')
    runner._read_control()
    assert runner.job.spec.worker.replicas == 4
    assert output.getvalue().splitlines() == [
        "workers: 2 -> 4",
        "workers: 4 already",
        "ignored a scale request: control.json: worker_replicas: must be >= 0, got -3",
    ]
