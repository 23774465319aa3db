"""`nn.Embedding` that skips its random init when built on the meta device, and one whose
table can stay in the checkpoint's mapped file.

Every model here is built on meta and then handed the checkpoint's tensors. On meta,
`nn.Embedding`'s `normal_` init goes through PyTorch's reference ops, whose first call imports
`torch._dynamo`: seconds at every worker start (as long as importing torch itself) for values
the checkpoint replaces. Built anywhere else it is exactly `nn.Embedding`, random init included.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

EmbeddingT = TypeVar("EmbeddingT", bound=nn.Embedding)


def Embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """`nn.Embedding(num_embeddings, embedding_dim)`, without the init on meta."""
    return _built(nn.Embedding, num_embeddings, embedding_dim)


def _built(kind: type[EmbeddingT], num_embeddings: int, embedding_dim: int) -> EmbeddingT:
    if torch.get_default_device().type == "meta":
        weight = torch.empty(num_embeddings, embedding_dim)
        return kind(num_embeddings, embedding_dim, _weight=weight)
    return kind(num_embeddings, embedding_dim)


class MappedTableEmbedding(nn.Embedding):
    """An embedding whose table may stay as the checkpoint stored it, memory-mapped, with each
    looked-up row cast to the model's precision.

    A bf16 LLM would otherwise hold a converted copy of Qwen's whole 151,936-row text table
    (272 MB) for the few thousand rows a worker ever reads. Left in the mapped fp32 file, only
    the pages of rows read become resident, and as the file's shared page cache. A row cast
    after the lookup has the very values the converted table would give (rounding is per
    element). Until `keep_mapped_table` is called it is exactly `nn.Embedding`.
    """

    output_dtype: torch.dtype | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = super().forward(ids)
        return rows if self.output_dtype is None else rows.to(self.output_dtype)

    def take_table(self) -> torch.Tensor:
        """Detach the table (left empty here) so that a module-wide `.to(dtype)` skips it."""
        table = self.weight.data
        self.weight = nn.Parameter(table.new_empty(0), requires_grad=False)
        return table

    def keep_mapped_table(self, table: torch.Tensor, output_dtype: torch.dtype) -> None:
        """Use `table` (from `take_table`) as it is; rows come out in `output_dtype`."""
        self.weight = nn.Parameter(table, requires_grad=False)
        self.output_dtype = None if table.dtype == output_dtype else output_dtype


def mapped_table_embedding(num_embeddings: int, embedding_dim: int) -> MappedTableEmbedding:
    """`MappedTableEmbedding(num_embeddings, embedding_dim)`, without the init on meta."""
    return _built(MappedTableEmbedding, num_embeddings, embedding_dim)
