"""Control groups per session (``cgroups.py``) and the seccomp filter (``seccomp.py``), for real.

The real-group tests need a hierarchy this process may write (root on cgroup v1, as in CI,
or a delegated cgroup v2 subtree) and are skipped elsewhere with the reason; the layout
logic is checked on the text of ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` as hosts
show it; the normal-user fallback is checked by running detection as an unprivileged user.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kernmind.execution.sandbox import cgroup_layout, cgroup_leftovers, cgroups, seccomp
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import CgroupsUnavailable, CgroupSupport
from kernmind.execution.sandbox.rundir import RunDir

pytestmark = pytest.mark.slow  # real processes in real control groups

SUPPORT = CgroupSupport.detect()
needs_groups = pytest.mark.skipif(not SUPPORT.active, reason=f"no control groups here: {SUPPORT.reason}")
SUPPORT.close()


@pytest.fixture
def support() -> Iterator[CgroupSupport]:
    made = CgroupSupport.detect()
    try:
        yield made
    finally:
        made.close()
        assert not any(d.exists() for d in made.server_dirs), "every group the test made is removed"


def run_in(group: cgroups.Cgroup, code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = group.join_argv([sys.executable, "-c", code])
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


# --- real groups ---------------------------------------------------------------------------


@needs_groups
def test_a_process_started_through_join_argv_is_in_the_group_from_its_start(support: CgroupSupport) -> None:
    group = support.new_group(memory_mb=256, max_pids=32)
    proc = run_in(group, "print(open('/proc/self/cgroup').read())")
    assert proc.returncode == 0, proc.stderr
    name = group.dirs[0].name
    lines = [line for line in proc.stdout.splitlines() if f"/{name}" in line]
    # v1: its memory and its pids lines; v2: its one line (in the group's leaf).
    assert len(lines) == (2 if support.mode == "v1" else 1), proc.stdout
    assert group.remove() and not any(d.exists() for d in group.dirs)


@needs_groups
def test_memory_past_the_limit_is_killed_and_counted(support: CgroupSupport) -> None:
    """A process that touches more than the group's memory is killed by the kernel; the group says so."""
    group = support.new_group(memory_mb=100, max_pids=32)
    assert group.oom_kills() == 0
    proc = run_in(group, "b = bytearray(300 * 2**20)\nprint('survived')")
    assert proc.returncode == -signal.SIGKILL and "survived" not in proc.stdout
    assert group.oom_kills() == 1
    group.remove()


@needs_groups
def test_tmpfs_pages_count_against_the_group(support: CgroupSupport, tmp_path: Path) -> None:
    """Files written into a sandbox's in-memory /dev/shm are the writer's group's memory."""
    sandbox = Sandbox.detect("auto")
    if not sandbox.isolated:
        pytest.skip(f"bubblewrap is not usable here: {sandbox.reason}")
    group = support.new_group(memory_mb=100, max_pids=64)
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(tmp_path, uid, uid)
    code = "for i in range(40):\n    open(f'/dev/shm/c{i}', 'wb').write(b'x' * 5 * 2**20)\nprint('wrote 200 MiB')"
    cmd = sandbox.wrap(["/usr/bin/python3", "-c", code], workspace=tmp_path, uid=uid)
    proc = subprocess.run(group.join_argv(cmd.argv), env=cmd.env, capture_output=True, text=True, timeout=60)
    assert "wrote 200 MiB" not in proc.stdout
    assert group.oom_kills() >= 1
    group.remove()


@needs_groups
def test_the_process_limit_holds_a_fork_bomb(support: CgroupSupport) -> None:
    group = support.new_group(memory_mb=256, max_pids=20)
    code = (
        "import os, time\nkids = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
        "            time.sleep(5); os._exit(0)\n        kids += 1\nexcept OSError as e:\n    print(kids, e.errno)"
    )
    proc = run_in(group, code)
    started, errno = map(int, proc.stdout.split())
    assert started < 20 and errno == 11  # EAGAIN at pids.max
    assert group.kill() and group.pids() == []
    group.remove()


@needs_groups
def test_adopt_moves_a_warm_groups_processes_and_removes_it(support: CgroupSupport) -> None:
    warm = support.new_group(memory_mb=256, max_pids=32)
    session = support.new_group(memory_mb=256, max_pids=32)
    sleeper = subprocess.Popen(warm.join_argv(["sleep", "30"]))
    try:
        deadline = time.monotonic() + 5
        while sleeper.pid not in warm.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        session.adopt(warm)
        assert session.pids() == [sleeper.pid]
        assert not any(d.exists() for d in warm.dirs)
    finally:
        session.remove()
        sleeper.wait(5)
    assert sleeper.returncode == -signal.SIGKILL  # removing a group kills what is left in it


@needs_groups
def test_a_dead_servers_groups_are_removed_by_the_next_server(tmp_path: Path) -> None:
    """A server killed with its groups in place: the next one on the same data dir (its run
    directory lists them) kills what still runs there and removes them."""
    script = (
        "import sys, time, subprocess\n"
        "from pathlib import Path\n"
        "from kernmind.execution.sandbox.cgroups import CgroupSupport\n"
        "from kernmind.execution.sandbox.rundir import RunDir\n"
        "s = CgroupSupport.detect()\n"
        "RunDir(Path(sys.argv[1]), cgroups=s.server_dirs).open()\n"
        "g = s.new_group(256, 32)\n"
        "p = subprocess.Popen(g.join_argv(['sleep', '120']), start_new_session=True)\n"
        "print(p.pid, *s.server_dirs, flush=True)\n"
        "time.sleep(120)\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    pid, *dirs = server.stdout.readline().split()
    server.kill()
    server.wait()
    orphan = int(pid)
    assert os.path.exists(f"/proc/{orphan}") and all(Path(d).is_dir() for d in dirs)
    RunDir(tmp_path).open().close()
    assert not any(Path(d).exists() for d in dirs)
    deadline = time.monotonic() + 5
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(orphan)


@needs_groups
def test_groups_under_a_dead_servers_directory_are_found_from_the_same_parent(support: CgroupSupport) -> None:
    """Without the run directory: the next server started from the same group finds them by name."""
    parents = [d.parent for d in support.server_dirs]
    dead = [p / "kernmind-999999999-1-dead00" for p in parents]  # no such pid
    for d in dead:
        d.mkdir()
    cgroup_leftovers.remove_orphans(parents[0])
    if len(parents) > 1:
        cgroup_leftovers.remove_orphans(parents[1])
    assert not any(d.exists() for d in dead)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# --- detection, as hosts show it -------------------------------------------------------------

V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_MEMBERSHIP = "8:pids:/\n4:memory:/jobs/42\n0::/\n"
CONTAINER_MOUNTINFO = "700 690 0:40 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"


def test_mountinfo_and_membership_are_read_as_hosts_write_them() -> None:
    mounts = cgroup_layout.read_mounts(V1_MOUNTINFO)
    assert [(m.fstype, str(m.point)) for m in mounts] == [
        ("cgroup", "/sys/fs/cgroup/memory"),
        ("cgroup", "/sys/fs/cgroup/pids"),
        ("cgroup2", "/sys/fs/cgroup/unified"),
    ]
    member = cgroup_layout.read_membership("9:cpu,cpuacct:/a\n4:memory:/jobs/42\n0::/user.slice/x.scope\n")
    assert member == {"cpu": "/a", "cpuacct": "/a", "memory": "/jobs/42", "": "/user.slice/x.scope"}


def test_a_group_is_found_under_a_mount_whose_root_is_not_the_hierarchys() -> None:
    """Inside a container the cgroup mount shows only the container's part of the hierarchy."""
    (mount,) = cgroup_layout.read_mounts(CONTAINER_MOUNTINFO)
    assert cgroup_layout.own_dir(mount, "/docker/abc") == Path("/sys/fs/cgroup")
    assert cgroup_layout.own_dir(mount, "/docker/abc/init.scope") == Path("/sys/fs/cgroup/init.scope")
    assert cgroup_layout.own_dir(mount, "/elsewhere") is None


def test_v2_without_the_memory_controller_says_so() -> None:
    """A cgroup2 hierarchy whose memory and pids controllers are bound elsewhere (here: to v1)."""
    unified = Path("/sys/fs/cgroup/unified")
    if not (unified / "cgroup.controllers").exists():
        pytest.skip("no cgroup2 mount at /sys/fs/cgroup/unified here")
    if {"memory", "pids"} <= set((unified / "cgroup.controllers").read_text().split()):
        pytest.skip("this host's cgroup2 has the controllers")
    found = cgroup_layout.detect_layout(
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n", "0::/\n"
    )
    assert isinstance(found, str) and "controller(s) are not available" in found


def test_turned_off_and_required() -> None:
    off = CgroupSupport.detect("none")
    assert not off.active and "--cgroups none" in off.reason
    with pytest.raises(OSError):
        off.new_group(256, 32)
    if not SUPPORT.active:
        with pytest.raises(CgroupsUnavailable, match="--cgroups required"):
            CgroupSupport.detect("required")


def test_dead_server_names_are_told_from_live_ones() -> None:
    me = f"kernmind-{os.getpid()}-{cgroup_leftovers.start_time(os.getpid())}-abcdef"
    assert not cgroup_leftovers.server_gone(me)
    assert cgroup_leftovers.server_gone(f"kernmind-{os.getpid()}-1-abcdef")  # same pid, another start: reused
    assert cgroup_leftovers.server_gone("kernmind-999999999-5-abcdef")
    assert not cgroup_leftovers.server_gone("kernmind-server")  # not a server's directory at all


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
def test_a_normal_user_without_a_delegated_subtree_falls_back_with_a_reason() -> None:
    """As a normal user on this host (v1 groups are root's; no delegated v2 subtree), detection
    says why there are no groups; ``required`` refuses."""
    user = pwd.getpwnam("nobody")
    lib = Path(tempfile.mkdtemp(prefix="kernmind-cg-"))
    try:
        lib.chmod(0o755)
        package = lib / "kernmind" / "execution" / "sandbox"  # the two modules, standard library only
        package.mkdir(parents=True)
        levels = (lib / "kernmind", lib / "kernmind" / "execution", package)
        for d in levels:
            d.chmod(0o755)
            (d / "__init__.py").write_text("")
        shutil.copy(cgroups.__file__, package / "cgroups.py")
        shutil.copy(cgroup_layout.__file__, package / "cgroup_layout.py")
        shutil.copy(cgroup_leftovers.__file__, package / "cgroup_leftovers.py")
        shutil.copy(Path(cgroups.__file__).with_name("lifeline.py"), package / "lifeline.py")
        for f in [f for d in levels for f in d.iterdir()]:
            if f.is_file():
                f.chmod(0o644)
        code = (
            "import json\nfrom kernmind.execution.sandbox import cgroups as kmcgroups\ns = kmcgroups.CgroupSupport.detect()\n"
            "try:\n    kmcgroups.CgroupSupport.detect('required'); r = 'started'\n"
            "except kmcgroups.CgroupsUnavailable as e:\n    r = str(e)\n"
            "print(json.dumps([s.mode, s.reason, r]))"
        )
        proc = subprocess.run(
            ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
             "/usr/bin/python3", "-c", code],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib)},
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    finally:
        shutil.rmtree(lib, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    mode, reason, required = json.loads(proc.stdout)
    if mode != "none":
        pytest.skip(f"this host delegates cgroups to normal users ({reason})")
    assert "not writable" in reason or "not available" in reason or "not visible" in reason
    assert required.startswith("--cgroups required:")


# --- the seccomp filter ---------------------------------------------------------------------------


def test_filter_programs_are_whole_instructions_for_known_machines() -> None:
    for machine in ("x86_64", "aarch64"):
        data = seccomp.program(machine)
        assert data is not None and len(data) % 8 == 0 and 8 < len(data) // 8 < 64
    assert seccomp.program("mips") is None


FSIZE_PROBE = """
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
out = [soft, hard]
for new in ((hard, hard), (0, hard)):
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, new)
        out.append("changed")
    except (ValueError, OSError):
        out.append("refused")
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
out.append(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
try:
    import os
    fd = os.open("probe", os.O_WRONLY | os.O_CREAT)
    out.append(os.write(fd, b"x"))
except OSError as exc:
    out.append(exc.errno)
print(out)
"""


def test_in_the_sandbox_code_cannot_change_its_file_size_limit(tmp_path: Path) -> None:
    """With writes blocked (soft RLIMIT_FSIZE 0, hard kept), code can neither write nor lift the block;
    other limits stay its own to change."""
    sandbox = Sandbox.detect("auto")
    if not sandbox.isolated or sandbox.seccomp is None:
        pytest.skip(f"no bubblewrap sandbox with the seccomp filter here: {sandbox.reason}")
    uid = sandbox.allocate_uid()
    if uid is not None:
        os.chown(tmp_path, uid, uid)
    blocked = replace(sandbox.limits, writes_blocked=True)
    cmd = sandbox.wrap(["/usr/bin/python3", "-c", FSIZE_PROBE], workspace=tmp_path, uid=uid, limits=blocked)
    proc = subprocess.run(cmd.argv, env=cmd.env, capture_output=True, text=True, timeout=60)
    hard = sandbox.limits.max_file_mb * 2**20
    # 122: EDQUOT, a sandbox started over the quota cannot even create the file (test_quota_enforcement.py)
    assert proc.stdout.strip() == f"[0, {hard}, 'refused', 'refused', 256, 122]", proc.stderr


@needs_groups
def test_with_a_cpu_weight_sessions_share_the_sandboxes_weight_equally() -> None:
    """``cpu_weight``: one group per server weighs that much on the processor (v1: 1024 shares
    per 100); each session's group below it has the default weight; a process started in the
    session is in its cpu group too; everything is removed at the end."""
    support = CgroupSupport.detect(cpu_weight=40)
    try:
        if support.cpu_dir is None:
            pytest.skip(f"no cpu controller to use here: {support.cpu_reason}")
        name = "cpu.weight" if support.mode == "v2" else "cpu.shares"
        assert (support.cpu_dir / name).read_text().strip() == ("40" if support.mode == "v2" else "410")
        one, two = (
            support.new_group(memory_mb=256, max_pids=32),
            support.new_group(memory_mb=256, max_pids=32),
        )
        assert one.cpu_weight() == two.cpu_weight() == 100
        assert one.cpu_dir is not None and one.cpu_dir.parent == support.cpu_dir
        proc = run_in(one, "print(open('/proc/self/cgroup').read())")
        assert proc.returncode == 0, proc.stderr
        weighed = [
            line
            for line in proc.stdout.split()
            if (support.mode == "v2" and line.startswith("0::")) or "cpu" in line.split(":")[1].split(",")
        ]
        assert any(f"/{support.cpu_dir.name}/{one.cpu_dir.name}" in line for line in weighed), proc.stdout
        assert one.remove() and two.remove() and not one.cpu_dir.exists()
    finally:
        support.close()
    assert not any(d.exists() for d in support.server_dirs)


@needs_groups
def test_without_a_cpu_weight_the_cpu_is_left_to_the_scheduler(support: CgroupSupport) -> None:
    assert support.cpu_dir is None and support.cpu_reason == "not asked for"
    group = support.new_group(memory_mb=256, max_pids=32)
    assert group.cpu_dir is None and group.cpu_weight() is None
    assert group.remove()


def test_a_v1_host_without_a_cpu_hierarchy_says_so() -> None:
    found = cgroup_layout.detect_cpu_base("v1", (), V1_MOUNTINFO, V1_MEMBERSHIP)
    assert found == "cgroup v1: no cpu hierarchy is mounted"
    assert cgroup_layout.detect_cpu_base("none", ()) == "no control groups"
    assert cgroups.v1_shares(100) == 1024 and cgroups.v1_shares(25) == 256 and cgroups.v1_shares(1) == 10


# --- cgroup v2 mechanics, on a real cgroup2 hierarchy (without controllers, where that is all there is) --

UNIFIED = Path("/sys/fs/cgroup/unified")
needs_v2_tree = pytest.mark.skipif(
    not (UNIFIED / "cgroup.procs").exists() or not os.access(UNIFIED, os.W_OK),
    reason="no writable cgroup2 hierarchy at /sys/fs/cgroup/unified",
)


@pytest.fixture
def v2_dir() -> Iterator[Path]:
    d = UNIFIED / f"kernmind-test-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    try:
        yield d
    finally:
        assert cgroup_leftovers.remove_server_dir(d) and not d.exists()


@needs_v2_tree
def test_v2_groups_join_in_their_leaf_and_are_killed_and_removed_whole(v2_dir: Path) -> None:
    """A session's processes live in the group's leaf; ``cgroup.kill`` (or signals) ends them all;
    the group goes."""
    (v2_dir / "s1" / cgroups.LEAF).mkdir(parents=True)
    group = cgroups.Cgroup("v2", (v2_dir / "s1",), (v2_dir / "s1" / cgroups.LEAF / "cgroup.procs",), 0, 0)
    sleeper = subprocess.Popen(group.join_argv(["sh", "-c", "sleep 60 & sleep 60"]))
    deadline = time.monotonic() + 5
    while len(group.pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(group.pids()) >= 2 and sleeper.pid in group.pids()
    membership = Path(f"/proc/{sleeper.pid}/cgroup").read_text()
    assert f"0::/{v2_dir.name}/s1/{cgroups.LEAF}" in membership
    assert group.remove() and not (v2_dir / "s1").exists()
    assert sleeper.wait(5) == -signal.SIGKILL


@needs_v2_tree
def test_v2_a_server_alone_in_its_group_moves_into_a_leaf(v2_dir: Path) -> None:
    """A delegated group that holds only the server (and its children): the server moves into
    ``kernmind-server``, so the group can hand controllers down."""
    code = (
        "import subprocess, sys\nfrom pathlib import Path\nfrom kernmind.execution.sandbox import cgroup_layout\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "print(cgroup_layout._move_into_leaf(Path(sys.argv[1])))\n"
        "print(open('/proc/self/cgroup').read().strip().splitlines()[-1])\n"
        "print(open(f'/proc/{child.pid}/cgroup').read().strip().splitlines()[-1])\n"
        "child.kill()"
    )
    procs = v2_dir / "cgroup.procs"
    proc = subprocess.run(
        ["/bin/sh", "-c", 'echo 0 > "$1" && shift && exec "$@"', "join", str(procs), sys.executable, "-c", code, str(v2_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    problem, own, child = proc.stdout.splitlines()
    assert problem == "None", proc.stderr
    assert own.endswith(f"/{v2_dir.name}/{cgroup_layout.SERVER_LEAF}") and child == own


@needs_v2_tree
def test_v2_a_group_shared_with_other_processes_is_left_alone(v2_dir: Path) -> None:
    stranger = subprocess.Popen(
        ["/bin/sh", "-c", 'echo 0 > "$1" && exec sleep 30', "join", str(v2_dir / "cgroup.procs")]
    )
    try:
        deadline = time.monotonic() + 5
        while str(stranger.pid) not in (v2_dir / "cgroup.procs").read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        code = "import sys\nfrom pathlib import Path\nfrom kernmind.execution.sandbox import cgroup_layout\nprint(cgroup_layout._move_into_leaf(Path(sys.argv[1])))"
        proc = subprocess.run(
            ["/bin/sh", "-c", 'echo 0 > "$1" && shift && exec "$@"', "join", str(v2_dir / "cgroup.procs"),
             sys.executable, "-c", code, str(v2_dir)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "also holds processes that are not this server's" in proc.stdout, proc.stdout + proc.stderr
        assert not (v2_dir / cgroup_layout.SERVER_LEAF).exists()
    finally:
        stranger.kill()
        stranger.wait()
