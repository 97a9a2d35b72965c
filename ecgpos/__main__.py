import sys

from ecgpos.cli import main

sys.exit(main())
