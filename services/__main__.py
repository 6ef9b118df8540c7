"""The `weir` command: one click group, each subcommand living with the
layer it drives and imported only when it runs (`services.cli.LazyGroup`),
so `weir --help` stays fast and a subcommand's imports stay its own.

Every subcommand takes `--help` (exit 0); a bad argument is one line on
stderr and exit 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import click

from services.cli import lazy_group, run

COMMANDS = {
    "up": ("services.node.app:up", "run the broker (embedded default: its own Redis and Kafka)"),
    "drain": ("services.machine.drain:drain",
              "tell nodes of `up --nodes/--workers` to send their clients elsewhere"),
    "bench": ("bench.cli:command",
              "run the load generator against a broker, optionally --vs a peer"),
    "streams": ("",
                "run a Spark job over the event log (run NAME), or check the state (verify)"),
    "report": ("streams.report:command", "tables and PNG charts of the analytics job's output"),
    "passwd": ("services.auth.passwd:passwd",
               "add or change a user of a password file (or, --redis URL, in Redis)"),
    "ban": ("services.auth.cli:ban",
            "ban clients cluster-wide by client id, user name or address (Redis)"),
    "ctl": ("services.admin.ctl.command:ctl",
            "manage a running Weir over its HTTP API: clients, retained, bans, keys..."),
    "config": ("services.config.commands:config",
               "show the effective settings, check a file, write the example file"),
}  # fmt: skip
STREAMS = {
    "run": ("streams.cli:command",
            "run a Spark job: state, analytics (over the event log), rules (bridged messages)"),
    "verify": ("services.admin.verify:command",
               "compare the state store and the live nodes with a replay of the log"),
}  # fmt: skip


def _version() -> str:
    try:
        return version("weir")
    except PackageNotFoundError:  # pragma: no cover - run from a checkout without install
        return "unknown"


@lazy_group("weir", "Weir, a clustered MQTT broker. `weir COMMAND --help` describes each.",
            COMMANDS)  # fmt: skip
@click.version_option(_version(), "--version", prog_name="weir", message="%(prog)s %(version)s")
def weir() -> None:
    pass


@lazy_group("streams", "The Spark jobs and the check of the state they keep.", STREAMS)
def streams() -> None:
    pass


weir.commands_here["streams"] = streams


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run(weir, args, "weir")


if __name__ == "__main__":
    sys.exit(main())
