"""The checkpoint schedule on its own: which versions are written, by one writer in order, and which
checkpoint a restart resumes from (the newest good one)."""

from __future__ import annotations

import functools
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps import checkpoint
from elasticps.ps.checkpointing import Checkpointing, capture, rebuild
from elasticps.ps.model import Model
from elasticps.ps.optimizers import make_optimizer
from elasticps.ps.settings import StoreSettings
from elasticps.ps.tables import DENSE, DenseTable

ADAM = OptimizerConfig("adam", {"learning_rate": 0.01})


def model() -> Model:
    dense = DenseTable.create({"w": np.array([1.0, 2.0], dtype=np.float32), "b": np.array(0.5)})
    return Model(dense, make_optimizer(ADAM))


def snap(version: int, base: object = None) -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(version=version, arrays={"var/w": np.full(2, float(version))}, meta={})


def names(directory: Path) -> list[int]:
    return sorted(int(p.name[5:17]) for p in checkpoint.list_checkpoints(directory))


@pytest.mark.parametrize(("every", "expected"), [(1, [8, 9, 10]), (3, [3, 6, 9]), (4, [4, 8]), (11, [])])
def test_writes_every_n_versions(tmp_path: Path, every: int, expected: list[int]) -> None:
    schedule = Checkpointing(tmp_path, every=every, keep=3)
    taken: list[int] = []

    def snapshot_of(version: int, base: object = None) -> checkpoint.Checkpoint:
        taken.append(version)
        return snap(version)

    for version in range(1, 11):
        schedule.after_update(version, functools.partial(snapshot_of, version))
        schedule.flush()  # each written before the next: none is replaced while it waits
    assert taken == [v for v in range(1, 11) if v % every == 0]  # snapshots only when due
    assert names(tmp_path) == expected


def test_a_stopping_shard_checkpoints_the_version_it_stops_at_once(tmp_path: Path) -> None:
    schedule = Checkpointing(tmp_path, every=10, keep=3)
    for version in range(1, 24):
        schedule.after_update(version, functools.partial(snap, version))
        schedule.flush()
    schedule.final(23, functools.partial(snap, 23))  # not due: written anyway
    schedule.flush()
    assert names(tmp_path) == [10, 20, 23]
    schedule.final(23, lambda base: pytest.fail("no second snapshot of one version"))  # type: ignore[arg-type, return-value]
    schedule.final(20, lambda base: pytest.fail("nor of an older one"))  # type: ignore[arg-type, return-value]
    Checkpointing(None, every=10).final(7, lambda base: pytest.fail("no directory: nothing"))  # type: ignore[arg-type, return-value]
    Checkpointing(tmp_path / "off", every=0).final(7, lambda base: pytest.fail("no steps: nothing"))  # type: ignore[arg-type, return-value]


def test_a_slow_disk_holds_at_most_two_snapshots_and_writes_the_newest_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # checkpointSteps 1 with writes far slower than updates: the issue saw 73 snapshots queued
    # after 100 versions. Now one is written, one waits, a newer one replaces the waiting one.
    live = 0
    most = 0
    written: list[int] = []
    guard = threading.Lock()

    def snapshot_of(version: int, base: object = None) -> checkpoint.Checkpoint:
        nonlocal live, most
        taken = snap(version)
        with guard:
            live += 1
            most = max(most, live)
        weakref.finalize(taken, released)
        return taken

    def released() -> None:
        nonlocal live
        with guard:
            live -= 1

    save = checkpoint.save

    def slow_save(directory: Path, found: checkpoint.Checkpoint, keep: int = 3, protect: int = 0) -> Path:
        time.sleep(0.02)
        written.append(found.version)
        return save(directory, found, keep=keep, protect=protect)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    schedule = Checkpointing(tmp_path, every=1, keep=3)
    started = time.monotonic()
    for version in range(1, 101):
        schedule.after_update(version, functools.partial(snapshot_of, version))
    pushing = time.monotonic() - started
    schedule.flush()
    assert most <= 2, f"{most} snapshots held at once"
    assert pushing < 0.02 * 20  # the updates never waited for the disk (100 writes would take 2 s)
    assert written[-1] == 100 and written == sorted(written) and len(written) < 100
    assert names(tmp_path)[-1] == 100
    assert schedule.skipped == 100 - len(written)
    newest = checkpoint.load_latest(tmp_path)
    assert newest is not None and newest.version == 100


@pytest.mark.parametrize(("directory", "every"), [(None, 2), ("here", 0)])
def test_never_writes_without_a_directory_or_steps(tmp_path: Path, directory: str | None, every: int) -> None:
    schedule = Checkpointing(None if directory is None else tmp_path / directory, every=every)
    assert not any(schedule.due(v) for v in range(1, 10))
    schedule.after_update(2, lambda base: pytest.fail("no snapshot should be taken"))
    schedule.flush()
    assert list(tmp_path.iterdir()) == []


def test_for_shard_writes_under_the_shards_folder(tmp_path: Path) -> None:
    schedule = Checkpointing.for_shard(
        StoreSettings(shard=2, checkpoint_dir=tmp_path, checkpoint_steps=5, keep_checkpoint_max=1)
    )
    assert (schedule.directory, schedule.every, schedule.keep, schedule.shard) == (tmp_path / "ps-2", 5, 1, 2)


def test_capture_and_rebuild_round_trip() -> None:
    original = model()
    original.apply({DENSE: {"w": np.ones(2, dtype=np.float32), "b": np.array(2.0)}}, lr=0.1)
    saved = capture(original, version=7, shard=1)
    assert list(saved.arrays)[:2] == ["var/w", "var/b"]  # the tables first, then the optimizer
    assert saved.meta == {
        "shard": 1,
        "optimizer": {"name": "adam", "params": dict(original.optimizer.config.params)},
        "state_table": True,  # written with a (here empty) state table
    }
    back = rebuild(saved, shard=1)
    for name, value in original.dense.variables.items():
        np.testing.assert_array_equal(back.dense.variables[name], value)
    for key, value in original.optimizer.state().items():
        np.testing.assert_array_equal(back.optimizer.state()[key], value, err_msg=key)


def test_restore_picks_the_newest_good_checkpoint(tmp_path: Path) -> None:
    schedule = Checkpointing(tmp_path, every=1, keep=5)
    m = model()
    for version in (1, 2, 3):
        schedule.after_update(version, functools.partial(capture, m, version, 0))
        schedule.flush()
    found = schedule.restore()
    assert found is not None and found[1] == 3

    newest = tmp_path / "ckpt-000000000003.eps"
    data = bytearray(newest.read_bytes())
    data[-40] ^= 0xFF  # corrupt the newest: the one before it is used
    newest.write_bytes(bytes(data))
    found = Checkpointing(tmp_path).restore()
    assert found is not None
    restored, version = found
    assert version == 2
    np.testing.assert_array_equal(restored.dense.variables["w"], m.dense.variables["w"])


def test_restore_without_checkpoints(tmp_path: Path) -> None:
    assert Checkpointing(tmp_path / "empty").restore() is None
    assert Checkpointing(None).restore() is None


def test_only_checkpoints_that_read_back_whole_are_listed_and_the_rest_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = Checkpointing(tmp_path, every=1, keep=5)
    for version in (10, 20, 30, 40):
        checkpoint.save(tmp_path, snap(version), keep=5)
    newest, second = checkpoint.path_of(tmp_path, 40), checkpoint.path_of(tmp_path, 30)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    flipped = bytearray(second.read_bytes())
    flipped[-40] ^= 0x01  # one byte of an array
    second.write_bytes(bytes(flipped))
    checkpoint.path_of(tmp_path, 10).unlink()  # missing
    verified: list[str] = []
    real = checkpoint.verify
    monkeypatch.setattr(checkpoint, "verify", lambda path: (verified.append(path.name), real(path))[1])

    assert schedule.versions() == [20]
    unreadable = schedule.unreadable()
    assert [u.split(": ", 1)[0] for u in unreadable] == [str(newest), str(second)]
    assert "truncated" in unreadable[0] and "checksum mismatch" in unreadable[1]
    assert sorted(verified) == sorted({newest.name, second.name, checkpoint.path_of(tmp_path, 20).name})
    verified.clear()
    assert schedule.versions() == [20] and verified == []  # each file read through once while it stays
    checkpoint.save(tmp_path, snap(40), keep=5)  # written again: read again
    assert schedule.versions() == [40, 20] and verified == [newest.name]


def test_a_failed_write_is_said_until_a_write_succeeds(tmp_path: Path) -> None:
    blocked = tmp_path / "ps-1"
    blocked.write_text("a file where the checkpoint folder should be")
    schedule = Checkpointing(blocked, every=1, keep=3)
    schedule.after_update(1, functools.partial(snap, 1))
    schedule.flush()
    assert schedule.failure.startswith(f"checkpoint of version 1 to {blocked} failed: ")
    blocked.unlink()
    schedule.after_update(2, functools.partial(snap, 2))
    schedule.flush()
    assert schedule.failure == "" and schedule.versions() == [2]
