"""`python -m tests.faults`: see tests/faults/run.py."""

import sys

from tests.faults.run import main

sys.exit(main())
