"""Packaging: one version source, presets and py.typed inside the package, README examples that
compile. The built wheel itself is exercised by ``scripts/smoke_wheel.sh`` (CI)."""
import fnmatch
import importlib.util
from pathlib import Path

import pytest

import stability_callbacks
from stability_callbacks import cli
from stability_callbacks.config import PRESETS_DIR

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("smoke_wheel", ROOT / "scripts" / "smoke_wheel.py")
smoke_wheel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(smoke_wheel)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")   # Python ≥ 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_has_one_source(capsys):
    project = _pyproject()
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "stability_callbacks.__version__"}
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"stability-callbacks {stability_callbacks.__version__}\n"


def test_presets_and_py_typed_ship_in_the_package():
    package = Path(stability_callbacks.__file__).resolve().parent
    assert PRESETS_DIR.parent == package
    assert sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")) == sorted(smoke_wheel.PRESETS)
    globs = _pyproject()["tool"]["setuptools"]["package-data"]["stability_callbacks"]
    shipped = [p.relative_to(package).as_posix() for p in (package / "py.typed", *PRESETS_DIR.glob("*.yaml"))]
    for rel in shipped:
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} matches no package-data glob {globs}"
    assert not (ROOT / "configs").exists(), "one home for the presets: stability_callbacks/configs/"


def test_readme_python_examples_compile():
    examples = smoke_wheel.readme_examples(ROOT / "README.md")
    assert len(examples) >= 5
    for line, code in examples:
        compile(code, f"README.md:{line}", "exec")
