"""``replay`` and ``replay --follow`` on bad input: one way to open and check it, one verdict.

Each input is run both ways (in process, through the CLI's ``main``); the exit code and the
one-line reason agree, and where the log is judged, so are its findings (``--json``). Refused
input never alerts nor writes a stop file (a real local HTTP server stands in for Slack, with
``policy.halt_on: critical``). The tail itself (:class:`TailLines`) on FIFOs, growing gzip and
a log that turns binary is tested line by line at the end.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import struct
import threading
import time

import pytest

from stability_callbacks.cli import main
from stability_callbacks.demo.terminal import LocalSlackInbox
from stability_callbacks.replay.follow import TailLines
from stability_callbacks.replay.readers import LogFormatError

fifo_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")


def _steps(first: int, last: int, *, nan_at: int | None = None, key: str = "loss") -> str:
    return "".join(f"step {s} | {key} {'nan' if s == nan_at else f'{2.0 + 1.0 / max(s, 1):.4f}'}\n"
                   for s in range(first, last + 1))


def _safetensors(path) -> None:
    """A checkpoint as safetensors writes it: the header's length, the JSON header (numbers
    galore), then float32 weights."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for i in range(8):
        n = 64 * 64 * 4
        header[f"model.layers.{i}.mlp.up_proj.weight"] = {"dtype": "F32", "shape": [64, 64],
                                                          "data_offsets": [offset, offset + n]}
        offset += n
    rng = random.Random(1)
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw
                     + b"".join(struct.pack("<f", rng.gauss(0, 0.02)) for _ in range(offset // 4)))


def _run(capsys, tmp_path, mode: str, path, *extra) -> tuple[int, str, str, list]:
    """``(exit code, stdout, stderr, findings)`` of one mode; findings as (step, kind, severity)."""
    out = tmp_path / f"{mode}.jsonl"
    argv = ["replay", str(path), "--idle-exit-s", "0.4", "--json", str(out), *map(str, extra)]
    if mode == "follow":
        argv += ["--follow", "--poll-s", "0.02", "--run-dir", str(tmp_path / "run")]
    code = main(argv)
    said = capsys.readouterr()
    found = ([(f["step"], f["kind"], f["severity"]) for f in map(json.loads, out.read_text().splitlines())
              if "kind" in f] if out.exists() else [])
    return code, said.out, said.err, found


def _both(capsys, tmp_path, path, *extra, writer=None) -> dict[str, tuple[int, str, str, list]]:
    """Both modes on ``path``; ``writer``: started before each (a FIFO's)."""
    got = {}
    for mode in ("replay", "follow"):
        thread = threading.Thread(target=writer, daemon=True) if writer else None
        if thread:
            thread.start()
        got[mode] = _run(capsys, tmp_path, mode, path, *extra)
        if thread:
            thread.join(10)
            assert not thread.is_alive()
    return got


def _error(err: str) -> str:
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    return line


def _fifo_writer(fifo, text: str):
    def write():
        with open(fifo, "w") as f:        # blocks until the replay opens its end
            for line in text.splitlines(keepends=True):
                f.write(line)
                f.flush()
    return write


@pytest.mark.end_report   # refused input writes no report: the real default, to see it
@pytest.mark.parametrize("name, reason", [
    ("model.safetensors", "not a text log: a safetensors file"),
    ("noise.log", "not a text log: binary data"),
    ("missing.log", "no such file"),
    ("lr_only.log", "no training loss was read and nothing else to judge (39 steps, keys: lr)"),
])
def test_refused_input_exits_2_with_the_same_reason_both_ways(capsys, tmp_path, name, reason):
    path = tmp_path / name
    if name == "model.safetensors":
        _safetensors(path)
    elif name == "noise.log":
        path.write_bytes(random.Random(0).randbytes(65536))
    elif name == "lr_only.log":
        path.write_text("".join(f"step {s} | lr {1e-4 * s:.2e}\n" for s in range(1, 40)))
    got = _both(capsys, tmp_path, path)
    for mode, (code, out, err, found) in got.items():
        assert code == 2, (mode, err)
        assert _error(err).startswith(f"error: {path}: {reason}"), (mode, err)
        assert "Traceback" not in err and not [f for f in found if f[2] != "info"]
        assert "[critical]" not in out and "[warning]" not in out
        # The one-line reason only: no summary block, no report (lr_only.log's run log has its steps).
        assert "stability: " not in out + err and not (tmp_path / "run" / "report.html").exists(), (mode, out)
    if name == "missing.log":                    # --follow waits for it, and says so
        assert "does not exist yet: waiting for it to appear" in got["follow"][2]
        assert "waited 0.4 s for it to appear" in got["follow"][2]


@fifo_only
def test_a_fifo_without_a_writer_ends_within_the_wait_both_ways(capsys, tmp_path):
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    got = _both(capsys, tmp_path, fifo)
    assert time.monotonic() - t0 < 10
    for mode, (code, _, err, _) in got.items():
        assert code == 2 and _error(err).startswith(f"error: {fifo}: a FIFO that no process opened "
                                                    "for writing"), (mode, err)
    assert "is a FIFO: read as a stream once a process opens it for writing" in got["follow"][2]


@fifo_only
def test_a_fifo_with_a_writer_is_read_as_a_stream_both_ways(capsys, tmp_path):
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    got = _both(capsys, tmp_path, fifo, writer=_fifo_writer(fifo, _steps(1, 200, nan_at=150)))
    for mode, (code, out, err, found) in got.items():
        assert code == 1 and "Illegal seek" not in err, (mode, err)
        assert out.startswith("following") or out.startswith("read 200 steps (generic)")
        assert (150, "nonfinite", "critical") in found
    assert got["replay"][3] == got["follow"][3]
    # Its writer closed it: the end of the input.
    assert "stability: following ended at step 200 (end of input), not halted" in got["follow"][1]


def test_a_gzip_log_is_read_both_ways(capsys, tmp_path):
    path = tmp_path / "train.log.gz"
    path.write_bytes(gzip.compress(_steps(1, 60, nan_at=30).encode()))
    got = _both(capsys, tmp_path, path)
    assert got["replay"][0] == got["follow"][0] == 1
    assert (30, "nonfinite", "critical") in got["replay"][3] and got["replay"][3] == got["follow"][3]


def test_a_log_without_a_loss_is_judged_on_its_grad_norm_both_ways(capsys, tmp_path):
    path = tmp_path / "gn_only.log"
    path.write_text(_steps(1, 40, nan_at=30, key="grad_norm"))
    got = _both(capsys, tmp_path, path)
    for mode, (code, out, err, _) in got.items():
        assert code == 1 and "no training loss read; judged on: grad_norm" in out, (mode, out, err)
    assert (30, "nonfinite", "critical") in got["replay"][3] and got["replay"][3] == got["follow"][3]
    assert "no training loss read in the first 10 steps (keys: grad_norm); judged on: grad_norm" in got["follow"][2]


@pytest.mark.parametrize("first", [1, 0], ids=["1-based", "0-based"])
def test_a_failure_at_the_first_step_names_no_checkpoint_before_it(capsys, tmp_path, first):
    """A NaN at the log's first step (1, or 0 in a log numbered from 0): the nonfinite finding and
    the rollback advice both say that nothing was trained before it; neither names a checkpoint."""
    path = tmp_path / "nan_first.log"
    path.write_text(_steps(first, 30, nan_at=first))
    got = _both(capsys, tmp_path, path, "--advice", "all")
    for mode, (code, out, err, found) in got.items():
        said = " ".join(out.split())
        assert code == 1 and (first, "rollback_advice", "critical") in found, (mode, err)
        assert f"saved before step {first}" not in out + err and "<" not in out.split("rollback_advice")[1][:600]
        assert "last checkpoint before" not in said, (mode, out)
        for kind in ("nonfinite: Non-finite values at step {first}: loss=nan.", "rollback_advice: Roll back: "
                     "nonfinite at step {first}; the episode began at step {first}."):
            assert (f"{kind.format(first=first)} Nothing was trained before step {first}, so no checkpoint comes "
                    "before it: train again from the initial weights") in said, (mode, kind, out)
        assert "megatron: train again without --load" in said


def test_a_failure_at_the_second_step_of_a_log_from_0_is_not_the_first(capsys, tmp_path):
    """Step 1 of a log numbered from 0 is its second: step 0 was trained, so no finding says it
    is the first."""
    path = tmp_path / "nan_at_1.log"
    path.write_text(_steps(0, 30, nan_at=1))
    for mode, (code, out, err, found) in _both(capsys, tmp_path, path).items():
        assert code == 1 and (1, "rollback_advice", "critical") in found, (mode, err)
        assert "Nothing was trained" not in out and "initial weights" not in out, (mode, out)
        assert "roll back to the last checkpoint before this step" in " ".join(out.split()), (mode, out)


@pytest.mark.slow
def test_binary_data_after_the_first_bytes_is_left_out_both_ways(capsys, tmp_path):
    # 70 KB of text (past the first 64 KiB every input is checked on), garbage, then a NaN.
    path = tmp_path / "train.log"
    garbage = random.Random(3).randbytes(20_000).replace(b"\n", b"")
    path.write_bytes(_steps(1, 3000).encode()[:70_000].rsplit(b"\n", 1)[0] + b"\n" + garbage + b"\n"
                     + _steps(3001, 3040, nan_at=3030).encode())
    got = _both(capsys, tmp_path, path)
    assert got["replay"][3] == got["follow"][3] and (3030, "nonfinite", "critical") in got["replay"][3]
    for mode, (code, out, err, _) in got.items():
        assert code == 1, (mode, err)
        assert "1 unreadable" in out and "binary data" in err
    assert got["follow"][2].count("binary data, not text: left out, not judged") == 1


def test_refused_input_never_alerts_nor_writes_the_stop_file(capsys, tmp_path):
    """With Slack (a real local HTTP server) and ``halt_on: critical``: a safetensors file and
    random bytes are refused, nothing reaches the server, no stop file, no run log; the same
    setup on a text log with a NaN alerts and halts (so the silence is the refusal's)."""
    posts: list[str] = []
    noise = tmp_path / "noise.log"
    noise.write_bytes(random.Random(7).randbytes(200_000))
    weights = tmp_path / "model.safetensors"
    _safetensors(weights)
    nan = tmp_path / "train.log"
    nan.write_text(_steps(1, 40, nan_at=30))
    with LocalSlackInbox(on_message=posts.append) as slack:
        config = tmp_path / "halt.yaml"
        config.write_text("policy: {halt_on: critical}\n"
                          f"actions:\n  slack: {{webhook_url: '{slack.url}', min_severity: info}}\n")
        for path, code in ((weights, 2), (noise, 2), (nan, 3)):
            stop, run = tmp_path / f"STOP-{path.name}", tmp_path / f"run-{path.name}"
            argv = ["replay", str(path), "--follow", "--idle-exit-s", "0.4", "--poll-s", "0.02",
                    "--config", str(config), "--stop-file", str(stop), "--run-dir", str(run)]
            assert main(argv) == code, capsys.readouterr().err
            said = capsys.readouterr()
            if code == 2:
                assert posts == [] and not stop.exists() and not (run / "runlog.jsonl").exists()
                assert _error(said.err).startswith(f"error: {path}: not a text log")
    assert stop.exists() and any("nonfinite" in p for p in posts)


# ---------------------------------------------------------------------------------------------
# The tail, line by line.

class _Stop:
    now = False

    def __call__(self):
        return self.now


def _next_line(it, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    for item in it:
        if item[1] is not None:
            return item
        assert time.monotonic() < deadline, "no line came"
    raise AssertionError("the tail ended")


def test_a_followed_log_that_turns_binary_leaves_those_lines_out_and_goes_on(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1 loss 2.5\n")
    left_out: list[int] = []
    stop = _Stop()
    it = iter(TailLines(log, poll_s=0.001, should_stop=stop,
                        on_ignore=lambda n, text, why: left_out.append(n)))
    assert _next_line(it) == (1, "step 1 loss 2.5")
    with open(log, "ab") as f:                    # a checkpoint's bytes written into the log
        f.write(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}\n\x1f\x02\x9c\xbe\x11\n" + bytes(40) + b"step 2 loss 2.4\n")
    assert _next_line(it) == (4, "step 2 loss 2.4")   # its NULs are a hole: dropped
    assert left_out == [2, 3]
    stop.now = True
    assert [x for x in it if x[1] is not None] == []


def test_binary_from_the_first_byte_is_refused_before_a_line_goes_out(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"PK\x03\x04" + b"step 1 loss 2.5\n" * 3)
    with pytest.raises(LogFormatError, match="not a text log: a zip archive"):
        next(iter(TailLines(log, poll_s=0.001, should_stop=lambda: True)))
    log.write_bytes(bytes(3000) + b"step 1 loss 2.5\n")     # truncated under its writer: a hole
    assert list(TailLines(log, poll_s=0.001, should_stop=lambda: True)) == [(1, "step 1 loss 2.5")]
    with pytest.raises(LogFormatError, match="not standard input"):   # nothing to poll nor reopen
        next(iter(TailLines("-", should_stop=lambda: True)))


def test_a_growing_gzip_log_is_read_as_it_is_written(tmp_path):
    log = tmp_path / "train.log.gz"
    stop = _Stop()
    with gzip.open(log, "wb") as f:
        it = iter(TailLines(log, poll_s=0.001, should_stop=stop))
        f.write(b"step 1 loss 2.5\n")
        f.flush()                                 # a sync flush: the bytes so far unpack
        assert _next_line(it) == (1, "step 1 loss 2.5")
        f.write(b"step 2 loss 2.4\nstep 3 lo")
        f.flush()
        assert _next_line(it) == (2, "step 2 loss 2.4")
        f.write(b"ss 2.3\n")
    assert _next_line(it) == (3, "step 3 loss 2.3")
    stop.now = True
    assert [x for x in it if x[1] is not None] == []


@fifo_only
def test_a_fifo_ticks_idle_until_its_writer_comes_and_ends_when_it_leaves(tmp_path):
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    it = iter(TailLines(fifo, poll_s=0.001))
    assert next(it) == (0, None) and next(it) == (0, None)    # no writer: idle ticks, no hang
    with open(fifo, "w") as f:
        f.write("step 1 loss 2.5\nstep 2 lo")
        f.flush()
        assert _next_line(it) == (1, "step 1 loss 2.5")
    assert list(it) == [(2, "step 2 lo")]          # the writer closed it: the end of the input
