"""`python -m ecgpos.cli <command>`: the same as `ecgpos <command>`."""

import sys

from ecgpos.cli import main

sys.exit(main())
