"""`python -m streams run NAME ...`: the same as `weir streams run NAME ...`."""

import sys

from services.cli import run
from streams.cli import command

args = sys.argv[1:]
if args[:1] == ["run"]:
    sys.exit(run(command, args[1:], "weir streams run"))
print("usage: python -m streams run NAME [options] (weir streams run --help)", file=sys.stderr)
sys.exit(2)
