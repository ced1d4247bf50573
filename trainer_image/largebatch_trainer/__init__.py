"""largebatch_trainer: the process torchrun starts on every worker.

It applies `largebatch.schedule.plan()` at every optimizer step, so the global batch and LR are right
whatever the world size: one global sample stream, losses normalised by the global batch, gradient
accumulation where the ranks cannot hold the batch, checkpoints that resume at the exact sample.
"""
