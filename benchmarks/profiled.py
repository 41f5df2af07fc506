"""Run a module under cProfile and write the profile when it ends, by SIGTERM too (how load_bench stops a server).

    python benchmarks/profiled.py OUT.prof -m proxy serve --engine scripted ...   # profile a server (one process)
    python benchmarks/profiled.py --root TREE OUT.prof -m proxy serve ...         # the module from another tree
    python benchmarks/profiled.py --show OUT.prof [N]                             # the N costliest functions

With load_bench.py, as a server of its own (its {placeholders} are filled in):

    load_bench.py --server-cmd 'prof={python} benchmarks/profiled.py /tmp/ours.prof -m proxy serve
        --engine scripted --script {script} --port {port} --no-store --tokens-per-step {tokens_per_step}'

cProfile slows the server several times over, so compare profiles with each other, not with load_bench's figures;
with --workers only the supervisor is profiled.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import runpy
import signal
import sys


def profile_module(out: str, module: str, argv: list[str], root: str) -> None:
    sys.path.insert(0, root)  # as `python -m` does with the working directory
    sys.argv = [module, *argv]
    # uvicorn hands SIGTERM on to the handler it found once it has shut down: this one exits normally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    profile = cProfile.Profile()
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--show"]:
        stats = pstats.Stats(args[1])
        stats.sort_stats("tottime").print_stats(int(args[2]) if len(args) > 2 else 30)
        return
    root = os.getcwd()
    if args[:1] == ["--root"]:
        root, args = os.path.abspath(args[1]), args[2:]
    if len(args) < 3 or args[1] != "-m":
        raise SystemExit(__doc__)
    profile_module(args[0], args[2], args[3:], root)


if __name__ == "__main__":
    main()
