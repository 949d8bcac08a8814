"""The torch backend on a real GPU: Qwen2.5-0.5B's shape, a few trajectories, through TorchRunner."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dataclasses import replace  # noqa: E402

from autotune.errors import ProbeOOM  # noqa: E402
from autotune.hardware import GIB, GpuSpec, get_gpu, match_device_name  # noqa: E402
from autotune.models import get_model  # noqa: E402
from autotune.backends.base import ProbeRequest  # noqa: E402
from autotune.backends.torch.runner import PHASES, TorchRunner  # noqa: E402
from autotune.spaces.candidate import Candidate  # noqa: E402
from autotune.workload import Workload  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

MODEL = get_model("qwen2.5-0.5b")
WORKLOAD = Workload(train_batch_size=64, ppo_mini_batch_size=16, rollout_n=4, max_prompt_length=256,
                    max_response_length=128)
CANDIDATE = Candidate(rollout_tp=1, gpu_memory_utilization=0.3, use_torch_compile=False,
                      ppo_micro_batch_size_per_gpu=8, log_prob_micro_batch_size_per_gpu=16,
                      ref_log_prob_micro_batch_size_per_gpu=16)


def this_gpu() -> GpuSpec:
    return match_device_name(torch.cuda.get_device_name(0)) or get_gpu("H200")


def gpu_request(tmp_path, candidate: Candidate) -> ProbeRequest:
    return ProbeRequest(model=MODEL, gpu=this_gpu(), n_gpus=1, nodes=1, workload=WORKLOAD, candidate=candidate,
                        run_dir=tmp_path / "probe", warmup_steps=1, timed_steps=2)


def test_qwen25_05b_probe_measures_throughput_mfu_and_memory(tmp_path):
    runner = TorchRunner(device="cuda", multi_gpu=False, request_overrides={"scale": {"trajectories": 32}})
    result = runner.probe(gpu_request(tmp_path, CANDIDATE), lambda step, tps: False)
    assert result.tokens_per_s_per_gpu > 0
    assert 0 < result.mfu < 1
    assert all(result.phase_s[phase] > 0 for phase in PHASES)
    fp32_weights_gib = MODEL.param_count() * 4 / GIB
    assert result.peak_mem_gib > fp32_weights_gib  # fp32 master weights + bf16 rollout/ref + activations
    # the KV pool sized as vLLM does: requested share less the rollout's weights and its profile run's peak
    plan = result.extra["plan"]
    assert plan["rollout_weights_gib"] == pytest.approx(MODEL.param_count() * 2 / GIB, rel=0.01)
    assert plan["kv_profile_peak_gib"] > 0
    total_gib = torch.cuda.mem_get_info(0)[1] / GIB
    assert plan["kv_cache_budget_gib"] == pytest.approx(
        CANDIDATE.gpu_memory_utilization * total_gib - plan["rollout_weights_gib"] - plan["kv_profile_peak_gib"])


def test_a_huge_micro_batch_raises_probe_oom(tmp_path):
    # 512 sequences of ~230 tokens in one micro-batch without checkpointing: activations and
    # 152k-vocab logits need several hundred GiB.
    candidate = CANDIDATE.with_(ppo_micro_batch_size_per_gpu=512, gradient_checkpointing=False)
    workload = Workload(train_batch_size=128, ppo_mini_batch_size=128, rollout_n=4, max_prompt_length=256,
                        max_response_length=128)
    request = ProbeRequest(model=MODEL, gpu=this_gpu(), n_gpus=1, nodes=1, workload=workload, candidate=candidate,
                           run_dir=tmp_path / "probe", warmup_steps=1, timed_steps=1)
    runner = TorchRunner(device="cuda", multi_gpu=False, request_overrides={"scale": {"trajectories": 512}})
    with pytest.raises(ProbeOOM) as info:
        runner.probe(request, lambda step, tps: False)
    assert info.value.phase == "update_actor"
    assert info.value.peak_mem_gib > 0


def test_memory_savers_and_compile_run_on_the_gpu(tmp_path):
    """Offloads, activation offload, token-budget packing and torch.compile all run; with the actor
    and its Adam state offloaded, rollout holds little more than vLLM's KV budget and bf16 weights."""
    candidate = CANDIDATE.with_(param_offload=True, optimizer_offload=True, ref_param_offload=True,
                                activation_offload=True, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=2048,
                                log_prob_max_token_len_per_gpu=4096, use_torch_compile=True)
    runner = TorchRunner(device="cuda", multi_gpu=False, request_overrides={"scale": {"trajectories": 32}})
    result = runner.probe(gpu_request(tmp_path, candidate), lambda step, tps: False)
    assert all(result.phase_s[phase] > 0 for phase in PHASES)
    bf16_weights_gib = MODEL.param_count() * 2 / GIB
    gen_peak_gib = result.extra["phase_peak_mem_gib"]["gen"]
    assert gen_peak_gib < result.extra["plan"]["kv_cache_budget_gib"] + bf16_weights_gib + 3.0


def test_packed_varlen_attention_matches_padded_rows_on_the_gpu():
    """torch's flash varlen kernel over one packed row gives the log-probs of separate padded rows
    (bf16: a few thousandths), forward and backward."""
    from autotune.backends.torch.probe.kernels import PACKED_ATTENTION, entropy_from_logits
    from autotune.backends.torch.probe.modeling import (PolicyHead, build_causal_lm, packed_micro_batch,
                                                        padded_micro_batch)

    device = torch.device("cuda")
    torch.manual_seed(0)
    prompt_lengths, response = [37, 200, 5, 91], 16
    sequences = [torch.randint(0, MODEL.vocab_size, (p + response,), device=device) for p in prompt_lengths]
    padded = PolicyHead(build_causal_lm(MODEL, dtype=torch.bfloat16, device=device, max_len=256), entropy_from_logits)
    packed = PolicyHead(build_causal_lm(MODEL, dtype=torch.bfloat16, device=device, max_len=256,
                                        attention=PACKED_ATTENTION), entropy_from_logits)
    packed.load_state_dict(padded.state_dict())
    expected, _ = padded(padded_micro_batch(sequences, prompt_lengths, response, 216, device))
    got, _ = packed(packed_micro_batch(sequences, prompt_lengths, response, device))
    assert torch.allclose(got.float(), expected.float(), atol=0.05, rtol=0.01)
    got.sum().backward()
    expected.sum().backward()
    g_packed = packed.lm.model.layers[0].self_attn.q_proj.weight.grad.float()
    g_padded = padded.lm.model.layers[0].self_attn.q_proj.weight.grad.float()
    assert (g_packed - g_padded).norm() / g_padded.norm() < 0.05


def test_lora_probe_runs_on_the_gpu_with_small_optimizer_state(tmp_path):
    """LoRA GRPO on 0.5B: adapters only in the optimizer, the reference through the actor without
    adapters; a full fine-tune of the same workload holds more memory."""
    pytest.importorskip("peft")
    lora = ProbeRequest(model=MODEL, gpu=this_gpu(), n_gpus=1, nodes=1, workload=replace(WORKLOAD, lora_rank=32),
                        candidate=CANDIDATE, run_dir=tmp_path / "lora", warmup_steps=1, timed_steps=1)
    full = replace(lora, workload=WORKLOAD, run_dir=tmp_path / "full")
    runner = TorchRunner(device="cuda", multi_gpu=False, request_overrides={"scale": {"trajectories": 32}})
    lora_result = runner.probe(lora, lambda step, tps: False)
    full_result = runner.probe(full, lambda step, tps: False)
    assert all(lora_result.phase_s[phase] > 0 for phase in PHASES)
    assert lora_result.peak_mem_gib < full_result.peak_mem_gib


def test_fused_log_probs_match_eager_fp32_forward_and_backward():
    """The compiled log-prob kernels equal the eager fp32 log-softmax, values and gradients (the
    gradient is written over the logits in place, as verl's flash-attn kernel)."""
    from autotune.backends.torch.probe.kernels import token_log_probs

    torch.manual_seed(0)
    logits = (torch.randn(3001, MODEL.vocab_size, device="cuda") * 3).bfloat16().requires_grad_()
    labels = torch.randint(0, MODEL.vocab_size, (3001,), device="cuda")
    weights = torch.randn(3001, device="cuda")
    reference = logits.detach().clone().requires_grad_()
    fused = token_log_probs(logits * 1, labels)  # a non-leaf, as the LM head's output: backward overwrites it
    (fused * weights).sum().backward()
    eager = torch.log_softmax(reference.float(), -1).gather(-1, labels[:, None]).squeeze(-1)
    (eager * weights).sum().backward()
    assert fused.dtype == torch.float32
    assert torch.allclose(fused, eager, atol=1e-4)
    assert torch.allclose(logits.grad.float(), reference.grad.float(), atol=1e-2)


def test_liger_kernels_keep_the_log_probs_and_the_probe_runs(tmp_path):
    """verl's model.use_liger: Liger's RMSNorm/SwiGLU/RoPE kernels give the HF modules' log-probs (bf16
    tolerance) on the same weights, and a probe with them runs every phase and saves update memory."""
    pytest.importorskip("liger_kernel")
    from autotune.backends.torch.probe.kernels import PACKED_ATTENTION, entropy_from_logits
    from autotune.backends.torch.probe.modeling import PolicyHead, apply_liger, build_causal_lm, packed_micro_batch

    device = torch.device("cuda")
    torch.manual_seed(0)
    prompt_lengths, response = [37, 200, 5, 91], 16
    sequences = [torch.randint(0, MODEL.vocab_size, (p + response,), device=device) for p in prompt_lengths]
    batch = packed_micro_batch(sequences, prompt_lengths, response, device)
    eager = PolicyHead(build_causal_lm(MODEL, dtype=torch.bfloat16, device=device, max_len=256,
                                       attention=PACKED_ATTENTION), entropy_from_logits)
    expected, _ = eager(batch)
    liger_lm = build_causal_lm(MODEL, dtype=torch.bfloat16, device=device, max_len=256, attention=PACKED_ATTENTION)
    liger_lm.load_state_dict(eager.lm.state_dict())
    apply_liger(liger_lm)
    got, _ = PolicyHead(liger_lm, entropy_from_logits)(batch)
    assert repr(liger_lm.model.norm).startswith("LigerRMSNorm")  # Liger patches the instance, not its class
    assert torch.allclose(got.float(), expected.float(), atol=0.1, rtol=0.02)

    runner = TorchRunner(device="cuda", multi_gpu=False, request_overrides={"scale": {"trajectories": 32}})
    plain = CANDIDATE.with_(gradient_checkpointing=False, ppo_micro_batch_size_per_gpu=32)
    with_liger = runner.probe(gpu_request(tmp_path / "liger", plain.with_(use_liger=True)), lambda step, tps: False)
    without = runner.probe(gpu_request(tmp_path / "plain", plain), lambda step, tps: False)
    assert all(with_liger.phase_s[phase] > 0 for phase in PHASES)
    update_peak = {name: r.extra["phase_peak_mem_gib"]["update_actor"]
                   for name, r in (("liger", with_liger), ("plain", without))}
    assert update_peak["liger"] < update_peak["plain"], update_peak


def test_fused_kernels_probe_runs_under_fsdp2_and_holds_less_update_memory(tmp_path):
    """verl's model.use_fused_kernels on the probe: log-probs 512 positions at a time from the hidden states,
    recomputed in backward under FSDP2; every phase runs, and the update no longer holds a micro-batch's logits
    (32 sequences x 384 positions x 151936 entries: gigabytes in bf16)."""
    runner = TorchRunner(device="cuda", multi_gpu=False, request_overrides={"scale": {"trajectories": 32}})
    plain = CANDIDATE.with_(ppo_micro_batch_size_per_gpu=32)
    fused = runner.probe(gpu_request(tmp_path / "fused", plain.with_(use_fused_kernels=True)), lambda step, tps: False)
    without = runner.probe(gpu_request(tmp_path / "plain", plain), lambda step, tps: False)
    assert all(fused.phase_s[phase] > 0 for phase in PHASES)
    update_peak = {name: r.extra["phase_peak_mem_gib"]["update_actor"]
                   for name, r in (("fused", fused), ("plain", without))}
    assert update_peak["fused"] < update_peak["plain"] - 1.0, update_peak
