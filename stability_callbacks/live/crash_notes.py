"""Crash notes: how failing ranks learn of each other through ``run_dir/crash/`` (no
collective), and what of an exception's message an alert may carry."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path


#: The folder under ``run_dir`` where failing ranks leave their crash notes.
CRASH_DIR = "crash"


def claim_first_crash(folder: Path, mine: dict, *, since_s: float) -> dict:
    """Leave ``mine`` as ``folder/rank<r>.json`` and claim ``folder/first.json`` (an exclusive
    create: one rank wins, on a shared filesystem too). Returns the first failing rank's note:
    ``mine`` itself when this rank claimed it. A ``first.json`` older than ``since_s`` is an
    earlier run's and is replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{mine['rank']}.json").write_text(json.dumps(mine), encoding="utf-8")
    first = folder / "first.json"
    for _ in range(2):
        try:
            fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            other = None
            for _ in range(20):   # the winner may be writing it this instant
                try:
                    other = json.loads(first.read_text(encoding="utf-8"))
                    break
                except (OSError, ValueError):
                    time.sleep(0.01)
            if other is None:
                return mine
            if other.get("time_s", 0) >= since_s:
                return other
            first.unlink(missing_ok=True)   # an earlier run's
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(mine, fh)
        return mine
    return mine


#: Environment variables whose values never leave the process in an alert.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|WEBHOOK|AUTH|CREDENTIAL|COOKIE", re.I)
_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/\s@]*@)?([^/\s?#]*)(\S*)")


def exception_text(exc: BaseException, limit: int = 200) -> str:
    r"""The part of an exception's message an alert may carry: its first line, at most
    ``limit`` characters, each URL cut to scheme and host (paths, queries and credentials hold
    tokens), and the value of every environment variable named like a secret replaced by ***.

    >>> exception_text(RuntimeError("POST https://bob:pw@hooks.example/T0/B1?token=x failed\nmore"))
    'POST https://hooks.example/... failed'
    """
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    for name, value in os.environ.items():
        if len(value) >= 6 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, "***")
    text = _URL.sub(lambda m: m.group(1) + m.group(2) + ("/..." if m.group(3) else ""), text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
