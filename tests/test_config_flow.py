"""The configuration's flow (docs/design.md, Configuration): a YAML file and ``section.key=value``
overrides are read ONCE into the typed tree, and each runtime object is built from it once,
on a real tiny HF run and on ``replay``; ``--set`` / ``overrides=`` everywhere a config is taken,
a wrong key named with a close match."""
from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pytest

from stability_callbacks import ConfigError, Monitor, load_config
from stability_callbacks import config as config_module
from stability_callbacks.alerts import SINK_CLASSES
from stability_callbacks.cli import main
from stability_callbacks.config import Config
from stability_callbacks.detectors import DETECTORS
from stability_callbacks.forensics import Forensics
from stability_callbacks.phase import PhaseTracker
from stability_callbacks.policy import Policy
from stability_callbacks.preflight import Preflight
from stability_callbacks.watchdog import HangWatchdog

DATA = Path(__file__).resolve().parent / "data"
LOG = DATA / "real_logs" / "bs_tr11_176B_spike31216.csv"
BUILT = (PhaseTracker, Policy, HangWatchdog, Forensics, Preflight, *DETECTORS.values(), *SINK_CLASSES.values())


@pytest.fixture
def counted(monkeypatch):
    """``(reads, built)``: how often a config source was read, and how many objects of each
    class were constructed from the config: the outermost constructions (a subclass's
    ``super().__init__``, or the per-stream ``LossSpike`` a ``StreamLossSpike`` makes for itself,
    is part of the object being built)."""
    reads: list = []
    built: Counter = Counter()
    depth = [0]
    real_read = config_module._read

    def read(source):
        reads.append(source)
        return real_read(source)
    monkeypatch.setattr(config_module, "_read", read)
    for cls in BUILT:
        init = cls.__init__

        def counting(self, *args, _init=init, _cls=cls, **kwargs):
            if depth[0] == 0:
                built[_cls.__name__] += 1
            depth[0] += 1
            try:
                _init(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        monkeypatch.setattr(cls, "__init__", functools.wraps(init)(counting))
    return reads, built


def _yaml(tmp_path) -> Path:
    path = tmp_path / "stability.yaml"
    path.write_text("policy: {save_on: warning}\ndetectors: {loss_spike: {z_threshold: 6}}\n"
                    "actions: {log: {min_severity: warning}}\n")
    return path


def _each_once(built: Counter) -> None:
    """Every object of the config built once: to validate it, and that one is the run's (a
    replay does not use the watchdog, forensics, preflight or sinks, built once all the same)."""
    want = {"PhaseTracker", "Policy", "HangWatchdog", "Forensics", "Preflight", "LogFindings",
            *(cls.__name__ for cls in DETECTORS.values())}
    assert dict(built) == {name: 1 for name in want}


def test_a_replay_reads_the_config_once_and_builds_each_object_once(tmp_path, counted, capsys):
    reads, built = counted
    code = main(["replay", str(LOG), "--config", str(_yaml(tmp_path)), "--set", "policy.halt_on=critical",
                 "--set", "detectors.loss_spike.z_threshold=7", "--json", str(tmp_path / "out.jsonl")])
    assert code == 0 and len(reads) == 1
    _each_once(built)


def test_a_live_hf_run_reads_the_config_once_and_builds_each_object_once(tmp_path, counted, one_thread):
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    from stability_callbacks.demo.scenarios import build_scenario
    from stability_callbacks.integrations.hf import StabilityCallback

    reads, built = counted
    sc = build_scenario("healthy", max_steps=4)
    cb = StabilityCallback(config=_yaml(tmp_path), overrides={"policy.halt_on": "critical"},
                           run_dir=tmp_path / "stability")
    args = TrainingArguments(output_dir=str(tmp_path / "ckpt"), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=1e-3, save_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True)
    Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset(), callbacks=[cb]).train()
    assert cb.run.steps_watched == 4 and len(reads) == 1
    _each_once(built)
    # The setting, from the override to its one object.
    assert cb.config.policy.halt_on == "critical" and cb.run.monitor.policy.halt_on == "critical"
    assert cb.config.detectors.loss_spike.z_threshold == 6 == cb.run.monitor._loss_spike.z_threshold


def test_overrides_in_the_python_api_and_what_they_name():
    cfg = load_config("pretrain-fp16", {"policy.halt_on": "critical", "detectors.not_learning": False,
                                        "detectors.loss_spike.z_threshold": 7})
    assert isinstance(cfg, Config) and cfg["policy"]["halt_on"] == "critical"
    assert cfg.policy.halt_on == "critical" and cfg.policy.save_on == "warning"   # the constructor's default
    assert "not_learning" in cfg.detectors.off and "not_learning" not in cfg.detectors.on
    # streams are judged like the main loss: its keys are theirs unless set apart
    assert cfg.detectors.stream_loss_spike.z_threshold == 7
    m = Monitor("pretrain-fp16", overrides={"policy.halt_on": "critical"})
    assert m.policy.halt_on == "critical" and m.config.source == "pretrain-fp16"
    assert Monitor(cfg).config is cfg
    for overrides, message in [
        ({"policy.halt_onn": "critical"}, r"^policy\.halt_onn: unknown key \(known: .*\); did you mean halt_on\?$"),
        ({"polcy.halt_on": "critical"}, r"^polcy\.halt_on: unknown section 'polcy' .*; did you mean policy\?$"),
        ({"detectors.loss_spik.z_threshold": 7}, r"unknown detector 'loss_spik' .*; did you mean loss_spike\?$"),
        ({"policy.halt_on": "sometimes"}, r"^policy\.halt_on must be 'never' or 'critical', got 'sometimes'$"),
        ({"policy": "critical"}, r"^policy: an override names section\.key"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config("pretrain-fp16", overrides)
    # a YAML file's key set wrong names the file; an override's does not
    with pytest.raises(ConfigError, match=r"^policy\.halt_onn: unknown key"):
        load_config(None, {"policy.halt_onn": 1})


def test_set_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "f.jsonl"
    assert main(["replay", str(LOG), "--json", str(out)]) == 0
    base = [json.loads(x) for x in out.read_text().splitlines()][1:]
    assert main(["replay", str(LOG), "--json", str(out), "--set", "detectors.loss_spike=false",
                 "--set", "detectors.stream_loss_spike=false"]) in (0, 1)
    fewer = [json.loads(x) for x in out.read_text().splitlines()][1:]
    assert any(f["kind"] == "loss_spike" for f in base) and not any(f["kind"] == "loss_spike" for f in fewer)
    capsys.readouterr()
    assert main(["replay", str(LOG), "--set", "policy.halt_onn=critical"]) == 2
    assert capsys.readouterr().err.strip().endswith("did you mean halt_on?")
    assert main(["replay", str(LOG), "--set", "policy.halt_on"]) == 2
    assert "expected section.key=value" in capsys.readouterr().err
    cfg = DATA / "preflight"
    model = next(p for p in sorted(cfg.rglob("config.json")))
    assert main(["preflight", str(model), "--set", "preflight.enabled=flase"]) == 2
    assert "preflight.enabled must be true or false, got 'flase'" in capsys.readouterr().err


def test_lightning_state_key_tells_overrides_apart():
    pytest.importorskip("lightning")
    from stability_callbacks.integrations.lightning import StabilityCallback

    a = StabilityCallback(config="pretrain-fp16")
    b = StabilityCallback(config="pretrain-fp16", overrides={"policy.halt_on": "critical"})
    c = StabilityCallback(config="pretrain-fp16", overrides={"policy.halt_on": "critical"})
    assert a.state_key == "StabilityCallback{'config': 'pretrain-fp16'}"
    assert b.state_key != a.state_key and b.state_key == c.state_key
    assert b.state_key.startswith("StabilityCallback{'config': 'pretrain-fp16+")
    with pytest.raises(ValueError, match="overrides apply to config"):
        StabilityCallback(monitor=Monitor(), overrides={"policy.halt_on": "critical"})
