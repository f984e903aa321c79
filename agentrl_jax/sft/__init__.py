"""Multi-turn SFT with assistant-only loss masks.

    masking.encode_conversation(tokenizer, messages, tools)  -> tokens + loss mask (assistant turns only)
    packing.pack(encoded, seq_len=..., micro_rows=..., max_rows=...)  -> fixed-shape [M, R, T] rows
    step.make_train_step(...)                                -> the one jitted update
    trainer.run(config, workdir)                             -> the job behind `configs/sft_*.py`
"""

from agentrl_jax.sft.masking import EncodedConversation, MalformedConversation, encode_conversation, render_pieces
from agentrl_jax.sft.packing import PackedBatch, pack
from agentrl_jax.sft.step import SFTConfig, StepData, encode_batch, make_train_step

__all__ = [
    "EncodedConversation",
    "MalformedConversation",
    "PackedBatch",
    "SFTConfig",
    "StepData",
    "encode_batch",
    "encode_conversation",
    "make_train_step",
    "pack",
    "render_pieces",
]
