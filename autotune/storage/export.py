"""One mapping from (workload, candidate) to verl 0.9.1 Hydra keys, and the best.yaml writer.

The same overrides feed a probe's command line (verl backend) and the exported best.yaml, so what was
probed is what is exported. Keys were checked against verl 0.9.1's configs (tests compose them with
verl's real Hydra config, which rejects unknown keys). Keys removed in 0.9.x (Megatron grad_offload)
are never emitted.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

import yaml

from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

ARO = "actor_rollout_ref"
# Keys that are not in verl's schema and are added on purpose (Hydra needs "+" on the command line).
ADDED_KEYS = ("ray_kwargs.ray_init.runtime_env.env_vars.CUDA_DEVICE_MAX_CONNECTIONS",)
VERL_CONFIG_SEARCHPATH = "pkg://verl.trainer.config"
# Characters Hydra's override grammar accepts unquoted in a value; anything else is quoted.
_HYDRA_BARE = re.compile(r"^[A-Za-z0-9_./@-]+$")


def workload_overrides(model: ModelSpec, workload: Workload, *, gpus_per_node: int, nodes: int) -> dict:
    """The user's job: held fixed by the tuner, emitted so the export runs the same workload."""
    out = {
        "algorithm.adv_estimator": "grpo",
        "data.train_files": workload.train_files,
        "data.val_files": workload.val_files,
        "data.train_batch_size": workload.train_batch_size,
        "data.max_prompt_length": workload.max_prompt_length,
        "data.max_response_length": workload.max_response_length,
        f"{ARO}.model.path": model.hf_id,
        f"{ARO}.actor.ppo_mini_batch_size": workload.ppo_mini_batch_size,
        f"{ARO}.actor.ppo_epochs": workload.ppo_epochs,
        f"{ARO}.actor.use_kl_loss": workload.use_kl_loss,
        f"{ARO}.rollout.name": "vllm",
        f"{ARO}.rollout.n": workload.rollout_n,
        "trainer.n_gpus_per_node": gpus_per_node,
        "trainer.nnodes": nodes,
    }
    if workload.lora_rank:
        out[f"{ARO}.model.lora_rank"] = workload.lora_rank
        out[f"{ARO}.model.target_modules"] = workload.lora_target_modules
    return out


def candidate_overrides(c: Candidate, *, use_kl_loss: bool = True) -> dict:
    """The speed/memory knobs the study chose, as verl keys."""
    a, r, ref, m = f"{ARO}.actor", f"{ARO}.rollout", f"{ARO}.ref", f"{ARO}.model"
    out: dict = {
        f"{r}.tensor_model_parallel_size": c.rollout_tp,
        f"{r}.gpu_memory_utilization": round(c.gpu_memory_utilization, 4),
        f"{r}.max_num_seqs": c.max_num_seqs,
        f"{r}.max_num_batched_tokens": c.max_num_batched_tokens,
        f"{r}.enable_chunked_prefill": c.enable_chunked_prefill,
        f"{m}.use_remove_padding": c.use_remove_padding,
        f"{a}.use_dynamic_bsz": c.use_dynamic_bsz,
        # must equal actor.use_dynamic_bsz (bare assert, workers/engine_workers.py:616-637)
        f"{r}.log_prob_use_dynamic_bsz": c.use_dynamic_bsz,
    }
    if use_kl_loss:
        out[f"{ref}.log_prob_use_dynamic_bsz"] = c.use_dynamic_bsz
    if c.use_dynamic_bsz:
        out[f"{a}.ppo_max_token_len_per_gpu"] = c.ppo_max_token_len_per_gpu
        out[f"{r}.log_prob_max_token_len_per_gpu"] = c.log_prob_max_token_len_per_gpu
        if use_kl_loss:
            out[f"{ref}.log_prob_max_token_len_per_gpu"] = c.log_prob_max_token_len_per_gpu
    else:
        out[f"{a}.ppo_micro_batch_size_per_gpu"] = c.ppo_micro_batch_size_per_gpu
        out[f"{r}.log_prob_micro_batch_size_per_gpu"] = c.log_prob_micro_batch_size_per_gpu
        if use_kl_loss:
            out[f"{ref}.log_prob_micro_batch_size_per_gpu"] = c.ref_log_prob_micro_batch_size_per_gpu
    if c.is_megatron:
        meg = f"{a}.megatron"
        out.update({
            f"{meg}.tensor_model_parallel_size": c.actor_tp,
            f"{meg}.pipeline_model_parallel_size": c.actor_pp,
            f"{meg}.virtual_pipeline_model_parallel_size": c.actor_vpp if c.actor_vpp > 1 else None,
            f"{meg}.context_parallel_size": c.actor_cp,
            f"{meg}.expert_model_parallel_size": c.actor_ep,
            f"{meg}.expert_tensor_parallel_size": c.actor_etp,
            f"{meg}.param_offload": c.param_offload,
            f"{meg}.optimizer_offload": c.optimizer_offload,
            # Megatron's checkpointing switch (hf_model.enable_gradient_checkpointing is FSDP-only)
            f"{meg}.override_transformer_config.recompute_granularity": "full" if c.gradient_checkpointing else None,
            f"{meg}.override_transformer_config.recompute_method": "uniform" if c.gradient_checkpointing else None,
            f"{meg}.override_transformer_config.recompute_num_layers": 1 if c.gradient_checkpointing else None,
        })
        if use_kl_loss:
            out[f"{ref}.megatron.param_offload"] = c.ref_param_offload
        if c.cuda_device_max_connections:
            out[ADDED_KEYS[0]] = str(c.cuda_device_max_connections)
        return out
    out.update({
        f"{a}.strategy": c.actor_engine,
        f"{a}.fsdp_config.param_offload": c.param_offload,
        f"{a}.fsdp_config.optimizer_offload": c.optimizer_offload,
        f"{a}.fsdp_config.ulysses_sequence_parallel_size": c.ulysses_sp,
        # the deprecated alias feeds ref.ulysses_sequence_parallel_size through oc.select (dp_ref.yaml:39)
        f"{a}.ulysses_sequence_parallel_size": c.ulysses_sp,
        # the FSDP engine reads fsdp_config.use_torch_compile (engine/fsdp/transformer_impl.py:183-187);
        # actor.use_torch_compile feeds ref.use_torch_compile (ref.yaml:9)
        f"{a}.fsdp_config.use_torch_compile": c.use_torch_compile,
        f"{a}.use_torch_compile": c.use_torch_compile,
        f"{m}.enable_gradient_checkpointing": c.gradient_checkpointing,
        f"{m}.enable_activation_offload": c.activation_offload,
        # read by the FSDP engine only (engine/fsdp/transformer_impl.py:307); the actor and the reference
        # are built from this one model config
        f"{m}.use_liger": c.use_liger,
    })
    if use_kl_loss:
        out[f"{ref}.fsdp_config.param_offload"] = c.ref_param_offload
    return out


def verl_overrides(model: ModelSpec, workload: Workload, candidate: Candidate, *, gpus_per_node: int,
                   nodes: int, passthrough: dict | None = None) -> dict:
    """The user's other keys first (unchanged), then the workload, then the chosen system knobs."""
    out = dict(passthrough or {})
    for key, value in workload_overrides(model, workload, gpus_per_node=gpus_per_node, nodes=nodes).items():
        # the user's own value wins (a local model folder, another advantage estimator or rollout engine);
        # keys that map to Workload fields never reach passthrough, their values are the user's already
        out.setdefault(key, value)
    out.update(candidate_overrides(candidate, use_kl_loss=workload.use_kl_loss))
    return out


def model_engine(candidate: Candidate) -> str:
    """verl's Hydra group: `model_engine=megatron` selects the Megatron actor/ref configs."""
    return "megatron" if candidate.is_megatron else "dp"


def _hydra_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):  # Hydra's list syntax, e.g. [q_proj,v_proj]
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    text = str(value)
    if not _HYDRA_BARE.match(text) or text.lower() in ("null", "true", "false") or _looks_numeric(text):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def _looks_numeric(text: str) -> bool:
    """A string Hydra would read as a number must stay a string (Ray env vars must be str)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def hydra_overrides(overrides: dict, engine: str) -> list[str]:
    """Command-line form: `key=value`, `+key=value` for the keys verl does not declare."""
    args = [f"model_engine={engine}"] if engine != "dp" else []
    for key, value in overrides.items():
        prefix = "+" if key in ADDED_KEYS else ""
        args.append(f"{prefix}{key}={_hydra_value(value)}")
    return args


def nest(flat: dict) -> dict:
    root: dict = {}
    for key, value in flat.items():
        node = root
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return root


def best_yaml_text(overrides: dict, engine: str, header: list[str]) -> str:
    """A Hydra primary config: verl's ppo_trainer as default, then only what autotune sets."""
    defaults: list = ["ppo_trainer"]
    if engine != "dp":
        defaults.append({"override model_engine": engine})
    defaults.append("_self_")
    doc = {"hydra": {"searchpath": [VERL_CONFIG_SEARCHPATH]}, "defaults": defaults}
    doc.update(nest(overrides))
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + body


def write_best_yaml(path: Path, overrides: dict, engine: str, header: list[str]) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".yaml.tmp")
    try:
        tmp.write_text(best_yaml_text(overrides, engine, header))
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no empty best.yaml.tmp behind
        raise
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


def export_header(*, model: ModelSpec, gpu_name: str, gpus_per_node: int, nodes: int, backend: str,
                  simulated: bool, study: str, trial: int, tokens_per_s_per_gpu: float, mfu: float | None,
                  peak_mem_gib: float, baseline_tokens_per_s_per_gpu: float | None,
                  tuned_workload_knobs: tuple[str, ...], config_dir: Path) -> list[str]:
    kind = "SIMULATED by the calibrated model, not measured" if simulated else f"measured by the {backend} backend"
    lines = [
        "autotune export: verl 0.9.1 GRPO configuration",
        f"model: {model.name} ({model.hf_id}); GPUs: {nodes} node(s) x {gpus_per_node} {gpu_name}",
        f"study: {study}, trial {trial}; backend: {backend}; simulated: {str(simulated).lower()}",
        f"score ({kind}): {tokens_per_s_per_gpu:.1f} tokens/s/GPU, actor MFU "
        f"{'n/a' if mfu is None else f'{mfu:.3f}'}, peak memory {peak_mem_gib:.1f} GiB",
    ]
    if baseline_tokens_per_s_per_gpu:
        gain = tokens_per_s_per_gpu / baseline_tokens_per_s_per_gpu
        lines.append(f"verl default baseline: {baseline_tokens_per_s_per_gpu:.1f} tokens/s/GPU (x{gain:.2f})")
    if tuned_workload_knobs:
        lines.append("WORKLOAD CHANGED (opted in): " + ", ".join(tuned_workload_knobs)
                     + " were tuned; the model may learn differently than with your values")
    else:
        lines.append("workload held fixed: batch sizes, rollout.n, lengths and algorithm are yours")
    lines += [
        f"exported {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"run: python3 -m verl.trainer.main_ppo --config-path={Path(config_dir).resolve()} --config-name=best",
    ]
    return lines
