"""A callback that SIGKILLs its own `vit fit` process at a chosen step, for the kill-and-resume tests.

Named on the command line (`--trainer.callbacks+=tests.killer.KillAt --trainer.callbacks.init_args.step=4`) with
the repository root on PYTHONPATH: a real process death, with no chance to save or clean up.
"""

import os
import signal

from lightning.pytorch import Callback


class KillAt(Callback):
    """SIGKILL this process as the given optimiser step starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class StopAt(KillAt):
    """Raise as the given optimiser step starts: a kill, for a run in this process
    (scripts/experiments/resume_check.py)."""

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"stopped at step {self.step}")
