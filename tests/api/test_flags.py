"""Training settings as flags: ElasticDL spellings, bounds, and spec -> flags -> spec round trips."""

from __future__ import annotations

import argparse
import dataclasses
import random

import pytest

from elasticps.api.flags import (
    add_data_flags,
    add_training_flags,
    data_args,
    data_from_args,
    parse_bool,
    training_args,
    training_from_args,
)
from elasticps.api.parsing import parse_job
from elasticps.api.modes import TrainingMode
from elasticps.api.replicas import Role, ps_replica, worker_replica
from elasticps.api.spec import DataSpec, StalenessCompensation, TrainingSpec
from elasticps.ps import main as ps_main
from elasticps.worker import main as worker_main


def parse(*argv: str) -> TrainingSpec:
    parser = argparse.ArgumentParser(prog="elasticps worker")
    add_training_flags(parser)
    return training_from_args(parser.parse_args(list(argv)))


def test_no_flags_give_the_spec_defaults() -> None:
    assert parse() == TrainingSpec()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--use_async"], True),
        (["--use_async=true"], True),
        (["--use_async=True"], True),
        (["--use_async=1"], True),
        (["--use_async", "yes"], True),
        (["--use_async=false"], False),
        (["--use_async=False"], False),
        (["--use_async=0"], False),
        (["--use_async", "off"], False),
        ([], False),
    ],
)
def test_boolean_spellings(argv: list[str], expected: bool) -> None:
    assert parse(*argv).use_async is expected


def test_boolean_flag_followed_by_another_flag() -> None:
    spec = parse("--use_async", "--lr_staleness_modulation", "--get_model_frequency", "3")
    assert (spec.use_async, spec.lr_staleness_modulation, spec.get_model_frequency) == (True, True, 3)


def test_every_boolean_field_takes_both_forms() -> None:
    for field in dataclasses.fields(TrainingSpec):
        if field.type in (bool, "bool"):
            # Each with the mode it belongs to: the others are async-only, adaptive is LocalSGD's.
            mode = {"use_async": [], "adaptive_local_sgd": ["--local_sgd_steps=4"]}.get(field.name, ["--use_async"])
            assert getattr(parse(*mode, f"--{field.name}"), field.name) is True
            assert getattr(parse(*mode, f"--{field.name}=true"), field.name) is True
            assert getattr(parse(*mode, f"--{field.name}=false"), field.name) is False


def test_get_model_steps_is_an_alias_of_get_model_frequency() -> None:
    assert parse("--use_async", "--get_model_steps", "4").get_model_frequency == 4
    assert parse("--use_async", "--get_model_steps=5").get_model_frequency == 5
    assert parse("--use_async", "--get_model_frequency", "6").get_model_frequency == 6


def test_localsgd_flags_are_the_fields_in_snake_case() -> None:
    spec = parse("--local_sgd_steps", "4", "--local_sgd_warmup_steps=20", "--adaptive_local_sgd", "--local_sgd_inf_loss=0.5")
    assert (spec.local_sgd_steps, spec.local_sgd_warmup_steps, spec.adaptive_local_sgd, spec.local_sgd_inf_loss) == (
        4,
        20,
        True,
        0.5,
    )


def test_typed_values() -> None:
    spec = parse("--learning_rate=0.125", "--task_timeout_seconds", "2.5", "--checkpoint_dir", "/tmp/ckpt")
    assert (spec.learning_rate, spec.task_timeout_seconds, spec.checkpoint_dir) == (0.125, 2.5, "/tmp/ckpt")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--get_model_frequency", "0"], "must be >= 1, got 0"),
        (["--get_model_steps=0"], "must be >= 1, got 0"),
        (["--minibatch_size=-3"], "must be >= 1, got -3"),
        (["--sync_version_tolerance=-1"], "must be >= 0, got -1"),
        (["--task_timeout_seconds=0"], "must be > 0, got 0"),
        (["--learning_rate=nan"], "must be a finite number"),
        (["--learning_rate=inf"], "must be a finite number"),
        (["--num_epochs=two"], "expected int, got 'two'"),
        (["--num_epochs=1000000000000"], "must be <= 1000000, got 1000000000000"),
        (["--num_epochs=1.5"], "expected int, got '1.5'"),
        (["--use_async=maybe"], "expected true or false, got 'maybe'"),
        (["--use_asnyc"], "unrecognized arguments"),
    ],
)
def test_bad_values_exit_with_an_argparse_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        parse(*argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--use_locking"], "error: --use_locking: needs useAsync: true"),
        (["--get_model_frequency=4"], "error: --get_model_frequency: needs useAsync: true"),
        (["--get_model_steps", "2", "--use_async=false"], "error: --get_model_frequency: needs useAsync: true"),
        (["--lr_staleness_modulation"], "error: --lr_staleness_modulation: needs useAsync: true"),
    ],
)
def test_ps_and_worker_refuse_async_only_flags_in_sync_mode(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for main in (ps_main, worker_main):
        parser = argparse.ArgumentParser()
        main.add_arguments(parser)
        required = ["--ps_addrs=127.0.0.1:1", "--model_def=m", "--training_data=/d"] if main is worker_main else []
        with pytest.raises(SystemExit) as raised:
            main.config_from_args(parser.parse_args([*required, *argv]))
        assert raised.value.code == 2, main.__name__
        assert message in capsys.readouterr().err, main.__name__


def test_parse_bool_rejects_other_text() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bool("tru")


# ---- round trips ------------------------------------------------------------------------------------


FULL = TrainingSpec(
    use_async=True,
    lr_staleness_modulation=True,
    staleness_compensation=StalenessCompensation.NONE,
    use_locking=True,
    get_model_frequency=4,
    grads_to_wait=3,
    sync_version_tolerance=2,
    minibatch_size=32,
    num_epochs=5,
    learning_rate=0.1,
    records_per_task=100,
    evaluation_steps=7,
    checkpoint_steps=10,
    checkpoint_dir="/tmp/check points/run=1",
    keep_checkpoint_max=2,
    task_timeout_seconds=12.5,
)


def test_defaults_render_to_no_flags() -> None:
    assert training_args(TrainingSpec()) == []


def test_full_spec_renders_every_field() -> None:
    args = training_args(FULL)
    assert args == [
        "--use_async",
        "--lr_staleness_modulation",
        "--staleness_compensation=none",
        "--use_locking",
        "--get_model_frequency=4",
        "--grads_to_wait=3",
        "--sync_version_tolerance=2",
        "--minibatch_size=32",
        "--num_epochs=5",
        "--learning_rate=0.1",
        "--records_per_task=100",
        "--evaluation_steps=7",
        "--checkpoint_steps=10",
        "--checkpoint_dir=/tmp/check points/run=1",
        "--keep_checkpoint_max=2",
        "--task_timeout_seconds=12.5",
    ]


def test_round_trip_full_spec() -> None:
    assert parse(*training_args(FULL)) == FULL


def test_grads_to_wait_zero_stays_zero_so_the_coordinator_counts_live_workers() -> None:
    assert parse(*training_args(TrainingSpec(grads_to_wait=0))).grads_to_wait == 0
    assert "--grads_to_wait=2" in training_args(TrainingSpec(grads_to_wait=2))


def random_spec(rng: random.Random) -> TrainingSpec:
    use_async = rng.random() < 0.5
    return TrainingSpec(
        use_async=use_async,
        lr_staleness_modulation=use_async and rng.random() < 0.5,
        use_locking=use_async and rng.random() < 0.5,
        get_model_frequency=rng.randint(1, 9) if use_async else 1,
        grads_to_wait=rng.randint(0, 9),
        sync_version_tolerance=rng.randint(0, 3),
        minibatch_size=rng.choice([1, 64, 1000]),
        num_epochs=rng.randint(1, 4),
        learning_rate=rng.choice([0.0, 1e-7, 0.1, 1 / 3, 2.5e-4]),
        records_per_task=rng.randint(1, 5000),
        evaluation_steps=rng.randint(0, 100),
        checkpoint_steps=rng.randint(0, 100),
        checkpoint_dir=rng.choice(["", "/ckpt", "rel/dir with space", "-dash"]),
        keep_checkpoint_max=rng.randint(1, 5),
        task_timeout_seconds=rng.choice([60.0, 0.001, 1e9, 7 / 3]),
    )


@pytest.mark.parametrize("seed", range(30))
def test_round_trip_random_specs(seed: int) -> None:
    spec = random_spec(random.Random(seed))
    assert parse(*training_args(spec)) == spec


def test_replica_command_lines_carry_the_jobs_training_settings() -> None:
    """The PS and worker processes of a job run with exactly the YAML's settings."""
    job = parse_job(
        {
            "apiVersion": "elasticps.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "j"},
            "spec": {
                "model": {"modelDef": "elasticps.backends.keras.zoo.mlp", "params": {"hidden": 8}},
                "data": {"training": "/d/train.npz", "validation": "/d/val.npz", "reader": "npz"},
                "training": {"useAsync": True, "lrStalenessModulation": True, "getModelFrequency": 3, "learningRate": 0.2},
                "worker": {"replicas": 3},
                "ps": {"replicas": 2},
            },
        }
    )
    expected = job.spec.training  # gradsToWait 0 stays 0: the coordinator follows the live workers

    ps = ps_replica(job, 1, host="127.0.0.1", port=0, checkpoint_dir="/run/ckpt")
    assert (ps.name, ps.args[0]) == ("j-ps-1", "ps")
    parser = argparse.ArgumentParser()
    ps_main.add_arguments(parser)
    config = ps_main.config_from_args(parser.parse_args(list(ps.args[1:])))
    assert config.job.training == dataclasses.replace(expected, checkpoint_dir="/run/ckpt")
    assert (config.job.role, config.job.index, config.num_ps, config.job.data) == (Role.PS, 1, 2, job.spec.data)
    assert "--num_workers" not in " ".join(ps.args)  # no snapshot of the worker count that can go stale
    ps0 = ps_replica(job, 0, host="127.0.0.1", port=0, ps_addresses=["a:1", "b:2"])
    assert "--ps_addrs=a:1,b:2" in ps0.args

    worker = worker_replica(job, 2, ["a:1", "b:2"])
    assert (worker.name, worker.args[0]) == ("j-worker-2", "worker")
    parser = argparse.ArgumentParser()
    worker_main.add_arguments(parser)
    wconfig = worker_main.config_from_args(parser.parse_args(list(worker.args[1:])))
    assert wconfig.job.training == expected
    assert (wconfig.job.role, wconfig.job.index, wconfig.job.mode) == (Role.WORKER, 2, TrainingMode.of(expected))
    assert (wconfig.ps_addrs, wconfig.model.model_def, wconfig.model.params) == (("a:1", "b:2"), "elasticps.backends.keras.zoo.mlp", {"hidden": 8})
    assert wconfig.job.data == job.spec.data


# ---- data flags ---------------------------------------------------------------------------------------


def parse_data(*argv: str) -> DataSpec:
    parser = argparse.ArgumentParser(prog="elasticps worker")
    add_data_flags(parser)
    return data_from_args(parser.parse_args(list(argv)))


@pytest.mark.parametrize(
    "spec",
    [
        DataSpec(training="/d/train"),
        DataSpec(training="/d/t.npz", validation="/d/v.npz", reader="npz"),
        DataSpec(training="s3://b/train-*.tfrecord", reader="tfrecord", index_dir="/shared/index"),
        DataSpec(training="/d/t.tsv", reader="tsv", header=False, label_column="0", feature_columns="1,2,5"),
        DataSpec(training="/d/t.csv", reader="csv", delimiter=";", label_column="click", feature_columns="a,b"),
        DataSpec(training="/d/t.csv", reader="csv", delimiter="\\t"),
        DataSpec(training="/d/t.csv", reader="my_readers.avro:AvroReader"),
    ],
    ids=["idx", "npz", "tfrecord", "tsv", "csv", "csv-escaped-tab", "plug-in"],
)
def test_data_round_trip(spec: DataSpec) -> None:
    args = data_args(spec)
    assert args[0] == f"--training_data={spec.training}"
    assert parse_data(*args) == spec


def test_data_flags_keep_their_elasticdl_names() -> None:
    spec = parse_data("--training_data=/t", "--validation_data=/v", "--data_reader=csv", "--label_column=y", "--header=false")
    assert spec == DataSpec(training="/t", validation="/v", reader="csv", label_column="y", header=False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--training_data=/t", "--data_reader=xml"], "argument --data_reader: must be a built-in reader"),
        (["--training_data=/t", "--data_reader=pkg.mod"], "or a plug-in class as package.module:ClassName"),
        (["--training_data=/t", "--delimiter=;;"], "argument --delimiter: must be one character"),
        (["--training_data=/t", "--header=maybe"], "argument --header: expected true or false"),
    ],
)
def test_bad_data_flags_are_refused_naming_the_flag(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        parse_data(*argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_the_training_data_flag_may_be_left_out() -> None:
    # A job that predicts with an exported model has none; the worker and PS 0 check (worker/main.py).
    assert parse_data().training == ""


def test_replica_command_lines_carry_the_jobs_data_settings() -> None:
    data = {"training": "s3://b/train-*.csv", "validation": "s3://b/val.csv", "reader": "csv", "delimiter": ";",
            "header": False, "labelColumn": "0", "featureColumns": "1,2", "indexDir": "/shared/idx"}
    job = parse_job({"apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"},
                     "spec": {"model": {"modelDef": "m"}, "data": data}})
    for main, replica in ((ps_main, ps_replica(job, 0, host="h", port=0)), (worker_main, worker_replica(job, 0, ["a:1"]))):
        parser = argparse.ArgumentParser()
        main.add_arguments(parser)
        assert main.config_from_args(parser.parse_args(list(replica.args[1:]))).job.data == job.spec.data
