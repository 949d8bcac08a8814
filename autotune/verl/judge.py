"""verl 0.9.1 judges an export: compose it with verl's Hydra config and run verl's own start-up checks.

Used by tests and benchmarks/verl_judge.py only; it imports verl (and its config dependencies: torch,
ray, tensordict, transformers) lazily. What runs is verl's code, in the order its trainer and workers
run it:

1. Hydra composition of `ppo_trainer` with the overrides (unknown keys: "Could not override ...").
2. `validate_config(config, use_reference_policy=need_reference_policy(config),
   use_critic=need_critic(config))` (verl/trainer/main_ppo.py:177-181, verl/utils/config.py:88-217),
   which also builds the actor's config dataclass and runs its `validate`.
3. The worker's config dataclasses (verl/workers/engine_workers.py:538-651, `init_model`): the reference's
   (after the same key renames the worker does, :545-553), the actor's and the rollout's, through
   `omega_conf_to_dataclass`, whose `__post_init__` checks run; the worker's asserts on what it then reads
   (:616, :628-633, :655-661).

What cannot run on CPU (the model config, which downloads the tokenizer; the engines themselves) is listed
in docs/verl-judge.md with why.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".strip()
    cause = exc.__cause__  # hydra's InstantiationException wraps the config class's own refusal
    return f"{line} {_first_line(cause)}" if cause is not None and type(exc).__name__ == "InstantiationException" \
        else line


def verdict(hydra_args: list[str]) -> str | None:
    """None when verl accepts these command-line overrides; otherwise verl's reason, one line."""
    from autotune.errors import ConfigError
    from autotune.verl.compose import compose_overrides

    try:
        config = compose_overrides(hydra_args)
    except ConfigError as exc:
        return str(exc)
    return verdict_config(config)


def _lora_rank_check_without_vllm() -> None:
    """validate_config checks a LoRA rank against vLLM's allowed ranks (verl/utils/config.py:205-207) through
    `get_vllm_max_lora_rank`, whose module imports vLLM at its top. Without vLLM (CI has none), that one
    function of verl's is loaded from verl's own source, with the rank list verl itself falls back to
    (verl/workers/rollout/vllm_rollout/utils.py:83-102)."""
    import ast
    import importlib.util
    import sys
    import types
    import typing
    from pathlib import Path

    name = "verl.workers.rollout.vllm_rollout.utils"
    if name in sys.modules or importlib.util.find_spec("vllm") is not None:
        return
    path = Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "workers/rollout/vllm_rollout/utils.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_vllm_max_lora_rank")
    module = types.ModuleType(name)
    module.__file__ = str(path)
    module.__dict__.update(Literal=typing.Literal, get_args=typing.get_args)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), module.__dict__)
    package = types.ModuleType("verl.workers.rollout.vllm_rollout")
    package.__path__ = [str(path.parent)]
    package.utils = module
    sys.modules.setdefault(package.__name__, package)
    sys.modules[name] = module


_CACHED_PARSE = None  # one cache for every candidate of the process: verl's strings are the same in each


@contextlib.contextmanager
def interpolation_parses_cached():
    """OmegaConf parses an interpolation string with ANTLR each time a node is resolved (omegaconf/base.py:38,
    grammar_parser.py:96 `parse`, a pure function of its arguments); verl's configs resolve the same few dozen strings
    for every candidate, which was a quarter of the judge's time. Cached for the judge's run only, and kept across
    candidates (a cache per candidate still parsed ~45 strings each); the verdicts are identical with and without
    (benchmarks/verl_judge_speed.py)."""
    import functools

    import omegaconf._utils
    import omegaconf.base

    global _CACHED_PARSE
    original = omegaconf.base.parse
    if _CACHED_PARSE is None or _CACHED_PARSE.__wrapped__ is not original:
        _CACHED_PARSE = functools.lru_cache(maxsize=4096)(original)
    cached = _CACHED_PARSE
    omegaconf.base.parse = omegaconf._utils.parse = cached
    try:
        yield
    finally:
        omegaconf.base.parse = omegaconf._utils.parse = original


def verdict_config(config, *, private: bool = False, fast: bool = False) -> str | None:
    """None when verl's start-up checks pass on this composed config; otherwise verl's reason. `private`: the
    config is the caller's own copy, which the worker's renames may edit. `fast`: interpolation parses cached, and
    the worker's build of the actor config skipped, since validate_config has just built it from the same,
    unchanged node (utils/config.py:164; the worker's renames touch the ref only) - same verdicts
    (benchmarks/verl_judge_speed.py)."""
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    _lora_rank_check_without_vllm()
    config = config if private else copy.deepcopy(config)  # the worker's renames edit it
    with interpolation_parses_cached() if fast else contextlib.nullcontext():
        return _verdict(config, need_critic, need_reference_policy, omega_conf_to_dataclass, validate_config,
                        open_dict, build_actor=not fast)


def _verdict(config, need_critic, need_reference_policy, omega_conf_to_dataclass, validate_config, open_dict, *,
             build_actor: bool) -> str | None:
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            use_ref = need_reference_policy(config)
            validate_config(config, use_reference_policy=use_ref, use_critic=need_critic(config))
        aro = config.actor_rollout_ref
        n_gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
        if use_ref:
            # the worker's renames before building the ref config (engine_workers.py:545-553)
            with open_dict(aro.ref):
                aro.ref.ppo_mini_batch_size = aro.actor.ppo_mini_batch_size
                aro.ref.ppo_micro_batch_size = aro.ref.pop("log_prob_micro_batch_size", None)
                aro.ref.ppo_micro_batch_size_per_gpu = aro.ref.pop("log_prob_micro_batch_size_per_gpu", None)
                aro.ref.use_dynamic_bsz = aro.ref.pop("log_prob_use_dynamic_bsz", False)
                aro.ref.ppo_max_token_len_per_gpu = aro.ref.pop("log_prob_max_token_len_per_gpu", None)
            omega_conf_to_dataclass(aro.ref)
        if build_actor:
            omega_conf_to_dataclass(aro.actor)
        # engine_workers.py:616: a bare assert
        assert aro.actor.use_dynamic_bsz == aro.rollout.log_prob_use_dynamic_bsz, \
            "actor.use_dynamic_bsz != rollout.log_prob_use_dynamic_bsz (engine_workers.py:616)"
        if aro.actor.use_dynamic_bsz:  # engine_workers.py:628-633
            assert aro.rollout.log_prob_max_token_len_per_gpu is not None, "rollout.log_prob_max_token_len_per_gpu is None"
            assert aro.actor.ppo_max_token_len_per_gpu is not None, "actor.ppo_max_token_len_per_gpu is None"
        else:
            assert aro.rollout.log_prob_micro_batch_size_per_gpu is not None, \
                "rollout.log_prob_micro_batch_size_per_gpu is None"
            assert aro.actor.ppo_micro_batch_size_per_gpu is not None, "actor.ppo_micro_batch_size_per_gpu is None"
        rollout = omega_conf_to_dataclass(aro.rollout)
        infer_world = (rollout.tensor_model_parallel_size * rollout.data_parallel_size
                       * rollout.pipeline_model_parallel_size)
        assert n_gpus % infer_world == 0, (  # engine_workers.py:655-661
            f"rollout world_size: {n_gpus} is not divisible by infer_world_size: {infer_world}")
    except Exception as exc:  # verl raises AssertionError, ValueError, TypeError, ConfigKeyError, ...
        return _first_line(exc)
    return None


# ---- the judge over the search space ---------------------------------------------------------------

SETUPS = {
    # name: (model, gpus per node, nodes, workload changes, pinned knobs)
    "dense-fsdp": ("qwen2.5-7b", 8, 1, {}, {"actor_engine": "fsdp"}),
    "fsdp2-dynamic-bsz": ("qwen3-8b", 8, 1, {"max_response_length": 4096},
                          {"actor_engine": "fsdp2", "use_dynamic_bsz": True}),
    "megatron-tp-pp-vpp-cp": ("qwen2.5-32b", 8, 2, {"train_batch_size": 512, "ppo_mini_batch_size": 128},
                              {"actor_engine": "megatron"}),
    "moe-ep-etp": ("qwen3-30b-a3b", 8, 2, {"train_batch_size": 512, "ppo_mini_batch_size": 128},
                   {"actor_engine": "megatron"}),
    "lora": ("qwen2.5-7b", 8, 1, {"lora_rank": 64, "lora_target_modules": "all-linear"}, {}),
    "in-reward-kl": ("qwen2.5-7b", 8, 1, {"use_kl_loss": False, "use_kl_in_reward": True}, {}),
    "no-reference": ("llama-3.1-8b", 4, 1, {"use_kl_loss": False, "train_batch_size": 250,
                                            "ppo_mini_batch_size": 50}, {}),
}


class _LazyComposer:
    def __call__(self, overrides):
        from autotune.verl.compose import Composer

        if not hasattr(self, "_composer"):
            self._composer = Composer()
        return self._composer(overrides)


COMPOSER = _LazyComposer()


def our_config_verdict(model, workload, candidate, *, gpus_per_node: int, nodes: int) -> list:
    """Our rules that verl checks at start-up on the config alone (Violation.stage == "config")."""
    from autotune.spaces.layout import ParallelLayout
    from autotune.verl.rules import check

    layout = ParallelLayout.of(candidate, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    return [v for v in check(model, workload, candidate, layout) if v.stage == "config"]


def sample_setup(name: str, n_candidates: int, *, seed: int = 0):
    """(model, workload, gpus_per_node, nodes, [candidates]) drawn at random from the setup's search space."""
    from autotune.models import get_model
    from autotune.workload import Workload

    model_name, gpn, nodes, changes, fixed = SETUPS[name]
    model, workload = get_model(model_name), Workload(**changes)
    return model, workload, gpn, nodes, sample_space(model, workload, gpn, nodes, fixed, n_candidates, seed=seed)


def sample_space(model, workload, gpn: int, nodes: int, fixed: dict, n_candidates: int, *, seed: int = 0,
                 holds=()) -> list:
    import optuna

    from autotune.spaces.space import SearchSpace

    space = SearchSpace.build(model, workload, gpus_per_node=gpn, nodes=nodes, fixed=fixed, holds=holds)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    candidates = []
    for _ in range(n_candidates):
        trial = study.ask()
        candidate, wl = space.suggest(trial, workload)
        study.tell(trial, 0.0)
        candidates.append(candidate)
    return candidates


def judge_setup(name: str, n_candidates: int, *, seed: int = 0) -> list[dict]:
    """One row per candidate: what our rules say, what verl says, and whether they agree."""
    model, workload, gpn, nodes, candidates = sample_setup(name, n_candidates, seed=seed)
    return judge_candidates(name, model, workload, gpn, nodes, candidates)


# The environment a fixture script is read in, and what a user types where the import's error asks for a value
# (`rerun with their values after --: -- KEY=VALUE ...`); the model path where a script has a placeholder is the
# --model given.
ENVIRON = {"HOME": "/home/user", "PWD": "/home/user/work"}
_ARO = "actor_rollout_ref"
REMEDY_VALUES = {
    "trainer.project_name": "grpo", "trainer.experiment_name": "run1", "trainer.default_local_dir": "/ckpt/run1",
    "data.train_files": "/data/train.parquet", "data.val_files": "/data/test.parquet",
    "data.train_batch_size": "256", "data.max_prompt_length": "1024", "data.max_response_length": "2048",
    f"{_ARO}.actor.ppo_mini_batch_size": "64", f"{_ARO}.actor.fsdp_config.param_offload": "False",
    f"{_ARO}.actor.fsdp_config.optimizer_offload": "False", f"{_ARO}.rollout.tensor_model_parallel_size": "2",
    f"{_ARO}.rollout.gpu_memory_utilization": "0.6", f"{_ARO}.rollout.max_num_seqs": "256",
    "trainer.n_gpus_per_node": "8", f"{_ARO}.actor.megatron.virtual_pipeline_model_parallel_size": "null",
    f"{_ARO}.ref.megatron.virtual_pipeline_model_parallel_size": "null",
    f"{_ARO}.actor.megatron.dist_checkpointing_path": "/ckpt/mcore",
    f"{_ARO}.ref.megatron.dist_checkpointing_path": "/ckpt/mcore",
}


def import_script(path, *, model_name: str | None = None, environ: dict | None = None):
    """(imported job with the `--` values applied, UserJob), as a user gets there: one rerun with the values the
    first error asks for (REMEDY_VALUES). Any other error is raised as the user sees it."""
    import re

    from autotune.errors import ConfigError
    from autotune.verl.job_import import user_job
    from autotune.verl.launch_script import import_launch_script

    imported = import_launch_script(path, environ or ENVIRON)
    try:
        return imported, user_job(imported, model_name=model_name)
    except ConfigError as exc:
        remedy = re.search(r"rerun with their values after --: -- (\S+=VALUE(?: \S+=VALUE)*)", str(exc))
        if remedy is None:
            raise
        keys = [arg.split("=", 1)[0] for arg in remedy.group(1).split()]
        values = {**REMEDY_VALUES, f"{_ARO}.model.path": model_name}
        if any(values.get(key) is None for key in keys):
            raise
        imported = imported.with_arguments([f"{key}={values[key]}" for key in keys])
        return imported, user_job(imported, model_name=model_name)


def judge_script(path, n_candidates: int, *, seed: int = 0, model_name: str | None = None) -> list[dict]:
    """A verl launch script as the user's job (`--from`): its own configuration, then candidates from its space,
    both engines, each exported with the script's other keys passed through."""
    from autotune.verl.engines import holds

    _, job = import_script(path, model_name=model_name)
    gpn, nodes = job.gpus_per_node or 8, job.nodes or 1
    held = holds(job.passthrough, job.baseline.actor_engine, job.workload.lora_rank, job.baseline.rollout_tp)
    candidates = [job.baseline] + sample_space(job.model, job.workload, gpn, nodes, {}, n_candidates - 1, seed=seed,
                                               holds=held)  # as the driver builds the job's space
    return judge_candidates(f"script:{path.name}", job.model, job.workload, gpn, nodes, candidates,
                            passthrough=job.passthrough)


def script_candidates(job, gpn: int, nodes: int, *, sampled: int = 2, per_engine: int = 1, seed: int = 3) -> list:
    """A user's job's own configuration, candidates of its search space, and candidates on each other engine it may
    move to (FSDP <-> FSDP2 <-> Megatron), with the holds the driver builds its space with."""
    from autotune.errors import ConfigError
    from autotune.verl.engines import holds

    held = holds(job.passthrough, job.baseline.actor_engine, job.workload.lora_rank, job.baseline.rollout_tp)
    out = [job.baseline] + sample_space(job.model, job.workload, gpn, nodes, {}, sampled, seed=seed, holds=held)
    allowed = next((h.values for h in held if h.knob == "actor_engine"), ("fsdp", "fsdp2", "megatron"))
    for engine in allowed:
        if engine != job.baseline.actor_engine:
            try:
                out += sample_space(job.model, job.workload, gpn, nodes, {"actor_engine": engine}, per_engine,
                                    seed=seed + 2, holds=held)
            except ConfigError:  # the engine cannot run this model here (no Megatron layout fits, say)
                pass
    return out


def judge_candidates(name: str, model, workload, gpn: int, nodes: int, candidates, *,
                     passthrough: dict | None = None, fast: bool = True) -> list[dict]:
    from autotune.errors import ConfigError
    from autotune.verl.export import hydra_overrides, model_engine, verl_overrides

    compose = COMPOSER
    rows = []
    for candidate in candidates:
        ours = our_config_verdict(model, workload, candidate, gpus_per_node=gpn, nodes=nodes)
        overrides = verl_overrides(model, workload, candidate, gpus_per_node=gpn, nodes=nodes,
                                   passthrough=passthrough)
        try:
            theirs = verdict_config(compose(hydra_overrides(overrides, model_engine(candidate))), private=True,
                                    fast=fast)
        except ConfigError as exc:
            theirs = str(exc)
        rows.append({"setup": name, "candidate": candidate, "ours": [str(v) for v in ours], "verl": theirs,
                     "agree": (not ours) == (theirs is None)})
    return rows


def _run_task(task: tuple) -> list[dict]:
    kind, name, n, seed = task
    if kind == "setup":
        return judge_setup(name, n, seed=seed)
    from pathlib import Path
    return judge_script(Path(name), n, seed=seed, model_name=script_model(name))


# --model for the fixture scripts whose model is a folder on the author's machine, a placeholder or outside autotune's
# table: a known name, or `model_configs/NAME`, a real config.json folder beside the fixtures (tests/data)
SCRIPT_MODELS = {
    "qwen2-70b_grpo_32_h20_fsdp_vllm.sh": "qwen2.5-72b",  # verl's script says model_path
    "run_deepseek671b_math_megatron_80gb.sh": "model_configs/DeepSeek-V3",
    "grpo_trainer__run_deepseek_v3_671b_megatron.sh": "model_configs/DeepSeek-V3",
    "run_gptoss_20b.sh": "model_configs/gpt-oss-20b",
    "grpo_trainer__run_gpt_oss_20b_fsdp.sh": "model_configs/gpt-oss-20b",
    "tuning__lora__run_qwen3_30b_a3b_megatron.sh": "model_configs/Qwen3-30B-A3B-Base",  # Instruct-2507: same shapes
    "recipe__dapo__test_dapo_qwen3_30b_math.sh": "model_configs/Qwen3-30B-A3B-Base",
    "recipe__dapo__test_dapo_7b_math.sh": "qwen2.5-math-7b",
    "recipe__dapo__test_dapo_7b_math_lora.sh": "qwen2.5-math-7b",
    "recipe__dapo__test_dapo_7b_math_megatron.sh": "qwen2.5-math-7b",
    "recipe__fapo__run_baseline_7b.sh": "qwen2.5-math-7b",
    "recipe__char_count__train_grpo.sh": "qwen2.5-0.5b",  # an SFT checkpoint of Qwen2.5-0.5B
    "run_qwen3-235b_megatron_96gb.sh": "qwen3-235b-a22b",  # verl's script reads it from $RAY_DATA_HOME/models
}


def script_model(path) -> str | None:
    """The --model a user gives for this fixture script (SCRIPT_MODELS), or None."""
    from pathlib import Path

    name = SCRIPT_MODELS.get(Path(path).name)
    return str(Path(path).resolve().parents[1] / name) if name and name.startswith("model_configs/") else name


def run(tasks: list[tuple], *, processes: int = 2) -> list[dict]:
    """Judge ("setup", name, n, seed) and ("script", path, n, seed) tasks over `processes` worker processes
    (each composes and validates on its own).

    The workers fork from a fresh fork server that imports verl once, never from this process: a fork of a process
    with other threads (a test's Ray or gRPC threads, a study's heartbeat) can copy a lock some thread held, and the
    child then waits on it for ever (seen in CI under xdist)."""
    import multiprocessing

    if processes <= 1:
        import verl.utils.config  # noqa: F401
        import verl.trainer.ppo.utils  # noqa: F401

        return [row for task in tasks for row in _run_task(task)]
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["verl.utils.config", "verl.trainer.ppo.utils", "autotune.verl.judge"])
    with context.Pool(processes) as pool:
        return [row for rows in pool.map(_run_task, tasks, chunksize=1) for row in rows]


def importable_scripts(folder) -> list:
    """The launch scripts of `folder` that `--from` imports, with the `--` values its error asks for (the others
    say why in one line)."""
    from pathlib import Path

    from autotune.errors import ConfigError

    out = []
    for path in sorted(Path(folder).glob("*.sh")):
        try:
            imported, job = import_script(path, model_name=script_model(path))
        except ConfigError:
            continue
        if refused_as_written(imported, job) is None:
            out.append(path)
    return out


def refused_as_written(imported, job) -> str | None:
    """verl's reason where it refuses the job as its author wrote it and the export of that job for the same reason (a
    key of a newer verl, a rollout expert-parallel size its TP and DP do not give): the user's to fix, which no rule
    of ours about the searched knobs can see. None where verl starts the job, or the export mends it (verl's
    deprecated global micro-batch keys, which the export writes per GPU)."""
    from autotune.verl.export import hydra_overrides, model_engine, verl_overrides
    from autotune.verl.semantic import user_job_args

    as_written = verdict_config(COMPOSER(user_job_args(imported, job.baseline.actor_engine)), private=True, fast=True)
    if as_written is None:
        return None
    gpn, nodes = job.gpus_per_node or 8, job.nodes or 1
    export = verl_overrides(job.model, job.workload, job.baseline, gpus_per_node=gpn, nodes=nodes,
                            passthrough=job.passthrough)
    exported = verdict_config(COMPOSER(hydra_overrides(export, model_engine(job.baseline))), private=True, fast=True)
    return as_written if exported == as_written else None


def tasks(examples_folder, per_setup: int, per_script: int, seed: int = 0) -> list[tuple]:
    """Every setup of SETUPS, then every importable verl example script (its own baseline first)."""
    out = [("setup", name, per_setup, seed) for name in SETUPS]
    out += [("script", str(path), per_script, seed) for path in importable_scripts(examples_folder)]
    return out


def summary(rows: list[dict]) -> dict:
    return {"candidates": len(rows), "setups": len({r["setup"] for r in rows}),
            "verl_refused": sum(r["verl"] is not None for r in rows),
            "rules_refused": sum(bool(r["ours"]) for r in rows),
            "disagreements": sum(not r["agree"] for r in rows)}
