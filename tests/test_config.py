"""Configuration: presets load, defaults are documented truthfully, errors name the key."""
import importlib.util
import inspect
import re

import pytest
import yaml

from stability_callbacks import ConfigError, Monitor, load_config
from stability_callbacks.config import PRESETS_DIR
from stability_callbacks.detectors import DETECTORS
from stability_callbacks.policy import Policy


@pytest.mark.parametrize("name", ["default", "pretrain-fp16", "pretrain-bf16", "finetune"])
def test_presets_load_by_name_and_path(name):
    assert load_config(name) == load_config(PRESETS_DIR / f"{name}.yaml")
    Monitor(name)


@pytest.mark.end_report   # the report's real default (the suite turns it off: conftest)
def test_default_yaml_shows_the_real_defaults():
    raw = yaml.safe_load((PRESETS_DIR / "default.yaml").read_text())
    for name, shown in raw["detectors"].items():
        sig = inspect.signature(DETECTORS[name].__init__).parameters
        for k, v in shown.items():
            assert sig[k].default == v, f"detectors.{name}.{k}"
    sig = inspect.signature(Policy.__init__).parameters
    for k, v in raw["policy"].items():
        assert sig[k].default == v, f"policy.{k}"
    from stability_callbacks.config import Sampling
    from stability_callbacks.params import config_keys
    from stability_callbacks.preflight import Preflight
    from stability_callbacks.watchdog import HangWatchdog
    from stability_callbacks.forensics import Forensics
    from stability_callbacks.outcome import RunReport
    for section, cls in (("sampling", Sampling), ("preflight", Preflight), ("watchdog", HangWatchdog),
                         ("forensics", Forensics), ("report", RunReport)):  # every key, shown
        built = cls()
        assert {k: getattr(built, k) for k in config_keys(cls)} == raw[section], section


@pytest.mark.parametrize("cfg, message", [
    ({"detector": {}}, "detector: unknown section"),
    ({"detectors": {"loss_spikes": {}}}, "detectors.loss_spikes: unknown detector"),
    ({"detectors": {"loss_spike": {"z_threshold": -2}}}, r"detectors.loss_spike.z_threshold must be a positive number, got -2"),
    ({"detectors": {"loss_spike": {"z_treshold": 5}}}, "detectors.loss_spike.z_treshold: unknown key"),
    ({"policy": {"halt_on": "always"}}, "policy.halt_on must be 'never' or 'critical', got 'always'"),
    ({"phase": {"warmup_steps": -5}}, "phase.warmup_steps must be a non-negative integer or null, got -5"),
    ({"sampling": {"every_n_steps": 0}}, r"sampling.every_n_steps must be an integer ≥ 1, got 0"),
    ({"actions": {"email": {}}}, "actions.email: unknown sink"),
    ({"sampling": {"loss_streams": "cm4"}}, "sampling.loss_streams must be a list of stream names, got 'cm4'"),
    ({"actions": {"slack": {"webhook": "x"}}}, "actions.slack.webhook: unknown key"),
])
def test_bad_values_name_key_path_and_value(cfg, message):
    with pytest.raises(ConfigError, match=message):
        load_config(cfg)


def test_yaml_errors_name_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("policy:\n  halt_on: critical\n detectors: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml line \d+: not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="missing.yaml: config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_disabled_detector_is_not_built():
    m = Monitor({"detectors": {"stall": False, "divergence": {"enabled": False}}})
    names = {d.name for d in m.detectors}
    assert "stall" not in names and "divergence" not in names and "loss_spike" in names


# -- one vocabulary: every section is a constructor, every key is a keyword-only parameter -------
def _sections():
    """(config path, class, required keys) for every constructor a config maps onto."""
    from stability_callbacks.alerts import SINK_CLASSES
    from stability_callbacks.config import Sampling
    from stability_callbacks.phase import PhaseTracker
    from stability_callbacks.preflight import Preflight
    required = {"slack": {"webhook_url": "http://x.test/h"}, "webhook": {"url": "http://x.test/h"},
                "apprise": {"urls": "json://localhost/x"}}
    from stability_callbacks.forensics import Forensics
    out = [("sampling", Sampling, {}), ("phase", PhaseTracker, {}), ("policy", Policy, {}),
           ("preflight", Preflight, {}), ("forensics", Forensics, {})]
    out += [(f"detectors.{n}", cls, {}) for n, cls in DETECTORS.items()]
    out += [(f"actions.{n}", cls, required.get(n, {})) for n, cls in SINK_CLASSES.items()
            if n != "apprise" or importlib.util.find_spec("apprise") is not None]   # optional
    return out


def _nest(path: str, kwargs: dict) -> dict:
    head, _, rest = path.partition(".")
    return {head: {rest: kwargs}} if rest else {head: kwargs}


def test_every_numeric_key_of_every_section_rejects_a_bad_value_naming_path_and_value():
    from stability_callbacks.params import config_keys
    checked = 0
    for path, cls, required in _sections():
        for key, p in config_keys(cls).items():
            if not isinstance(p.default, (int, float)) or isinstance(p.default, bool):
                continue
            with pytest.raises(ConfigError) as err:
                load_config(_nest(path, {**required, key: -1}))
            assert re.fullmatch(rf"{re.escape(path)}\.{key} must be .+, got -1", str(err.value)), err.value
            checked += 1
    assert checked >= 100


def test_sections_keep_their_arguments_and_sampling_its_defaults():
    cfg = load_config({"sampling": {"every_n_steps": 4, "loss_streams": ["cm4"]}})
    assert cfg["sampling"] == {"every_n_steps": 4, "adam_every_n_steps": 1,
                               "param_norm_every_n_steps": 0, "loss_streams": ["cm4"]}
    assert load_config(None)["actions"] == {"log": {"min_severity": "info"}}
    assert load_config({"actions": None})["actions"] == {}
    assert load_config({"actions": {"log": {}, "slack": False}})["actions"] == {"log": {}}


def test_sink_keys_are_their_constructor_signatures():
    from stability_callbacks.alerts import SINK_CLASSES
    from stability_callbacks.params import config_keys
    assert list(SINK_CLASSES) == ["log", "slack", "webhook", "apprise", "wandb", "tensorboard", "trackio"]
    assert sorted(config_keys(SINK_CLASSES["tensorboard"])) == [
        "log_dir", "metrics", "metrics_every_n_steps", "min_severity", "queue_size", "rate_limit_s"]   # `writer` is not config
    assert sorted(config_keys(SINK_CLASSES["wandb"])) == [
        "metrics", "metrics_every_n_steps", "min_severity", "queue_size", "rate_limit_s", "wait_duration_s"]   # nor `run`
    assert sorted(config_keys(SINK_CLASSES["trackio"])) == [
        "metrics", "metrics_every_n_steps", "min_severity", "project", "queue_size", "rate_limit_s"]   # nor `run`, `run_name`
    with pytest.raises(ConfigError, match=r"^actions\.webhook\.url: required key missing$"):
        load_config({"actions": {"webhook": {}}})


def test_config_validation_never_reads_the_environment(monkeypatch):
    """A replay of a training config needs no Slack secret: the variable is read when the
    sinks are built for a run, not when the config is loaded."""
    monkeypatch.delenv("SLACK_WEBHOOK_URL", raising=False)
    cfg = load_config({"actions": {"slack": {"webhook_url": "${SLACK_WEBHOOK_URL}"}}})
    Monitor(cfg)
    from stability_callbacks.alerts import build_sinks
    with pytest.raises(ConfigError, match=r"^actions\.slack\.webhook_url: environment variable "
                                          r"SLACK_WEBHOOK_URL is not set$"):
        build_sinks(cfg["actions"], is_rank0=True, run_name="r")
