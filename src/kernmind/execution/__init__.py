"""Running code: the ``run_code`` call path at the top, one room per job below.

The call path (this folder):
    executor      routing: language -> runner, hold the session (or a throw-away one), supervise.
    supervisor    every runner's time limit, quota, progress, close/cancel, and the RunResult.
    results       the run_code result model and the budgets of one call; plotly_result: figures.
    errors        exceptions shared across execution.
    remote        ``--kernel-gateway``: the gateway client, kernel factory and session registry
                  (shared by replicas on PostgreSQL), wired from settings.
The rooms:
    tools/        the MCP surface: run_code and install_packages (code_tools), a run result's
                  content blocks (run_content), files and workspace:// resources (file_tools),
                  sessions and jobs (session_tools), an interpreter that cannot start worded
                  as a refusal (runtime_refusals), ``kernmind sessions`` (sessions_cli).
    sessions/     who owns which session: the registry (with its idle reaper; session: a
                  Session; session_rows: what list_sessions shows), caps, the on-disk store, the PostgreSQL
                  rows shared by replicas, history, notebooks, background jobs.
    kernels/      Jupyter kernels behind one interface (api: the Kernel and KernelFactory
                  protocols): local, forked from a template (forkserver/), on a gateway
                  (gateway/); the warm pool, the message reader, variable snapshots.
    sandbox/      isolation and limits: bubblewrap, rlimits, seccomp, cgroups, GPU, the
                  workspace directory, its quota and file scan, the run directory.
    runners/      one Runner per language (Python on kernels; Deno, R, Java, Bash).
    packages/     run-time installs into per-session layers (uv, npm via Deno, policy).

Dependency direction: tools -> executor/supervisor/remote -> the rooms; results and errors are the
vocabulary every room imports; packages -> sandbox only. No module cycle anywhere and nothing
here imports ``kernmind.memory`` (tests/test_architecture.py). Between rooms, two back-edges
remain: kernels/pool.py and kernels/snapshot.py read the on-disk session layout
(sessions/disk_store.py), and sessions/shared.py builds gateway kernels (kernels/gateway/).
"""
