"""The hang watchdog's rule on given clocks, its config section, and what a crash alert may
carry. The real thing (a stalled HF run, a raising one, a real local endpoint) is in
tests/test_hf.py, test_lightning.py and test_deepspeed.py."""
from __future__ import annotations

import pytest

from stability_callbacks.config import ConfigError, load_config
from stability_callbacks.live import exception_text
from stability_callbacks.watchdog import ARMED_AFTER, HangWatchdog


def test_the_section_is_validated_with_its_key_path():
    assert load_config(None)["watchdog"] == {}
    assert load_config({"watchdog": {"hang_min_s": 60}})["watchdog"] == {"hang_min_s": 60}
    with pytest.raises(ConfigError, match=r"^watchdog.hang_factor must be a positive number, got 0$"):
        load_config({"watchdog": {"hang_factor": 0}})
    with pytest.raises(ConfigError, match=r"^watchdog.enabled must be true or false, got 'no'$"):
        load_config({"watchdog": {"enabled": "no"}})
    with pytest.raises(ConfigError, match=r"^watchdog.hang_mins: unknown key \(known: enabled, "
                                          r"hang_factor, hang_min_s\); did you mean hang_min_s\?$"):
        load_config({"watchdog": {"hang_mins": 5}})


def test_armed_after_three_steps_then_one_alert_per_stall():
    w = HangWatchdog(hang_factor=10, hang_min_s=2)
    # Steps every 0.5 s; the threshold is max(10 x 0.5 s, 2 s) = 5 s.
    times = [0.0, 0.5]
    assert ARMED_AFTER == 3 and w.check(100.0, 2, times) is None      # not armed: 2 steps
    times.append(1.0)
    assert w.threshold_s(times) == (5.0, 0.5)
    assert w.check(5.9, 3, times) is None                              # 4.9 s: not yet
    hang = w.check(6.0, 3, times)
    assert (hang.step, hang.kind, hang.severity, hang.value, hang.baseline, hang.threshold) == \
        (3, "hang", "critical", 5.0, 0.5, 5.0)
    assert hang.message.startswith("No training progress for 5 s after step 3, where a step takes "
                                   "0.5 s (alert after max(10 x median, 2 s) = 5 s).")
    assert [w.check(t, 3, times) for t in (7.0, 60.0)] == [None, None]   # once per stall
    times += [61.0, 61.5]                                              # steps 4 and 5
    done = w.check(61.6, 5, times)
    assert (done.step, done.kind, done.severity, done.value, done.details) == \
        (4, "hang_resolved", "info", 60.0, {"stall_s": 60.0, "stalled_step": 3})
    assert done.message.startswith("Training is moving again: step 4 finished 60 s after the last "
                                   "progress at step 3.")
    assert w.check(62.0, 5, times) is None
    # The stall itself moved no median (0.5 s); the next stall alerts again.
    again = w.check(61.5 + 5.0, 5, times)
    assert (again.step, again.kind, again.threshold) == (5, "hang", 5.0)


def test_a_long_checkpoint_write_now_and_then_leaves_the_median_alone():
    w = HangWatchdog(hang_factor=4, hang_min_s=1)
    times = [0.0, 1.0, 2.0, 32.0, 33.0, 34.0]     # a 30 s save between steps 3 and 4
    assert w.threshold_s(times) == (4.0, 1.0)


def test_evaluation_batches_are_progress():
    w = HangWatchdog(hang_factor=10, hang_min_s=1)
    times = [0.0, 0.1, 0.2]                        # threshold 1 s
    assert w.check(1.5, 3, times, alive_at_s=1.0) is None   # evaluating since step 3
    hang = w.check(2.0, 3, times, alive_at_s=1.0)           # then nothing for 1 s
    assert (hang.step, hang.kind, hang.value) == (3, "hang", 1.0)
    back = w.check(3.0, 3, times, alive_at_s=2.5)           # evaluation goes on
    assert (back.step, back.kind, back.value) == (3, "hang_resolved", 1.5)
    assert "evaluation batches are coming again" in back.message


def test_disabled_starts_no_thread():
    w = HangWatchdog(enabled=False)
    w.start(lambda: (0, [], None), lambda finding: None)
    assert w._thread is None
    w.stop()


def test_a_crash_alert_carries_one_line_without_secrets(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefgh12345")
    monkeypatch.setenv("NUM_WORKERS", "12345678")               # not a secret's name: kept
    exc = RuntimeError("auth failed for hf_abcdefgh12345 with 12345678 workers via "
                       "s3://key:secret@bucket.example/run/ckpt?sig=XYZ\nTraceback-ish detail")
    assert exception_text(exc) == ("auth failed for *** with 12345678 workers via "
                                   "s3://bucket.example/...")
    assert exception_text(ValueError("x" * 500)) == "x" * 197 + "..."
    assert exception_text(KeyError()) == ""
