"""The `weir` command: `weir up` runs the broker, `weir bench` measures one.

Each subcommand lives with the layer it drives; this module only dispatches,
so `weir --help` stays fast and a subcommand's imports stay its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

USAGE = """usage: weir <command> [options]

commands:
  up      run the broker (embedded default: its own Redis and Kafka)
  bench   run the load generator against a broker, optionally --vs a peer

`weir <command> --help` describes each command's options."""


def _up(argv: Sequence[str]) -> int:
    from services.node.app import main as up_main

    return up_main(argv)


def _bench(argv: Sequence[str]) -> int:
    from bench.cli import main as bench_main

    return bench_main(argv)


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {"up": _up, "bench": _bench}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"weir: unknown command {args[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())
