"""The coordinator's ledger saved at checkpointed versions (``coordinator/journal.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticps.coordinator.journal import Journals


def test_write_then_read_gives_the_ledger_back(tmp_path: Path) -> None:
    journals = Journals(tmp_path / "coordinator", keep=3)
    journals.write(20, {"epoch": 0, "done": [[0, 4]], "incarnation": 2})
    assert journals.read(20) == {"epoch": 0, "done": [[0, 4]], "incarnation": 2}
    assert journals.path(20).name == "ledger-000000000020.json"


def test_versions_are_newest_first_and_other_files_ignored(tmp_path: Path) -> None:
    journals = Journals(tmp_path, keep=5)
    for version in (40, 20, 100):
        journals.write(version, {"v": version})
    (tmp_path / "ledger-20.json").write_text("{}")  # not the name it writes
    (tmp_path / "notes.txt").write_text("x")
    assert journals.versions() == [100, 40, 20]


def test_only_the_newest_keep_are_kept(tmp_path: Path) -> None:
    journals = Journals(tmp_path, keep=2)
    for version in (20, 40, 60):
        journals.write(version, {"v": version})
    assert journals.versions() == [60, 40]
    assert not journals.path(20).exists()


def test_the_ledger_of_the_newest_version_every_shard_can_restore_outlives_keep(tmp_path: Path) -> None:
    journals = Journals(tmp_path, keep=2)
    for version in (20, 40, 60, 80):
        journals.write(version, {"v": version}, protect=20)
    assert journals.versions() == [80, 60, 20]


def test_keep_is_at_least_one(tmp_path: Path) -> None:
    journals = Journals(tmp_path, keep=0)
    journals.write(20, {})
    journals.write(40, {})
    assert journals.versions() == [40]


def test_a_missing_directory_has_no_versions(tmp_path: Path) -> None:
    assert Journals(tmp_path / "nowhere", keep=2).versions() == []
    file = tmp_path / "file"
    file.write_text("")
    assert Journals(file, keep=2).versions() == []


def test_reading_a_missing_or_bad_ledger_raises(tmp_path: Path) -> None:
    journals = Journals(tmp_path, keep=2)
    with pytest.raises(OSError):
        journals.read(20)
    journals.path(40).write_text("[1, 2]")
    with pytest.raises(ValueError):
        journals.read(40)
    journals.path(60).write_text("{not json")
    with pytest.raises(ValueError):
        journals.read(60)
