"""Issue 15's nine defects, each as verl 0.9.1 shows it, and issue 20 item 7 (a user's hydra.* key)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import yaml

from autotune.hardware import detect_gpus, get_gpu, visible_device_ids
from autotune.models import get_model
from autotune.model.memory import estimate_memory
from autotune.verl.rollout import effective_batched_tokens
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import SearchSpace
from autotune.verl.export import best_yaml_text, hydra_overrides, model_engine, verl_overrides
from autotune.verl.failures import FailureKind, classify_failure
from autotune.verl.job_import import user_job
from autotune.verl.keys import active_knobs_for
from autotune.verl.launch_script import import_launch_text
from autotune.verl.rules import check
from autotune.workload import Workload

ARO = "actor_rollout_ref"
EXAMPLES = Path(__file__).parents[1] / "data" / "verl_examples"


def _script(*overrides: str, model: str = "Qwen/Qwen2.5-7B-Instruct", gpus: int = 8) -> str:
    lines = ["python3 -m verl.trainer.main_ppo", "algorithm.adv_estimator=grpo", f"{ARO}.model.path={model}",
             "data.train_batch_size=64", f"{ARO}.actor.ppo_mini_batch_size=16", f"{ARO}.rollout.n=4",
             f"trainer.n_gpus_per_node={gpus}", "trainer.nnodes=1", *overrides]
    return " \\\n    ".join(lines) + "\n"


def _job(*overrides: str, **kw):
    return user_job(import_launch_text(_script(*overrides, **kw), source="job.sh"))


def _export(job, candidate=None):
    return verl_overrides(job.model, job.workload, candidate or job.baseline, gpus_per_node=job.gpus_per_node,
                          nodes=job.nodes or 1, passthrough=job.passthrough)


def _verl_verdict(job, candidate=None):
    from autotune.verl.judge import verdict
    candidate = candidate or job.baseline
    return verdict(hydra_overrides(_export(job, candidate), model_engine(candidate)))


MICRO = (f"{ARO}.actor.ppo_micro_batch_size_per_gpu=2", f"{ARO}.rollout.log_prob_micro_batch_size_per_gpu=4")


# ---- 1. the reference model: in-reward KL needs it too ---------------------------------------------

IN_REWARD_KL = _script("algorithm.use_kl_in_reward=True", f"{ARO}.actor.use_kl_loss=False", *MICRO,
                       f"{ARO}.ref.log_prob_micro_batch_size_per_gpu=4")


def test_1_in_reward_kl_runs_a_reference_model_exported_and_modelled():
    job = user_job(import_launch_text(IN_REWARD_KL, source="job.sh"))
    assert job.workload.use_kl_in_reward and not job.workload.use_kl_loss
    assert job.baseline.ref_log_prob_micro_batch_size_per_gpu == 4
    out = _export(job)
    assert out["algorithm.use_kl_in_reward"] is True
    assert out[f"{ARO}.ref.log_prob_micro_batch_size_per_gpu"] == 4
    layout = ParallelLayout.of(job.baseline, job.workload, gpus_per_node=8, nodes=1)
    mem = estimate_memory(job.model, get_gpu("H100-80GB"), job.workload, job.baseline, layout)
    assert "ref" in mem.phase_peak_gib and mem.components_gib["reference"] > 1.0  # a 7B bf16 model / 8 GPUs
    assert "ref_log_prob_micro_batch_size_per_gpu" in active_knobs_for(job.workload, "fsdp")


@pytest.mark.verl_judge
def test_1_verl_accepts_the_in_reward_kl_baseline():
    job = user_job(import_launch_text(IN_REWARD_KL, source="job.sh"))
    assert _verl_verdict(job) is None


# ---- 2. rollout.max_model_len ---------------------------------------------------------------------

def test_2_max_model_len_is_exported_as_prompt_plus_response_unless_the_user_set_it():
    job = _job(*MICRO, "data.max_prompt_length=1024", "data.max_response_length=3072")
    assert _export(job)[f"{ARO}.rollout.max_model_len"] == 4096
    own = _job(*MICRO, "data.max_prompt_length=1024", "data.max_response_length=3072",
               f"{ARO}.rollout.max_model_len=8192")
    assert own.workload.rollout_max_model_len == 8192
    assert _export(own)[f"{ARO}.rollout.max_model_len"] == 8192
    # vLLM needs KV room for one sequence of the length it is started with
    layout = ParallelLayout.of(own.baseline, own.workload, gpus_per_node=8, nodes=1)
    mem = estimate_memory(own.model, get_gpu("H100-80GB"), own.workload, own.baseline, layout)
    short = estimate_memory(job.model, get_gpu("H100-80GB"), job.workload, job.baseline, layout)
    assert mem.kv_cache_needed_gib == pytest.approx(2 * short.kv_cache_needed_gib)


def test_2_chunked_prefill_off_with_fewer_batched_tokens_is_accepted_and_raised_as_verl_does():
    model, wl = get_model("qwen2.5-7b"), Workload(max_prompt_length=2048, max_response_length=4096)
    cand = Candidate(enable_chunked_prefill=False, max_num_batched_tokens=4096)
    layout = ParallelLayout.of(cand, wl, gpus_per_node=8, nodes=1)
    assert not [v for v in check(model, wl, cand, layout) if "batched_tokens" in v.rule]
    # vllm_async_server.py:1113-1119 raises max_num_batched_tokens to max_model_len
    assert effective_batched_tokens(cand, wl.rollout_max_model_len) == 6144
    assert effective_batched_tokens(cand.with_(enable_chunked_prefill=True), 6144) == 4096


@pytest.mark.verl_judge
def test_2_verl_accepts_chunked_prefill_off_below_max_model_len():
    job = _job(*MICRO, f"{ARO}.rollout.enable_chunked_prefill=False", f"{ARO}.rollout.max_num_batched_tokens=512",
               "data.max_prompt_length=512", "data.max_response_length=1024")
    assert _verl_verdict(job) is None


# The user's own null: verl runs vLLM with the model's max_position_embeddings (vllm_async_server.py:1103-1105,
# get_max_position_embeddings: workers/rollout/utils.py:31-40), and raises max_num_batched_tokens to it with chunked
# prefill off (:1113-1119); a value above max_position_embeddings is refused (:1107-1111).

def test_2_the_users_null_max_model_len_is_the_models_context_and_priced_so():
    short = _job(*MICRO, "data.max_prompt_length=1024", "data.max_response_length=1024",
                 model="meta-llama/Llama-3.1-8B-Instruct")
    null = _job(*MICRO, "data.max_prompt_length=1024", "data.max_response_length=1024",
                f"{ARO}.rollout.max_model_len=null", model="meta-llama/Llama-3.1-8B-Instruct")
    assert null.model.max_position_embeddings == 131072  # its config.json
    assert null.workload.rollout_max_model_len == 131072
    assert _export(null)[f"{ARO}.rollout.max_model_len"] == 131072  # what verl would have run
    assert _export(short)[f"{ARO}.rollout.max_model_len"] == 2048
    gpu, cand = get_gpu("H100-80GB"), null.baseline.with_(rollout_tp=1, gpu_memory_utilization=0.3)
    layout = ParallelLayout.of(cand, null.workload, gpus_per_node=8, nodes=1)
    full = estimate_memory(null.model, gpu, null.workload, cand, layout)
    assert full.kv_cache_needed_gib == pytest.approx(16.0)  # 131072 tokens x 32 layers x 2 x 8 x 128 x 2 B
    assert full.kv_cache_needed_gib > full.kv_cache_gib  # vLLM refuses: the Llama-3.1-8B at share 0.3
    ok = estimate_memory(short.model, gpu, short.workload, cand, layout)
    assert ok.kv_cache_needed_gib < ok.kv_cache_gib


def test_2_chunked_prefill_off_raises_batched_tokens_to_the_models_context():
    null = _job(*MICRO, f"{ARO}.rollout.max_model_len=null", f"{ARO}.rollout.enable_chunked_prefill=False",
                f"{ARO}.rollout.max_num_batched_tokens=8192", model="Qwen/Qwen2.5-7B-Instruct")
    assert effective_batched_tokens(null.baseline, null.workload.rollout_max_model_len) == 32768


def test_2_max_model_len_above_the_models_context_is_refused_as_verl_does():
    job = _job(*MICRO, f"{ARO}.rollout.max_model_len=65536", model="Qwen/Qwen2.5-7B-Instruct")
    layout = ParallelLayout.of(job.baseline, job.workload, gpus_per_node=8, nodes=1)
    bad = [v for v in check(job.model, job.workload, job.baseline, layout) if v.rule == "max_model_len_within_context"]
    assert bad and "max_position_embeddings (32768)" in bad[0].message and "vllm_async_server.py" in bad[0].source


def test_2_an_alias_of_a_table_entry_does_not_claim_its_context():
    from autotune.model_config import resolve_model
    # Qwen2.5-7B base has another max_position_embeddings than the Instruct entry whose shapes it shares
    assert resolve_model("Qwen/Qwen2.5-7B").max_position_embeddings == 0
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct").max_position_embeddings == 32768


# ---- 3. Megatron recompute ------------------------------------------------------------------------

def test_3_megatron_without_recompute_imports_as_no_checkpointing():
    job = _job("model_engine=megatron", f"{ARO}.actor.megatron.tensor_model_parallel_size=2", *MICRO)
    assert job.baseline.is_megatron and job.baseline.gradient_checkpointing is False
    out = _export(job)
    assert out[f"{ARO}.actor.megatron.override_transformer_config.recompute_granularity"] is None


def test_3_the_users_own_recompute_settings_survive_the_export():
    otc = f"{ARO}.actor.megatron.override_transformer_config"
    job = _job("model_engine=megatron", f"{otc}.recompute_granularity=selective",
               f"{otc}.recompute_modules=[core_attn,mlp]", *MICRO)
    assert job.baseline.gradient_checkpointing is True
    out = _export(job)
    assert out[f"{otc}.recompute_granularity"] == "selective"
    assert out[f"{otc}.recompute_modules"] == ["core_attn", "mlp"]
    off = _export(job, job.baseline.with_(gradient_checkpointing=False))
    assert off[f"{otc}.recompute_granularity"] is None


# ---- 4. expert tensor parallel: null means TP -----------------------------------------------------

def test_4_expert_tp_left_null_is_tp_and_sizes_the_experts():
    job = _job("model_engine=megatron", f"{ARO}.actor.megatron.tensor_model_parallel_size=4",
               f"{ARO}.actor.megatron.expert_model_parallel_size=8", *MICRO, model="Qwen/Qwen3-30B-A3B", gpus=8)
    assert job.baseline.actor_etp == 4
    layout = ParallelLayout.of(job.baseline, job.workload, gpus_per_node=8, nodes=1)
    gpu = get_gpu("H100-80GB")
    at_tp = estimate_memory(job.model, gpu, job.workload, job.baseline, layout).components_gib["weights"]
    at_one = estimate_memory(job.model, gpu, job.workload, job.baseline.with_(actor_etp=1),
                             ParallelLayout.of(job.baseline.with_(actor_etp=1), job.workload, gpus_per_node=8,
                                               nodes=1)).components_gib["weights"]
    assert at_tp < at_one


# ---- 5. knobs verl does not read are not searched ---------------------------------------------------

def test_5_torch_compile_is_not_searched_or_charged_under_megatron():
    model, wl = get_model("qwen2.5-7b"), Workload()
    space = SearchSpace.build(model, wl, gpus_per_node=8, nodes=1)
    assert "use_torch_compile" not in space.active_knobs({"actor_engine": "megatron", "use_dynamic_bsz": False}, wl)
    assert "use_torch_compile" in space.active_knobs({"actor_engine": "fsdp", "use_dynamic_bsz": False}, wl)
    cand = Candidate(actor_engine="megatron", actor_tp=2, rollout_tp=2)
    layout = ParallelLayout.of(cand, wl, gpus_per_node=8, nodes=1)
    gpu = get_gpu("H100-80GB")
    on = estimate_memory(model, gpu, wl, cand, layout).phase_peak_gib
    off = estimate_memory(model, gpu, wl, cand.with_(use_torch_compile=False), layout).phase_peak_gib
    assert on == off


def test_5_ref_knobs_are_not_searched_under_lora():
    model = get_model("qwen2.5-7b")
    lora = Workload(lora_rank=32)
    space = SearchSpace.build(model, lora, gpus_per_node=8, nodes=1)
    active = space.active_knobs({"actor_engine": "fsdp", "use_dynamic_bsz": False}, lora)
    assert "ref_log_prob_micro_batch_size_per_gpu" not in active and "ref_param_offload" not in active
    full = space.active_knobs({"actor_engine": "fsdp", "use_dynamic_bsz": False}, Workload())
    assert "ref_log_prob_micro_batch_size_per_gpu" in full
    # the key is still written (validate_config wants it), from the actor's log-prob micro-batch
    out = verl_overrides(model, lora, Candidate(log_prob_micro_batch_size_per_gpu=16), gpus_per_node=8, nodes=1)
    assert out[f"{ARO}.ref.log_prob_micro_batch_size_per_gpu"] == 16


# ---- 6. deprecated global micro-batch keys ----------------------------------------------------------

def test_6_global_micro_batch_is_divided_by_gpus_over_ulysses_sp():
    job = _job(f"{ARO}.actor.ppo_micro_batch_size=16", f"{ARO}.rollout.log_prob_micro_batch_size=32",
               f"{ARO}.actor.ulysses_sequence_parallel_size=2")
    assert job.baseline.ulysses_sp == 2
    assert job.baseline.ppo_micro_batch_size_per_gpu == 4  # 16 / (8 / 2), not 16 / 8
    assert job.baseline.log_prob_micro_batch_size_per_gpu == 8


# ---- 7. failure classification --------------------------------------------------------------------

def test_7_sglang_curesult_out_of_memory_is_an_oom():
    log = "in generate_sequences\nRuntimeError: CUresult error: 2 (out of memory)\n"
    assert classify_failure(1, log).kind is FailureKind.CUDA_OOM


def test_7_config_dataclass_key_error_is_a_rejected_config():
    log = ("omegaconf.errors.ConfigKeyError: Key 'megatron' not in 'FSDPActorConfig'\n"
           "    full_key: megatron\n")
    assert classify_failure(1, log).kind is FailureKind.CONFIG_REJECTED


def test_7_oom_phase_is_taken_at_the_error_not_from_later_lines():
    log = "\n".join([
        "(WorkerDict pid=1) step 0: generate_sequences",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "(WorkerDict pid=2) update_actor: waiting for peers",
        "(TaskRunner pid=3) shutting down after update_policy",
    ])
    failure = classify_failure(1, log)
    assert failure.kind is FailureKind.CUDA_OOM and failure.phase == "rollout"


# ---- 8. CUDA_VISIBLE_DEVICES ----------------------------------------------------------------------

def _fake_nvml(count: int):
    calls = []
    mod = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(i) or (i if i < count else (_ for _ in ()).throw(
            RuntimeError("invalid index"))),
        nvmlDeviceGetHandleByUUID=lambda u: (_ for _ in ()).throw(RuntimeError("unknown uuid")),
        nvmlDeviceGetName=lambda h: f"NVIDIA H100 80GB HBM3 #{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 1024**3),
        nvmlSystemGetDriverVersion=lambda: "560.35")
    return mod, calls


@pytest.mark.parametrize("visible, count, first", [(None, 8, 0), ("2,3", 2, 2), ("5", 1, 5), ("1,x,2", 1, 1),
                                                   ("", None, None), ("6,7,9", 2, 6)])
def test_8_detection_counts_only_the_visible_gpus(monkeypatch, visible, count, first):
    mod, _ = _fake_nvml(8)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    found = detect_gpus(environ)
    if count is None:
        assert found is None
        return
    assert found.count == count and found.device_name.endswith(f"#{first}")


def test_8_visible_device_ids_parse_as_cuda_does():
    assert visible_device_ids({}) is None
    assert visible_device_ids({"CUDA_VISIBLE_DEVICES": "GPU-ab12,1"}) == ["GPU-ab12", "1"]
    assert visible_device_ids({"CUDA_VISIBLE_DEVICES": "0,-1,2"}) == ["0"]


# ---- 9. engine switches drop the other engine's keys --------------------------------------------------

MEGATRON_SCRIPT = ("model_engine=megatron", f"{ARO}.actor.megatron.tensor_model_parallel_size=2",
                   f"{ARO}.ref.megatron.tensor_model_parallel_size=2", f"{ARO}.actor.megatron.use_mbridge=True",
                   *MICRO, f"{ARO}.ref.log_prob_micro_batch_size_per_gpu=4")
FSDP_SCRIPT = (f"{ARO}.actor.fsdp_config.fsdp_size=-1", f"{ARO}.ref.fsdp_config.reshard_after_forward=True",
               f"{ARO}.actor.strategy=fsdp2", *MICRO, f"{ARO}.ref.log_prob_micro_batch_size_per_gpu=4")


def test_9_a_megatron_job_moved_to_fsdp_keeps_no_megatron_key():
    job = _job(*MEGATRON_SCRIPT)
    out = _export(job, Candidate(actor_engine="fsdp"))
    assert not [k for k in out if ".megatron." in k]
    assert out[f"{ARO}.actor.strategy"] == "fsdp"
    back = _export(job)
    assert back[f"{ARO}.actor.megatron.use_mbridge"] is True


def test_9_an_fsdp_job_moved_to_megatron_keeps_no_fsdp_key():
    job = _job(*FSDP_SCRIPT)
    out = _export(job, Candidate(actor_engine="megatron", actor_tp=2))
    assert not [k for k in out if ".fsdp_config." in k or k.endswith(".strategy")]
    assert _export(job)[f"{ARO}.actor.fsdp_config.fsdp_size"] == -1


@pytest.mark.verl_judge
@pytest.mark.parametrize("script, candidate", [
    (MEGATRON_SCRIPT, Candidate(actor_engine="fsdp")),
    (FSDP_SCRIPT, Candidate(actor_engine="megatron", actor_tp=2)),
])
def test_9_verl_accepts_the_switched_engine(script, candidate):
    job = _job(*script)
    candidate = candidate.with_(ppo_micro_batch_size_per_gpu=2, log_prob_micro_batch_size_per_gpu=4,
                                ref_log_prob_micro_batch_size_per_gpu=4)
    assert _verl_verdict(job, candidate) is None


# An optimizer key that only one engine's optimizer config declares has no counterpart in the other engine's
# (verl/workers/config/optimizer.py: McoreOptimizerConfig vs FSDPOptimizerConfig); dropping it would change the
# learning-rate schedule, so the search keeps the user's engine (the space does not offer the other).
MEGATRON_OPTIM = (*MEGATRON_SCRIPT, f"{ARO}.actor.optim.lr=1e-6", f"{ARO}.actor.optim.lr_warmup_steps=10",
                  f"{ARO}.actor.optim.lr_decay_style=cosine",
                  f"+{ARO}.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.0")
FSDP_OPTIM = (*FSDP_SCRIPT, f"{ARO}.actor.optim.lr_scheduler_type=cosine", f"{ARO}.actor.optim.min_lr_ratio=0.1")
SHARED_OPTIM = (*MICRO, f"{ARO}.actor.optim.lr=1e-6", f"{ARO}.actor.optim.weight_decay=0.1",
                f"{ARO}.actor.optim.lr_warmup_steps=10", f"{ARO}.actor.optim.clip_grad=0.5")


def _space_of(job, **kw):
    from autotune.config import ProbeBudget, TuneConfig
    from autotune.search.driver import build_space

    cfg = dict(model=job.model, gpu=get_gpu("H100-80GB"), gpus_per_node=job.gpus_per_node, nodes=job.nodes or 1,
               backend="sim", trials=1, storage_url="sqlite://", study_name="s", out_dir=".", seed=0,
               workload=job.workload, fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget(),
               baseline=job.baseline, passthrough=job.passthrough)
    return build_space(TuneConfig(**{**cfg, **kw}))


@pytest.mark.parametrize("script, engines", [(MEGATRON_OPTIM, ("megatron",)), (FSDP_OPTIM, ("fsdp", "fsdp2")),
                                             (SHARED_OPTIM, ("fsdp", "fsdp2", "megatron"))])
def test_9_an_optimizer_key_of_one_engine_holds_that_engine(script, engines):
    job = _job(*script)
    assert _space_of(job).domains["actor_engine"].choices == engines


def test_9_a_pin_to_the_other_engine_is_one_clear_error():
    from autotune.errors import ConfigError

    job = _job(*MEGATRON_OPTIM)
    with pytest.raises(ConfigError, match="lr_decay_style"):
        _space_of(job, fixed={"actor_engine": "fsdp"})


def test_9_the_held_engine_is_said_in_the_export_header():
    from autotune.verl.engines import engine_hold

    job = _job(*MEGATRON_OPTIM)
    hold = engine_hold(job.passthrough, job.baseline.actor_engine)
    assert hold.values == ("megatron",)
    assert f"{ARO}.actor.optim.lr_decay_style" in hold.keys and f"{ARO}.actor.optim.lr" not in hold.keys
    assert "lr_decay_style" in hold.describe() and "megatron" in hold.describe()
    from autotune.verl.export import export_header
    header = export_header(model=job.model, gpu_name="H100", gpus_per_node=8, nodes=1, backend="sim", simulated=True,
                           study="s", trial=3, tokens_per_s_per_gpu=1.0, mfu=None, peak_mem_gib=1.0,
                           baseline_tokens_per_s_per_gpu=None, tuned_workload_knobs=(), config_dir=Path("."),
                           holds=(hold,))
    assert hold.describe() in header
    assert engine_hold(_job(*SHARED_OPTIM).passthrough, "fsdp") is None


@pytest.mark.verl_judge
def test_9_verl_accepts_every_candidate_of_a_megatron_job_with_its_own_lr_schedule():
    from autotune.verl.judge import judge_script

    rows = judge_script(EXAMPLES / "run_qwen3moe-30b_megatron_96gb.sh", 6, seed=1)
    assert {r["candidate"].actor_engine for r in rows} == {"megatron"}
    assert all(r["agree"] for r in rows), [(r["ours"], r["verl"]) for r in rows if not r["agree"]]


# ---- issue 20 item 7: a user's hydra.* key -------------------------------------------------------------

def test_a_users_hydra_key_keeps_verls_search_path(tmp_path):
    job = _job(*MICRO, "hydra.run.dir=/tmp/outputs/run1")
    assert job.passthrough["hydra.run.dir"] == "/tmp/outputs/run1"
    text = best_yaml_text(_export(job), model_engine(job.baseline), ["header"])
    doc = yaml.safe_load(text)
    assert doc["hydra"]["run"]["dir"] == "/tmp/outputs/run1"
    assert doc["hydra"]["searchpath"] == ["pkg://verl.trainer.config"]
    assert doc["defaults"][0] == "ppo_trainer"


@pytest.mark.verl
def test_best_yaml_with_a_hydra_key_still_composes_with_verl(tmp_path):
    from autotune.verl.compose import compose_exported, select
    job = _job(*MICRO, "hydra.run.dir=/tmp/outputs/run1")
    path = tmp_path / "best.yaml"
    path.write_text(best_yaml_text(_export(job), model_engine(job.baseline), ["header"]))
    cfg = compose_exported(path)
    assert select(cfg, f"{ARO}.actor.ppo_micro_batch_size_per_gpu") == 2
    assert select(cfg, "trainer.n_gpus_per_node") == 8
