"""`python -m largebatch_trainer`."""

import sys

from largebatch_trainer.main import main

sys.exit(main())
