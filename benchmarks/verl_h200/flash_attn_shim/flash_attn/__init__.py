"""flash_attn's Python API over PyTorch's varlen FlashAttention kernels (torch.nn.attention.varlen.varlen_attn).

What verl 0.9.1 and transformers 5.9 import from flash-attn, and nothing more: flash_attn_varlen_func,
flash_attn_func (flash_attn/flash_attn_interface.py in flash-attn 2.8.3) and flash_attn.bert_padding;
flash_attn_with_kvcache is importable (transformers imports it) and raises when called. Options
the PyTorch kernel does not offer (dropout, sliding window, softcap, ALiBi, attention probabilities) raise
NotImplementedError instead of computing something else.
"""
from flash_attn.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

__version__ = "2.8.3+torchvarlen"
__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
