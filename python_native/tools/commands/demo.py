"""``python -m python_native demo``: a transformer block with the overrides on, then off."""

from __future__ import annotations

import argparse

from python_native.tools.commands.usage import at_least

HELP = "run a small transformer block forward and backward with the overrides on and off, and compare"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from python_native.tools import demo

    demo.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    at_least("--repeats", args.repeats, 1, "timed runs per mode; leave it out for the default")
    from python_native.tools import demo

    return demo.run(args)
