"""stability_callbacks: catch training instabilities live, and replay real logs offline.

The core (everything outside ``integrations/``) imports without torch.
"""
from .config import ConfigError, load_config
from .control import Control
from .monitor import Monitor
from .record import Finding, StepRecord

__all__ = ["Monitor", "load_config", "ConfigError", "Control", "Finding", "StepRecord"]
__version__ = "0.1.0"
