"""Framework integrations: the only part of the package that imports torch or a framework.

One package per framework, each holding everything that knows it: :mod:`.hf` (the HF Trainer
and TRL), :mod:`.lightning`, :mod:`.deepspeed` (the engine hook; also what HF and Lightning read
from an engine they run on). What they share, torch but no framework, is :mod:`.torch`. Import
the package you need; this one imports nothing, so that the core stays torch-free.
"""
