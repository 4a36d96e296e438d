"""Atomic writes: the target holds the old bytes or all of the new ones, never a part."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticps import files
from elasticps.files import atomic_writer, write_atomically


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "state.json"
    write_atomically(target, "one")
    write_atomically(target, b"two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomically(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_writer(target) as (file, temporary):
            file.write(b"half of the new")
            assert temporary.exists()
            raise RuntimeError("crash in the middle")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_file_and_its_folder_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = files.os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    folders: list[Path] = []
    real_folder = files.fsync_folder
    monkeypatch.setattr(files.os, "fsync", spy)
    monkeypatch.setattr(files, "fsync_folder", lambda folder: (folders.append(folder), real_folder(folder)))
    write_atomically(tmp_path / "x", "data")
    assert len(synced) == 2  # the file, then the folder
    assert folders == [tmp_path]


def test_the_temporary_prefix_is_the_callers(tmp_path: Path) -> None:
    with atomic_writer(tmp_path / "ckpt", prefix=".ckpt-7.", suffix=".tmp") as (_, temporary):
        assert temporary.name.startswith(".ckpt-7.") and temporary.name.endswith(".tmp")
