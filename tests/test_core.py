"""The core imports without torch; its docstring examples are the spec and they run."""
import doctest
import importlib
import pkgutil
import subprocess
import sys

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


@pytest.mark.parametrize("name", CORE)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
