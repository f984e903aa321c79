"""Datasets: local files in the recipe's published schemas -> TFDS ArrayRecord -> grain batches of records.

`builders.prepare(SourceConfig(...))` builds a source once; `pipeline.prompt_batches` /
`pipeline.conversation_batches` turn it into a checkpointable grain iterator of `PromptRecord` /
`Conversation` lists; `prompts.PromptStyle` is the per-source wording applied per row.
"""

from agentrl_jax.data.builders import PreparedDataset, SourceConfig, prepare, refuse_unknown_sources
from agentrl_jax.data.pipeline import (PipelineConfig, all_prompt_records, conversation_batches, num_batches,
                                      prompt_batches)
from agentrl_jax.data.prompts import PromptStyle, PromptTemplate, apply_prompt_style
from agentrl_jax.data.records import Conversation, PromptRecord

__all__ = [
    "Conversation",
    "PipelineConfig",
    "PreparedDataset",
    "PromptRecord",
    "PromptStyle",
    "PromptTemplate",
    "SourceConfig",
    "all_prompt_records",
    "apply_prompt_style",
    "conversation_batches",
    "num_batches",
    "prepare",
    "prompt_batches",
    "refuse_unknown_sources",
]
