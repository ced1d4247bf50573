"""The errors library code raises for what a user must fix, one type per kind. They belong to the shared
contract so that the trainer raises them and both entry points turn them into a message and an exit
code: the worker's (`largebatch_trainer.main`) and lbctl's (`largebatch.cli`), which preflights a task
in its own process. Each message is the sentence a user reads: what is wrong, with the numbers, and
the fix."""

from __future__ import annotations


class JobError(Exception):
    """A job that cannot run as written, or on what this process was given."""


class TaskError(JobError):
    """The task cannot be built: its entrypoint, its args, or a package it needs."""


class DataError(JobError):
    """The task's data cannot be trained on (empty, or not what the trainer reads)."""


class SetupError(JobError):
    """This process lacks what the job asks for (an accelerator, a checkpoint it can resume)."""


class DivergenceError(JobError, ArithmeticError):
    """The loss became NaN or infinite: every later step would only spread it. The worker lets this one
    end it as an uncaught exception: its traceback's last line, `largebatch.errors.DivergenceError:
    training diverged: ...`, is what torchrun's agent, the operator and `lbctl sweep` recognise."""
