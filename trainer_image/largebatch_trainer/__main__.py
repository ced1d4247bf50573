"""`python -m largebatch_trainer`."""

from largebatch_trainer.main import run

run()
