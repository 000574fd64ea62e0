"""The torch side of data forensics (:mod:`stability_callbacks.forensics`; docs/design.md,
Forensics): the one gather at a finding, and the ranking forward of ``dump_batches``.

The ranking forward runs the model, in eval mode and under ``torch.no_grad()``, on a held step's
micro-batches as the framework handed them: a mapping is called as ``model(**batch)`` with its
``labels``; an ``(inputs, labels)`` pair as ``model(inputs)``. Each sample's loss is the model's
own loss restricted to that sample (:func:`per_sample_loss`): for a causal LM the mean
cross-entropy over the row's label tokens (shifted by one, ``-100`` ignored, as transformers'
``ForCausalLMLoss``), for a token-level head without the shift, for a classifier the row's
cross-entropy. Whichever rule it takes must reproduce the model's own batch loss when the model
returns one; a model whose loss is something else (label smoothing, an auxiliary loss, an
encoder-decoder) is refused with that reason, and the dump goes off for the run.

The weights are those after the steps already taken when the finding comes (the spiking step's
update included): the ranking, not the loss values, is the point. Its cost is one forward of
the step's micro-batches, at a finding only (``details.samples.ranked.forward_ms``).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["TorchPeer", "per_sample_loss", "row_indices", "held", "rows_of"]

#: Labels that take no part in the loss (transformers' and torch's ``ignore_index``).
IGNORE_INDEX = -100


class TorchPeer:
    """:class:`~stability_callbacks.forensics.ForensicsPeer` over torch: this rank in the
    data-parallel ``process_group`` (None: the default group), and ``model`` (the unwrapped
    module the framework trains; under ZeRO-3 / FSDP its forward gathers parameters, so every
    rank runs the ranking forward at the same finding, as it does)."""

    def __init__(self, model: Any, process_group=None):
        dist = torch.distributed
        several = dist.is_available() and dist.is_initialized()
        self.model, self.group = model, process_group
        self.rank = dist.get_rank(process_group) if several else 0
        self.world_size = dist.get_world_size(process_group) if several else 1

    def gather(self, obj: Any) -> list:
        out: list = [None] * self.world_size
        # host-sync: one object gather, only at a finding that names samples (docs/design.md, Forensics).
        torch.distributed.all_gather_object(out, obj, group=self.group)
        return out

    def rank_rows(self, batches: list, indices: list | None, shared_by_ranks: int,
                  tokens_kept: int) -> tuple[list[dict], float, str]:
        model = self.model
        if model is None:
            raise ValueError("the integration knows no model to run")
        params = next(model.parameters(), None)
        device = params.device if params is not None else torch.device("cpu")
        modes = [(m, m.training) for m in model.modules()]
        t0 = time.perf_counter()
        losses, counted, tokens, rule = [], [], [], ""
        model.eval()   # no dropout: each sample's loss, not a noisy draw of it
        try:
            with torch.no_grad():
                for batch in batches:
                    args, kwargs, labels = _call_of(_to(batch, device))
                    per_row, has_labels, rule = per_sample_loss(model(*args, **kwargs), labels)
                    losses.append(per_row)
                    counted.append(has_labels)
                    tokens.append(_token_ids(args, kwargs))
            values = torch.cat(losses).tolist()   # host-sync: at a finding only
        finally:
            for m, mode in modes:   # each module as it was (a frozen part may stay in eval)
                m.training = mode
        ms = (time.perf_counter() - t0) * 1e3
        sizes = [len(x) for x in losses]
        where = row_indices(indices, sizes, self.rank, shared_by_ranks)
        keep = torch.cat(counted).tolist()
        prefix: list = []
        for ids, n in zip(tokens, sizes):
            prefix += ids[:, :tokens_kept].tolist() if ids is not None else [[] for _ in range(n)]
        rows = [{"index": i, "loss": v if k else None, "tokens": t}
                for i, v, k, t in zip(where, values, keep, prefix)]
        return rows, ms, rule


def per_sample_loss(output: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Each row's share of the model's own loss (module docstring): a float tensor ``[rows]``,
    a bool tensor of the rows that hold a label at all, and the rule used. Raises
    ``ValueError`` saying what is missing or unsupported.

    >>> logits = torch.zeros(2, 3, 5); logits[1, :, 0] = 4.0
    >>> labels = torch.tensor([[0, 0, 0], [1, 1, -100]])
    >>> loss, counted, rule = per_sample_loss({"logits": logits}, labels)
    >>> [round(x, 3) for x in loss.tolist()], counted.tolist(), rule.split(":")[0]
    ([1.609, 4.071], [True, True], 'causal LM')
    """
    logits = _field(output, "logits")
    if logits is None and isinstance(output, torch.Tensor):
        logits = output
    if not isinstance(logits, torch.Tensor):
        raise ValueError("the model's output has no logits (an output with .logits, a mapping with "
                         "'logits', or the logits tensor itself)")
    if not isinstance(labels, torch.Tensor):
        raise ValueError("the batch has no labels (a mapping with 'labels', or an (inputs, labels) pair)")
    own = _field(output, "loss")
    own = float(own.detach()) if isinstance(own, torch.Tensor) and own.numel() == 1 else None   # host-sync: at a finding
    labels = labels.to(logits.device)
    if logits.dim() == 3 and labels.dim() == 2:
        tried = []
        for shift, name in ((1, "causal LM: mean cross-entropy of the row's label tokens, shifted by one"),
                            (0, "token head: mean cross-entropy of the row's label tokens")):
            per_row, counted, mean = _token_loss(logits, labels, shift)
            if own is None:
                return per_row, counted, name + ", unchecked (the model returned no loss)"
            if abs(mean - own) <= 1e-3 * max(1.0, abs(own)):
                return per_row, counted, name + ", equal to the model's own loss"
            tried.append(f"{mean:.4g}")
        raise ValueError(f"the model's own loss ({own:.4g}) is neither the shifted nor the unshifted "
                         f"token cross-entropy ({' / '.join(tried)}): not a plain causal or token LM loss")
    if logits.dim() == 2 and labels.dim() == 1 and not labels.is_floating_point():
        per_row = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="none")
        counted = labels != IGNORE_INDEX
        mean = float(per_row[counted].mean().detach()) if bool(counted.any()) else float("nan")   # host-sync: at a finding
        if own is not None and abs(mean - own) > 1e-3 * max(1.0, abs(own)):
            raise ValueError(f"the model's own loss ({own:.4g}) is not the mean cross-entropy of its "
                             f"rows ({mean:.4g})")
        return per_row, counted, "classifier: the row's cross-entropy" + (
            ", equal to the model's own loss" if own is not None else ", unchecked (the model returned no loss)")
    raise ValueError(f"logits of shape {tuple(logits.shape)} with labels of shape {tuple(labels.shape)}: "
                     f"not a token or class loss this can split by row")


def _token_loss(logits: torch.Tensor, labels: torch.Tensor, shift: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    if shift:
        logits, labels = logits[:, :-shift], labels[:, shift:]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         ignore_index=IGNORE_INDEX, reduction="none").view(labels.shape)
    valid = labels != IGNORE_INDEX
    n = valid.sum(1)
    per_row = (ce * valid).sum(1) / n.clamp(min=1)
    mean = float(((ce * valid).sum() / valid.sum().clamp(min=1)).detach())   # host-sync: at a finding
    return per_row, n > 0, mean


def row_indices(indices: list | None, rows_per_micro: list[int], rank: int, shared_by_ranks: int) -> list:
    """The dataset index of each row of this rank's micro-batches of one step (None where it
    cannot be told: no indices, or counts that do not match). ``indices``: the step's indices as
    the sampler drew them; ``shared_by_ranks`` > 1: one sampler dealt to every rank, each taking
    every W-th batch (accelerate's batch sharding, and its ``split_batches`` alike): micro-batch
    ``j`` of rank ``r`` is batch ``j * W + r`` of the step.

    >>> row_indices(list(range(8)), [2, 2], 1, 2)
    [2, 3, 6, 7]
    """
    total = sum(rows_per_micro)
    if indices is None or len(indices) != total * shared_by_ranks:
        return [None] * total
    if shared_by_ranks == 1:
        return list(indices)
    size = rows_per_micro[0]
    if any(n != size for n in rows_per_micro):
        return [None] * total
    out: list = []
    for j, n in enumerate(rows_per_micro):
        start = (j * shared_by_ranks + rank) * size
        out += indices[start:start + n]
    return out


def held(batch: Any) -> Any:
    """A micro-batch to hold by reference until it is ranked: a mapping is copied shallowly (a
    framework may pop keys from it in place, ``labels`` under a label smoother); tensors are
    never copied."""
    return dict(batch) if isinstance(batch, Mapping) else batch


def rows_of(batch: Any) -> int:
    """How many samples a micro-batch holds (a tensor's first dimension, or that of a mapping's
    or pair's first tensor; 0: cannot tell). Shapes only: no device work."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 0
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    return next((int(v.shape[0]) for v in values if isinstance(v, torch.Tensor) and v.dim()), 0)


def _call_of(batch: Any) -> tuple[tuple, dict, Any]:
    if isinstance(batch, Mapping):
        # HF's num_items_in_batch normalises the loss by the whole accumulation window's tokens:
        # without it the model returns the batch's own mean, the one the rows must add up to.
        return (), {k: v for k, v in batch.items() if k != "num_items_in_batch"}, batch.get("labels")
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return (batch[0],), {}, batch[1]
    raise ValueError(f"a micro-batch of type {type(batch).__name__}: a mapping (model(**batch), with "
                     f"'labels') or an (inputs, labels) pair is needed")


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(v, device) for v in batch)
    return batch


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


def _token_ids(args: tuple, kwargs: dict) -> torch.Tensor | None:
    ids = kwargs.get("input_ids")
    if ids is None and args and isinstance(args[0], torch.Tensor):
        ids = args[0]
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point():
        return ids
    return None
