"""Preflight audit: pure rules, the torch-side measurement on tiny real models, the offline CLI."""
from __future__ import annotations

import doctest
import json
import math
import os

import pytest
import torch

from stability_callbacks import preflight as preflight_mod
from stability_callbacks.integrations.torch import preflight as torch_side
from stability_callbacks.integrations.torch.preflight import collect_facts
from stability_callbacks.cli import main as cli_main
from stability_callbacks.config import load_config
from stability_callbacks.preflight import Preflight, PreflightFacts, audit, init_std_formulas

DATA = os.path.join(os.path.dirname(__file__), "data", "preflight")


def signals(findings):
    return [(f.signal, f.severity) for f in findings]


def test_doctests_are_the_spec():
    for mod in (preflight_mod, torch_side):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


# -- pure rules ---------------------------------------------------------------------------------
def test_formulas_match_the_bloom_numbers():
    f = init_std_formulas(14336)
    assert round(f["mt_nlg_530b"], 5) == 0.00482       # what BLOOM-176B used
    assert round(f["transformers_without_tears"], 5) == 0.00528


def test_megatron_default_on_a_4096_wide_model_is_flagged_with_the_issue_numbers():
    facts = PreflightFacts(hidden_size=4096, layer_init_std={"layers.0": 0.02, "layers.1": 0.02,
                                                              "layers.10": 0.0085})
    [f] = audit(facts)
    assert (f.step, f.kind, f.severity, f.signal) == (0, "preflight", "warning", "init_std")
    assert f.value == 0.02
    assert f.baseline == pytest.approx(math.sqrt(1 / (3 * 4096)))
    assert f.threshold == pytest.approx(1.5 * math.sqrt(1 / (3 * 4096)))
    assert f.details["layers"] == ["layers.0", "layers.1"]
    assert "arXiv:2201.11990" in f.details["source"] and "arXiv:1910.05895" in f.details["source"]
    assert "2.2x the 0.0090" in f.message and "Re-initialise with std≈0.0090" in f.message


def test_init_rule_thresholds_and_gates():
    # 0.02 passes on GPT-2 widths (768..1600) and is flagged from 2048 on
    assert audit(PreflightFacts(hidden_size=1600, layer_init_std={"h.0": 0.02})) == []
    assert signals(audit(PreflightFacts(hidden_size=2048, layer_init_std={"h.0": 0.02}))) == [
        ("init_std", "warning")]
    # narrow models are not checked unless the knob says so
    narrow = PreflightFacts(hidden_size=64, layer_init_std={"h.0": 0.2})
    assert audit(narrow) == []
    assert signals(audit(narrow, min_hidden_size_for_init=0)) == [("init_std", "warning")]
    # a fine-tune's weights are trained, not initialised
    assert audit(PreflightFacts(hidden_size=4096, layer_init_std={"h.0": 0.02},
                                weights_pretrained=True)) == []
    # offline: the config's initializer_range stands in for the measurement
    [f] = audit(PreflightFacts(hidden_size=14336, initializer_range=0.02))
    assert f.details["measured_from"] == "initializer_range" and "4.1x" in f.message
    # a measurement wins over the config value
    assert audit(PreflightFacts(hidden_size=4096, initializer_range=0.02,
                                layer_init_std={"h.0": 0.009})) == []


def test_beta2_only_on_large_adam_models():
    big = dict(hidden_size=4096, betas=(0.9, 0.999), optimizer="AdamW")
    [f] = audit(PreflightFacts(**big))
    assert (f.signal, f.severity, f.value, f.baseline, f.threshold) == (
        "adam_beta2", "warning", 0.999, 0.95, 0.99)
    assert "~1000 steps" in f.message and "chronicles" in f.details["source"]
    assert audit(PreflightFacts(**{**big, "betas": (0.9, 0.95)})) == []
    assert audit(PreflightFacts(**{**big, "hidden_size": 512, "num_params": 10**8})) == []
    assert signals(audit(PreflightFacts(hidden_size=512, num_params=10**8, betas=(0.9, 0.999)),
                         large_model_min_params=10**6)) == [("adam_beta2", "warning")]
    # Lion's beta2 = 0.99 default means something else: not an Adam rule
    assert audit(PreflightFacts(**{**big, "optimizer": "Lion", "betas": (0.9, 0.999)})) == []


def test_warmup_missing_short_and_fine():
    large = dict(hidden_size=4096)
    [f] = audit(PreflightFacts(**large, warmup_steps=0, total_steps=100_000))
    assert (f.signal, f.severity, f.value, f.baseline) == ("warmup_steps", "warning", 0.0, 100.0)
    assert "No LR warmup in a 100000-step run" in f.message
    [f] = audit(PreflightFacts(**large, warmup_steps=50, total_steps=100_000))
    assert (f.signal, f.value, f.threshold) == ("warmup_steps", 50.0, 100.0)
    assert audit(PreflightFacts(**large, warmup_steps=117, total_steps=100_000)) == []   # GPT-3
    # a short run needs only 1% of its length
    assert audit(PreflightFacts(**large, warmup_steps=10, total_steps=1000)) == []
    [f] = audit(PreflightFacts(**large, warmup_steps=5, total_steps=1000))
    assert f.threshold == 10.0
    # small models: a note, not a warning; unknown warmup: nothing
    assert signals(audit(PreflightFacts(hidden_size=256, warmup_steps=0))) == [("warmup_steps", "info")]
    assert audit(PreflightFacts(**large, total_steps=1000)) == []
    # the reason is Adam's second moment: plain SGD gets no note; AdamW and an unknown optimizer do
    assert audit(PreflightFacts(hidden_size=256, warmup_steps=0, optimizer="SGD")) == []
    assert signals(audit(PreflightFacts(hidden_size=256, warmup_steps=0, optimizer="AdamW"))) == [("warmup_steps", "info")]


def test_precision_and_attention_scale():
    assert signals(audit(PreflightFacts(precision="fp16", bf16_available=True))) == [("precision", "warning")]
    assert signals(audit(PreflightFacts(precision="fp16"))) == [("precision", "info")]
    assert audit(PreflightFacts(precision="fp16", bf16_available=False)) == []
    assert audit(PreflightFacts(precision="bf16", bf16_available=True, attention_scale_after_qk=True)) == []
    assert signals(audit(PreflightFacts(precision="fp16", bf16_available=False,
                                        attention_scale_after_qk=True))) == [("attention_scale", "warning")]


def test_lion_weight_decay():
    [f] = audit(PreflightFacts(optimizer="DecoupledLionW", weight_decay=2.56e-5, weight_decay_decoupled=True))
    assert (f.signal, f.severity, f.value) == ("weight_decay", "warning", 2.56e-5)
    assert "~60k steps" in f.message
    assert signals(audit(PreflightFacts(optimizer="Lion", weight_decay=0.1,
                                        weight_decay_decoupled=False))) == [("weight_decay", "info")]
    assert audit(PreflightFacts(optimizer="Lion", weight_decay=0.0)) == []
    assert audit(PreflightFacts(optimizer="AdamW", weight_decay=0.1, weight_decay_decoupled=True)) == []


def test_embedding_notes_on_large_models_only():
    facts = PreflightFacts(hidden_size=4096, has_embedding_layernorm=False,
                           embedding_init_std={"wte": 1.0, "wpe": 0.005})
    fs = audit(facts)
    assert signals(fs) == [("embedding_layernorm", "info"), ("embedding_init_std", "info")]
    assert fs[1].details["layers"] == ["wte"]
    assert audit(PreflightFacts(hidden_size=512, has_embedding_layernorm=False)) == []
    assert audit(PreflightFacts(hidden_size=4096, has_embedding_layernorm=True)) == []


@pytest.mark.parametrize("key,value", [("init_std_factor", 0), ("max_adam_beta2", 1.0),
                                       ("min_warmup_fraction", -0.1), ("min_warmup_steps", "100")])
def test_bad_thresholds_raise_naming_key_and_value(key, value):
    with pytest.raises(ValueError, match=rf"^preflight\.{key} .*{value!r}"):
        load_config({"preflight": {key: value}})
    with pytest.raises(ValueError, match=rf"^{key} .*{value!r}"):
        Preflight(**{key: value})


# -- torch side on tiny real models -------------------------------------------------------------
def _wide_linear(std=None, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(2048, 2048)
    if std is not None:
        torch.nn.init.normal_(lin.weight, std=std)
        torch.nn.init.zeros_(lin.bias)
    return lin


def test_badly_configured_wide_model_fp16_beta2_no_warmup():
    from transformers import get_linear_schedule_with_warmup

    model = _wide_linear(std=0.02)                      # Megatron's default on a 2048-wide layer
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999))
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=10_000)
    facts = collect_facts(model, opt, sched, precision="fp16", bf16_available=True)
    assert (facts.hidden_size, facts.warmup_steps, facts.total_steps) == (2048, 0, 10_000)
    assert facts.optimizer == "AdamW" and facts.weight_decay_decoupled is True
    assert facts.num_params == 2048 * 2048 + 2048
    assert facts.layer_init_std["<root>"] == pytest.approx(0.02, rel=0.01)   # sampled: 4M > 1M
    assert json.loads(json.dumps(facts.to_json()))["betas"] == [0.9, 0.999]
    fs = audit(facts)
    assert [(f.step, f.kind) for f in fs] == [(0, "preflight")] * 4
    assert signals(fs) == [("init_std", "warning"), ("precision", "warning"),
                           ("adam_beta2", "warning"), ("warmup_steps", "warning")]


def test_well_configured_wide_model_has_no_findings():
    from transformers import get_linear_schedule_with_warmup

    model = _wide_linear()      # PyTorch's default init: 1/sqrt(3*fan_in), the MT-NLG formula
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=200, num_training_steps=10_000)
    facts = collect_facts(model, opt, sched, precision="bf16", bf16_available=True)
    assert facts.layer_init_std["<root>"] == pytest.approx(math.sqrt(1 / (3 * 2048)), rel=0.01)
    assert audit(facts) == []


def test_sampling_bounds_the_work_and_keeps_the_estimate():
    model = _wide_linear(std=0.02)
    facts = collect_facts(model, max_sample_elements=1000)
    # 4,194,304 values read as 1000 (stride 4195, odd): a 1000-sample std is within ~2%
    assert torch_side._sampled_numel(model.weight, 1000) == 1000
    assert facts.layer_init_std["<root>"] == pytest.approx(0.02, rel=0.08)


def test_tiny_gpt2_groups_layers_and_reads_the_config():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32,
                     initializer_range=0.2)
    model = GPT2LMHeadModel(cfg)
    facts = collect_facts(model)
    assert (facts.hidden_size, facts.num_layers, facts.initializer_range) == (64, 2, 0.2)
    assert sorted(facts.layer_init_std) == ["transformer.h.0", "transformer.h.1"]  # lm_head tied
    assert sorted(facts.embedding_init_std) == ["transformer.wpe", "transformer.wte"]
    assert facts.has_embedding_layernorm is False and facts.weights_pretrained is False
    assert facts.num_params == sum(p.numel() for p in model.parameters())
    fs = audit(facts, min_hidden_size_for_init=0)
    assert signals(fs) == [("init_std", "warning")]
    assert fs[0].details["layers"] == ["transformer.h.0", "transformer.h.1"]


def test_tiny_bloom_embedding_layernorm_and_scale_after_qk_in_fp16():
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(hidden_size=64, n_layer=2, n_head=2, vocab_size=100))
    facts = collect_facts(model, precision="fp16", bf16_available=False)
    assert facts.has_embedding_layernorm is True and facts.attention_scale_after_qk is True
    assert signals(audit(facts)) == [("attention_scale", "warning")]


def test_loaded_checkpoint_counts_as_pretrained(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50,
                               n_positions=16)).save_pretrained(tmp_path)
    assert collect_facts(GPT2LMHeadModel.from_pretrained(tmp_path)).weights_pretrained is True
    assert collect_facts(GPT2LMHeadModel.from_pretrained(tmp_path),
                         weights_pretrained=False).weights_pretrained is False

    class Wrapper(torch.nn.Module):      # a LightningModule-like owner of an HF model
        def __init__(self):
            super().__init__()
            self.net = GPT2LMHeadModel.from_pretrained(tmp_path)

    facts = collect_facts(Wrapper())
    assert (facts.weights_pretrained, facts.hidden_size, facts.num_layers) == (True, 32, 1)
    assert sorted(facts.layer_init_std) == ["net.transformer.h.0"]


class DecoupledLionW(torch.optim.Optimizer):
    """Composer's DecoupledLionW update rule in small (the longer-than-chinchilla 3B run)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay, initial_lr=lr))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - g["weight_decay"] * g["lr"] / g["initial_lr"])
                p.add_(torch.sign(m * g["betas"][0] + p.grad * (1 - g["betas"][0])), alpha=-g["lr"])
                m.lerp_(p.grad, 1 - g["betas"][1])


def test_lion_and_scheduler_shapes():
    model = torch.nn.Linear(8, 8)
    lion = DecoupledLionW(model.parameters(), lr=2.56e-4, weight_decay=2.56e-5)
    facts = collect_facts(model, lion)
    assert (facts.optimizer, facts.weight_decay_decoupled, facts.weight_decay) == ("DecoupledLionW", True, 2.56e-5)
    assert signals(audit(facts)) == [("weight_decay", "warning")]

    opt = torch.optim.Adam(model.parameters())
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=50)
    seq = torch.optim.lr_scheduler.SequentialLR(
        opt, [warm, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=950)], milestones=[50])
    assert collect_facts(model, opt, seq, total_steps=1000).warmup_steps == 50
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    one = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1000, pct_start=0.3)
    f = collect_facts(model, opt, one)
    assert (f.warmup_steps, f.total_steps) == (300, 1000)
    lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 10))
    assert collect_facts(model, opt, lam).warmup_steps == 10
    const = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    assert collect_facts(model, opt, const).warmup_steps == 0
    # the scheduler in use wins over a framework's warmup argument; the argument counts without one
    assert collect_facts(model, opt, const, warmup_steps=7).warmup_steps == 0
    assert collect_facts(model, opt, warmup_steps=7).warmup_steps == 7


class _WarmupCosine(torch.optim.lr_scheduler.LRScheduler):
    """A hand-written scheduler: 30 warmup steps, then cosine (no lambda to call, no known name)."""

    def get_lr(self):
        t = self.last_epoch
        f = t / 30 if t < 30 else 0.5 * (1 + math.cos(math.pi * (t - 30) / 970))
        return [base * f for base in self.base_lrs]


def test_any_scheduler_is_read_by_evaluating_its_lr_without_stepping_it():
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = _WarmupCosine(opt)
    state = (sched.state_dict(), [dict(g) for g in opt.param_groups])
    assert collect_facts(model, opt, sched, warmup_steps=0, total_steps=1000).warmup_steps == 30
    assert (sched.state_dict(), [dict(g) for g in opt.param_groups]) == state   # untouched
    restarts = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=100)
    assert collect_facts(model, opt, restarts).warmup_steps == 0
    opt.step()
    sched.step()   # a scheduler that has stepped (a resume) would show the rest of its course only
    assert collect_facts(model, opt, sched).warmup_steps is None


@pytest.mark.slow
def test_hf_trainer_with_a_hand_made_lambdalr_warmup_is_not_told_it_has_none(tmp_path):
    # TrainingArguments say warmup_steps=0; the LambdaLR passed in warms up over 30 steps
    transformers = pytest.importorskip("transformers")
    from stability_callbacks.integrations.hf import StabilityCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=2048, n_layer=1, n_head=16)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 30))
    ids = torch.randint(0, 64, (16, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    cb = StabilityCallback(run_dir=tmp_path)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8,
                                          report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, sched), callbacks=[cb]).train()
    pre = [f for f in cb.findings if f.kind == "preflight"]
    assert pre and not [f for f in pre if f.signal == "warmup_steps"], [f.message for f in pre]


def test_unreadable_parts_degrade_to_unknown(caplog):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def stateful(step):          # a lambda that refuses to be probed
        calls.append(step)
        if len(calls) > 1:
            raise RuntimeError("not a pure function")
        return 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, stateful)
    facts = collect_facts(model, object(), sched)
    assert facts.warmup_steps is None and facts.optimizer == "object" and facts.betas is None
    with pytest.raises(ValueError, match="preflight.precision .*'fp8'"):
        collect_facts(model, precision="fp8")


# -- offline CLI ---------------------------------------------------------------------------------
def test_cli_wide_fp16_config_with_training_flags(capsys):
    rc = cli_main(["preflight", os.path.join(DATA, "wide_fp16"), "--bf16-available", "yes", "--beta2", "0.999",
               "--warmup-steps", "0", "--total-steps", "100000", "--json"])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 1
    assert [(o["signal"], o["severity"]) for o in out] == [
        ("init_std", "warning"), ("embedding_layernorm", "info"), ("precision", "warning"),
        ("adam_beta2", "warning"), ("warmup_steps", "warning")]
    assert all(o["type"] == "finding" and o["kind"] == "preflight" and o["step"] == 0 for o in out)
    assert out[0]["value"] == 0.02 and out[0]["details"]["measured_from"] == "initializer_range"


def test_cli_config_file_alone(capsys):
    rc = cli_main(["preflight", os.path.join(DATA, "wide_fp16", "config.json")])
    out = capsys.readouterr().out
    assert rc == 1
    assert [line.split(":")[0] for line in out.splitlines()] == [
        "[warning] init_std", "[info] embedding_layernorm", "[info] precision"]


def test_cli_bloom_shaped_config_is_clean(capsys):
    assert cli_main(["preflight", os.path.join(DATA, "bloom_like")]) == 0
    assert "no known cause of instability" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["broken.json", "missing.json", "no_config_dir"])
def test_cli_unreadable_input_exits_2_naming_the_file(name, tmp_path, capsys):
    path = os.path.join(DATA, name) if name != "no_config_dir" else str(tmp_path)
    assert cli_main(["preflight", path]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and (name if name != "no_config_dir" else "config.json") in err


def test_cli_lion_flags(capsys):
    rc = cli_main(["preflight", os.path.join(DATA, "bloom_like"), "--optimizer", "DecoupledLionW",
               "--weight-decay", "2.56e-5", "--warmup-steps", "2000", "--total-steps", "200000"])
    assert rc == 1
    assert capsys.readouterr().out.startswith("[warning] weight_decay: DecoupledLionW with decoupled")


def test_framework_precision_names():
    lin = torch.nn.Linear(4, 4)
    assert collect_facts(lin, precision="16-mixed").precision == "fp16"
    assert collect_facts(lin, precision=torch.bfloat16).precision == "bf16"
    assert collect_facts(lin.half()).precision == "fp16"       # half weights say it themselves
    assert collect_facts(torch.nn.Linear(4, 4)).precision is None   # fp32 weights: maybe AMP


def test_rules_import_without_torch():
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "from stability_callbacks.preflight import audit, PreflightFacts\n"
            "print(len(audit(PreflightFacts(hidden_size=4096, initializer_range=0.02))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


# -- the `preflight` config section: one set of thresholds for the CLI and the integrations ------
def test_preflight_section_is_validated_and_false_turns_it_off():
    assert load_config(None)["preflight"] == {}
    assert load_config({"preflight": False})["preflight"] == {"enabled": False}
    cfg = load_config({"preflight": {"init_std_factor": 3.0, "max_sample_elements": 4096}})
    assert cfg["preflight"] == {"init_std_factor": 3.0, "max_sample_elements": 4096}
    with pytest.raises(ValueError, match=r"^preflight\.init_std_facter: unknown key \(known: enabled, "):
        load_config({"preflight": {"init_std_facter": 3.0}})


def test_integrations_audit_with_the_run_configs_thresholds(tmp_path):
    from stability_callbacks.integrations.torch.preflight import run_preflight
    from stability_callbacks.live import LiveRun

    model = _wide_linear(std=0.02)          # 2.6x sqrt(1/(3*2048)): flagged at the default 1.5x
    found = {}
    for name, section in [("default", {}), ("lenient", {"init_std_factor": 3.0}),
                          ("off", False), ("narrow-only", {"min_hidden_size_for_init": 4096})]:
        run = LiveRun(config={"actions": {}, "preflight": section}, run_dir=tmp_path / name)
        found[name] = signals(run_preflight(run, model))
        run.close()
        log = tmp_path / name / "runlog.jsonl"   # opened by the first line it holds
        lines = log.read_text().splitlines() if log.exists() else []
        assert [json.loads(x)["signal"] for x in lines if '"finding"' in x] == [s for s, _ in found[name]]
    assert found == {"default": [("init_std", "warning")], "lenient": [], "off": [], "narrow-only": []}


def test_cli_takes_the_thresholds_from_config(tmp_path, capsys):
    wide = os.path.join(DATA, "wide_fp16")
    cfg = tmp_path / "stability.yaml"
    cfg.write_text("preflight: {init_std_factor: 10.0}\n")
    assert cli_main(["preflight", wide]) == 1
    assert capsys.readouterr().out.splitlines()[0].startswith("[warning] init_std:")
    assert cli_main(["preflight", wide, "--config", str(cfg)]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "[info] embedding_layernorm", "[info] precision"]
    cfg.write_text("preflight: {init_std_factor: -1}\n")
    assert cli_main(["preflight", wide, "--config", str(cfg)]) == 2
    assert capsys.readouterr().err == (f"error: {cfg}: preflight.init_std_factor must be a positive "
                                       f"number, got -1\n")
