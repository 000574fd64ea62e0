"""Framework integrations: the only part of the package that imports torch or a framework.

Import the module you need (``stability_callbacks.integrations.hf``, ``.lightning``,
``.deepspeed``); this package itself imports nothing so that the core stays torch-free.
``_torch`` holds the sync-free per-step sampling (``StepProbe``) the three share.
"""
