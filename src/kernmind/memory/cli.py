"""`kernmind memory export|import` (placeholder until the memory issue lands)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kernmind.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    sub.add_parser("memory", parents=[common], help="export or import a memory namespace")


def run(args: argparse.Namespace, settings: Settings) -> int:
    print("kernmind memory: not implemented yet", file=sys.stderr)
    return 2
