"""Sync-free per-step sampling shared by the HF, Lightning and DeepSpeed integrations.

What a step costs (docs/design.md, "Invariants": no host sync, one collective, exact Adam
statistics under sharding):

* Per-step scalars (loss, grad norm, loss scale, skip flag, extras) stay **device tensors**; at
  the end of the step they travel in one packed vector (:mod:`.packed`): one collective, a
  non-blocking copy to the host, the record handed out ``lag_steps`` steps later.
* Adam's moments (:mod:`.reductions`) are read from the local state (:mod:`.optim_state`:
  rank-local ZeRO fragments, FSDP2 shards, or the replicated DDP/ZeRO-0 state, its layout found
  once and checked each sampled step: :class:`~.reductions.MomentPass`) in one pass per sampled
  step: ``exp_avg_sq`` max and L1, ``exp_avg``'s norm, and per parameter tensor the sums
  that :mod:`.layers` turns into the update norm and the per-layer summary on the device (a
  :class:`~.packed.Block` of the same collective). Alignment padding (ZeRO) is excluded from
  every statistic.
* ``adam/beta1``, ``adam/beta2`` and ``adam/step`` come with the Adam statistics, for their bias
  correction: host values every rank has (the param groups' betas; the state's ``step``, a CPU
  tensor unless the optimizer is capturable/fused), so no reduction; a device ``step`` rides in
  the packed vector.
* Nothing calls ``.item()``; every deliberate host sync carries a ``# host-sync:`` comment.

Float values given to ``set_grad_norm``/``set_loss_scale``/``set_skipped``/``set_lr`` are host
values the framework already made global (DeepSpeed's ``cur_scale``, ``skipped_steps``,
ZeRO-0's float norm): they skip the collective and go straight into the record.
"""
from __future__ import annotations

import logging
from typing import Mapping

import torch

from stability_callbacks import keys
from stability_callbacks.live import Guard
from stability_callbacks.record import StepRecord

from .layers import LayerSummary
from .optim_state import NoSecondMoment, adam_hyperparams, basic_optimizer, optimized_params
from .packed import REDUCE_OPS, SLOTS, Block, PackedSteps, world_size
from .reductions import MomentPass, param_sq_sum

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch / no distributed
    DTensor = None

log = logging.getLogger("stability_callbacks")

__all__ = ["StepProbe"]

_ONCE = Guard()   # process-wide: one warning per problem, whichever probe meets it


class StepProbe:
    """Per-step sampling on the device, one packed collective, records one step late.

    Keyword arguments (the config): ``device`` (where the model computes; default: the device
    of the first loss given), ``process_group`` (the data-parallel group; None = default group
    when torch.distributed is initialised), ``adam_every_n_steps`` (0 = never),
    ``param_norm_every_n_steps`` (0 = never), ``extra_reductions`` (name -> default op for
    :meth:`set_extra`), ``lag_steps`` (records come out this many steps late; None = 0 on CPU,
    1 on accelerators; see :meth:`poll`).

    Every rank must call :meth:`finish_step` for the same steps (it runs the collective). Under
    torch.distributed only extras declared in ``extra_reductions`` are reduced and recorded
    (the same names on every rank keep the packed layout identical; a declared extra a rank
    did not set this step is left out of that step's reduction); others are dropped with one
    warning. In a single process every extra is recorded.

    >>> import torch
    >>> model = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> probe = StepProbe(adam_every_n_steps=1)
    >>> for step in range(1, 3):
    ...     for _ in range(2):                          # 2 micro-batches (GA = 2)
    ...         loss = model(torch.ones(8, 4)).pow(2).mean() / 2
    ...         loss.backward()
    ...         probe.add_loss(loss)
    ...     norm = probe.compute_grad_norm(model.parameters())   # device tensor (clip with it)
    ...     probe.set_lr(opt.param_groups[0]["lr"])
    ...     opt.step(); opt.zero_grad()
    ...     probe.finish_step(step, optimizer=opt)
    >>> records = probe.poll() + probe.flush()          # CPU: ready at once
    >>> [r.step for r in records], sorted(records[-1].metrics)[:6]   # doctest: +NORMALIZE_WHITESPACE
    ([1, 2], ['adam/beta1', 'adam/beta2', 'adam/exp_avg_norm', 'adam/exp_avg_sq_l1',
              'adam/exp_avg_sq_max', 'adam/exp_avg_sq_numel'])
    >>> records[-1].metrics["adam/beta2"], records[-1].metrics["adam/step"]
    (0.999, 2.0)
    """

    def __init__(self, *, device=None, process_group=None, adam_every_n_steps: int = 1,
                 param_norm_every_n_steps: int = 0,
                 extra_reductions: Mapping[str, str] | None = None,
                 lag_steps: int | None = None):
        for key, val in (("adam_every_n_steps", adam_every_n_steps),
                         ("param_norm_every_n_steps", param_norm_every_n_steps)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise ValueError(f"{key} must be an integer >= 0, got {val!r}")
        if lag_steps is not None and (isinstance(lag_steps, bool) or not isinstance(lag_steps, int)
                                      or lag_steps < 0):
            raise ValueError(f"lag_steps must be None or an integer >= 0, got {lag_steps!r}")
        extra_reductions = dict(extra_reductions or {})
        for name, op in extra_reductions.items():
            if op not in REDUCE_OPS:
                raise ValueError(f"extra_reductions.{name} must be one of {REDUCE_OPS}, got {op!r}")
        self.process_group = process_group
        self.adam_every_n_steps = adam_every_n_steps
        self.param_norm_every_n_steps = param_norm_every_n_steps
        self.extra_reductions = extra_reductions
        #: The finished steps on their way out (packed, reduced, copied).
        self.packed = PackedSteps(device=device, process_group=process_group, lag_steps=lag_steps)
        self._adam_disabled = False
        self._param_norm_disabled = False
        #: The per-tensor baselines and summary (update norm, layers/...).
        self.layers = LayerSummary()
        #: Adam's moments: the state's layout and the device pass's table, kept from step to step.
        self.moments = MomentPass()
        self._num_tensors: int | None = None   # the per-tensor block's layout, once known
        self._prev_scale: torch.Tensor | None = None
        #: The Adam-like optimizer whose ``step()`` calls are watched (:meth:`_watch_steps`), its
        #: hook's handle, and what the hook saw since the last finished step: None (no call), or
        #: whether the state was still empty after the call.
        self._watched: tuple | None = None
        self._stepped_empty: bool | None = None
        self._reset_step()

    @property
    def num_tensors(self) -> int | None:
        """How many parameter tensors the per-tensor statistics number (the optimizer's, in its
        order: :func:`~.optim_state.tensor_names` names them), once a sample has seen them."""
        return self._num_tensors

    # ---- per-step inputs (all cheap, none syncs) ---------------------------------------------
    def _reset_step(self) -> None:
        self._loss: torch.Tensor | None = None
        self._dev: dict[str, torch.Tensor] = {}       # slot key -> device tensor
        self._host: dict[str, float] = {}
        self._extras: dict[str, tuple] = {}           # name -> (value, op)
        self._skip_from_scale = False

    @property
    def device(self) -> torch.device | None:
        """Where the model computes (the first loss's device, unless given)."""
        return self.packed.device

    @device.setter
    def device(self, value) -> None:
        self.packed.device = None if value is None else torch.device(value)

    def _adopt_device(self, t: torch.Tensor) -> None:
        if self.packed.device is None:
            self.packed.device = t.device

    def add_loss(self, loss, *, divide_by: float = 1.0) -> None:
        """Add one micro-batch's loss (a tensor, as the framework returns it, usually already
        divided by the accumulation steps; pass ``divide_by`` when it is not). Accumulated on
        the device out of place (the caller's tensor is never modified)."""
        if not isinstance(loss, torch.Tensor):
            loss = torch.tensor(float(loss))
        self._adopt_device(loss)
        v = loss.detach()
        if v.numel() != 1:
            v = v.float().mean()
        v = v.reshape(()).float()
        if divide_by != 1.0:
            v = v / divide_by
        self._loss = v if self._loss is None else self._loss + v

    def set_grad_norm(self, value) -> None:
        """The framework's pre-clip, unscaled, global grad norm (tensor, float or None)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            if DTensor is not None and isinstance(value, DTensor):
                value = value.full_tensor()  # a collective, not a host sync (FSDP2 norms)
            self._dev[keys.GRAD_NORM] = value.detach()
            self._host.pop(keys.GRAD_NORM, None)   # the latest reading wins
        else:
            self._host[keys.GRAD_NORM] = float(value)

    def compute_grad_norm(self, parameters, norm_type: float = 2.0) -> torch.Tensor | None:
        """Global grad norm with one foreach reduction, for frameworks that expose none.

        Returns the device tensor so the caller can clip with it
        (``torch.nn.utils.clip_grads_with_norm_``). Call it before clipping (pre-clip norm).
        DTensor grads (FSDP2) are completed with one all_reduce by ``full_tensor()``; plain DDP
        grads are already all-reduced, so the local norm is global.
        """
        params = list(parameters)
        grads = [p.grad for p in params if getattr(p, "grad", None) is not None]
        if not params:
            return None
        if grads:
            norm = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False, foreach=None)
        else:   # parameters none of which got a gradient (all frozen): the norm is 0, as HF logs it
            norm = torch.zeros((), dtype=torch.float32, device=params[0].device)
        if DTensor is not None and isinstance(norm, DTensor):
            norm = norm.full_tensor()
        self._adopt_device(norm)
        self._dev[keys.GRAD_NORM] = norm.detach()
        return norm

    def set_lr(self, lr: float) -> None:
        """The LR used by this step (a host float; identical on every rank)."""
        self._host[keys.LR] = float(lr)

    def set_loss_scale(self, value, *, detect_decrease: bool = False) -> None:
        """Loss scale (device tensor such as ``GradScaler._scale``, or a host float such as
        DeepSpeed's ``cur_scale``). Prefer the scale used by this step with ``found_inf``
        (:func:`grad_scaler_readings`). Where only the scale is at hand, pass the scale read
        **after** ``scaler.update()`` with ``detect_decrease=True``: when :meth:`set_skipped`
        was not called, ``skipped`` is then derived on the device as "lower than at the previous
        call" (a torch GradScaler lowers its scale exactly on an overflow; DeepSpeed ZeRO's
        hysteresis does not, so use its ``skipped_steps`` there)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            v = value.detach().reshape(()).to(torch.float64)
            if detect_decrease:
                if self._prev_scale is not None:
                    self._skip_from_scale = (v, self._prev_scale)
                self._prev_scale = v.clone()
            self._dev[keys.LOSS_SCALE] = v
        else:
            self._host[keys.LOSS_SCALE] = float(value)

    def set_skipped(self, value) -> None:
        """Whether the optimizer step was skipped: a device tensor (e.g. ``found_inf``: > 0 means
        skipped) or a host bool/float (DeepSpeed ``skipped_steps`` delta)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            self._dev[keys.OVERFLOW_SKIPPED] = value.detach().reshape(-1).sum()
        else:
            self._host[keys.OVERFLOW_SKIPPED] = 1.0 if float(value) > 0 else 0.0

    def set_extra(self, name: str, value, op: str | None = None) -> None:
        """A further per-step value reduced across ranks with ``op`` (sum, mean, max, min),
        e.g. ``batch_fingerprint`` (sum) or ``loss/<stream>`` (mean)."""
        op = op or self.extra_reductions.get(name, "sum")
        if op not in REDUCE_OPS:
            raise ValueError(f"op for extra {name!r} must be one of {REDUCE_OPS}, got {op!r}")
        if isinstance(value, torch.Tensor):
            value = value.detach().reshape(-1).sum() if value.numel() != 1 else \
                value.detach().reshape(())
        else:
            value = float(value)
        self._extras[name] = (value, op)

    def set_value(self, key: str, value: float) -> None:
        """A host float that is already identical on every rank (e.g. ``consumed_samples``)."""
        self._host[key] = float(value)

    def discard_step(self) -> None:
        """Forget what this step accumulated (for steps the sampling cadence skips)."""
        self._reset_step()

    # ---- end of step ----------------------------------------------------------------------------
    def finish_step(self, step: int, *, optimizer=None, model=None, epoch: int | None = None) -> None:
        """Close the step: Adam / param-norm stats on their cadence, pack, one collective when
        distributed, non-blocking copy to the host (``epoch``: carried to the record, where the
        loop counts epochs). Never raises for a monitoring failure
        (logs once and degrades); a collective that fails is a distributed failure and does."""
        step = int(step)
        world = world_size(self.process_group)
        adam_step = (self.adam_every_n_steps > 0 and step % self.adam_every_n_steps == 0
                     and optimizer is not None)
        want_pnorm = (self.param_norm_every_n_steps > 0 and not self._param_norm_disabled
                      and step % self.param_norm_every_n_steps == 0
                      and (optimizer is not None or model is not None))
        replicated: dict[str, str] = {}   # slot key -> "max" for replicated state
        block = None
        if adam_step and not self._adam_disabled:
            block = self._sample_adam(optimizer, replicated)
        elif adam_step:
            block = self._empty_block()
        if want_pnorm:
            self._sample_param_norm(optimizer, model, replicated)
        if optimizer is not None:
            self._watch_steps(optimizer)
        if self._stepped_empty:   # step() ran and no parameter got an update: exactly 0, no device
            self._host[keys.UPDATE_NORM] = 0.0
        self._stepped_empty = None
        if self._loss is not None:
            self._dev[keys.LOSS] = self._loss   # NaN/Inf travel as values: the NonFinite detector reads them
        if self._skip_from_scale and keys.OVERFLOW_SKIPPED not in self._dev and keys.OVERFLOW_SKIPPED not in self._host:
            cur, prev = self._skip_from_scale
            self._dev[keys.OVERFLOW_SKIPPED] = cur < prev

        values: list = [self._dev.get(k) for k in SLOTS]
        ops = [replicated.get(k, slot.op) for k, slot in SLOTS.items()]
        names: list = list(SLOTS)
        host = dict(self._host)
        if world > 1:
            # The packed layout must be identical on every rank, so across ranks only the
            # extras declared at construction travel (absent ones with presence 0). An extra
            # set on one rank only would otherwise change the size of its vector and hang the
            # collective.
            extra_names = sorted(self.extra_reductions)
            undeclared = sorted(set(self._extras) - set(self.extra_reductions))
            if undeclared:
                _ONCE.warn_once("undeclared-extra:" + ",".join(undeclared),
                                "stability: extras %s are not in extra_reductions and are dropped "
                                "under torch.distributed (declare them on every rank)", undeclared)
        else:
            extra_names = sorted(self._extras)
        for name in extra_names:
            value, op = self._extras.get(name, (None, self.extra_reductions.get(name, "sum")))
            if isinstance(value, float) and world == 1:
                host[name] = value          # nothing to reduce
                continue
            values.append(value)
            ops.append(op)
            names.append(name)
        self._reset_step()
        self.packed.push(step, values, ops, names, host, world, block, epoch=epoch)

    def _sample_adam(self, optimizer, replicated: dict) -> Block | None:
        """Adam's moments in one pass: the global statistics into the packed slots, the
        per-tensor sums as this step's block (None when there are none)."""
        try:
            got = self.moments(optimizer)
        except NoSecondMoment as e:
            self._adam_disabled = True
            _ONCE.warn_once("no-second-moment", "stability: %s keeps no Adam second moment "
                            "(exp_avg_sq); second-moment statistics are off for this run", e, level=logging.INFO)
            return None
        except Exception:  # monitoring never takes training down
            self._adam_disabled = True
            log.exception("stability: Adam second-moment statistics failed; turned off")
            return self._empty_block()
        if got is None:
            return None
        state, st = got
        step = self._sample_adam_hyperparams(optimizer)
        self._dev[keys.ADAM_V_MAX] = st.v_max
        self._dev[keys.ADAM_V_L1] = st.v_l1
        self._dev[keys.ADAM_V_NUMEL] = self.packed.const(float(st.numel), st.v_max.device)
        if st.m_sq is not None:
            self._dev[keys.ADAM_M_NORM] = st.m_sq
        if not st.partitioned:
            # Replicated state (DDP, ZeRO-0): every rank holds the same values. MAX keeps them
            # (and makes ranks agree bit-for-bit even if float noise differed); SUM would
            # multiply the L1, the count and the sum of squares by the world size.
            for key in (keys.ADAM_V_L1, keys.ADAM_V_NUMEL, keys.ADAM_M_NORM):
                replicated[key] = "max"
        if st.per_tensor is not None and self._num_tensors is None:
            self._num_tensors = state.num_tensors   # the same on every rank: the optimizer's tensors
        if self._num_tensors is None:
            return None
        return self.layers.block(st, state, num_tensors=self._num_tensors, step=step,
                                 lr=self._host.get(keys.LR), device=self.packed.device or st.v_max.device)

    def _watch_steps(self, optimizer) -> None:
        """Hook the ``step()`` of an Adam-like optimizer (its param groups have betas), once: an
        Adam-like optimizer creates its state for every parameter it updates, so a state still
        empty after a ``step()`` means no parameter had a gradient — an update norm of exactly 0
        (an optimizer built before the model was re-created holds other tensors than those that
        train: the model's grad norm is > 0, yet nothing moves). A dictionary's length read on
        the host in the hook: no compute, no sync. A step the framework skipped (an fp16
        overflow) never calls ``step()`` and says nothing. Watching starts at the first finished
        step."""
        basic = basic_optimizer(optimizer)
        if self._watched is not None and self._watched[0] is basic:
            return
        if self._watched is not None:
            self._watched[1].remove()
            self._watched = None
        groups = getattr(basic, "param_groups", None)
        if not groups or not all("betas" in g for g in groups) or not hasattr(basic, "register_step_post_hook"):
            return

        def stepped(opt, args, kwargs) -> None:
            self._stepped_empty = not opt.state

        self._watched = (basic, basic.register_step_post_hook(stepped))

    def _empty_block(self) -> Block | None:
        """A sampled step without this rank's values (its pass failed or is off): the block
        still travels, zeros with its flag down, so that every rank's packed vector matches."""
        if self._num_tensors is None:
            return None
        return self.layers.block(None, None, num_tensors=self._num_tensors, step=None, lr=None,
                                 device=self.packed.device)

    def _sample_adam_hyperparams(self, optimizer):
        """``adam/beta1``, ``adam/beta2`` and ``adam/step`` beside the moment statistics (the bias
        correction needs them); returns the step. All are identical on every rank, so no
        reduction: the betas are host floats from the param groups; ``step`` a host number or CPU
        tensor (read on the host: no device involved), or — capturable/fused Adam — a device
        tensor the kernels update, which travels in the packed vector like the other device
        scalars (``.item()`` would sync)."""
        try:
            hyper = adam_hyperparams(optimizer)
        except Exception:  # monitoring never takes training down; the detectors assume defaults
            _ONCE.warn_once("adam-hyperparams", "stability: could not read Adam's betas/step; "
                            "the bias correction assumes beta2=0.999 and t=the step")
            return None
        if hyper.beta1 is not None:
            self._host[keys.ADAM_BETA1] = hyper.beta1
        if hyper.beta2 is not None:
            self._host[keys.ADAM_BETA2] = hyper.beta2
        step = hyper.step
        if isinstance(step, torch.Tensor):
            if step.device.type == "cpu":
                step = self._host[keys.ADAM_STEP] = float(step)   # a CPU tensor: no device sync
            else:
                self._dev[keys.ADAM_STEP] = step.detach().reshape(())
        elif step is not None:
            step = self._host[keys.ADAM_STEP] = float(step)
        return step

    def _sample_param_norm(self, optimizer, model, replicated: dict) -> None:
        try:
            tensors, partitioned = optimized_params(optimizer, model)
            sq = param_sq_sum(tensors)
        except Exception:
            self._param_norm_disabled = True
            log.exception("stability: parameter norm failed; turned off")
            return
        if sq is None:
            return
        self._dev[keys.PARAM_NORM] = sq
        if not partitioned:
            replicated[keys.PARAM_NORM] = "max"

    # ---- getting records out ------------------------------------------------------------------
    def poll(self) -> list[StepRecord]:
        """Records of every step finished at least ``lag_steps`` steps ago, oldest first
        (:meth:`.packed.PackedSteps.poll`)."""
        return self.packed.poll()

    def flush(self) -> list[StepRecord]:
        """Every pending record (end of training, or before a checkpoint)."""
        return self.packed.flush()   # host-sync: waits for the pending copies
