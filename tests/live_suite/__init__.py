"""The live scenario suite (issue 16 item 2): real tiny training runs on the HF Trainer,
Lightning and a DeepSpeed engine, healthy ones varied as users vary them and ones with a
planted fault, each judged from its run log.

- ``scenarios``: the table (one row per run) and the tiny models, data and schedules;
- ``fields``: the workloads of other fields (a CNN, a DDPM denoiser, a Gaussian-NLL regressor,
  a VAE, a REINFORCE bandit policy) and their data faults;
- ``runners``: one runner per framework, using only the library's public API;
- ``verdict``: what a run log says about a scenario (warnings, catch, delay, evidence);
- ``matrix``: runs a selection in worker processes and prints the table and summary line.

``scripts/live_matrix.py`` runs the full matrix; ``tests/test_live_matrix.py`` the quick subset.
"""
