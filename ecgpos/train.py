"""`python -m ecgpos.train`: the older spelling of `python -m ecgpos.pretrain`, kept for existing job scripts."""

import sys

from ecgpos.cli import run_command

if __name__ == "__main__":
    sys.exit(run_command("pretrain", sys.argv[1:]))
