"""A model module's own failures are said as its file and line (backends/api.blame_model_code), at
import (load_model_module) and when its functions run."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from elasticps.backends.api import ModelError, blame_model_code
from elasticps.backends.keras.model_loading import load_model_module


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return tmp_path


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(text)
    sys.modules.pop(name, None)
    return path


def test_an_error_raised_in_the_modules_code_names_its_innermost_line(modules: Path) -> None:
    path = write(modules, "raising_model", "def helper():\n    return {}['x']\n\n\ndef loss(a, b):\n    return helper()\n")
    module = importlib.import_module("raising_model")
    with pytest.raises(KeyError) as caught:
        module.loss(1, 2)
    blamed = blame_model_code(caught.value, str(path))
    assert str(blamed) == f"{path}:2 (in helper): KeyError: 'x'"


def test_an_error_that_never_passed_the_module_is_not_blamed_on_it(modules: Path) -> None:
    path = write(modules, "innocent_model", "def loss(a, b):\n    return 0\n")
    try:
        {}["x"]
    except KeyError as err:
        assert blame_model_code(err, str(path)) is None
    assert blame_model_code(ValueError("x"), None) is None


def test_a_traced_frame_named_in_the_message_is_blamed(tmp_path: Path) -> None:
    # TensorFlow's autograph runs user code from generated files and names the user's frames in
    # its message instead of the traceback.
    path = str(tmp_path / "m.py")
    message = (f'in user code:\n    File "/x/trainer.py", line 3, in step  *\n        loss = f()\n'
               f'    File "{path}", line 5, in loss  *\n        raise RuntimeError(\'the loss breaks\')\n'
               f"    RuntimeError: the loss breaks\n")
    assert str(blame_model_code(RuntimeError(message), path)) == f"{path}:5 (in loss): RuntimeError: the loss breaks"
    # A runtime error naming where an op was defined (an out-of-memory one) is not the module's doing.
    oom = f'OOM when allocating tensor\nDetected at node conv defined at (most recent call last):\n  File "{path}", line 9, in custom_model\n'
    assert blame_model_code(MemoryError(oom), path) is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param("def custom_model(:\n    pass\n", ":1: SyntaxError: ", id="syntax"),
        pytest.param("x = 1\nundefined_name()\n", ":2 (in <module>): NameError: name 'undefined_name' is not defined",
                     id="name-error"),
        pytest.param("import no_such_package_here\n", ":1 (in <module>): ModuleNotFoundError: No module named",
                     id="missing-package"),
    ],
)
def test_a_module_that_cannot_be_imported_names_its_line(modules: Path, text: str, said: str) -> None:
    path = write(modules, "broken_model", text)
    with pytest.raises(ModelError) as caught:
        load_model_module("broken_model")
    message = str(caught.value)
    assert message.startswith(f"model module 'broken_model' cannot be imported: {path}{said}"), message
    assert "\n" not in message


def test_a_module_name_that_does_not_exist_says_so() -> None:
    with pytest.raises(ModelError, match="model module 'no_such_model_anywhere' cannot be imported: No module named"):
        load_model_module("no_such_model_anywhere")
