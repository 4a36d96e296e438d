"""The ``elasticps`` command: ``run`` a TrainingJob locally (and ``scale`` its workers while it runs),
serve as a ``ps``, a ``worker`` or a decentralized job's ``coordinator``, run the Kubernetes ``operator``, or ``export`` a model from PS
checkpoints.

User mistakes (a malformed TrainingJob, a missing file, data that cannot be read, an output that
cannot take files: ``run`` opens the job's data and checks ``spec.output`` before it starts any
process) print one line and exit 2, never a traceback. ``run`` exits 0 when the job succeeded, 1 when it failed, 130 on Ctrl-C (SIGINT) and
143 on SIGTERM (what ``timeout``, ``docker stop``, CI runners and systemd send); on either signal
it first stops every replica it started, so none is left running. ``scale`` exits 0 once the request
is written (the run applies it on its next pass, within a second), 2 when there is no run to ask or
the number is out of bounds. ``export`` exits 0 once the files are written, 2 for a bad folder,
job, checkpoint or model (one line on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elasticps.api.spec import TrainingJob

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(Exception):
    """SIGTERM arrived during ``elasticps run``: unwinds like Ctrl-C, through the runner's clean-up."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Only the first one unwinds: a second SIGTERM must not cut the stopping of the replicas short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


# The roles' commands: help, and the module whose ``add_arguments`` adds their flags. A process
# imports only its own command's module (the PS does not load the operator's Kubernetes client,
# about 20 MiB resident that it would keep for nothing).
_ROLES = {
    "ps": ("serve one parameter-server shard (PS 0 also coordinates)", "elasticps.ps.main"),
    "worker": ("train as one worker", "elasticps.worker.main"),
    "coordinator": ("coordinate a decentralized job (tasks, progress; no PS)", "elasticps.coordinator.main"),
    "operator": ("run the Kubernetes operator (kopf) for TrainingJob resources", "elasticps.operator.main"),
}


def command_of(argv: Sequence[str]) -> str | None:
    """The command an ``elasticps`` command line names, read before the full parser exists."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--log_level")
    early.add_argument("command", nargs="?")
    known, _ = early.parse_known_args(argv)
    return known.command if isinstance(known.command, str) else None


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser, with the flags of ``command``'s role (None: of every role)."""
    parser = argparse.ArgumentParser(prog="elasticps", description="Elastic training with parameter servers.")
    parser.add_argument("--log_level", default="", help="DEBUG, INFO, WARNING (default: INFO for ps/worker)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a TrainingJob YAML on this machine, no cluster needed")
    run.add_argument("job", type=Path, help="TrainingJob YAML file")
    run.add_argument(
        "--run_dir", type=Path, default=None, help="logs and checkpoints (default: .elasticps/runs/NAME-TIME)"
    )
    run.add_argument("--result_file", type=Path, default=None, help="also write the outcome as JSON here")
    scale = commands.add_parser("scale", help="change the number of workers of a running `elasticps run`")
    scale.add_argument("run_dir", type=Path, help="the run's directory (its --run_dir)")
    scale.add_argument("--workers", type=int, required=True, help="the number of workers the job should have")
    export = commands.add_parser(
        "export", help="write a job's model (model.keras, saved_model/, job.json, metrics.json) from PS checkpoints"
    )
    export.add_argument(
        "checkpoints", type=Path, nargs="+", help="every PS shard's checkpoint folder (ps-0 ...), or the folder holding them"
    )
    export.add_argument("--job", type=Path, required=True, help="the TrainingJob YAML (its model module and data)")
    export.add_argument("--out", required=True, help="the folder (or object-store URI) to write the model into")
    export.add_argument("--version", type=int, default=None, help="this checkpointed version (default: the newest all shards have)")
    for name, (help_text, module) in _ROLES.items():
        role = commands.add_parser(name, help=help_text)
        if command is None or command == name:
            importlib.import_module(module).add_arguments(role)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from elasticps import allocator  # ctypes and argparse only

    arenas = allocator.arenas_of(sys.argv[1:] if argv is None else argv)
    if arenas is not None and arenas > 0:  # `elasticps ps`: before the parser's imports start threads (numpy's, gRPC's)
        allocator.limit_malloc_arenas(arenas)
    args = _parser(command_of(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    level = args.log_level or ("WARNING" if args.command == "run" else "INFO")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "run":
        return _run(args.job, args.run_dir, args.result_file)
    if args.command == "scale":
        return _scale(args.run_dir, args.workers)
    if args.command == "export":
        return _export(args.checkpoints, args.job, args.out, args.version)
    if args.command == "operator":
        from elasticps.operator import main as operator_main

        return operator_main.run(operator_main.config_from_args(args), args.liveness)
    if args.command == "coordinator":
        from elasticps.coordinator import main as coordinator_main

        return coordinator_main.run(coordinator_main.config_from_args(args))
    if args.command == "ps":
        from elasticps.ps import main as ps_main

        return ps_main.run(ps_main.config_from_args(args))
    from elasticps.worker import main as worker_main

    return worker_main.run(worker_main.config_from_args(args))


def _scale(run_dir: Path, workers: int) -> int:
    from elasticps.local import control

    try:
        runner = control.request(run_dir, workers)
    except control.ControlError as err:
        print(f"elasticps scale: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"asked job {runner.job} (elasticps run, pid {runner.pid}, in {run_dir}) for {workers} workers")
    return 0


def _export(checkpoints: Sequence[Path], job_file: Path, out: str, version: int | None) -> int:
    from elasticps.api.parsing import SpecError, load_job_file
    from elasticps.worker.checkpoint_export import ExportProblem, export_from_checkpoints

    try:
        job = load_job_file(job_file)
        written = export_from_checkpoints(checkpoints, job, out, version)
    except (SpecError, ExportProblem) as err:
        print(f"elasticps export: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"exported model version {written} of job {job.name} to {out}")
    return 0


def _check_prediction(job: TrainingJob) -> None:
    """Opens ``spec.prediction.data`` as PS 0 will, and checks that ``spec.prediction.model``
    holds a model file: a :class:`DataError` naming the field, before any process starts."""
    from elasticps.api.output import MODEL_FILES
    from elasticps.data.readers import DataError, ReaderOptions, open_reader
    from elasticps.storage import exists

    prediction, data = job.spec.prediction, job.spec.data
    if not prediction.enabled:
        return
    try:
        records = open_reader(data.reader, prediction.data, ReaderOptions.of(data)).num_records
    except DataError as err:
        raise DataError(f"spec.prediction.data: {err}") from None
    if records == 0:
        raise DataError(f"spec.prediction.data: {prediction.data}: holds no records")
    if prediction.model:
        model = f"{prediction.model.rstrip('/')}/{MODEL_FILES[job.spec.model.framework]}"
        try:
            found = exists(model)
        except OSError as err:
            raise DataError(f"spec.prediction.model: {model}: {err}") from None
        if not found:
            raise DataError(f"spec.prediction.model: no {model} (export a model there first)")


def _queue_label(job_file: Path) -> str:
    """The job's Kueue queue label, if it has one: the local runner queues nothing and says so."""
    import yaml

    from elasticps.operator.kueue import QUEUE_LABEL

    document = yaml.safe_load(job_file.read_text())
    labels = (document.get("metadata") or {}).get("labels") if isinstance(document, dict) else None
    value = labels.get(QUEUE_LABEL) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else ""


def _run(job_file: Path, run_dir: Path | None, result_file: Path | None) -> int:
    from elasticps.api.modes import mode_label
    from elasticps.api.parsing import SpecError, load_job_file
    from elasticps.local.progress import Progress
    from elasticps.local.results import JobFailed, outcome, summary
    from elasticps.local.runner import LocalRunner

    from elasticps.data.readers import DataError, count_records
    from elasticps.storage import OutputError, check_output

    try:
        job = load_job_file(job_file)
        # The data, opened as PS 0 will: a bad path or file is one line and exit 2 here, not a PS
        # that fails until the backoff limit (the record-offset indexes it builds are cached for PS 0).
        count_records(job.spec.data)
        _check_prediction(job)
        # The output, as far as a look tells (an unknown scheme, a path under a file): not a job
        # that trains to the end and then cannot write its model.
        if job.spec.output:
            check_output(job.spec.output)
    except SpecError as err:
        print(f"elasticps: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OutputError as err:
        print(f"elasticps: error: {job_file}: spec.output: {err}", file=sys.stderr)
        return EXIT_USAGE
    except DataError as err:
        print(f"elasticps: error: {job_file}: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_USAGE
    run_dir = run_dir or Path(".elasticps") / "runs" / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    spec = job.spec
    mode = mode_label(spec)
    what = (
        f"predicting with {spec.prediction.model}"
        if spec.prediction.standalone
        else f"{mode}, model {spec.model.model_def}, {spec.training.num_epochs} epochs"
    )
    servers = f"{spec.ps.replicas} PS" if job.uses_ps else f"a coordinator ({spec.decentralized.graph} graph)"
    print(f"job {job.name}: {servers} + {spec.worker.replicas} workers, {what}; logs in {run_dir}", file=sys.stderr)
    queue = _queue_label(job_file)
    if queue:
        print(f"job {job.name}: its Kueue LocalQueue {queue!r} is the cluster's; here it runs at once, "
              f"with all {spec.worker.replicas} workers", file=sys.stderr)
    runner = LocalRunner(job, run_dir, Progress(job.name))
    # Without a handler SIGTERM would end this process at once and orphan every replica (each runs
    # in its own session); raised in the main thread, it takes the runner's finally, as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = runner.run()
    except JobFailed as err:
        print(f"job {job.name} failed: {err}", file=sys.stderr)
        if result_file:
            result_file.write_text(json.dumps({"succeeded": False, "reason": str(err)}, indent=2))
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"job {job.name}: interrupted, every replica stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"job {job.name}: terminated, every replica stopped", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summary(job, result))
    if result_file:
        result_file.write_text(json.dumps(outcome(result), indent=2))
    return 0
