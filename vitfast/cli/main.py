"""`vitfast` entry point. User errors: one line on stderr, exit code 2; anything unexpected: one line, exit code 3
(`--debug` for the traceback of either)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
import warnings

from vitfast._version import __version__
from vitfast.errors import VitfastError, VitfastWarning, describe_exception

from . import bench, export, info, inspect, predict, serve
from .config_args import warn_guesses


INTERNAL_ERROR = 3  # 0 done, 1 parity failed (check, export), 2 a user error (one line), 3 a bug (the traceback with --debug)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitfast", description="Fast, faithful Vision Transformer inference.")
    parser.add_argument("--version", action="version", version=f"vitfast {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (info, export, predict, serve, bench, inspect):  # the order of `vitfast --help`
        group.add_parsers(sub, common)
    return parser


_GUESSES_SHOWN: set[str] = set()


def _show_guesses() -> None:
    """Print each `VitfastWarning` (guessed config fields, ...) once per command, as one `vitfast: warning:` line on stderr."""
    _GUESSES_SHOWN.clear()
    warnings.simplefilter("always", VitfastWarning)
    if getattr(warnings.showwarning, "vitfast_guesses", False):
        return
    default = warnings.showwarning

    def show(message, category, *rest, **kwargs):
        if not issubclass(category, VitfastWarning):
            return default(message, category, *rest, **kwargs)
        if str(message) not in _GUESSES_SHOWN:
            _GUESSES_SHOWN.add(str(message))
            warn_guesses(str(message))

    show.vitfast_guesses = True
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _show_guesses()
    _refuse_empty_values(parser, args)
    previous = signal.signal(signal.SIGTERM, _terminate)  # so cleanup (staging folders) runs on SIGTERM too
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that went away (`--json | head`) shows up here, not as a traceback at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit is quiet too
        return 1
    except VitfastError as exc:
        return _fail(args, str(exc))
    except OSError as exc:  # the environment (a file that vanished, a full disk): still one line, never a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        return _fail(args, f"{exc.strerror or exc}{where}; check the path and its permissions and free space")
    except KeyboardInterrupt as exc:
        print("vitfast: terminated" if isinstance(exc, Terminated) else "vitfast: interrupted", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)  # the shell's convention: 143, 130
    except Exception as exc:  # a bug of vitfast's or a library's: its own exit code, never taken for a failed parity (1)
        if args.debug:
            traceback.print_exc()
        print(f"vitfast: error: internal error: {describe_exception(exc)}; rerun with --debug for the traceback and report it",
              file=sys.stderr)  # fmt: skip
        return INTERNAL_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)


def _refuse_empty_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse turns `--flag=--` into [] without calling the flag's type, and takes `--out ""` (an unset shell variable)
    as given, which the commands then read as not given (predict printed to stdout, bench wrote nothing): refuse both
    like any bad value. A flag whose choices hold "" (--global-pool: timm's name for none) keeps it."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
    command = sub.choices.get(args.command) if sub else None
    for action in command._actions if command else ():  # noqa: SLF001
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            continue
        if action.nargs is None and value == []:
            command.error(f"argument {'/'.join(action.option_strings)}: expected a value")
        if (value == "" or isinstance(value, list) and "" in value) and "" not in (action.choices or ()):
            command.error(f"argument {'/'.join(action.option_strings)}: expected a value, got an empty string")


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.debug:
        traceback.print_exc()
    print(f"vitfast: error: {message}", file=sys.stderr)
    return 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that cleanup (staging folders) runs as it does on Ctrl-C."""


def _terminate(signum, frame) -> None:
    raise Terminated
