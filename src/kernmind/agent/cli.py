"""`kernmind agent` (placeholder until the agent issue lands)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kernmind.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("agent", parents=[common], help="run the bundled agent loop")
    p.add_argument("-p", "--prompt", help="one-shot prompt; prints the final answer")


def run(args: argparse.Namespace, settings: Settings) -> int:
    print("kernmind agent: not implemented yet", file=sys.stderr)
    return 2
