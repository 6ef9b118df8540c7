"""`python -m streams run NAME ...`: the same as `weir streams run NAME ...`."""

import sys

from streams.cli import main

sys.exit(main(sys.argv[1:]))
