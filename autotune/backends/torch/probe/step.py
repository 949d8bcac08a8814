"""One GRPO step, timed by phase: generation, old and reference log-probs, the actor update, the weight sync."""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from autotune.backends.torch.probe.device import (Dist, PhaseClock, allocated_bytes, move_optimizer_state,
                                                  peak_allocated_bytes, reset_peak_mem, resident, synchronize,
                                                  total_device_mem_bytes)
from autotune.backends.torch.probe.kernels import entropy_from_logits, grpo_advantages, grpo_loss
from autotune.backends.torch.probe.modeling import (PACKED_ATTENTION, MicroBatch, PolicyHead, apply_liger, apply_lora,
                                                    build_causal_lm, cache_kwarg, enable_gradient_checkpointing,
                                                    fsdp2_shard, full_param, lora_merged_weights, make_entropy_fn,
                                                    packed_micro_batch, padded_micro_batch)
from autotune.backends.torch.probe.plan import (kv_cache_budget_bytes, local_trajectories, micro_batches,
                                                mini_batch_sizes, rollout_concurrency, sample_prompt_lengths)
from autotune.backends.torch.probe.request import WorkloadRequest
from autotune.backends.torch.runner import PHASES
from autotune.hardware import GIB
from autotune.verl.flops import mfu, train_flops
from autotune.verl.rollout import effective_batched_tokens
from autotune.verl.roles import need_reference_policy, separate_reference

# verl actor defaults (verl 0.9.1 actor/actor.yaml, optim/fsdp.yaml): grad clip 1.0, AdamW lr 1e-6 and weight
# decay 0.01.
GRAD_CLIP = 1.0
LR = 1e-6
WEIGHT_DECAY = 0.01


@dataclass
class Trajectories:
    prompt_lengths: list[int]
    tokens: list[torch.Tensor]  # prompt + response, int64, on the device
    response_length: int

    @property
    def seq_lengths(self) -> dict[int, int]:
        return {i: p + self.response_length for i, p in enumerate(self.prompt_lengths)}


class GrpoProbe:
    """Holds the models and optimizer; `step()` runs and times one GRPO step."""

    def __init__(self, req: WorkloadRequest, dist: Dist, clock: PhaseClock) -> None:
        self.req = req
        self.dist = dist
        self.device = dist.device
        self.cand = req.candidate
        # verl's FSDP2 offloads to pinned blocks (non_blocking); the probe runs FSDP1 as FSDP2, and for it
        # copies to pageable memory of exact size, nearer FSDP1's flat per-layer blocks
        self.pinned_offload = self.cand.actor_engine == "fsdp2" and self.device.type == "cuda"
        self.work = req.workload
        self.rng = random.Random(req.seed + dist.rank)
        self.generator = torch.Generator(device=self.device).manual_seed(req.seed + dist.rank)
        self.layout = req.layout
        self.n_trajectories = local_trajectories(self.layout, req.scale_trajectories)
        self.clock = clock
        self._build_models()
        self.rollout_weights_bytes = sum(p.numel() * p.element_size() for p in self.rollout.parameters())
        self.profile_peak_bytes = self._profile_rollout()
        tp = max(1, self.cand.rollout_tp)  # emulated: one GPU of a TP replica holds 1/tp of the weights
        self.kv_budget_bytes = kv_cache_budget_bytes(total_device_mem_bytes(self.device, req.device_mem_gib),
                                                     self.cand.gpu_memory_utilization,
                                                     self.rollout_weights_bytes / tp, self.profile_peak_bytes)
        self.concurrency = rollout_concurrency(self.kv_budget_bytes, req.model, self.cand, self.work)

    def autocast(self) -> torch.autocast:
        """bf16 autocast around the forward, as verl's dp_actor (FSDP2 already computes in bf16)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    # -- set-up ---------------------------------------------------------------------------------

    def _build_models(self) -> None:
        req, cand, device = self.req, self.cand, self.device
        max_len = self.work.seq_len
        attention = PACKED_ATTENTION if cand.use_remove_padding else "sdpa"
        # verl FSDP keeps fp32 master weights (fsdp_config.model_dtype: fp32) and computes in bf16.
        actor_lm = build_causal_lm(req.model, dtype=torch.float32, device=device, max_len=max_len, attention=attention)
        if cand.use_liger:  # before the adapters, as verl (the engine patches the module, then wraps it)
            apply_liger(actor_lm)
        if self.work.lora_rank:
            actor_lm = apply_lora(actor_lm, self.work.lora_rank, self.work.lora_target_modules)
        if cand.gradient_checkpointing:
            enable_gradient_checkpointing(actor_lm)
        self.actor = PolicyHead(actor_lm, make_entropy_fn(cand), fused=cand.use_fused_kernels)
        self.rollout = build_causal_lm(req.model, dtype=torch.bfloat16, device=device, max_len=max_len).eval()
        self.ref = None
        # With LoRA the reference is the actor with its adapters disabled (verl's ref_in_actor,
        # trainer/ppo/ray_trainer.py: "the reference policy will be actor without lora applied").
        if separate_reference(self.work):
            ref_lm = build_causal_lm(req.model, dtype=torch.bfloat16, device=device, max_len=max_len,
                                     attention=attention).eval()
            if cand.use_liger:  # the reference is built by the same engine code
                apply_liger(ref_lm)
            self.ref = PolicyHead(ref_lm, entropy_from_logits, fused=cand.use_fused_kernels)
        fsdp2_shard(self.actor, param_dtype=torch.bfloat16)
        if self.ref is not None:
            fsdp2_shard(self.ref, param_dtype=torch.bfloat16)
        trainable = [p for p in self.actor.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY, fused=device.type == "cuda")
        self._copy_actor_to(self.rollout)  # the rollout starts from the actor, as vLLM's first sync
        if cand.param_offload:
            self.actor.to("cpu", non_blocking=self.pinned_offload)
        if self.ref is not None and cand.ref_param_offload:
            self.ref.to("cpu", non_blocking=self.pinned_offload)

    def _profile_rollout(self) -> float:
        """The memory vLLM's profile run adds before it sizes the KV cache (vllm/v1/worker/gpu_model_runner.py
        profile_run: one forward of max_num_batched_tokens dummy tokens, then the sampler over max_num_seqs
        rows; memory_profiling keeps the torch peak increase over the run). Measured on our rollout model; the
        forward's share is 1/rollout_tp (emulated TP), the sampler's full-vocab logits are not split (vLLM
        gathers them on every rank). The CPU allocator keeps no peak: there the profile adds nothing (tests)."""
        if self.device.type != "cuda":
            return 0.0
        tokens = effective_batched_tokens(self.cand, self.work.rollout_max_model_len)
        rows = min(self.cand.max_num_seqs, tokens)
        torch.cuda.empty_cache()
        with torch.no_grad():
            base_bytes = allocated_bytes(self.device)
            reset_peak_mem(self.device)
            ids = torch.zeros(1, tokens, dtype=torch.long, device=self.device)
            last = self.rollout.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0, -rows:].clone()
            forward_peak_bytes = peak_allocated_bytes(self.device) - base_bytes
            reset_peak_mem(self.device)
            torch.softmax(self.rollout.get_output_embeddings()(last).float(), dim=-1)
            sampler_peak_bytes = peak_allocated_bytes(self.device) - base_bytes
            del ids, last
        torch.cuda.empty_cache()
        return max(forward_peak_bytes / max(1, self.cand.rollout_tp), sampler_peak_bytes)

    def _copy_actor_to(self, target) -> None:
        """fp32 -> bf16 cast copy of every weight; with LoRA, of the merged weights W + s*B@A."""
        with torch.no_grad():
            if not self.work.lora_rank:
                for dst, src in zip(target.parameters(), self.actor.lm.parameters(), strict=True):
                    dst.copy_(full_param(src))
                return
            for name, dst in lora_merged_weights(self.actor.lm):
                target.get_parameter(name).copy_(dst)

    # -- phases ---------------------------------------------------------------------------------

    def generate(self, prompt_lengths: list[int]) -> Trajectories:
        """Waves of `concurrency` sequences: chunked prefill, last-position logits, multinomial decode."""
        response_len = self.work.max_response_length
        vocab = self.req.model.vocab_size
        tokens: list[torch.Tensor] = []
        pool = self._reserve_kv_pool(prompt_lengths)
        with torch.no_grad():
            for start in range(0, len(prompt_lengths), self.concurrency):
                wave = prompt_lengths[start:start + self.concurrency]
                prompts = [torch.randint(0, vocab, (p,), device=self.device, generator=self.generator) for p in wave]
                responses = self._generate_wave(prompts, response_len)
                tokens.extend(torch.cat([p, r]) for p, r in zip(prompts, responses))
        del pool
        return Trajectories(prompt_lengths=list(prompt_lengths), tokens=tokens, response_length=response_len)

    def _reserve_kv_pool(self, prompt_lengths: list[int]) -> list[torch.Tensor] | None:
        """vLLM allocates its whole KV budget up front; hold the part our caches do not use (CUDA only:
        on the CPU the budget is nominal)."""
        if self.device.type != "cuda":
            return None
        # verl puts the trainer to sleep before vLLM wakes: its cached blocks go back to the driver. Without
        # this, one large allocation fails on fragmentation (measured on the H200: 53 GiB reserved but
        # unallocated, a 64 GiB hold refused), which vLLM's paged pool never meets.
        torch.cuda.empty_cache()
        seqs = min(self.concurrency, len(prompt_lengths))
        used = seqs * (max(prompt_lengths) + self.work.max_response_length) * self.req.model.kv_cache_bytes_per_token()
        slack = int(self.kv_budget_bytes - used)
        if slack <= 0:
            return None
        block = 1 << 30  # vLLM's pool is many blocks, not one tensor: hold it in 1 GiB pieces
        return [torch.empty(min(block, slack - off), dtype=torch.uint8, device=self.device)
                for off in range(0, slack, block)]

    def _generate_wave(self, prompts: list[torch.Tensor], response_len: int) -> list[torch.Tensor]:
        from transformers import DynamicCache

        decoder, head = self.rollout.get_decoder(), self.rollout.get_output_embeddings()
        cache_kw = cache_kwarg(decoder)
        width = max(p.numel() for p in prompts)
        batch = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            batch[row, width - prompt.numel():] = prompt  # left-padded; pad tokens are attended (see docstring)
        cache = DynamicCache()
        # Chunked prefill: at most max_num_batched_tokens tokens per forward, as vLLM's scheduler.
        chunk = max(1, self.cand.max_num_batched_tokens // len(prompts))
        for start in range(0, width, chunk):
            hidden = decoder(input_ids=batch[:, start:start + chunk], use_cache=True, **{cache_kw: cache}).last_hidden_state
        # Only the last position's logits: full-vocab logits at prefill OOM (calibration README).
        next_token = self._sample(head(hidden[:, -1]))
        out = [next_token]
        for _ in range(response_len - 1):
            hidden = decoder(input_ids=next_token, use_cache=True, **{cache_kw: cache}).last_hidden_state
            next_token = self._sample(head(hidden[:, -1]))
            out.append(next_token)
        del cache
        return list(torch.cat(out, dim=1))

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator)

    def _micro_batch(self, traj: Trajectories, indices: list[int]) -> MicroBatch:
        sequences = [traj.tokens[i] for i in indices]
        prompt_lens = [traj.prompt_lengths[i] for i in indices]
        if self.cand.use_remove_padding:
            return packed_micro_batch(sequences, prompt_lens, traj.response_length, self.device)
        # verl without remove-padding pads every row to prompt+response max
        return padded_micro_batch(sequences, prompt_lens, traj.response_length, self.work.seq_len, self.device)

    def _forward_log_probs(self, policy: PolicyHead, traj: Trajectories, batches: list[list[int]],
                           with_entropy: bool) -> torch.Tensor:
        out = torch.empty(len(traj.tokens), traj.response_length, device=self.device)
        with torch.no_grad(), self.autocast():
            for indices in batches:
                log_probs, _entropy = policy(self._micro_batch(traj, indices), with_entropy=with_entropy)
                out[indices] = log_probs
        return out

    def _resident(self, module: torch.nn.Module, offload: bool):
        """`module` on this rank's GPU for the duration, offloaded the way this candidate's engine does."""
        return resident(module, self.device, offload=offload, pinned=self.pinned_offload)

    def _micro_batches(self, lengths: dict[int, int], indices: Sequence[int], micro_batch_size: int,
                       max_tokens: int) -> list[list[int]]:
        return micro_batches(indices, lengths, dynamic=self.cand.use_dynamic_bsz,
                             micro_batch_size=micro_batch_size, max_tokens=max_tokens,
                             padded=not self.cand.use_remove_padding)

    def _log_prob_batches(self, traj: Trajectories, micro_batch_size: int) -> list[list[int]]:
        return self._micro_batches(traj.seq_lengths, range(len(traj.tokens)), micro_batch_size,
                                   self.cand.log_prob_max_token_len_per_gpu)

    def old_log_prob(self, traj: Trajectories) -> torch.Tensor:
        batches = self._log_prob_batches(traj, self.cand.log_prob_micro_batch_size_per_gpu)
        self.actor.eval()
        with self._resident(self.actor, self.cand.param_offload):
            return self._forward_log_probs(self.actor, traj, batches, with_entropy=True)

    def ref_log_prob(self, traj: Trajectories) -> torch.Tensor:
        batches = self._log_prob_batches(traj, self.cand.ref_log_prob_micro_batch_size_per_gpu)
        if self.ref is None:  # LoRA: the actor with its adapters disabled
            self.actor.eval()
            with self._resident(self.actor, self.cand.param_offload), self.actor.lm.disable_adapter():
                return self._forward_log_probs(self.actor, traj, batches, with_entropy=False)
        with self._resident(self.ref, self.cand.ref_param_offload):
            return self._forward_log_probs(self.ref, traj, batches, with_entropy=False)

    def update_actor(self, traj: Trajectories, old_lp: torch.Tensor, ref_lp: torch.Tensor | None,
                     advantages: torch.Tensor) -> float:
        """ppo_epochs x mini-batches x micro-batches; returns the FLOPs verl counts for this rank."""
        flops = 0.0
        lengths = traj.seq_lengths
        self.actor.train()
        with self._resident(self.actor, self.cand.param_offload):
            if self.cand.optimizer_offload:
                move_optimizer_state(self.optimizer, self.device)
            for _epoch in range(self.work.ppo_epochs):
                start = 0
                for size in mini_batch_sizes(len(traj.tokens), self.layout):
                    mini = list(range(start, start + size))
                    start += size
                    self._train_mini_batch(traj, mini, lengths, old_lp, ref_lp, advantages)
                    flops += train_flops(self.req.model, [lengths[i] for i in mini])
            if self.cand.optimizer_offload:
                move_optimizer_state(self.optimizer, "cpu", pinned=self.pinned_offload)
        return flops

    def _train_mini_batch(self, traj: Trajectories, mini: list[int], lengths: dict[int, int],
                          old_lp: torch.Tensor, ref_lp: torch.Tensor | None, advantages: torch.Tensor) -> None:
        batches = self._micro_batches(lengths, mini, self.cand.ppo_micro_batch_size_per_gpu,
                                      self.cand.ppo_max_token_len_per_gpu)
        offload = torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")
        for indices in batches:
            batch = self._micro_batch(traj, indices)
            with self.autocast(), (offload if self.cand.activation_offload else nullcontext()):
                log_prob, _ = self.actor(batch)
                ref = ref_lp[indices] if ref_lp is not None else None
                loss = grpo_loss(log_prob, old_lp[indices], advantages[indices], ref)
            # verl scales each micro-batch loss by its share of the mini-batch (dp_actor.update_policy).
            (loss * (len(indices) / len(mini))).backward()
        torch.nn.utils.clip_grad_norm_(self.actor.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def update_weights(self) -> None:
        """Actor -> rollout copy. verl syncs FSDP shards into vLLM's bf16 weights; on one GPU the
        honest stand-in is the same gather-and-cast copy into our rollout model.

        Between generation and this sync vLLM sleeps (rollout.free_cache_engine=True: sleep level 1
        moves its weights to host memory and drops the KV cache), so the rollout weights are not on
        the GPU while the actor trains; they come back here, as verl's wake_up before the sync."""
        self.rollout.to(self.device)
        with self._resident(self.actor, self.cand.param_offload):
            self._copy_actor_to(self.rollout)

    # -- one step -------------------------------------------------------------------------------

    def step(self) -> dict:
        seconds: dict[str, float] = {name: 0.0 for name in PHASES}
        mem_gib: dict[str, float] = {}
        phase = lambda name: self.clock.phase(name, seconds, mem_gib)  # noqa: E731
        prompt_lengths = sample_prompt_lengths(self.rng, self.n_trajectories, self.work)
        synchronize(self.device)
        start_s = time.perf_counter()
        with phase("gen"):
            traj = self.generate(prompt_lengths)
            self.rollout.to("cpu")  # vLLM sleeps until the next weight sync (see update_weights)
        rewards = torch.randint(0, 2, (len(traj.tokens),), device=self.device, generator=self.generator)
        advantages = grpo_advantages(rewards, self.work.rollout_n)
        with phase("old_log_prob"):
            old_lp = self.old_log_prob(traj)
        ref_lp = None
        if need_reference_policy(self.work):
            with phase("ref"):
                ref_lp = self.ref_log_prob(traj)
        with phase("update_actor"):
            flops = self.update_actor(traj, old_lp, ref_lp, advantages)
        with phase("update_weights"):
            self.update_weights()
        synchronize(self.device)
        step_s = time.perf_counter() - start_s
        return self._step_record(step_s, seconds, mem_gib, traj, flops)

    def _step_record(self, step_s: float, seconds: dict, mem_gib: dict, traj: Trajectories, flops: float) -> dict:
        # verl perf/throughput: prompt+response tokens of every trajectory / step time / GPUs.
        tokens = self.dist.sum(float(sum(traj.seq_lengths.values())))
        total_flops = self.dist.sum(flops)
        return {
            "step_s": step_s,
            "phase_s": seconds,
            "phase_peak_mem_gib": mem_gib,
            "tokens": tokens,
            "tokens_per_s_per_gpu": tokens / step_s / self.dist.world_size,
            # verl perf/mfu/actor: update-phase FLOPs / update time / promised FLOP/s / world size
            "mfu": mfu(total_flops, seconds["update_actor"], self.dist.world_size, self.req.peak_flops_per_gpu),
        }

    def plan(self) -> dict:
        return {
            "trajectories_per_rank": self.n_trajectories,
            "world_size": self.dist.world_size,
            "dp": self.layout.dp,
            "rollout_concurrency": self.concurrency,
            "kv_cache_budget_gib": self.kv_budget_bytes / GIB,
            "rollout_weights_gib": self.rollout_weights_bytes / GIB,
            "kv_profile_peak_gib": self.profile_peak_bytes / GIB,
            "mini_batches": mini_batch_sizes(self.n_trajectories, self.layout),
        }


def summarize(records: list[dict], warmup_steps: int, peak_gib: float, plan: dict) -> dict:
    """Medians over the timed steps (gpt-fast style: warm-up and compile steps are not timed).

    `series` holds the timed steps under verl's metric names, as the sim backend's series do.
    """
    timed = records[warmup_steps:]
    median = statistics.median
    phase_peaks = {name: max(r["phase_peak_mem_gib"].get(name, 0.0) for r in records) for name in PHASES}
    series = {
        "perf/throughput": [r["tokens_per_s_per_gpu"] for r in timed],
        "perf/mfu/actor": [r["mfu"] for r in timed],
        "timing_s/step": [r["step_s"] for r in timed],
        **{f"timing_s/{name}": [r["phase_s"][name] for r in timed] for name in PHASES},
        "perf/max_memory_allocated_gb": [max(r["phase_peak_mem_gib"].values()) for r in timed],
    }
    return {
        "ok": True,
        "tokens_per_s_per_gpu": median(series["perf/throughput"]),
        "mfu": median(series["perf/mfu/actor"]),
        "peak_mem_gib": peak_gib,
        "phase_peak_mem_gib": phase_peaks,
        "step_s": median(series["timing_s/step"]),
        "phase_s": {name: median(series[f"timing_s/{name}"]) for name in PHASES},
        "series": series,
        "steps": [{"step": i, "timed": i >= warmup_steps, **r} for i, r in enumerate(records)],
        "plan": plan,
    }


def run(req: WorkloadRequest, dist: Dist, clock: PhaseClock) -> dict:
    torch.manual_seed(req.seed)
    probe = GrpoProbe(req, dist, clock)
    records = []
    for step in range(req.warmup_steps + req.timed_steps):
        record = probe.step()
        records.append(record)
        if dist.rank == 0:
            # phase times ride along so a probe killed at its deadline still leaves where its time went
            line = {"step": step, "tokens_per_s_per_gpu": record["tokens_per_s_per_gpu"],
                    "timed": step >= req.warmup_steps, "mfu": record["mfu"],
                    "phase_s": {name: round(s, 3) for name, s in record["phase_s"].items()},
                    "peak_mem_gib": round(max(record["phase_peak_mem_gib"].values()), 2)}
            print(json.dumps(line), flush=True)
    return summarize(records, req.warmup_steps, clock.peak_gib, probe.plan())
