"""The package's import structure (docs/design.md, "Layout"): no import cycle between modules,
and no import that runs back up a layer. Read from the source with ``ast`` (every import
statement, those inside functions too), so a lazy import cannot hide an arrow.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stability_callbacks"

#: Rooms from the ground up. A module may import its own room and the rooms below it, never a
#: room on its own floor or above. The package face (``stability_callbacks/__init__.py``) only
#: hands names on and is exempt.
FLOORS = [
    ["keys", "record", "params", "stats"],
    ["control", "phase", "preflight", "watchdog", "detectors", "advice"],
    ["policy", "runlog", "alerts", "forensics", "outcome", "cycles"],
    ["config"],
    ["monitor"],
    ["live"],
    ["replay", "integrations"],
    ["integrations.torch"],
    ["integrations.deepspeed"],
    ["integrations.hf", "integrations.lightning"],
    ["demo"],
    ["cli"],
    ["__main__"],
]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports (a ``from pkg import sub`` names ``pkg.sub``)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = (".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                    if node.level else node.module or "")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            while t not in MODULES and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _room(name: str) -> str:
    rel = name.split(".")[1:]
    for depth in (2, 1):
        room = ".".join(rel[:depth])
        if room in FLOOR:
            return room
    raise AssertionError(f"{name}: in no room of FLOORS (add it to the table)")


def test_every_module_has_a_floor():
    for name in MODULES:
        if name != "stability_callbacks":
            _room(name)


def test_no_import_runs_back_up_a_floor():
    upward = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() if a != "stability_callbacks"
                    for b in bs if b != "stability_callbacks" and _room(a) != _room(b)
                    and FLOOR[_room(b)] >= FLOOR[_room(a)])
    assert upward == []


def test_no_import_cycle():
    state: dict[str, int] = {}   # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert cycles == []


@pytest.mark.parametrize("framework", ["hf", "lightning", "deepspeed"])
def test_integrations_reach_the_policy_only_through_named_methods(framework):
    """No attribute chain into the Monitor's policy from the integrations: they request and read
    through ``LiveRun`` and ``Control`` (``run.data_skips``, ``control.halt``, ...)."""
    folders = [PACKAGE / "integrations" / framework, PACKAGE / "integrations" / "torch"]
    chains = sorted(f"{f.relative_to(PACKAGE)}:{node.lineno}" for folder in folders
                    for f in folder.rglob("*.py") for node in ast.walk(ast.parse(f.read_text()))
                    if isinstance(node, ast.Attribute) and node.attr == "policy")
    assert chains == []


def test_the_check_sees_a_planted_cycle_and_an_upward_arrow():
    """The graph is read right: ``config`` imports ``actions`` (a floor below), and a planted
    ``actions -> config`` arrow would be both a cycle and an upward import."""
    assert "stability_callbacks.alerts" in GRAPH["stability_callbacks.config"] or \
        "stability_callbacks.alerts.section" in GRAPH["stability_callbacks.config"]
    assert FLOOR[_room("stability_callbacks.alerts.section")] < FLOOR[_room("stability_callbacks.config")]


def test_no_function_over_60_logical_lines_without_a_written_reason(tmp_path):
    """Functions fit on a screen (STYLE.md): ``scripts/long_functions.py`` counts each function's
    own logical lines; one over 60 needs a ``# long: <why>`` comment above it. The count sees a
    planted long function, and its reason."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("long_functions", PACKAGE.parent / "scripts" / "long_functions.py")
    lf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lf)
    assert [where for _, where, reason in lf.long_functions() if not reason] == []
    body = "".join(f"    x{i} = {i}\n" for i in range(61))
    (tmp_path / "m.py").write_text(f"def f():\n    \"\"\"doc\"\"\"\n{body}\n\n# long: planted\ndef g():\n{body}")
    assert lf.long_functions(package=tmp_path) == [(61, f"{tmp_path.name}/m.py:67 g", True),
                                                   (61, f"{tmp_path.name}/m.py:1 f", False)]
