"""The subprocess signal test (tests/test_signals.py) in a loop, several at once, to count rare failures.

    python benchmarks/signal_loop.py [--runs 60] [--parallel 3] [--root DIR] [--kinds SIGTERM SIGINT SIGHUP double]

Each run starts `autotune run --backend sim --trials 100000` (the CLI from --root, default this checkout),
waits for 5 trials in its SQLite study, sends the signal (double: SIGINT, 5 ms, SIGINT) and checks what the
test checks: exit 130, stderr exactly the one line, no trial left RUNNING. Runs overlap (--parallel), so
they load the CPUs as CI does. Prints each failure (exit code, RUNNING count, stderr tail) and the counts.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = "autotune: interrupted; finished trials are stored, run the same command to resume"


def _count(db: Path, sql: str = "SELECT count(*) FROM trials") -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute(sql).fetchone()[0]
    except sqlite3.Error:
        return 0


def _default_signals() -> None:
    """As a terminal starts it: a shell's background job (`cmd &`) ignores SIGINT, and autotune keeps an ignored
    signal ignored on purpose (nohup), so a run started from one never stops on SIGINT."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def one(root: Path, kind: str) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="signal-loop-") as d:
        out = Path(d) / "o"
        proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-7b", "--gpus", "8",
                                 "--backend", "sim", "--trials", "100000", "--out", str(out), "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
                                env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(root)},
                                preexec_fn=_default_signals)
        db = out / "autotune.db"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _count(db) < 5:
            time.sleep(0.3)
        if kind == "double":
            proc.send_signal(signal.SIGINT)
            time.sleep(0.005)
            proc.send_signal(signal.SIGINT)
        else:
            proc.send_signal(getattr(signal, kind))
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return False, "no exit within 180 s of the signal (killed)"
        running = _count(db, "SELECT count(*) FROM trials WHERE state='RUNNING'")
        ok = proc.returncode == 130 and err.strip().splitlines() == [LINE] and running == 0
        return ok, f"exit {proc.returncode}, RUNNING {running}, stderr tail {err.strip()[-400:]!r}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--parallel", type=int, default=3)
    p.add_argument("--root", type=Path, default=ROOT, help="checkout whose autotune is run (default: this one)")
    p.add_argument("--kinds", nargs="+", default=["SIGTERM", "SIGINT", "SIGHUP", "double"],
                   choices=["SIGTERM", "SIGINT", "SIGHUP", "double"])
    args = p.parse_args()
    print(f"# benchmarks/signal_loop.py  {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  {platform.node()} "
          f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}), root {args.root}, {args.runs} runs, "
          f"{args.parallel} at once", flush=True)
    counts = {k: [0, 0] for k in args.kinds}
    started = time.monotonic()
    kinds = [args.kinds[i % len(args.kinds)] for i in range(args.runs)]
    with ThreadPoolExecutor(args.parallel) as pool:
        for kind, (ok, detail) in zip(kinds, pool.map(lambda k: one(args.root, k), kinds)):
            counts[kind][0] += 1
            if not ok:
                counts[kind][1] += 1
                print(f"  FAIL {kind}: {detail}", flush=True)
    failed = sum(f for _, f in counts.values())
    print("runs (failures): " + ", ".join(f"{k} {n} ({f})" for k, (n, f) in counts.items())
          + f"; total {args.runs} runs, {failed} failures; {time.monotonic() - started:.0f} s; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
