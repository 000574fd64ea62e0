"""Planted-fault training scenarios shared by the integration tests and the ``demo`` command.

Framework-neutral: :mod:`stability_callbacks.demo.scenarios` builds a tiny GPT, a dataset with a
planted fault at a known optimizer step, and the findings that fault must produce. It imports
torch and transformers; the core never imports this package.
"""

#: The demo's scenarios (``build_scenario`` names); here, torch-free, for ``demo --help``.
SCENARIOS = ("healthy", "data-pocket", "nan", "warmup-spike")