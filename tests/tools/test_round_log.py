"""``elasticps.tools.round_log``: the minibatches a shard's model holds, from its round log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elasticps.tools import round_log


def write(path: Path, entries: list[dict[str, object]], torn: str = "") -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries) + torn)
    return path


def test_a_restore_takes_the_rounds_from_its_version_out_of_the_model(tmp_path: Path) -> None:
    log = write(tmp_path / "ps-1.jsonl", [
        {"shard": 1, "round": 0, "minibatches": ["a/s/1/e0", "b/s/1/e0"]},
        {"shard": 1, "round": 1, "minibatches": ["a/s/2/e0"]},
        {"shard": 1, "round": 2, "minibatches": ["b/s/2/e0"]},
        {"shard": 1, "restored": 1},  # rolled back to version 1: rounds 1 and 2 are gone
        {"shard": 1, "round": 1, "minibatches": ["c/t/1/e0"]},
        {"shard": 1, "round": 2, "minibatches": ["c/t/2/e1", "a/s/1/e0"]},
    ], torn='{"shard": 1, "rou')  # fmt: skip
    entries = round_log.read(log)
    assert [e["round"] for e in round_log.in_model(entries)] == [0, 1, 2]
    assert round_log.per_epoch(entries) == {0: 4, 1: 1}
    assert round_log.twice(entries) == ["a/s/1/e0"]


def test_the_minibatches_of_an_epoch_are_each_tasks_records_cut_by_the_minibatch_size() -> None:
    assert round_log.expected_per_epoch(6000, 960, 32) == 6 * 30 + 8
    assert round_log.expected_per_epoch(60000, 64, 64) == 938  # 937 tasks of one minibatch, one of 32 records
    assert round_log.expected_per_epoch(100, 10, 4) == 10 * 3


def test_a_minibatch_that_names_no_epoch_is_refused() -> None:
    with pytest.raises(ValueError, match="names no epoch"):
        round_log.epoch_of("w/s/3")


def test_the_command_prints_each_shards_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "ps-0.jsonl", [{"shard": 0, "round": 0, "minibatches": ["a/s/1/e0"]}])
    assert round_log.main([str(tmp_path)]) == 0
    assert "ps-0: 1 rounds in the model (0 restores), minibatches per epoch {0: 1}, applied twice: 0" in capsys.readouterr().out
    assert round_log.main([str(tmp_path / "none")]) == 1
