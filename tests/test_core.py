"""The core imports without torch; its docstring examples are the spec and they run."""
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import stability_callbacks

CORE = sorted(m.name for m in pkgutil.walk_packages(stability_callbacks.__path__, "stability_callbacks.")
              if not m.name.startswith(("stability_callbacks.integrations", "stability_callbacks.demo",
                                        "stability_callbacks.__main__")))


def test_core_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            f"import importlib\nfor m in {CORE!r}: importlib.import_module(m)\n"
            "from stability_callbacks import Monitor; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.slow
def test_pytest_runs_every_docstring_example_in_the_package(pytestconfig):
    """The docstring examples are the spec: a plain ``pytest`` collects them from every module
    (pyproject: ``testpaths`` + ``--doctest-modules``), the torch-side ones included."""
    root = Path(stability_callbacks.__file__).resolve().parent
    assert "stability_callbacks" in pytestconfig.getini("testpaths")
    assert "--doctest-modules" in pytestconfig.getini("addopts")
    with_examples = {p.relative_to(root.parent).as_posix() for p in root.rglob("*.py")
                     if ">>>" in p.read_text() and p.name != "__main__.py"}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "stability_callbacks"], cwd=root.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    collected = {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}
    assert with_examples and with_examples <= collected, sorted(with_examples - collected)


def test_instance_patches_restore_the_class_method_or_an_earlier_wrap():
    from stability_callbacks.live import InstancePatches
    torch = pytest.importorskip("torch")

    class Engine(torch.nn.Module):   # nn.Module keeps plain functions in __dict__ too
        def forward(self, x):
            return x + 1

        def step(self):
            return "class"

    e = Engine()
    e.step = lambda: "earlier wrap"
    patches = InstancePatches(e)
    patches.set("forward", lambda x: x * 10)
    patches.set("step", lambda: "ours")
    assert e(torch.tensor(2.0)).item() == 20.0 and e.step() == "ours"
    patches.restore()
    assert e(torch.tensor(2.0)).item() == 3.0 and "forward" not in e.__dict__
    assert e.step() == "earlier wrap"
