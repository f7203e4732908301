#!/usr/bin/env python3
"""The child job of leaderd's safety tests.

Appends to a shared history log (path as the first argument, else the
LEADERD_TEST_HISTORY environment variable):

    <CLOCK_MONOTONIC ns> <start|beat|end> <LEADERD_IDENTITY> <LEADERD_FENCING_TOKEN> <pid>

one `start` line, a `beat` line every ~20 ms, and an `end` line when it gets
SIGTERM (then it exits 0). Every line is one write(2) on an O_APPEND file
descriptor, so concurrent writers never interleave within a line. The checker
is tests/common/history.rs.

Options:
  --ignore-term   ignore SIGTERM (only SIGKILL stops it; no `end` line)
  --grandchild    also spawn a grandchild in the same process group that
                  ignores SIGTERM and heartbeats under the same tenure

Safety net against strays: every process exits once the log file is gone
(the test's temporary directory was removed) or after --max-seconds.
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class History:
    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, text):
        data = text.encode()
        written = os.write(self.fd, data)
        if written != len(data):
            # Never seen for a line this short on a local file; say so loudly
            # rather than leave a torn line for the checker to puzzle over.
            sys.stderr.write(f"job.py: short write ({written} of {len(data)} bytes)\n")
            sys.exit(3)

    def still_there(self):
        return os.path.exists(self.path)


def fail(history, message):
    """Reports a setup error in the log too, so the checker fails clearly."""
    sys.stderr.write(f"job.py: {message}\n")
    if history is not None:
        history.write(f"# job.py pid {os.getpid()}: {message}\n")
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="?", default=os.environ.get("LEADERD_TEST_HISTORY"))
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--role", choices=["job", "grandchild"], default="job", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if not args.log:
        fail(None, "no history log: pass a path or set LEADERD_TEST_HISTORY")
    try:
        history = History(args.log)
    except OSError as error:
        fail(None, f"cannot open history log {args.log!r}: {error}")

    identity = os.environ.get("LEADERD_IDENTITY", "")
    token = os.environ.get("LEADERD_FENCING_TOKEN", "")
    if not identity or any(c.isspace() for c in identity):
        fail(history, f"LEADERD_IDENTITY must be set and free of whitespace, got {identity!r}")
    if not token.isdigit():
        fail(history, f"LEADERD_FENCING_TOKEN must be a whole number, got {token!r}")

    pid = os.getpid()

    def line(event):
        history.write(f"{now_ns()} {event} {identity} {token} {pid}\n")

    if args.role == "grandchild" or args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        def on_term(_signum, _frame):
            line("end")
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)

    line("start")

    if args.grandchild and args.role == "job":
        # Same process group (no new session): leaderd's group kill must
        # reach it, its SIGTERM must not.
        subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                args.log,
                "--role",
                "grandchild",
                "--interval-ms",
                str(args.interval_ms),
                "--max-seconds",
                str(args.max_seconds),
            ],
            stdin=subprocess.DEVNULL,
        )

    interval = args.interval_ms / 1000.0
    started = time.monotonic()
    deadline = started + interval
    while True:
        pause = deadline - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        # After a pause (SIGSTOP, a frozen machine) carry on at the usual
        # pace instead of bursting to catch up.
        deadline = max(deadline + interval, time.monotonic())
        if not history.still_there():
            sys.exit(0)
        if time.monotonic() - started > args.max_seconds:
            sys.stderr.write(f"job.py: pid {pid} ran for --max-seconds {args.max_seconds}, leaving\n")
            sys.exit(4)
        line("beat")


if __name__ == "__main__":
    main()
