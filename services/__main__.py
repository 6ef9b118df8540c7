"""The `weir` command: `weir up` runs the broker, `weir bench` measures one,
`weir streams` runs the Spark jobs and checks the state they keep, `weir
report` shows what the analytics job found.

Each subcommand lives with the layer it drives; this module only dispatches,
so `weir --help` stays fast and a subcommand's imports stay its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

USAGE = """usage: weir <command> [options]

commands:
  up                 run the broker (embedded default: its own Redis and Kafka)
  drain [NODE-ID...] tell nodes of `up --nodes/--workers` to send their clients elsewhere
  bench              run the load generator against a broker, optionally --vs a peer
  streams run NAME   run a Spark job over the event log (state, analytics)
  streams verify     compare the state store and the live nodes with a replay of the log
  report             tables and PNG charts of the analytics job's output
  passwd FILE USER   add or change a user of a password file (argon2id hashes;
                     passwd --redis URL USER: a user in Redis, for --auth-redis)
  ban add|list|del   ban clients cluster-wide by client id, user name or address (Redis)

`weir <command> --help` describes each command's options."""


def _up(argv: Sequence[str]) -> int:
    from services.node.app import main as up_main

    return up_main(argv)


def _drain(argv: Sequence[str]) -> int:
    from services.machine.drain import main as drain_main

    return drain_main(argv)


def _bench(argv: Sequence[str]) -> int:
    from bench.cli import main as bench_main

    return bench_main(argv)


STREAMS_USAGE = "usage: weir streams run NAME [options] | weir streams verify [options]"


def _streams(argv: Sequence[str]) -> int:
    sub = argv[0] if argv else None
    if sub == "run":
        from streams.cli import main as streams_main  # needs the 'spark' extra

        return streams_main(argv)
    if sub == "verify":
        from services.admin.verify import main as verify_main

        return verify_main(argv[1:])
    if sub in ("-h", "--help"):
        print(STREAMS_USAGE)
        return 0
    print(STREAMS_USAGE, file=sys.stderr)
    return 2


def _report(argv: Sequence[str]) -> int:
    from streams.report import main as report_main  # needs the 'spark' extra (pyarrow, matplotlib)

    return report_main(argv)


def _passwd(argv: Sequence[str]) -> int:
    from services.auth.passwd import main as passwd_main

    return passwd_main(argv)


def _ban(argv: Sequence[str]) -> int:
    from services.auth.cli import main as ban_main

    return ban_main(argv)


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "passwd": _passwd,
    "ban": _ban,
    "up": _up,
    "drain": _drain,
    "bench": _bench,
    "streams": _streams,
    "report": _report,
}


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
