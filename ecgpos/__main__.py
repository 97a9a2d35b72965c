"""`python -m ecgpos <command>`: the same as `ecgpos <command>` (ecgpos.cli)."""

import sys

from ecgpos.cli import main

sys.exit(main())
