"""A session's layer: what it holds, how it moves with the session, and what a sandboxed
build may put into it (regular files only, no links, no setuid bits)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kernmind.execution.packages.layer import Layer, merge_untrusted_tree
from tests.execution.packages.package_sources import make_wheel


def test_adopt_moves_packages_and_npm_cache_to_the_new_layer(tmp_path: Path) -> None:
    old, new = Layer(tmp_path / "old").create(), Layer(tmp_path / "new").create()
    (old.python / "alpha").mkdir()
    (old.python / "alpha" / "__init__.py").write_text("X = 1\n")
    (old.deno / "npm").mkdir()
    new.adopt_from(old)
    assert (new.python / "alpha" / "__init__.py").read_text() == "X = 1\n"
    assert (new.deno / "npm").is_dir()
    assert not old.root.exists()


def test_distributions_are_read_from_dist_info(tmp_path: Path) -> None:
    import zipfile

    layer = Layer(tmp_path / "layer").create()
    wheel = make_wheel(tmp_path / "wh", "Some_Pkg", "1.2.3")
    zipfile.ZipFile(wheel).extractall(layer.python)
    dists = layer.python_distributions()
    assert list(dists) == ["some-pkg"] and dists["some-pkg"].version == "1.2.3"
    assert not layer.is_empty()
    layer.remove()
    assert layer.is_empty()


def test_untrusted_tree_keeps_only_regular_files_with_safe_modes(tmp_path: Path) -> None:
    out, target = tmp_path / "out", tmp_path / "layer"
    (out / "pkg").mkdir(parents=True)
    (out / "pkg" / "__init__.py").write_text("ok\n")
    tool = out / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    os.chmod(tool, 0o6777)  # setuid, setgid, world-writable
    (out / "pkg" / "secret.txt").symlink_to("/etc/shadow")
    (out / "escape").symlink_to("/etc")
    os.mkfifo(out / "pkg" / "pipe")
    target.mkdir()
    (target / "pkg").mkdir()
    (target / "pkg" / "__init__.py").write_text("already here\n")

    skipped = merge_untrusted_tree(out, target)

    assert sorted(skipped) == ["escape", "pkg/__init__.py", "pkg/pipe", "pkg/secret.txt"]
    assert (target / "pkg" / "__init__.py").read_text() == "already here\n"
    mode = stat.S_IMODE((target / "bin" / "tool").stat().st_mode)
    assert mode == 0o755
    assert not (target / "escape").exists() and not (target / "pkg" / "secret.txt").exists()
    assert all(not p.is_symlink() for p in target.rglob("*"))
