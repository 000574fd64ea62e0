"""Framework integrations: the only part of the package that imports torch or a framework.

Import the module you need (``stability_callbacks.integrations.hf``, ``.lightning``,
``.deepspeed``); this package itself imports nothing so that the core stays torch-free.
The private modules hold what the three share: ``_optim_state`` (where an optimizer keeps
``exp_avg_sq`` under DDP/FSDP2/ZeRO), ``_reductions`` (the device kernels), ``_probe`` (the
sync-free per-step ``StepProbe``), ``_readings`` (values a framework already holds) and
``_preflight`` (the audit at train begin).
"""
