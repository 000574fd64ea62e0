"""The installed wheel, as a user meets it: run by ``scripts/smoke_wheel.sh`` with the clean venv's
Python in isolated mode (``python -I``: neither the checkout nor ``PYTHONPATH`` on ``sys.path``),
from a scratch directory outside the checkout.

    python -I smoke_wheel.py README.md REAL_LOG

Checks, each printed as it passes; the first failure prints what went wrong and exits 1:
- the package is the installed one (not the checkout), with its presets, ``py.typed``, the LICENSE
  and ``License-Expression: Apache-2.0`` in its metadata, and one version everywhere;
- ``stability-callbacks --version``;
- every preset by name from this directory: ``load_config``, ``Monitor`` and the HF and Lightning
  ``StabilityCallback(config=...)``;
- every fenced ``python`` block of the README, each as its own script in its own directory (the
  README reads ``train.log``: REAL_LOG is copied there), exit code 0 within a time limit;
- every script of the checkout's ``examples/`` (a user's own model under HF, TRL, Lightning, a
  DeepSpeed loop, and a followed log), each in its own directory: exit code 0 (each asserts that
  its planted fault was found);
- ``stability-callbacks replay REAL_LOG --config pretrain-bf16``: exit code 1 (critical), the labelled
  findings of the 104B divergence at their steps, and the HTML report written.
"""
from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

PRESETS = ("default", "pretrain-fp16", "pretrain-bf16", "finetune")
EXAMPLE_TIMEOUT_S = 300
# tests/data/real_logs/labels.json for bs_tr8_104B_exp12_spike8740_diverge9027: (kind, first step, last step)
REPLAY_EXPECT = (("grad_norm_spike", 8740, 8741), ("loss_spike", 8741, 8743), ("nonfinite", 9027, 9027))


# The venv is not activated: its console script lies next to its interpreter.
CLI = str(Path(sys.executable).with_name("stability-callbacks"))


class SmokeFailure(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SmokeFailure(message)


def run(cmd: list[str], cwd: Path, timeout_s: float = EXAMPLE_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        raise SmokeFailure(f"{' '.join(cmd)} (in {cwd}) ran past {timeout_s}s; output tail:\n{out[-3000:]}") from None


def output_tail(proc: subprocess.CompletedProcess, n: int = 4000) -> str:
    return (proc.stdout + proc.stderr)[-n:]


def readme_examples(readme: Path) -> list[tuple[int, str]]:
    """(line number, code) of every fenced ```python block."""
    blocks, lines = [], readme.read_text(encoding="utf-8").splitlines()
    start = None
    for i, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = i
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start:i - 1]) + "\n"))
            start = None
    check(start is None, f"{readme}: the python block opened at line {start} is never closed")
    return blocks


def check_installed_package(checkout: Path) -> str:
    import stability_callbacks
    from stability_callbacks.config import PRESETS_DIR

    where = Path(stability_callbacks.__file__).resolve()
    check(checkout not in where.parents, f"stability_callbacks imported from the checkout ({where}), not the wheel")
    check(Path(sys.prefix).resolve() in where.parents, f"stability_callbacks at {where}, outside this venv ({sys.prefix})")
    meta = importlib.metadata.metadata("stability-callbacks")
    version = meta["Version"]
    check(version == stability_callbacks.__version__,
          f"metadata version {version} != stability_callbacks.__version__ {stability_callbacks.__version__}")
    check(meta.get("License-Expression") == "Apache-2.0",
          f"License-Expression in the metadata: {meta.get('License-Expression')!r}, expected 'Apache-2.0'")
    files = {str(f) for f in importlib.metadata.files("stability-callbacks") or ()}
    check(any(f.endswith("licenses/LICENSE") for f in files), "no LICENSE in the wheel's .dist-info/licenses")
    check((where.parent / "py.typed").is_file(), "no py.typed in the installed package")
    shipped = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
    check(shipped == sorted(PRESETS), f"presets shipped: {shipped}, expected {sorted(PRESETS)}")
    check(where.parent in PRESETS_DIR.resolve().parents, f"PRESETS_DIR {PRESETS_DIR} is not inside the package")
    return version


def check_presets_by_name() -> None:
    from stability_callbacks import Monitor, load_config
    from stability_callbacks.integrations.hf import StabilityCallback as HFCallback
    from stability_callbacks.integrations.lightning import StabilityCallback as LightningCallback

    for name in PRESETS:
        check(isinstance(load_config(name), Mapping), f"load_config({name!r})")   # the Config tree, a mapping of sections
        Monitor(name)
        HFCallback(config=name, run_dir="out/presets")
        LightningCallback(config=name, run_dir="out/presets")


def check_replay(log: Path, cwd: Path) -> None:
    proc = run([CLI, "replay", str(log), "--config", "pretrain-bf16", "--json", "findings.jsonl",
                "--report", "report.html"], cwd)
    check(proc.returncode == 1, f"replay exit code {proc.returncode}, expected 1 (a critical finding):\n"
                                f"{output_tail(proc)}")
    records = [json.loads(line) for line in (cwd / "findings.jsonl").read_text().splitlines()]
    check(bool(records) and records[0].get("type") == "read",
          f"replay --json: the first record is not what was read ({records[:1]})")
    findings = records[1:]
    for kind, lo, hi in REPLAY_EXPECT:
        steps = [f["step"] for f in findings if f["kind"] == kind]
        check(bool(steps) and lo <= steps[0] <= hi,
              f"replay of {log.name}: first {kind} at {steps[:1] or 'no step'}, expected in [{lo}, {hi}]")
    check((cwd / "report.html").stat().st_size > 0, "replay --report report.html wrote nothing")


def main(argv: list[str]) -> int:
    readme, log = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    checkout = readme.parent
    here = Path.cwd()
    check(checkout not in here.parents and here != checkout, f"run from inside the checkout ({here})")
    t_start = time.perf_counter()
    passed = 0

    def ok(what: str, t0: float) -> None:
        nonlocal passed
        passed += 1
        print(f"ok   {what} ({time.perf_counter() - t0:.1f}s)", flush=True)

    try:
        t0 = time.perf_counter()
        version = check_installed_package(checkout)
        ok(f"installed wheel {version}: presets, py.typed, LICENSE, License-Expression", t0)

        t0 = time.perf_counter()
        proc = run([CLI, "--version"], here)
        check(proc.returncode == 0 and proc.stdout.strip() == f"stability-callbacks {version}",
              f"stability-callbacks --version: rc={proc.returncode}, {output_tail(proc)!r}")
        ok(f"stability-callbacks --version -> {proc.stdout.strip()}", t0)

        t0 = time.perf_counter()
        check_presets_by_name()
        ok(f"presets by name from {here}: {', '.join(PRESETS)}", t0)

        examples = readme_examples(readme)
        check(len(examples) >= 5, f"{readme}: found {len(examples)} python blocks, expected at least 5")
        for n, (line, code) in enumerate(examples, 1):
            t0 = time.perf_counter()
            d = here / f"example_{n}"
            d.mkdir()
            shutil.copy(log, d / "train.log")
            (d / "example.py").write_text(code, encoding="utf-8")
            proc = run([sys.executable, "-I", "example.py"], d)
            check(proc.returncode == 0, f"README.md line {line} (python block {n}) failed, "
                                        f"exit code {proc.returncode}:\n{code}\n--- output tail:\n{output_tail(proc)}")
            ok(f"README.md python block {n} (line {line})", t0)

        scripts = sorted((checkout / "examples").glob("*.py"))
        check(len(scripts) >= 5, f"{checkout / 'examples'}: found {len(scripts)} scripts, expected at least 5")
        for script in scripts:
            t0 = time.perf_counter()
            d = here / f"examples_{script.stem}"
            d.mkdir()
            proc = run([sys.executable, "-I", str(script)], d)
            check(proc.returncode == 0, f"examples/{script.name} failed, exit code {proc.returncode}:\n"
                                        f"--- output tail:\n{output_tail(proc)}")
            ok(f"examples/{script.name}", t0)

        t0 = time.perf_counter()
        check_replay(log, here)
        ok(f"stability-callbacks replay {log.name} --config pretrain-bf16 (exit 1, findings at the labelled steps)", t0)
    except SmokeFailure as e:
        print(f"\nFAILED: wheel smoke test: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"wheel smoke test: all {passed} checks passed in {time.perf_counter() - t_start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
