"""`python -m ecgpos.pretrain` / `accelerate launch -m ecgpos.pretrain`: the `ecgpos pretrain` command."""

import sys

from ecgpos.cli import run_command

sys.exit(run_command("pretrain", sys.argv[1:]))
