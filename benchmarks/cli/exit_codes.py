"""Exit codes of the command lines that used to abort in XLA's C++ (exit 134, "terminate called"):
N runs in all, counted by exit code. The goal: none but 0, 1, 2 and 130.

    PYTHONPATH=src python benchmarks/cli/exit_codes.py OUT [--runs 50] [--jobs 3] [--only bench,advise-ctrl-c]

The commands (``COMMANDS``): ``bench`` of two cells over a 1 s cell budget; ``advise`` of
llama-3.1-8b at 4k (the README's command; half its cells over the CPU's budget); and both with
Ctrl-C 10-12 s in (uniformly drawn, seeded). ``--runs`` is the total, shared among the chosen
commands in turn. Each run is ``python -m attnlab.cli`` in its own session with SIGINT's default
handler. Its code is the shell's (killed by signal N: 128 + N; SIGABRT is 134); a run whose output
holds "terminate called", "FATAL", "Segmentation fault", "Fatal Python error" or "Traceback" counts
as a crash whatever its code. Writes OUT/exit_codes.json (every run: command, code, seconds,
Ctrl-C's delay and the seconds from it to the exit) and prints the summary.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

CRASH_WORDS = ("terminate called", "FATAL", "Segmentation fault", "Fatal Python error", "Traceback")
#: name -> (arguments of attnlab, Ctrl-C's delay range in seconds or None)
COMMANDS = {
    "bench": (["bench", "--backends", "xla", "--seq", "64,128", "--heads", "8", "--head-dim", "64",
               "--cell-budget", "1"], None),
    "advise": (["advise", "--model", "llama-3.1-8b", "--context", "4k"], None),
    "bench-ctrl-c": (["bench", "--backends", "xla,naive", "--seq", "64,128,256", "--heads", "8", "--head-dim", "64"],
                     (10.0, 12.0)),
    "advise-ctrl-c": (["advise", "--model", "llama-3.1-8b", "--context", "4k"], (10.0, 12.0)),
}


def run_once(name: str, out_dir: str, delay: float | None, timeout_s: float) -> dict:
    args, _ = COMMANDS[name]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli", *args, "--out", out_dir], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    sent = None
    try:
        if delay is not None:
            try:
                proc.wait(delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                sent = time.monotonic()
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    text = out.decode(errors="replace")
    end = time.monotonic()
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode   # killed by signal N: 128 + N
    return {"command": name, "code": code, "signal": -proc.returncode if proc.returncode < 0 else None,
            "seconds": round(end - t0, 2), "ctrl_c_at_s": delay,
            "exit_after_ctrl_c_s": round(end - sent, 2) if sent else None,
            "crash_words": [w for w in CRASH_WORDS if w in text], "tail": text[-600:]}


def _report(r: dict) -> dict:
    print(f"{r['command']:<14} exit {r['code']:>4} in {r['seconds']:6.1f} s"
          + (f", Ctrl-C at {r['ctrl_c_at_s']:.1f} s, exit {r['exit_after_ctrl_c_s']} s later"
             if r["exit_after_ctrl_c_s"] is not None else "") + (f"  {r['crash_words']}" if r["crash_words"] else ""),
          flush=True)
    return r


def summary(runs: list[dict]) -> str:
    lines = []
    for name in COMMANDS:
        mine = [r for r in runs if r["command"] == name]
        if not mine:
            continue
        codes = collections.Counter(r["code"] for r in mine)
        crashes = sum(bool(r["crash_words"]) for r in mine)
        waits = sorted(r["exit_after_ctrl_c_s"] for r in mine if r["exit_after_ctrl_c_s"] is not None)
        w = f"; Ctrl-C to exit: median {waits[len(waits) // 2]:.2f} s, max {waits[-1]:.2f} s" if waits else ""
        lines.append(f"{name:<14} {len(mine):>3} runs: " + ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))
                     + f"; crash words in {crashes}{w}")
    bad = sum(r["code"] not in (0, 1, 2, 130) or bool(r["crash_words"]) for r in runs)
    lines.append(f"all            {len(runs):>3} runs: {bad} outside 0/1/2/130 or with crash words")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=50, help="runs in all, shared among the commands in turn")
    ap.add_argument("--jobs", type=int, default=3, help="runs at once")
    ap.add_argument("--only", default=",".join(COMMANDS), help="comma-separated commands: " + ", ".join(COMMANDS))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is killed")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        ap.error(f"--only: unknown {unknown}; choose from {list(COMMANDS)}")
    rng = random.Random(0)
    plan = []
    for i in range(a.runs):
        name = names[i % len(names)]
        span = COMMANDS[name][1]
        plan.append((name, os.path.join(a.out, f"run{i:03d}-{name}"), rng.uniform(*span) if span else None))
    os.makedirs(a.out, exist_ok=True)
    with ThreadPoolExecutor(a.jobs) as pool:
        runs = list(pool.map(lambda p: _report(run_once(*p, a.timeout)), plan))
    with open(os.path.join(a.out, "exit_codes.json"), "w", encoding="utf-8") as f:
        json.dump({"python": sys.version.split()[0], "runs": runs, "summary": summary(runs)}, f, indent=1)
    print(summary(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
