"""Configuration: presets load, defaults are documented truthfully, errors name the key."""
import inspect

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


def test_default_yaml_shows_the_real_defaults():
    raw = yaml.safe_load((PRESETS_DIR / "default.yaml").read_text())
    for name, shown in raw["detectors"].items():
        sig = inspect.signature(DETECTORS[name].__init__).parameters
        for k, v in shown.items():
            assert sig[k].default == v, f"detectors.{name}.{k}"
    sig = inspect.signature(Policy.__init__).parameters
    for k, v in raw["policy"].items():
        assert sig[k].default == v, f"policy.{k}"


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
