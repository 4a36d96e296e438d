"""A job's output: where each export goes, and why a job whose output refused its model failed."""

from __future__ import annotations

from elasticps.api.output import ERROR_CHARS, export_failure, export_path


def test_export_paths() -> None:
    assert export_path("s3://b/models/tj/", 7, final=True) == "s3://b/models/tj/"
    assert export_path("s3://b/models/tj/", 7, final=False) == "s3://b/models/tj/versions/7"


def test_an_export_failure_names_the_output_the_error_and_the_checkpoints() -> None:
    message = export_failure("/out", 12, False, 3, "OSError: disk\n  full", "/ckpt", 5)
    assert message == (
        "could not write the periodic export of the model (version 12) to /out/versions/12: 3 attempts failed, "
        "the last with OSError: disk full. The PS checkpoints in /ckpt are kept: once the output works, "
        "`elasticps export /ckpt --job JOB.yaml --out /out` writes the newest version every shard checkpointed."
    )


def test_an_export_failure_without_checkpoints_says_so_and_cuts_a_long_error() -> None:
    message = export_failure("s3://b/m", 3, True, 3, "x" * 1000, "/ckpt", 0)
    assert message.startswith("could not write the final model (version 3) to s3://b/m: 3 attempts failed, the last with xxx")
    assert ("x" * (ERROR_CHARS - 3) + "...") in message and "x" * (ERROR_CHARS - 2) not in message
    assert message.endswith("The PS wrote no checkpoints (spec.training.checkpointSteps is 0): the model cannot be exported later.")
