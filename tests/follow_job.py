"""A tiny real training job for the ``replay --follow`` tests: it knows nothing of us.

    python tests/follow_job.py LOG [--nan-at N] [--steps N] [--stop-file PATH] [--rotate-at N]
                               [--go-file PATH]

A 2-layer MLP learns a fixed random regression with torch, printing torchtitan-style lines
(colour codes included) to LOG, flushed every step. ``--nan-at N``: the batch of step N carries
an inf, so the loss goes NaN and the weights with it. ``--stop-file``: the job stops at the
first step that finds the file (how a sidecar halts it). ``--rotate-at N``: before step N the
log is renamed to LOG.1 and a new LOG is opened (logrotate's ``create`` mode), once
``--go-file`` exists (the test's signal that the follower has the old file open). Prints
``stopped by the stop file after step N`` or ``finished N steps`` on stdout at the end.
"""
import argparse
import os
import time

import torch

GREEN, RESET = "\x1b[32m", "\x1b[39m"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--nan-at", type=int)
    ap.add_argument("--stop-file")
    ap.add_argument("--rotate-at", type=int)
    ap.add_argument("--go-file")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = open(args.log, "w")
    out.write("[titan] Starting job: follow test\n[titan] Training starts at step 1\n")
    for step in range(1, args.steps + 1):
        if args.stop_file and os.path.exists(args.stop_file):
            print(f"stopped by the stop file after step {step - 1}")
            return
        if args.rotate_at == step:
            while args.go_file and not os.path.exists(args.go_file):
                time.sleep(0.01)
            out.close()
            os.replace(args.log, args.log + ".1")
            out = open(args.log, "w")
        batch = x.clone()
        if step == args.nan_at:
            batch[0, 0] = float("inf")
        loss = torch.nn.functional.mse_loss(model(batch), y)
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        out.write(f"[titan] {GREEN}step: {step:2d}  loss: {loss.item():7.4f}  grad_norm: "
                  f"{grad_norm.item():7.4f}  memory:  0.01GiB(0.01%)  tps: 12,345  "
                  f"mfu: 0.01%{RESET}\n")
        out.flush()
    print(f"finished {args.steps} steps")


if __name__ == "__main__":
    main()
