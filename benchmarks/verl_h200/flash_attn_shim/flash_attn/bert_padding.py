"""flash_attn.bert_padding's helpers in plain torch (verl 0.9.1's utils/attention_utils.py imports these four).

unpad_input returns flash-attn >= 2.7's five values (hidden states, indices, cu_seqlens, max_seqlen, used seqlens).
`rearrange` is einops' (verl re-exports it from here; einops comes with vLLM).
"""
import torch
import torch.nn.functional as F
from einops import rearrange  # noqa: F401  (re-exported, as flash-attn's bert_padding does)


def index_first_axis(input, indices):
    """Rows `indices` of input's first axis (autograd scatters the gradient back)."""
    return input[indices]


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """(batch, seqlen, ...) and a 0/1 mask -> (tokens, ...), indices, cu_seqlens, max_seqlen, seqlens used."""
    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max().item())
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen_in_batch, used_seqlens_in_batch


def pad_input(hidden_states, indices, batch, seqlen):
    """(tokens, ...) back to (batch, seqlen, ...), zeros where the mask was 0."""
    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], device=hidden_states.device, dtype=hidden_states.dtype)
    out = out.index_put((indices,), hidden_states)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
