"""What every `weir` subcommand shares: running a click command as
`main(argv) -> exit code`, and groups whose subcommands load lazily.

Errors: a bad argument or a bad setting (click's UsageError, which
services.config's SettingsError is) is one line on stderr, `<prog>:
<what>`, and exit 2; the command's own return value is its exit code. `weir --help` lists the
subcommands from their names and one-line helps here, without importing
them, so it stays fast and each subcommand's imports stay its own.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

EXIT_USAGE = 2
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
T = TypeVar("T")


def run(command: click.Command, argv: Sequence[str], prog: str) -> int:
    """Run `command` on `argv`; its result (an int, None: 0) is the exit code."""
    try:
        result = command.main(list(argv), prog_name=prog, standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog
        print(f"{where}: {' '.join(exc.format_message().split())}", file=sys.stderr)  # one line
        return EXIT_USAGE
    except click.Abort:
        print(f"{prog}: aborted", file=sys.stderr)
        return 1
    except click.ClickException as exc:
        print(f"{prog}: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    return int(result or 0)


def fail(message: str) -> None:
    """A bad argument found after parsing: one line, exit 2."""
    raise click.UsageError(message)


def _attached(ctx: click.Context, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, a usage error it raises naming `ctx`'s command."""
    try:
        return call(*args)
    except click.UsageError as exc:
        exc.ctx = exc.ctx or ctx
        raise


class Command(click.Command):
    """A command whose errors name it (`weir up: ...`): a SettingsError (a
    UsageError) raised while it runs, or a bad argument click found unattached."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _attached(ctx, super().parse_args, ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        return _attached(ctx, super().invoke, ctx)


class Group(click.Group):
    command_class = Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args:  # one line naming the commands, not the whole help
            commands = ", ".join(f"{ctx.command_path} {n}" for n in self.list_commands(ctx))
            raise click.UsageError(f"give a command: {commands}", ctx)
        return _attached(ctx, super().parse_args, ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        return _attached(ctx, super().invoke, ctx)


class LazyGroup(Group):
    """A group whose subcommands are `module:attribute` strings, imported when used."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy  # name -> ("module:attribute", one-line help)
        self.commands_here: dict[str, click.Command] = {}  # defined beside the group

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and ctx.parent is None:  # `weir` alone: its help, as `weir --help`
            click.echo(ctx.get_help())
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.lazy)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return None
        if cmd_name in self.commands_here:
            return self.commands_here[cmd_name]
        module, _, attribute = self.lazy[cmd_name][0].partition(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args[0] not in self.lazy and not args[0].startswith("-"):
            raise click.UsageError(
                f"unknown command {args[0]!r} (see {ctx.command_path} --help)", ctx
            )
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in self.lazy.items()])


def lazy_group(name: str, help: str, lazy: dict[str, tuple[str, str]]) -> Callable[..., Any]:
    """Decorator for a group function with lazily imported subcommands."""
    return click.group(name, cls=LazyGroup, lazy=lazy, help=help, context_settings=CONTEXT)


PLAIN_EVERY_S = 5.0  # seconds between plain progress lines of one long step


class Progress:
    """A long command's progress on stderr: a rich bar in a terminal, plain
    `<prog>: <message>` lines otherwise (a log, a pipe, a test).

    `step(what, total)` is one phase (a bar; total None: a count with no end),
    used as a context manager; in it `say(message)` names what happens now
    (the bar's text, or a line) and `advance(n)` counts (a plain line at most
    every PLAIN_EVERY_S). rich is imported only for a terminal.
    """

    def __init__(self, prog: str, terminal: bool | None = None) -> None:
        self.prog = prog
        self.terminal = sys.stderr.isatty() if terminal is None else terminal

    def line(self, message: str) -> None:
        print(f"{self.prog}: {message}", file=sys.stderr, flush=True)

    def step(self, what: str, total: float | None = None) -> Step:
        return Step(self, what, total)


class Step:
    def __init__(self, progress: Progress, what: str, total: float | None) -> None:
        import time

        self.progress, self.what, self.total = progress, what, total
        self.done = 0.0
        self._clock = time.monotonic
        self._said_at = self._clock()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Step:
        if self.progress.terminal:
            import rich.progress as rp
            from rich.console import Console

            self._bar = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(),
                                    rp.MofNCompleteColumn(), rp.TimeElapsedColumn(),
                                    console=Console(stderr=True))  # fmt: skip
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        return self

    def say(self, message: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=message)
        else:
            self.progress.line(message)

    def set_total(self, total: float | None) -> None:
        """The end, once known (a bench's messages: when the publishers are done)."""
        self.total = total
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def advance(self, n: float = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.advance(self._task, n)
        elif self._clock() - self._said_at >= PLAIN_EVERY_S:
            self._said_at = self._clock()
            of = f" of {self.total:,.0f}" if self.total is not None else ""
            self.progress.line(f"{self.what}: {self.done:,.0f}{of}")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
