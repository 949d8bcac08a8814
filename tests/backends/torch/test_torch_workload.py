"""The torch backend on the CPU: batch planning, GRPO maths, vLLM's KV arithmetic, and whole probes
through TorchRunner on a tiny shape (hidden 64, 2 layers, vocab 512) in a subprocess."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from autotune.errors import ProbeCrashed, ProbeOOM, ProbeRejected  # noqa: E402
from autotune.hardware import GIB, get_gpu  # noqa: E402
from autotune.models import get_model  # noqa: E402
from autotune.backends.base import ProbePruned, ProbeRequest  # noqa: E402
from autotune.model.memory import lora_params  # noqa: E402
from autotune.backends.torch.runner import PHASES, TorchRunner  # noqa: E402
from autotune.backends.torch.probe.device import oom_over_gib  # noqa: E402
from autotune.backends.torch.probe.kernels import (PACKED_ATTENTION, entropy_from_logits,  # noqa: E402
                                                   grpo_advantages, token_log_probs)
from autotune.backends.torch.probe.modeling import (PolicyHead, apply_lora, build_causal_lm,  # noqa: E402
                                                    lora_merged_weights, packed_micro_batch, padded_micro_batch)
from autotune.backends.torch.probe.plan import (KvCacheTooSmall, check_kv_cache, kv_cache_budget_bytes,  # noqa: E402
                                                local_trajectories, micro_batches, mini_batch_sizes,
                                                pack_by_token_budget, rollout_concurrency, static_micro_batches)
from autotune.spaces.candidate import Candidate  # noqa: E402
from autotune.spaces.layout import ParallelLayout  # noqa: E402
from autotune.workload import Workload  # noqa: E402

TINY_MODEL = replace(get_model("qwen2.5-0.5b"), hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, intermediate_size=128, vocab_size=512)
TINY_WORKLOAD = Workload(train_batch_size=4, ppo_mini_batch_size=2, rollout_n=2, max_prompt_length=16,
                         max_response_length=8)
TINY_CANDIDATE = Candidate(use_torch_compile=False, ppo_micro_batch_size_per_gpu=2,
                           log_prob_micro_batch_size_per_gpu=4, ref_log_prob_micro_batch_size_per_gpu=4)


def tiny_request(tmp_path: Path, **candidate_changes) -> ProbeRequest:
    return ProbeRequest(model=TINY_MODEL, gpu=get_gpu("H200"), n_gpus=1, nodes=1, workload=TINY_WORKLOAD,
                        candidate=TINY_CANDIDATE.with_(**candidate_changes), run_dir=tmp_path / "probe",
                        warmup_steps=1, timed_steps=2)


# ---- batch planning ---------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1536, 4096, 16384])
@pytest.mark.parametrize("padded", [False, True])
def test_token_budget_packing_places_every_sequence_once_and_no_row_over_budget(budget, padded):
    rng = random.Random(budget)
    lengths = {i: rng.randint(1, 1536) for i in range(300)}
    batches = pack_by_token_budget(lengths, budget, padded=padded)
    placed = [i for batch in batches for i in batch]
    assert sorted(placed) == sorted(lengths)
    for batch in batches:  # packed: real tokens (verl's bound); padded: rows x longest, the tensor built
        cost = len(batch) * max(lengths[i] for i in batch) if padded else sum(lengths[i] for i in batch)
        assert cost <= budget


@pytest.mark.parametrize("budget", [4096, 16384])
@pytest.mark.parametrize("padded", [False, True])
def test_token_budget_packing_wastes_little_on_grpo_lengths(budget, padded):
    """Close to verl's ceil(total / max_token_len) micro-batches, padded or not."""
    rng = random.Random(budget)
    lengths = {i: 1024 + rng.randint(100, 300) for i in range(640)}
    batches = pack_by_token_budget(lengths, budget, padded=padded)
    ideal = sum(lengths.values()) / budget
    assert len(batches) <= 1.15 * ideal + 1


def test_token_budget_packing_balances_like_verl():
    """verl 0.9.1 rearrange_micro_batches: ceil(total / budget) micro-batches balanced by workload, so
    1.4 budgets run as two near-halves, not one full micro-batch and a small one."""
    lengths = {i: 700 for i in range(20)}  # 14000 tokens
    batches = pack_by_token_budget(lengths, 10000)
    assert sorted(sum(lengths[i] for i in b) for b in batches) == [7000, 7000]
    rng = random.Random(7)
    lengths = {i: rng.randint(200, 900) for i in range(64)}
    batches = pack_by_token_budget(lengths, 8192)
    sums = [sum(lengths[i] for i in b) for b in batches]
    assert len(batches) == -(-sum(lengths.values()) // 8192) and max(sums) <= 8192
    assert max(sums) - min(sums) <= 900  # within one sequence of each other


def test_token_budget_packing_adds_a_micro_batch_when_the_balanced_split_breaks_the_bound():
    lengths = {0: 600, 1: 600, 2: 600}  # ceil(1800 / 1000) = 2, but two sequences never fit in 1000
    batches = pack_by_token_budget(lengths, 1000)
    assert len(batches) == 3 and all(len(b) == 1 for b in batches)


def test_token_budget_packing_rejects_a_sequence_longer_than_the_budget():
    with pytest.raises(ValueError, match="max_token_len must be greater than the sequence length"):
        pack_by_token_budget({0: 100, 1: 5000}, 4096)


def test_micro_batch_counts_static_and_dynamic():
    assert [len(b) for b in static_micro_batches(list(range(10)), 4)] == [4, 4, 2]
    lengths = {i: 1000 for i in range(16)}
    static = micro_batches(range(16), lengths, dynamic=False, micro_batch_size=4, max_tokens=0)
    dynamic = micro_batches(range(16), lengths, dynamic=True, micro_batch_size=0, max_tokens=3000)
    assert [len(b) for b in static] == [4, 4, 4, 4]
    assert sorted(len(b) for b in dynamic) == [2, 2, 3, 3, 3, 3]  # ceil(16000 / 3000) = 6, balanced
    uneven = {i: 100 * (i + 1) for i in range(4)}  # 100..400: packed counts real tokens, padded rows x longest
    assert micro_batches(range(4), uneven, dynamic=True, micro_batch_size=0, max_tokens=600) == [[0, 3], [1, 2]]
    assert micro_batches(range(4), uneven, dynamic=True, micro_batch_size=0, max_tokens=600,
                         padded=True) == [[3], [2], [0, 1]]


def test_a_rank_does_its_share_of_an_8_gpu_step_in_mini_batches_of_its_share():
    workload = Workload()  # 1024 prompts x 5, mini-batch 256 prompts
    layout = ParallelLayout.of(Candidate(), workload, gpus_per_node=8, nodes=1)
    n = local_trajectories(layout, None)
    assert n == 1024 * 5 // 8
    assert mini_batch_sizes(n, layout) == [160] * 4  # ppo_mini_batch_size * n / dp
    micro = micro_batches(range(160), {i: 1000 for i in range(160)}, dynamic=False, micro_batch_size=4, max_tokens=0)
    assert len(micro) == 40
    # a scaled probe keeps the mini-batch size and runs fewer of them
    assert mini_batch_sizes(local_trajectories(layout, 330), layout) == [160, 160, 10]
    assert mini_batch_sizes(local_trajectories(layout, 10), layout) == [10]


# ---- GRPO maths -------------------------------------------------------------------------------


def test_grpo_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 5.0, 5.0, 5.0, 5.0, 3.0])
    adv = grpo_advantages(rewards, group_size=5)
    for group in (adv[0:5], adv[5:10]):
        assert abs(group.mean().item()) < 1e-5
    assert torch.allclose(adv[0:5].std(), torch.tensor(1.0), atol=1e-4)  # unbiased std, as verl
    assert torch.allclose(adv[5:10], torch.tensor([-1.7888, 0.4472, 0.4472, 0.4472, 0.4472]), atol=1e-3)
    assert adv[10].item() == pytest.approx(3.0, rel=1e-4)  # a group of one: mean 0, std 1


def test_chunked_log_probs_equal_log_softmax():
    logits = torch.randn(37, 50)
    labels = torch.randint(0, 50, (37,))
    expected = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    assert torch.allclose(token_log_probs(logits, labels, chunk_tokens=8), expected, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_prob_gradient_is_exact_and_written_over_the_logits(dtype):
    """verl's in-place backward (flash-attn inplace_backward): the gradient equals log_softmax's, and it is
    the logits' own storage, so training holds no second logits-sized tensor."""
    torch.manual_seed(0)
    base = (torch.randn(37, 50) * 3).to(dtype)
    weights = torch.randn(37)
    labels = torch.randint(0, 50, (37,))
    leaf = base.clone().requires_grad_()
    logits = leaf * 1  # the LM head's output: a non-leaf
    storage = logits.data_ptr()
    captured = {}
    logits.register_hook(lambda g: captured.update(ptr=g.data_ptr()))
    (token_log_probs(logits, labels, chunk_tokens=8) * weights).sum().backward()
    reference = base.clone().float().requires_grad_()
    (torch.log_softmax(reference, -1).gather(-1, labels[:, None]).squeeze(-1) * weights).sum().backward()
    assert captured["ptr"] == storage
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(leaf.grad.float(), reference.grad, atol=tol)


def _tiny_policy(attention: str):
    lm = build_causal_lm(TINY_MODEL, dtype=torch.float32, device=torch.device("cpu"), max_len=64, attention=attention)
    return PolicyHead(lm.eval(), entropy_from_logits)


def test_packed_rows_give_the_log_probs_of_padded_rows():
    """One packed row with per-sequence positions and varlen attention computes what separate padded
    rows do: no attention across sequence boundaries, positions restart, targets index the right logits."""
    torch.manual_seed(0)
    prompt_lengths, response = [5, 9, 3], 4
    sequences = [torch.randint(0, TINY_MODEL.vocab_size, (p + response,)) for p in prompt_lengths]
    padded = _tiny_policy("sdpa")
    packed = _tiny_policy(PACKED_ATTENTION)
    packed.load_state_dict(padded.state_dict())
    cpu = torch.device("cpu")
    with torch.no_grad():
        expected, _ = padded(padded_micro_batch(sequences, prompt_lengths, response, 16, cpu))
        got, _ = packed(packed_micro_batch(sequences, prompt_lengths, response, cpu))
    assert got.shape == (3, response)
    assert torch.allclose(got, expected, atol=1e-4)


def test_fused_log_probs_and_entropy_and_their_gradients_equal_the_logits_path():
    """model.use_fused_kernels (verl's fused log-prob, 512 positions at a time, recomputed in backward) computes what
    the logits path does: the same log-probs, entropy and parameter gradients."""
    torch.manual_seed(0)
    prompt_lengths, response = [5, 9, 3], 4
    sequences = [torch.randint(0, TINY_MODEL.vocab_size, (p + response,)) for p in prompt_lengths]
    batch = padded_micro_batch(sequences, prompt_lengths, response, 16, torch.device("cpu"))
    plain = _tiny_policy("sdpa")
    fused = _tiny_policy("sdpa")
    fused.load_state_dict(plain.state_dict())
    fused.fused = True
    grads = []
    for policy in (plain, fused):
        log_p, entropy = policy(batch, with_entropy=True)
        (log_p.sum() + 0.1 * entropy.sum()).backward()
        grads.append((log_p.detach(), entropy.detach(),
                      {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}))
    (lp0, e0, g0), (lp1, e1, g1) = grads
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    assert g0.keys() == g1.keys() and g0
    for name in g0:
        assert torch.allclose(g0[name], g1[name], atol=1e-5), name


def test_fused_log_probs_run_in_chunks_of_verls_size():
    from autotune.backends.torch.probe.kernels import FUSED_CHUNK_TOKENS, fused_log_probs

    seen = []
    head = torch.nn.Linear(8, 50, bias=False)

    def lm_head(h):
        seen.append(h.shape[0])
        return head(h)

    fused_log_probs(torch.randn(1300, 8), lm_head, torch.randint(0, 50, (1300,)), None)
    assert FUSED_CHUNK_TOKENS == 512 and seen == [512, 512, 276]


def test_lora_reference_is_the_base_and_the_merged_copy_is_w_plus_scaled_ba():
    pytest.importorskip("peft")
    torch.manual_seed(0)
    base = _tiny_policy("sdpa")
    peft_lm = apply_lora(base.lm, rank=4)
    trainable = [n for n, p in peft_lm.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # the sim's parameter count for LoRA is peft's all-linear count
    assert sum(p.numel() for p in peft_lm.parameters() if p.requires_grad) == lora_params(TINY_MODEL, 4)
    with torch.no_grad():
        for n, p in peft_lm.named_parameters():
            if "lora_B" in n:
                p.normal_()  # peft starts B at zero; make the adapter matter
    merged = dict(lora_merged_weights(peft_lm))
    plain = build_causal_lm(TINY_MODEL, dtype=torch.float32, device=torch.device("cpu"), max_len=64)
    assert set(merged) == {n for n, _ in plain.named_parameters()}
    q = next(m for n, m in peft_lm.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
    expected = q.base_layer.weight + q.scaling["default"] * (q.lora_B["default"].weight @ q.lora_A["default"].weight)
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], expected)
    ids = torch.randint(0, TINY_MODEL.vocab_size, (1, 12))
    with torch.no_grad():
        for name, weight in merged.items():
            plain.get_parameter(name).copy_(weight)
        assert torch.allclose(plain(ids).logits, peft_lm(input_ids=ids).logits, atol=1e-4)
        with peft_lm.disable_adapter():  # verl's ref_in_actor: the actor without its adapters is the base
            base_logits = peft_lm(input_ids=ids).logits
        assert not torch.allclose(base_logits, plain(ids).logits, atol=1e-3)


def test_lora_target_modules_train_only_the_named_projections_and_the_sim_counts_them():
    pytest.importorskip("peft")
    peft_lm = apply_lora(_tiny_policy("sdpa").lm, rank=4, target_modules=["q_proj", "v_proj"])
    trained = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in peft_lm.named_parameters() if p.requires_grad}
    assert trained == {"q_proj", "v_proj"}
    count = sum(p.numel() for p in peft_lm.parameters() if p.requires_grad)
    assert count == lora_params(TINY_MODEL, 4, ["q_proj", "v_proj"]) < lora_params(TINY_MODEL, 4)


# ---- vLLM's KV budget -------------------------------------------------------------------------


def test_kv_capacity_follows_vllms_block_budget():
    """vLLM's budget from the probe's measured parts: gpu_memory_utilization x total, less the weights and the
    profile run's peak (vllm/v1/worker/gpu_worker.py determine_available_memory); qwen2.5-7b's config.json
    has 28 layers, 4 KV heads of 128."""
    model = get_model("qwen2.5-7b")
    total = get_gpu("H200").mem_gib * GIB
    cand = Candidate(gpu_memory_utilization=0.5, rollout_tp=1, max_num_seqs=4096)
    assert model.kv_cache_bytes_per_token(1) == 2 * 28 * 4 * 128 * 2  # K+V x layers x kv heads x head_dim x bf16
    assert model.kv_cache_bytes_per_token(2) == model.kv_cache_bytes_per_token(1) / 2
    weights, profile = 15.2 * GIB, 3.1 * GIB
    budget = kv_cache_budget_bytes(total, cand.gpu_memory_utilization, weights, profile)
    assert budget == pytest.approx(0.5 * total - 18.3 * GIB)
    workload = Workload()
    expected = int(budget // (model.kv_cache_bytes_per_token(1) * workload.mean_seq_len))
    assert rollout_concurrency(budget, model, cand, workload) == expected
    assert rollout_concurrency(budget, model, cand.with_(max_num_seqs=64), workload) == 64
    # TP 2: weights and KV heads split over two GPUs, which serve two GPUs' share of the batch
    cand_tp2 = cand.with_(rollout_tp=2, max_num_seqs=256)
    assert rollout_concurrency(kv_cache_budget_bytes(total, 0.5, weights / 2, profile), model, cand_tp2,
                               workload) == 128


def test_kv_cache_too_small_raises_vllms_errors():
    model = get_model("qwen2.5-7b")
    total = get_gpu("H200").mem_gib * GIB
    with pytest.raises(KvCacheTooSmall, match="No available memory for the cache blocks"):
        rollout_concurrency(kv_cache_budget_bytes(total, 0.1, 15.2 * GIB, 3.1 * GIB), model, Candidate(), Workload())
    with pytest.raises(KvCacheTooSmall, match="To serve at least one request") as info:
        check_kv_cache(1 * 2**20, model, Candidate(rollout_tp=1), max_model_len=1536)
    assert info.value.over_gib == pytest.approx((1536 * model.kv_cache_bytes_per_token(1) - 2**20) / GIB)


def test_oom_over_gib_reads_torchs_message():
    message = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.81 GiB of "
               "which 4.50 GiB is free.")
    assert oom_over_gib(message) == pytest.approx(15.5)
    assert oom_over_gib("Tried to allocate 512.00 MiB") == pytest.approx(0.5)
    assert oom_over_gib("test double") is None


# ---- whole probes through TorchRunner ---------------------------------------------------------


def test_runner_module_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
            "import autotune.backends.torch.runner")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_tiny_probe_end_to_end_on_cpu(tmp_path):
    reported = []

    def report(step: int, tokens_per_s: float) -> bool:
        reported.append((step, tokens_per_s))
        return False

    result = TorchRunner(device="cpu").probe(tiny_request(tmp_path), report)
    assert result.simulated is False
    assert set(result.phase_s) == set(PHASES)
    assert all(result.phase_s[phase] > 0 for phase in PHASES)
    assert result.step_s >= sum(result.phase_s.values()) * 0.99
    assert result.tokens_per_s_per_gpu > 0 and 0 < result.mfu < 1 and result.peak_mem_gib > 0
    assert len(result.series["perf/throughput"]) == 2
    assert [step for step, _ in reported] == [2, 3]  # timed steps only, 1-based like the sim backend
    assert result.extra["plan"]["trajectories_per_rank"] == 8
    # tokens/s per GPU is (prompt+response tokens) / step time, as verl's perf/throughput
    first_timed = result.extra["steps"][1]
    assert first_timed["tokens_per_s_per_gpu"] == pytest.approx(first_timed["tokens"] / first_timed["step_s"])


def test_a_relative_run_folder_works_and_each_step_logs_its_phase_times(tmp_path, monkeypatch):
    """`--out results` is relative: the probe runs with cwd=run_dir, so the runner must hand it absolute paths.
    Each step's progress line carries its phase times, so a probe killed at its deadline still shows them."""
    monkeypatch.chdir(tmp_path)
    request = replace(tiny_request(tmp_path), run_dir=Path("results") / "runs" / "trial0001", timed_steps=1)
    result = TorchRunner(device="cpu").probe(request, lambda step, tps: False)
    assert result.tokens_per_s_per_gpu > 0
    log = (tmp_path / "results" / "runs" / "trial0001" / "probe.log").read_text()
    steps = [json.loads(line) for line in log.splitlines() if line.startswith('{"step"')]
    assert [s["step"] for s in steps] == [0, 1] and [s["timed"] for s in steps] == [False, True]
    assert set(steps[1]["phase_s"]) == set(PHASES) and steps[1]["peak_mem_gib"] > 0 and steps[1]["mfu"] > 0


def test_lora_probe_end_to_end_on_cpu(tmp_path):
    """LoRA GRPO: adapters train, the reference pass runs through the actor with adapters disabled,
    packed micro-batches by token budget."""
    pytest.importorskip("peft")
    request = replace(tiny_request(tmp_path, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=64,
                                   log_prob_max_token_len_per_gpu=64),
                      workload=replace(TINY_WORKLOAD, lora_rank=8, use_kl_loss=True))
    result = TorchRunner(device="cpu").probe(request, lambda step, tps: False)
    assert all(result.phase_s[phase] > 0 for phase in PHASES)
    assert result.tokens_per_s_per_gpu > 0


def test_report_returning_true_prunes_the_probe(tmp_path):
    request = tiny_request(tmp_path)
    with pytest.raises(ProbePruned) as info:
        TorchRunner(device="cpu").probe(request, lambda step, tps: True)
    assert info.value.step == 2
    assert not (request.run_dir / "result.json").exists()  # the process was stopped before it finished


def test_oom_in_a_phase_becomes_probe_oom_with_that_phase(tmp_path):
    runner = TorchRunner(device="cpu", request_overrides={"test_raise_oom_in": "update_actor"})
    with pytest.raises(ProbeOOM) as info:
        runner.probe(tiny_request(tmp_path), lambda step, tps: False)
    assert info.value.phase == "update_actor"
    assert info.value.peak_mem_gib is not None and info.value.peak_mem_gib > 0


def test_kv_cache_too_small_becomes_probe_oom_in_rollout(tmp_path):
    # half of 100 KiB for vLLM is less than the tiny rollout's own bf16 weights (about 0.2 MiB)
    runner = TorchRunner(device="cpu", request_overrides={"device_mem_gib": 100 / 2**20})
    with pytest.raises(ProbeOOM, match="No available memory for the cache blocks") as info:
        runner.probe(tiny_request(tmp_path), lambda step, tps: False)
    assert info.value.phase == "rollout"
    assert info.value.over_gib > 0


def test_a_token_budget_below_one_sequence_is_rejected_like_verl_rejects_it(tmp_path):
    request = tiny_request(tmp_path, use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=10)
    with pytest.raises(ProbeRejected, match="max_token_len must be greater than the sequence length"):
        TorchRunner(device="cpu").probe(request, lambda step, tps: False)


def test_a_crash_becomes_probe_crashed_with_the_error_line(tmp_path):
    runner = TorchRunner(device="cpu", request_overrides={"workload": {"rollout_n": 0}})
    with pytest.raises(ProbeCrashed, match="workload.rollout_n must be a positive integer"):
        runner.probe(tiny_request(tmp_path), lambda step, tps: False)


def test_megatron_candidates_are_rejected_before_launch(tmp_path):
    with pytest.raises(ProbeRejected, match="FSDP layouts only"):
        TorchRunner(device="cpu").probe(tiny_request(tmp_path, actor_engine="megatron"), lambda step, tps: False)
    assert not (tmp_path / "probe").exists()


def test_liger_candidates_are_rejected_on_the_cpu_and_without_the_package(tmp_path, monkeypatch):
    """Liger's kernels are Triton: a CPU probe cannot run them, and neither can a GPU without liger-kernel."""
    from autotune.backends import select

    with pytest.raises(ProbeRejected, match="need a CUDA GPU|not installed"):
        TorchRunner(device="cpu").probe(tiny_request(tmp_path, use_liger=True), lambda step, tps: False)
    assert not (tmp_path / "probe").exists()
    monkeypatch.setattr(select, "knob_without_package", lambda knob: "liger_kernel")
    reason = TorchRunner(device="cuda").unsupported(Candidate(use_liger=True), Workload())
    assert "use_liger needs liger-kernel" in reason
