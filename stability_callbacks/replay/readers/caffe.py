"""Caffe solver logs: one record per iteration group of glog lines.

    I0515 ... solver.cpp:239] Iteration 20 (1.02848 iter/s, 19.4461s/20 iters), loss = 6.90501
    I0515 ... solver.cpp:258]     Train net output #0: loss = 6.90776 (* 1 = 6.90776 loss)
    I0515 ... sgd_solver.cpp:112] Iteration 20, lr = 0.01

Caffe's own rules: the header's ``loss =`` is a display average (``average_loss`` iterations);
the iteration's loss is the ``Train net output`` that enters the objective (``(* w = V loss)``;
an output without it, ``lambda = 5``, is no loss). Old Caffe prints only ``Iteration N, loss =
X`` / ``Iteration N, lr = Y``: that loss is the loss. The ``lr`` line closes a group; a group
whose header was cut off (an excerpt) takes its step from it. ``Test net output`` lines are
evaluation; ``-nan iter/s`` is throughput.
"""
from __future__ import annotations

import re
from typing import Iterator

from ... import keys
from ...record import StepRecord
from .account import ReadAccount
from .source import to_float

HEADER = re.compile(r"\] Iteration (\d+)(?: \([^)]*\))?, loss = (\S+)")
_OUTPUT = re.compile(r"\] +Train net output #\d+: \S+ = (\S+)(?: \(\* \S+ = (\S+) loss\))?")
_LR = re.compile(r"\] Iteration (\d+), lr = (\S+)")
SIGNATURES = (HEADER, _OUTPUT)


def read(path, *, account: ReadAccount, lines, **_) -> Iterator[StepRecord]:
    account.saw(keys.LOSS, "Train net output (* w = V loss)")
    account.saw(keys.LR, "lr")
    account.numbered("counter", "Iteration")
    group: dict = {}                  # step, header (loss), loss, lr of the iteration being read
    for line_no, text in lines:
        if text is None or "] " not in text:
            continue
        try:
            m = HEADER.search(text)
            if m:
                step = int(m.group(1))
                if group and group.get("step") != step:
                    yield from _record(group)
                    group = {}
                group.update(step=step, header=to_float(m.group(2)))
                continue
            m = _OUTPUT.search(text)
            if m:
                if m.group(2) is not None and "loss" not in group:
                    group["loss"] = to_float(m.group(2))
                continue
            m = _LR.search(text)
            if m:
                step = int(m.group(1))
                if group and group.get("step", step) != step:
                    yield from _record(group)
                    group = {}
                group.update(step=step, lr=to_float(m.group(2)))
                yield from _record(group)
                group = {}
        except ValueError as e:
            account(line_no, text, f"unreadable number: {e}")
    if group:
        yield from _record(group)


def _record(group: dict) -> Iterator[StepRecord]:
    if "step" not in group:
        return
    metrics = {}
    loss = group.get("loss", group.get("header"))
    if loss is not None:
        metrics[keys.LOSS] = loss
    if "lr" in group:
        metrics[keys.LR] = group["lr"]
    yield StepRecord(group["step"], metrics)
