"""Lightning's SIGTERM check under data-parallel training, at the logging steps instead of at every step
(``callbacks.CheckpointOnSigterm`` applies it when every fit starts)."""

from __future__ import annotations

import lightning.pytorch as pl

__all__ = ["check_sigterm_at_logging_steps"]


def check_sigterm_at_logging_steps(trainer: pl.Trainer, every: int = 50) -> bool:
    """Make the trainer look for a SIGTERM on rank 0 at the logging steps only (every ``every`` steps without them).

    Under data-parallel training Lightning 2.6 broadcasts rank 0's SIGTERM flag and reads it back before every
    training step: one collective and one device-to-host read per step, which stall every rank until the GPU has
    finished the step before. A stop then takes up to ``log_every_n_steps`` more steps to be noticed, on every rank
    alike (they all count the same steps), and still ends in Lightning's ``SIGTERMException``.

    Returns:
        whether the check was moved (only under several processes, with a Lightning that has it).
    """
    loop = trainer.fit_loop.epoch_loop
    check = getattr(type(loop), "_broadcast_sigterm_tensor", None)
    if check is None or trainer.world_size == 1:
        return False
    period = trainer.log_every_n_steps or every

    def at_logging_steps() -> None:
        if (loop._batches_that_stepped + 1) % period == 0:
            check(loop)

    loop._broadcast_sigterm_tensor = at_logging_steps
    return True
