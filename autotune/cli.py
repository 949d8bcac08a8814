"""autotune's command line: one small function per command, each returning an exit code.

Bad input is one line on stderr and exit code 2, checked before anything is stored.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import autotune
from autotune import __version__
from autotune.argtypes import (duration_s, host_mem_gib, nonempty_text, positive_int, seed_int, whole_int,
                               writable_folder)
from autotune.errors import AutotuneError, ConfigError

EPILOG = """examples:
  autotune run --model Qwen/Qwen2.5-7B --gpus 8          # an HF id (config.json from the local HF cache)
  autotune run --model /models/my-qwen --gpus 8          # a local model folder, exported as that path
  autotune estimate --model Qwen/Qwen2.5-7B --gpus 8 --gpu H100   # verl's defaults, no search
  autotune gpus                                          # GPU types and the names they go by
  autotune run --model qwen2.5-7b --gpus 8              # search, store, export best.yaml
  autotune run --model qwen2.5-7b --gpus 8 --config tune.yaml --trials 60
  autotune run --from run_grpo.sh --gpus 8 -- trainer.total_epochs=3   # start from your own verl job
  autotune estimate --from run_grpo.sh --gpus 8 --gpu H100-80GB      # one configuration, no search
  autotune show --out autotune-out                       # the stored trials
  autotune export --out autotune-out                     # best.yaml from the stored study
  autotune models                                        # known models and their shapes
  autotune train --config autotune-out/best.yaml trainer.total_epochs=3   # full verl training
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"autotune: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune", description="Find the fastest way to run a verl GRPO training job.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="search for the fastest configuration and export it")
    run.add_argument("--model", type=nonempty_text,
                     help="a Hugging Face id or a local model folder (shapes from its config.json; "
                                     "`autotune models` lists the built-in fallback); or `model:` in tune.yaml")
    run.add_argument("--gpus", type=whole_int, help="GPUs per node (default: the --from job's trainer.n_gpus_per_node)")
    run.add_argument("--from", dest="from_job", type=Path,
                     help="your verl launch script (.sh) or config (.yaml): its workload is held fixed, its system "
                          "knobs are the baseline, its `export VAR=...` lines reach the probes, best.yaml and train; "
                          "extra Hydra overrides may follow after --")
    run.add_argument("--tune-workload", action="append", default=[], metavar="KNOB",
                     help="opt in to tuning a workload knob (ppo_mini_batch_size); the export says so")
    run.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    run.add_argument("--nodes", type=whole_int, help="nodes (default: the --from job's trainer.nnodes, else 1)")
    run.add_argument("--backend", default="auto", help="sim | torch | verl | auto (default: auto)")
    run.add_argument("--trials", type=positive_int, default=40,
                     help="finished trials the study should hold (a second run resumes up to this; default 40)")
    run.add_argument("--storage", type=nonempty_text,
                     help="SQLAlchemy URL of the study database (default: sqlite:///OUT/autotune.db)")
    run.add_argument("--study", type=nonempty_text, help="study name (default: MODEL-NODESxGPUS-BACKEND)")
    run.add_argument("--out", default="autotune-out", help="output folder (default ./autotune-out)")
    run.add_argument("--seed", type=seed_int, default=0,
                     help="sampler seed (default 0: the same command gives the same study and best.yaml)")
    run.add_argument("--config", type=Path, help="tune.yaml: workload, pinned knobs, narrowed ranges")
    run.add_argument("--gpu", type=nonempty_text,
                     help="GPU type when none is detected (default H200; `autotune gpus` lists names)")
    run.add_argument("--host-mem-gib", type=host_mem_gib,
                     help="RAM per node for offloaded states (default: this machine's when probes run here; "
                          "unchecked for sim and Ray unless given)")
    run.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local: one probe at a time here; ray: probes as Ray tasks, several in flight")
    run.add_argument("--ray-address", help="Ray cluster to join with --executor ray (default: start a local one)")
    run.add_argument("--budget", type=duration_s, metavar="DURATION",
                     help="stop once the probes have held the job's GPUs this long, e.g. 45m or 2h (the GPU-hours of "
                          "tune.yaml budget.gpu_hours, counted per GPU of the job)")
    run.add_argument("--quiet", action="store_true", help="no per-trial lines")
    run.set_defaults(func=cmd_run)

    train = sub.add_parser("train", help="launch the full verl training with an exported best.yaml",
                           description="Runs python3 -m verl.trainer.main_ppo --config-path=DIR --config-name=best "
                                       "[OVERRIDES], the same launcher as a probe without the probe limits, with the "
                                       "environment best.yaml's header notes (its `# export VAR=value` lines, from "
                                       "your launch script). A local data file or model folder that is not there is "
                                       "refused before launch. For trainer.nnodes > 1 the Ray cluster must be up "
                                       "with the job's nodes and GPUs (--dry-run prints the ray start steps).")
    train.add_argument("--config", type=Path, required=True, help="the exported best.yaml")
    train.add_argument("--dry-run", action="store_true",
                       help="print the exact command (after the Ray cluster steps when nnodes > 1) and exit")
    train.add_argument("--idle-timeout", type=positive_int, default=6 * 3600,
                       help="kill the run when no step finishes for this many seconds (default 21600)")
    train.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. trainer.total_epochs=3")
    train.set_defaults(func=cmd_train)

    est = sub.add_parser("estimate", help="predict one configuration: rules, memory by component, time by phase",
                         description="Evaluates your job without searching, with the calibrated model (SIMULATED).")
    est.add_argument("--from", dest="from_job", type=Path, help="verl launch script or YAML config (else --model and "
                                                               "--gpus with verl's defaults and tune.yaml's workload)")
    est.add_argument("--config", type=Path, help="tune.yaml: the workload when there is no --from")
    est.add_argument("--gpus", type=whole_int, help="GPUs per node (default: the job's trainer.n_gpus_per_node)")
    est.add_argument("--nodes", type=whole_int, help="nodes (default: the job's trainer.nnodes)")
    est.add_argument("--gpu", type=nonempty_text, help="GPU type (default: detected, else H200)")
    est.add_argument("--model", type=nonempty_text,
                     help="a Hugging Face id or local model folder (with --from: replaces model.path)")
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.add_argument("--mean-response-length", type=whole_int, metavar="TOKENS",
                     help="typical response length (verl's response_length/mean): time is priced over it and memory "
                          "is also reported at it (the verdict stays at data.max_response_length)")
    est.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    est.set_defaults(func=cmd_estimate)

    models = sub.add_parser("models", help="list the built-in models (the fallback when no config.json is at hand)")
    models.set_defaults(func=cmd_models)

    gpus = sub.add_parser("gpus", help="list the GPU types, their aliases and figures, and the detected GPU")
    gpus.set_defaults(func=cmd_gpus)

    for name, helptext, func in (("show", "print a stored study's trials (the best marked)", "cmd_show"),
                                 ("export", "write best.yaml from a stored study", "cmd_export")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--out", default="autotune-out", help="output folder (default ./autotune-out)")
        cmd.add_argument("--storage", type=nonempty_text,
                         help="study database URL (default: sqlite:///OUT/autotune.db)")
        cmd.add_argument("--study", type=nonempty_text, help="study name (default: the only study in the storage)")
        if name == "export":
            cmd.add_argument("--format", choices=("yaml", "overrides"), default="yaml",
                             help="yaml: OUT/best.yaml (default); overrides: print key=value lines for a launch script")
        cmd.set_defaults(func=globals()[func])

    from autotune.study_tools import add_commands

    add_commands(sub)  # dashboard, report, worker
    return p


def main(argv: list[str] | None = None) -> int:
    from autotune import interrupt

    parser = build_parser()
    args = parser.parse_args(argv)
    # Ctrl-C, a scheduler's SIGTERM and SIGHUP stop any command with one line and 130 (interrupt.py); with Python's
    # defaults SIGTERM and SIGHUP ended `show` or `export` with no word at all (issue 33)
    interrupt.install()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except AutotuneError as exc:
        print(f"autotune: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        interrupt.ignore_further()  # stopping already: another Ctrl-C here would only print a traceback
        interrupt.reset()
        resumable = args.command in ("run", "worker")
        print(autotune.INTERRUPTED_LINE + (autotune.RESUME_NOTE if resumable else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:  # `autotune ... | head`: the reader left; nothing more to say
        sys.stderr.close()
        return 0
    except OSError as exc:  # writing results or exports: a full disk, a read-only folder
        print(f"autotune: error: cannot write {exc.filename or 'a file'}: {exc.strerror or exc}", file=sys.stderr)
        return 1


# ---- run ------------------------------------------------------------------------------------------------

def build_tune_config(args):
    """Validate everything the user gave, without touching storage."""
    from autotune.config import (TuneConfig, check_study_name, default_study_name, load_tune_yaml,
                                 with_budget)
    from autotune.hardware import detect_gpus, detect_host_mem_gib
    from autotune.model_config import resolve_model
    from autotune.backends.select import choose_backend
    from autotune.search.driver import build_space
    from autotune.verl.logprob_path import takes_logprob_loop
    from autotune.search.feasibility import require_fit
    from autotune.storage.urls import check_storage_url, default_storage_url

    tune = load_tune_yaml(args.config)
    job = load_user_job(args.from_job, args.overrides, args.model or tune.model) if args.from_job else None
    if args.overrides and job is None:
        raise ConfigError(f"unexpected arguments {args.overrides}; Hydra overrides need --from")
    if job is not None and args.config and tune.workload != load_tune_yaml(None).workload:
        raise ConfigError("the workload comes from --from; remove `workload:` from tune.yaml")
    gpus = args.gpus if args.gpus is not None else (job.gpus_per_node if job else None)
    if gpus is None:
        raise ConfigError("--gpus is required (GPUs per node)" + _gpu_count_hint(args.gpu))
    args.nodes = args.nodes if args.nodes is not None else (job.nodes if job and job.nodes else 1)
    check_cluster(gpus, args.nodes)
    args.gpus = gpus
    model_name = args.model or tune.model or (job.model.name if job else None)
    if not model_name:
        raise ConfigError("--model is required (or `model:` in tune.yaml); see `autotune models`")
    model = job.model if job is not None and not (args.model or tune.model) else resolve_model(model_name)
    detected = detect_gpus()
    if getattr(args, "executor", "local") == "ray" and args.backend in ("torch", "verl"):
        from autotune.backends.select import BackendChoice
        choice = BackendChoice(args.backend, None)  # probes run on the Ray workers, which have the packages
    else:
        choice = choose_backend(args.backend, detected)
    if choice.name != "sim" and detected is not None and args.nodes == 1 and args.gpus > detected.count \
            and getattr(args, "executor", "local") == "local":
        raise ConfigError(f"--gpus {args.gpus} but this machine has {detected.count} GPU(s)")
    gpu, gpu_how = choose_gpu(args.gpu or tune.gpu, detected)
    out_dir = writable_folder(args.out)
    storage_url = check_storage_url(args.storage or default_storage_url(out_dir))
    study = check_study_name(args.study or default_study_name(model, args.gpus, args.nodes, choice.name))
    tune_workload = tuple(dict.fromkeys(tune.tune_workload + tuple(args.tune_workload)))
    host_mem_gib = getattr(args, "host_mem_gib", None)
    if host_mem_gib is None and choice.name != "sim" and getattr(args, "executor", "local") == "local":
        host_mem_gib = detect_host_mem_gib()  # probes run on this machine
    cfg = TuneConfig(model=model, gpu=gpu, gpus_per_node=args.gpus, nodes=args.nodes, backend=choice.name,
                     trials=args.trials, storage_url=storage_url, study_name=study, out_dir=out_dir, seed=args.seed,
                     workload=job.workload if job else tune.workload, fixed=tune.fixed, ranges=tune.ranges,
                     tune_workload=tune_workload, probe=tune.probe, search=tune.search,
                     budget=with_budget(tune.budget, getattr(args, "budget", None), args.gpus * args.nodes),
                     baseline=job.baseline if job else None, passthrough=job.passthrough if job else {},
                     source=str(args.from_job) if job else None, host_mem_gib=host_mem_gib,
                     env=job.env if job else {},
                     logprob_loop=takes_logprob_loop(choice.name, job.env if job else {},
                                                     probes_here=getattr(args, "executor", "local") == "local"))
    build_space(cfg)  # validates fixed/ranges/tune_workload against the model and GPU count
    require_fit(model, gpu, cfg.workload, gpus_per_node=cfg.gpus_per_node, nodes=cfg.nodes)
    print(first_line(model, gpu, gpu_how, cfg.gpus_per_node, cfg.nodes, cfg.workload,
                     f"from {args.from_job}" if job else ("from " + str(args.config) if args.config else "default")))
    remark = node_size_remark(cfg.gpus_per_node, cfg.nodes, detected)
    if remark:
        print(remark)
    if job is not None:
        print(f"read {args.from_job}: workload held fixed; your job is trial 0, the baseline the speedup is measured "
              f"against; {len(job.passthrough)} other keys pass through")
        for name in job.unresolved:
            print(f"not read statically: {name}")
        if job.env:
            print("environment your script exports, set for every probe, noted in best.yaml and set by "
                  f"`autotune train`: {' '.join(f'{k}={v}' for k, v in job.env.items())}")
        for note in job.notes:
            print(note)
        from autotune.search.driver import holds_of
        for hold in holds_of(cfg):
            print(hold.describe())
    if choice.note:
        print(choice.note)
    return cfg


def _gpu_count_hint(gpu: str | None) -> str:
    """`--gpu 8` (the GPU type) where `--gpus 8` (the count) was meant: argparse takes both, so say which is which."""
    return f"; --gpu names the GPU type (H100, H200): did you mean --gpus {gpu}?" if gpu and gpu.isdigit() else ""


def choose_gpu(name: str | None, detected):
    """The GPU type and how it was chosen: given (--gpu / tune.yaml), detected, or assumed."""
    from autotune.hardware import DEFAULT_GPU, get_gpu, match_device_name

    if name:
        return get_gpu(name, detected), f"given as {name}"
    if detected is not None and match_device_name(detected.device_name):
        return match_device_name(detected.device_name), f"detected: {detected.device_name}"
    return get_gpu(DEFAULT_GPU), "assumed, none detected; --gpu to change"


def first_line(model, gpu, gpu_how: str, gpus_per_node: int, nodes: int, workload, workload_from: str) -> str:
    """What the run assumes, before anything else: model and where its shapes came from, GPU, count, workload."""
    lora = f", LoRA rank {workload.lora_rank}" if workload.lora_rank else ""
    return (f"model {model.model_path} (shapes from {model.shapes_from or 'autotune built-in table'}); "
            f"GPU {gpu.name} {gpu.mem_gib:.0f} GiB ({gpu_how}); {gpus_per_node} GPUs x {nodes} node(s); workload "
            f"({workload_from}): train batch {workload.train_batch_size}, mini {workload.ppo_mini_batch_size}, "
            f"n {workload.rollout_n}, prompt {workload.max_prompt_length}, response {workload.max_response_length}"
            f"{lora}")


def node_size_remark(gpus_per_node: int, nodes: int, detected) -> str | None:
    """A word when --gpus is larger than a node holds (8; this machine's count when one is detected and it has more):
    --gpus counts per node, and `--gpus 16 --nodes 2` is 32 GPUs where 16 in all were likely meant (issue 32 item 6)."""
    from autotune.search.feasibility import NODE_GPUS

    node = max(NODE_GPUS, detected.count if detected is not None else 0)
    if gpus_per_node <= node:
        return None
    total = gpus_per_node * nodes
    text = f"note: --gpus counts GPUs per node: {nodes} node(s) x {gpus_per_node} = {total} GPUs in all"
    if total % NODE_GPUS == 0:
        text += f"; nodes of {NODE_GPUS} would be --gpus {NODE_GPUS} --nodes {total // NODE_GPUS}"
    if nodes > 1 and gpus_per_node % nodes == 0 and gpus_per_node // nodes <= node:
        text += f"; {gpus_per_node} in all would be --gpus {gpus_per_node // nodes} --nodes {nodes}"
    return text


MAX_GPUS_PER_NODE = 1024  # no machine has more; larger numbers are typos (and slow the layout search to a crawl)
MAX_NODES = 65536


def check_cluster(gpus: int, nodes: int) -> None:
    if not 1 <= gpus <= MAX_GPUS_PER_NODE:
        raise ConfigError(f"--gpus must be at least 1 and at most {MAX_GPUS_PER_NODE} (GPUs per node), but got "
                          f"--gpus {gpus}")
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"--nodes must be at least 1 and at most {MAX_NODES}, but got --nodes {nodes}")


def load_user_job(path: Path, overrides: list[str], model_name: str | None, *, exporting: bool = True):
    """The user's own verl job (launch script or YAML), plus Hydra overrides given after --."""
    from autotune.verl.job_import import user_job
    from autotune.verl.launch_script import import_config_yaml, import_launch_script

    path = Path(path).expanduser()
    imported = import_config_yaml(path) if path.suffix in (".yaml", ".yml") else import_launch_script(path, os.environ)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"overrides after -- must look like key=value, but got {bad[0]!r}")
    return user_job(imported.with_arguments(list(overrides)), model_name=model_name, exporting=exporting)


def cmd_estimate(args) -> int:
    import json

    from autotune.estimate import estimate, node_profile_for, render
    from autotune.hardware import detect_gpus
    from autotune.verl.rollout import vllm_eager

    if args.from_job is None:
        return _estimate_flags(args)
    if args.config is not None:
        raise ConfigError("--config gives the workload only without --from; the workload comes from --from")
    job = load_user_job(args.from_job, args.overrides, args.model, exporting=False)
    gpus = args.gpus if args.gpus is not None else job.gpus_per_node
    nodes = args.nodes if args.nodes is not None else (job.nodes or 1)
    if gpus is None or gpus < 1 or nodes < 1:
        raise ConfigError("--gpus (GPUs per node, >= 1) is required when the job does not set trainer.n_gpus_per_node"
                          + _gpu_count_hint(args.gpu))
    check_cluster(gpus, nodes)
    detected = detect_gpus()
    gpu, gpu_how = choose_gpu(args.gpu, detected)
    workload = job.workload
    if args.mean_response_length is not None:
        from dataclasses import replace

        workload = replace(workload, mean_response_length=min(args.mean_response_length, workload.max_response_length))
    if not args.json:
        print(first_line(job.model, gpu, gpu_how, gpus, nodes, workload, f"from {args.from_job}"))
    result = estimate(job.model, gpu, workload, job.baseline, gpus_per_node=gpus, nodes=nodes,
                      profile=node_profile_for(gpu, job.passthrough, detected),
                      logprob_loop=_logprob_loop_here(job.env, detected), vllm_eager=vllm_eager(job.passthrough))
    if args.json:
        print(json.dumps({**result.as_dict(), "source": str(args.from_job), "model_path": job.model.model_path,
                          "shapes_from": job.model.shapes_from, "unresolved": list(job.unresolved),
                          "notes": list(job.notes)},
                         indent=2, default=str))
    else:
        print(render(result, str(args.from_job), job.unresolved, job.notes))
    return 0


def _estimate_flags(args) -> int:
    """`estimate --model M --gpus N`: verl's default configuration for that model on that many GPUs."""
    import json

    from autotune.config import load_tune_yaml
    from autotune.estimate import estimate, node_profile_for, render
    from autotune.hardware import detect_gpus
    from autotune.model_config import resolve_model
    from autotune.spaces.space import verl_default_candidate

    if args.overrides:
        raise ConfigError(f"unexpected arguments {args.overrides}; Hydra overrides need --from")
    tune = load_tune_yaml(args.config)
    name = args.model or tune.model
    if not name:
        raise ConfigError("estimate needs --from SCRIPT|CONFIG, or --model and --gpus")
    if args.gpus is None or args.gpus < 1:
        raise ConfigError("--gpus (GPUs per node, >= 1) is required with --model" + _gpu_count_hint(args.gpu))
    nodes = args.nodes if args.nodes is not None else 1
    if nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, but got --nodes {nodes}")
    model = resolve_model(name)
    detected = detect_gpus()
    gpu, gpu_how = choose_gpu(args.gpu or tune.gpu, detected)
    workload = tune.workload
    cand = verl_default_candidate(model, workload, gpus_per_node=args.gpus, nodes=nodes)
    source = f"{model.model_path} with verl's default configuration"
    if args.json:
        print(json.dumps({**estimate(model, gpu, workload, cand, gpus_per_node=args.gpus, nodes=nodes,
                                     profile=node_profile_for(gpu, {}, detected),
                                     logprob_loop=_logprob_loop_here({}, detected)).as_dict(),
                          "source": source, "model_path": model.model_path, "shapes_from": model.shapes_from},
                         indent=2, default=str))
        return 0
    print(first_line(model, gpu, gpu_how, args.gpus, nodes, workload,
                     f"from {args.config}" if args.config else "autotune's default"))
    print(render(estimate(model, gpu, workload, cand, gpus_per_node=args.gpus, nodes=nodes,
                          profile=node_profile_for(gpu, {}, detected),
                          logprob_loop=_logprob_loop_here({}, detected)), source, ()))
    return 0


def _logprob_loop_here(job_env: dict, detected) -> str | None:
    """Why verl would take its per-token log-prob loop for a job run here (None: it would not): looked up on a GPU
    node (where the estimate is for this node), else only the job's own VERL_DISABLE_FLASH_ATTN_CE."""
    from autotune.verl.logprob_path import logprob_loop_reason

    return logprob_loop_reason("verl" if detected is not None else "sim", job_env, probes_here=detected is not None)


def cmd_run(args) -> int:
    from autotune.backends.base import get_runner
    from autotune.search.driver import held_off_knobs, run_study
    from autotune.storage.results import export_best, summary, write_result_json
    from autotune.progress import RunProgress
    from autotune.ui import print_best_table

    out_is_new = not Path(args.out).expanduser().exists()
    try:
        cfg = build_tune_config(args)
    except AutotuneError:
        if out_is_new:  # refused input leaves no trace: the --out folder this run created is removed, empty
            with contextlib.suppress(OSError):
                Path(args.out).expanduser().rmdir()
        raise
    label = "your job" if cfg.baseline is not None else "verl default"
    if cfg.host_mem_gib is not None:
        from autotune.model.host_memory import HOST_HEADROOM

        print(f"host memory: {cfg.host_mem_gib:.0f} GiB per node; offloaded states must fit in "
              f"{HOST_HEADROOM:.0%} of it")
    if args.executor == "ray":
        from autotune.search.ray_executor import run_study_ray

        with RunProgress(cfg.trials, study_name=cfg.study_name, simulated=cfg.backend == "sim",
                         warmup_steps=cfg.probe.warmup_steps, quiet=args.quiet, baseline_label=label,
                         final_summary=False) as progress:
            study = run_study_ray(cfg, address=args.ray_address, on_trial=progress.on_trial)
    else:
        runner = get_runner(cfg.backend)
        held = held_off_knobs(cfg, runner)
        if held:
            print(f"held off, their package is not installed here: {', '.join(f'{k}={v}' for k, v in held.items())}")
        narrowed = {k: v for k, v in runner.measurable_choices().items() if k not in cfg.fixed}
        if narrowed:
            print(f"the {cfg.backend} backend measures only: "
                  + "; ".join(f"{k} in {', '.join(map(str, v))}" for k, v in narrowed.items()))
        with RunProgress(cfg.trials, study_name=cfg.study_name, simulated=runner.simulated,
                         warmup_steps=cfg.probe.warmup_steps, quiet=args.quiet, baseline_label=label,
                         final_summary=False) as progress:
            study = run_study(cfg, runner, on_trial=progress.on_trial, on_step=progress.on_step,
                              on_start=lambda s: progress.preload(s.get_trials(deepcopy=False)))
    doc = summary(study, cfg.storage_url)
    if doc["best"] is not None:
        exported = export_best(study, cfg.out_dir)
        doc["best_yaml"] = str(exported.path)
        if exported.note:
            print(exported.note)
    result = write_result_json(cfg.out_dir / "result.json", doc)
    print_best_table(study, simulated=doc["simulated"])
    if not args.quiet:
        from autotune.search.budget import finished_count

        from autotune.storage.tuning_cost import describe

        from autotune.storage.changes import describe_changes

        print(status_line(doc, cfg.trials, finished_count(study)))
        changed = describe_changes(doc["changes_vs_baseline"], doc["baseline_is"])
        if changed:
            print(changed)
        print(describe(doc["tuning_cost"], doc["payback"]))
    if doc["best"] is None:
        print(f"no feasible configuration found in {doc['trials_total']} trials; nothing exported "
              f"(see `autotune show --out {args.out}`)")
        return 1
    print(f"wrote {doc['best_yaml']} and {result}")
    return 0


def status_line(doc: dict, target: int, done: int) -> str:
    """The run's last word, from the stored study (result.json), so it names the trial best.yaml exports."""
    sim = " SIMULATED" if doc["simulated"] else ""
    best = doc["best"]
    if best is None:
        text = "best none"
    else:
        text = f"best {best['tokens_per_s_per_gpu']:.0f} tok/s/GPU (trial {best['trial']}, exported)"
        after = [p for p in best.get("probes") or () if p.get("scored") and p["trial"] != best["trial"]]
        verifying = [p["trial"] for p in after if p.get("role") == "verify"]
        if verifying:  # search/confirm.verify: a probe taken after the export was chosen, and not used to choose it
            text += f", scored by its verifying probe {verifying[0]} (taken after it was chosen)"
        elif after:  # storage/records.pooled: the probe that chose it for confirmation is left out of its score
            text += f", scored by its confirmation probe(s) {', '.join(str(p['trial']) for p in after)}"
        if best.get("posterior_tokens_per_s_per_gpu"):  # what the export ranked by where probes are noisy
            text += f", {best['posterior_tokens_per_s_per_gpu']:.0f} under the corrected model"
        if doc.get("speedup_vs_baseline"):
            from autotune.storage.noise import describe as noise_clause
            text += (f", x{doc['speedup_vs_baseline']:.2f} vs {doc['baseline_is']} (trial {doc['baseline']['trial']}; "
                     f"{noise_clause(doc.get('noise'), doc.get('speedup_vs_baseline_interval'), simulated=doc['simulated'])})")
        if doc.get("speedup_vs_verl_default"):
            text += f", x{doc['speedup_vs_verl_default']:.2f} vs verl default (trial {doc['verl_default']['trial']})"
        if doc.get("tied_with_best"):
            text += (f"; tied within {100 * doc['tie_fraction']:.0f}% with trial(s) "
                     f"{', '.join(map(str, doc['tied_with_best']))}: exported the one with the most memory headroom")
    return (f"{doc['study']}: {done}/{target} trials finished{sim}; {text}; failures: oom {doc['trials_failed_oom']}, "
            f"rejected {doc['trials_rejected_before_launch']}, failed {doc['trials_failed']}")


# ---- models, gpus, show, export ---------------------------------------------------------------------------

def cmd_gpus(args) -> int:
    from autotune.ui import print_gpus

    print_gpus()
    return 0


def cmd_models(args) -> int:
    from autotune.ui import print_models

    print_models()
    return 0


def _load_study(args):
    """The study named by --study (or the only one) in --storage or OUT/autotune.db; never creates one."""
    from autotune.study_tools import load_study, resolve_storage

    return load_study(resolve_storage(args.storage, args.out), args.study), Path(args.out).expanduser()


def cmd_show(args) -> int:
    from autotune.ui import print_trials

    study, _ = _load_study(args)
    print_trials(study)
    return 0


def cmd_export(args) -> int:
    from autotune.storage.results import export_best

    study, out_dir = _load_study(args)
    if getattr(args, "format", "yaml") == "overrides":
        from autotune.storage.results import best_overrides

        for line in best_overrides(study):
            print(line)
        return 0
    writable_folder(str(out_dir))
    exported = export_best(study, out_dir)
    if exported.note:
        print(exported.note)
    print(f"wrote {exported.path}")
    return 0


def cmd_train(args) -> int:
    from autotune.train import train

    return train(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
