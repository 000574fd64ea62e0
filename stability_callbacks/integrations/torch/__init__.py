"""The torch side of monitoring that knows no framework: what the HF, Lightning and DeepSpeed
packages build on.

- :mod:`.session`: :class:`~.session.LiveSession`, one monitored run (micro-batches, the step
  close, requests, checkpoints, crash and hang);
- :mod:`.adapter`: :class:`~.adapter.SessionAdapter`, what every framework adapter shares;
- :mod:`.probe` and :mod:`.packed`: the sync-free per-step sampling and its one packed collective;
- :mod:`.optim_state` (where an optimizer keeps Adam's moments under DDP / FSDP2 / ZeRO),
  :mod:`.reductions` (the device kernels over them: one pass) and :mod:`.layers` (the update
  norm and the per-tensor summary, computed on the device);
- :mod:`.readings`: values torch already holds (GradScaler, the LR, FSDP grad norms);
- :mod:`.skip_step` and :mod:`.auto_rollback`: carrying out skip step and automatic rollback;
- :mod:`.preflight`: the audit at train begin.
"""
