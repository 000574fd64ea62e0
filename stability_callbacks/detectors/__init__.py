"""One phenomenon per module. ``DETECTORS`` maps the config key to the class, in the order
the Monitor runs them (``loss_spike`` first: later loss detectors read its episode state;
``precursor`` after ``grad_norm_spike``, whose finding at the same step explains a jump;
``loss_scale_collapse`` before ``overflow_burst``, which counts a failed start-up search;
``stream_loss_spike`` last: it names the streams spiking with a main-loss spike)."""
from .base import Columns, Context, Detector
from .data_repetition import DataRepetition
from .divergence import Divergence
from .grad_norm_spike import GradNormSpike
from .growth import GradNormGrowth, ParamNormGrowth
from .level_shift import LevelShift
from .loss_scale_collapse import LossScaleCollapse
from .loss_spike import LossSpike
from .lr_anomaly import LrAnomaly
from .nonfinite import NonFinite
from .not_learning import NotLearning
from .overflow_burst import OverflowBurst
from .precursor import Precursor
from .resume_spike import ResumeSpike
from .second_moment_surge import SecondMomentSurge
from .stall import Stall
from .stream_loss_spike import StreamLossSpike
from .sudden_drop import SuddenDrop

DETECTORS: dict[str, type[Detector]] = {cls.name: cls for cls in (
    NonFinite, LossSpike, Divergence, LevelShift, SuddenDrop, Stall, GradNormSpike,
    GradNormGrowth, ParamNormGrowth, SecondMomentSurge, Precursor, LossScaleCollapse, OverflowBurst,
    LrAnomaly, ResumeSpike, DataRepetition, NotLearning, StreamLossSpike,
)}

__all__ = ["DETECTORS", "Columns", "Context", "Detector"] + [c.__name__ for c in DETECTORS.values()]
