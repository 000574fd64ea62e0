"""Follow a running job's log from the side: no change to the training code at all.

The job (``--job``) is a plain torch loop that prints one line per step, as most training scripts
do; a pocket of garbage batches arrives at steps 31-33. Without ``--job`` this script starts the
job with its output going to ``train.log`` and runs what you would run beside your own job:

    stability-callbacks replay train.log --follow --pid <the job's pid> --run-dir <dir>

which reads each line as it is written, through the same detector as the live callbacks, writes
the run log, alerts, and ends when the job does, as a live run ends: a summary block whose last
lines name the run log and the report it wrote next to it (``<dir>/report.html``).

    python examples/follow_a_log.py
"""
import json
import subprocess
import sys
import time
from pathlib import Path

BATCH, SEQ, VOCAB, STEPS = 8, 32, 128, 45


def job() -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    embed, rnn, head = nn.Embedding(VOCAB, 64), nn.GRU(64, 128, batch_first=True), nn.Linear(128, VOCAB)
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    for step in range(1, STEPS + 1):
        ids = (torch.randint(0, VOCAB, (BATCH, 1)) + torch.arange(SEQ)) % VOCAB
        if 31 <= step <= 33:
            ids = torch.randint(0, VOCAB, (BATCH, SEQ))   # the garbage pocket
        hidden, _ = rnn(embed(ids[:, :-1]))
        loss = nn.functional.cross_entropy(head(hidden).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        norm = nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        print(f"step {step}/{STEPS} | loss {loss.item():.4f} | grad_norm {norm.item():.4f} | lr 3.0e-03", flush=True)
        time.sleep(0.05)


def follow() -> None:
    out = Path("out/examples/follow")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "train.log"
    with open(log, "w") as fh:
        training = subprocess.Popen([sys.executable, __file__, "--job"], stdout=fh)
    cli = [sys.executable, "-m", "stability_callbacks", "replay", str(log), "--follow", "--pid",
           str(training.pid), "--poll-s", "0.2", "--run-dir", str(out / "stability")]
    code = subprocess.run(cli, timeout=600).returncode
    training.wait()
    findings = [json.loads(line) for line in (out / "stability" / "runlog.jsonl").read_text().splitlines()
                if json.loads(line)["type"] == "finding"]
    print(f"replay --follow exited {code}; the run log holds {len(findings)} findings")
    assert any(f["kind"] == "loss_spike" and 31 <= f["step"] <= 33 for f in findings), "the pocket was missed"


if __name__ == "__main__":
    job() if "--job" in sys.argv else follow()
