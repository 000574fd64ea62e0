"""The live scenario suite, full matrix: real tiny training runs on the HF Trainer, Lightning
and a DeepSpeed engine; healthy ones must stay quiet, planted faults must be caught.

    python scripts/live_matrix.py [--only NAME] [--framework hf|lightning|deepspeed] [--model M]
                                  [--quick] [--out DIR] [--jobs N] [--list]

(``--model cnn --model ddpm --model nll --model vae --model bandit``: the runs of other fields.)

Prints one row per run and ``healthy runs with warn+ A/B, faults caught C/D, median delay E
steps``; run logs under ``--out`` (default ``out/live_matrix/<scenario>/runlog.jsonl``, replay
them with ``stability-callbacks replay``). Exit 1 when a healthy run warns or a fault is missed
(the scenario table: ``tests/live_suite/scenarios.py``).
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from live_suite.matrix import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
