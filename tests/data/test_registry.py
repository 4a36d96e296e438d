"""Readers by name: built-ins, plug-in classes (``package.module:ClassName``) and their errors, and
``elasticps run`` refusing unreadable data in one line with exit 2 before it starts any process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from elasticps.api.spec import DataReader, DataSpec
from elasticps.data import readers
from elasticps.data.readers import DataError, ReaderOptions, count_records, open_reader

PLUGIN = '''
import numpy as np

class Squares:
    def __init__(self, path, options):
        self.path, self.options = path, options
        self.num_records = int(path.rsplit("/", 1)[-1])

    def read(self, start, end):
        k = np.arange(start, end)
        return (k * k).reshape(-1, 1).astype(np.float32), None if self.options.label_column == "" else k

class NoRead:
    def __init__(self, path, options):
        self.num_records = 3

class Exploding:
    def __init__(self, path, options):
        raise KeyError("no such partition")

class Complaining:
    def __init__(self, path, options):
        from elasticps.data.readers import DataError
        raise DataError(path + ": the plug-in's own message")

not_a_class = 7
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_readers").mkdir()
    (tmp_path / "my_readers" / "__init__.py").write_text("")
    (tmp_path / "my_readers" / "squares.py").write_text(PLUGIN)
    (tmp_path / "my_readers" / "broken.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_readers.squares"


def test_every_built_in_name_has_a_reader() -> None:
    assert set(readers.BUILTIN) == {r.value for r in DataReader}


def test_a_data_reader_member_is_its_name(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.ones((2, 1)), y=np.zeros(2))
    assert open_reader(DataReader.NPZ, str(tmp_path / "d.npz")).num_records == 2


def test_a_plug_in_gets_the_path_and_the_options(plugin: str) -> None:
    reader = open_reader(f"{plugin}:Squares", "/data/5", ReaderOptions(label_column="y"))
    assert reader.num_records == 5
    features, labels = reader.read(2, 4)
    assert features.tolist() == [[4], [9]] and labels.tolist() == [2, 3]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("my_readers.nothing:Squares", "reader my_readers.nothing:Squares: cannot import module 'my_readers.nothing': ModuleNotFoundError"),
        ("my_readers.broken:Reader", "cannot import module 'my_readers.broken': ModuleNotFoundError: No module named 'no_such_dependency'"),
        ("my_readers.squares:Cubes", "module 'my_readers.squares' has no class 'Cubes'"),
        ("my_readers.squares:not_a_class", "module 'my_readers.squares' has no class 'not_a_class'"),
        ("my_readers.squares:NoRead", r"NoRead has no num_records and read\(start, end\)"),
        ("my_readers.squares:Exploding", "/data/3: reader my_readers.squares:Exploding: KeyError: 'no such partition'"),
        ("my_readers.squares:Complaining", "/data/3: the plug-in's own message"),
        ("my_readers.squares", "must be a built-in reader .* or a plug-in class as package.module:ClassName"),
        ("xml", "must be a built-in reader"),
    ],
)
def test_plug_in_errors_name_the_module_or_class(plugin: str, name: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        open_reader(name, "/data/3")


def test_count_records_names_the_field(tmp_path: Path) -> None:
    np.savez(tmp_path / "t.npz", x=np.ones((4, 1)), y=np.zeros(4))
    assert count_records(DataSpec(training=str(tmp_path / "t.npz"), reader="npz")) == (4, 0)
    with pytest.raises(DataError, match="spec.data.validation: .*v.npz: cannot read"):
        count_records(DataSpec(training=str(tmp_path / "t.npz"), validation=str(tmp_path / "v.npz"), reader="npz"))


# ---- elasticps run: bad data is one line and exit 2, before any process starts ---------------------


def run_job(tmp_path: Path, data: str) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent(f"""\
        apiVersion: elasticps.io/v1alpha1
        kind: TrainingJob
        metadata: {{name: bad-data}}
        spec:
          model: {{modelDef: elasticps.backends.keras.zoo.mlp}}
          data: {data}
        """))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "elasticps", "run", str(job), "--run_dir", str(run_dir)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert not run_dir.exists() or not any(run_dir.glob("*.log")), "no replica may have started"
    return done


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{reader: tfrecord, training: 'DIR/train-*.tfrecord'}", r"spec.data.training: .*train-\*.tfrecord: no file matches"),
        ("{reader: tfrecord, training: 'DIR/bad.csv'}", "spec.data.training: .*bad.csv: record 0 at byte 0: the length's CRC does not match"),
        ("{reader: csv, training: 'DIR/bad.csv', labelColumn: click}", "spec.data.training: .*bad.csv: no label column 'click'"),
        ("{reader: csv, training: 'DIR/bad.csv', validation: 'DIR/nope.csv', labelColumn: y}", "spec.data.validation: .*nope.csv: no such file"),
        ("{reader: parquet, training: 'DIR/bad.csv'}", "bad.csv: not a readable Parquet file"),
        ("{reader: 'no_such_pkg.readers:Reader', training: 'DIR/bad.csv'}", "cannot import module 'no_such_pkg.readers'"),
        ("{reader: npz, training: 'DIR/nope.npz'}", "spec.data.training: .*nope.npz: cannot read"),
    ],
    ids=["empty-glob", "csv-as-tfrecord", "missing-column", "missing-validation", "not-parquet", "plug-in-import", "missing-npz"],
)
def test_elasticps_run_refuses_unreadable_data_in_one_line(tmp_path: Path, data: str, message: str) -> None:
    (tmp_path / "bad.csv").write_text("x,y\n1,0\n2,1\n")
    done = run_job(tmp_path, data.replace("DIR", str(tmp_path)))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"elasticps: error: {tmp_path / 'job.yaml'}: ")
    assert __import__("re").search(message, lines[0]), lines[0]


def test_every_reader_expands_a_leading_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elasticps import storage

    monkeypatch.setenv("HOME", str(tmp_path))
    np.savez(tmp_path / "d.npz", x=np.zeros((3, 2), np.float32), y=np.zeros(3, np.int64))
    assert open_reader("npz", "~/d.npz").num_records == 3
    assert storage.expand_user("~/d.npz") == str(tmp_path / "d.npz")
    for unchanged in ("s3://bucket/~/x", "file://~/x", "data/~x", "/abs/path"):
        assert storage.expand_user(unchanged) == unchanged
