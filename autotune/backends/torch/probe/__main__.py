"""Entry point of the torch probe: `python -m autotune.backends.torch.probe --request R --out O`.

Exit codes (runner.py): 0 measured, EXIT_REJECTED (verl would refuse the configuration), EXIT_KV_CACHE_TOO_SMALL
(vLLM would not start), EXIT_ENVIRONMENT (a package or the device is missing), EXIT_OOM (the measurement is an
OOM); any other exception is a crash and leaves its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch

from autotune.backends.torch.probe.device import PhaseClock, init_dist, is_oom, oom_over_gib, peak_mem_gib
from autotune.backends.torch.probe.plan import ConfigRejected, KvCacheTooSmall
from autotune.backends.torch.probe.request import parse_request
from autotune.backends.torch.probe.step import run
from autotune.backends.torch.runner import (EXIT_ENVIRONMENT, EXIT_KV_CACHE_TOO_SMALL, EXIT_OOM, EXIT_REJECTED,
                                            rank_result_path)


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


def _oom_record(exc: BaseException, clock: PhaseClock | None) -> dict:
    """What the runner needs for ProbeOOM; "init" when the models themselves did not fit."""
    phase = clock.current if clock and clock.current else "init"
    peak_gib = max(clock.peak_gib, peak_mem_gib(clock.device)) if clock else None
    return {"ok": False, "oom": True, "phase": phase, "peak_mem_gib": peak_gib,
            "over_gib": oom_over_gib(str(exc)), "message": _first_line(exc)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.request) as f:
        req = parse_request(json.load(f))
    out_path = rank_result_path(args.out, int(os.environ.get("RANK", "0")))
    clock: PhaseClock | None = None
    try:
        dist = init_dist(req.device)
        clock = PhaseClock(dist.device, test_raise_oom_in=req.test_raise_oom_in)
        result = run(req, dist, clock)
        if dist.rank == 0:
            _write_json(out_path, result)
        torch.distributed.destroy_process_group()
        return 0
    except ConfigRejected as exc:
        _write_json(out_path, {"ok": False, "rejected": True, "message": _first_line(exc)})
        return EXIT_REJECTED
    except KvCacheTooSmall as exc:
        _write_json(out_path, {"ok": False, "kv_cache_too_small": True, "phase": "rollout",
                               "over_gib": exc.over_gib, "message": str(exc)})
        return EXIT_KV_CACHE_TOO_SMALL
    except (ImportError, EnvironmentError) as exc:
        _write_json(out_path, {"ok": False, "environment": True, "message": _first_line(exc)})
        return EXIT_ENVIRONMENT
    except Exception as exc:  # an OOM is a measurement; anything else is a crash and re-raised
        if not is_oom(exc):
            raise
        traceback.print_exc(file=sys.stderr)
        _write_json(out_path, _oom_record(exc, clock))
        return EXIT_OOM


if __name__ == "__main__":
    sys.exit(main())
