"""Per-test times by xdist group, for balancing the suite (``KERNMIND_TEST_TIMES=<file prefix>``).

Each worker appends ``<seconds>\t<phase>\t<group>\t<nodeid>`` lines to ``<prefix>.<worker>``;
without the variable this plugin does nothing. ``python tests/timings.py <prefix>`` sums them by
group and by file: with ``--dist loadfile`` (the README's) one file runs on one worker, so its
module fixtures start once. (The groups no longer schedule anything: ``--dist loadgroup`` stopped
grouping with pytest 9.2, pytest-xdist issue 1386; they still say which tests share a server.)
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PREFIX = os.environ.get("KERNMIND_TEST_TIMES")


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None and marker.args else "-"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    if PREFIX is None:
        return
    report = outcome.get_result()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{PREFIX}.{worker}", "a") as out:
        out.write(f"{report.duration:.3f}\t{report.when}\t{_group(item)}\t{report.nodeid}\n")


def summarise(prefix: str) -> None:
    by_group: dict[str, float] = defaultdict(float)
    by_file: dict[str, float] = defaultdict(float)
    for path in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        for line in path.read_text().splitlines():
            seconds, _, group, nodeid = line.split("\t", 3)
            by_group[group] += float(seconds)
            by_file[nodeid.split("::")[0]] += float(seconds)
    print(f"all: {sum(by_group.values()):.0f} s")
    for name, total in sorted(by_group.items(), key=lambda kv: -kv[1])[:15]:
        print(f"group {name}: {total:.0f} s")
    for name, total in sorted(by_file.items(), key=lambda kv: -kv[1])[:25]:
        print(f"file {name}: {total:.0f} s")


if __name__ == "__main__":
    summarise(sys.argv[1])
