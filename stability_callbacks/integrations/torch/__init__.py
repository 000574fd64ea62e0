"""The torch side of monitoring that knows no framework: what the HF, Lightning and DeepSpeed
packages build on.

- :mod:`.session`: :class:`~.session.LiveSession`, one monitored run (micro-batches, the step
  close, requests, checkpoints, crash and hang);
- :mod:`.adapter`: :class:`~.adapter.SessionAdapter`, what every framework adapter shares;
- :mod:`.probe` and :mod:`.packed`: the sync-free per-step sampling and its one packed collective;
- :mod:`.optim_state` (where an optimizer keeps ``exp_avg_sq`` under DDP / FSDP2 / ZeRO) and
  :mod:`.reductions` (the device kernels over it);
- :mod:`.readings`: values torch already holds (GradScaler, the LR, FSDP grad norms);
- :mod:`.skip_step` and :mod:`.rollback`: carrying out skip step and automatic rollback;
- :mod:`.preflight`: the audit at train begin.
"""
