"""`python -m largebatch` is `lbctl`."""

from largebatch.cli import main

main()
