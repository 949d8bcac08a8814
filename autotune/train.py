"""`autotune train`: the full verl training with an exported best.yaml, after the checks a launch would otherwise
fail on late (missing local paths, a multi-node job without its Ray cluster)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from autotune.errors import ConfigError


def train(args) -> int:
    import shlex

    from autotune.backends.process import run_in_process_group
    from autotune.verl.metrics import parse_console_line
    from autotune.backends.verl.runner import train_command

    config = args.config.expanduser()
    if not config.exists():
        raise ConfigError(f"--config {args.config}: no such file (`autotune export` writes OUT/best.yaml)")
    if not config.is_file() or config.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"--config {args.config}: not an exported best.yaml file")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise ConfigError(f"overrides must look like key=value, but got {bad[0]!r}")
    job_env, missing, (nodes, gpus_per_node) = _train_checks(config, list(args.overrides))
    argv = train_command(config, list(args.overrides))
    if missing:
        text = (f"--config {args.config}: {'; '.join(missing)}: not found here, and verl would stop at start-up; fix "
                "the path in best.yaml or give it after --config, e.g. data.train_files=/abs/train.parquet")
        if not args.dry_run:
            raise ConfigError(text)
        print(f"autotune: warning: {text}", file=sys.stderr)
    if nodes > 1:
        from autotune.backends.verl.cluster import cluster_shortfall, ray_start_lines

        if args.dry_run:
            print("\n".join(ray_start_lines(nodes)))
        else:
            short = cluster_shortfall(nodes, gpus_per_node)
            if short:
                raise ConfigError(f"--config {args.config}: {short}")
    # the environment best.yaml notes comes first, as a shell would take it
    print(" ".join([f"{k}={shlex.quote(v)}" for k, v in job_env.items()] + [shlex.join(argv)]))
    if args.dry_run:
        return 0
    outcome = run_in_process_group(
        argv, env={**os.environ, **job_env, "PYTHONUNBUFFERED": "1"}, cwd=Path.cwd(),
        log_path=config.parent / "train.log",
        deadline_s=float(365 * 24 * 3600), idle_timeout_s=float(args.idle_timeout),
        on_output=lambda line: (print(line, end="" if line.endswith("\n") else "\n", flush=True),
                                parse_console_line(line) is not None)[1])
    if outcome.hung:
        print(f"autotune: error: no training step for {args.idle_timeout} s; stopped (log: {outcome.log_path})",
              file=sys.stderr)
        return 1
    return 0 if outcome.returncode == 0 else 1


LAYOUT_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")


def _train_checks(config: Path, overrides: list[str]) -> tuple[dict[str, str], list[str], tuple[int, int]]:
    """What `train` reads from best.yaml before launching: the environment its header notes (the job's launch script
    exports), its local data and model paths that are not here, and its (nodes, GPUs per node), with the command
    line's overrides applied."""
    import yaml

    from autotune.verl.export import header_env
    from autotune.verl.paths import DATA_KEYS, MODEL_KEY, missing_local_paths

    try:
        text = config.read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"cannot read --config {config}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, yaml.YAMLError):
        raise ConfigError(f"--config {config}: not an exported best.yaml file (not YAML text)") from None
    flat = {}
    for key in DATA_KEYS + (MODEL_KEY,) + LAYOUT_KEYS:
        node = doc
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            flat[key] = node
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") in flat or key.lstrip("+") in DATA_KEYS + (MODEL_KEY,) + LAYOUT_KEYS:
            # a list given on the command line ([a,b]) is Hydra's syntax: left to verl
            flat[key.lstrip("+")] = None if value.startswith("[") else value.strip("'\"")
    layout = tuple(_layout_int(config, key, flat.pop(key, 1)) for key in LAYOUT_KEYS)
    return header_env(text), missing_local_paths(flat), layout


def _layout_int(config: Path, key: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or str(value).strip() != str(number):
        raise ConfigError(f"--config {config}: {key} must be a whole number of at least 1, but is {value!r}")
    return number
