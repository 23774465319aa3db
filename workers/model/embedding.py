"""`nn.Embedding` that skips its random init when built on the meta device.

Every model here is built on meta and then handed the checkpoint's tensors. On meta,
`nn.Embedding`'s `normal_` init goes through PyTorch's reference ops, whose first call imports
`torch._dynamo`: seconds at every worker start (as long as importing torch itself) for values
the checkpoint replaces. Built anywhere else it is exactly `nn.Embedding`, random init included.
"""

from __future__ import annotations

import torch
from torch import nn


def Embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """`nn.Embedding(num_embeddings, embedding_dim)`, without the init on meta."""
    if torch.get_default_device().type == "meta":
        weight = torch.empty(num_embeddings, embedding_dim)
        return nn.Embedding(num_embeddings, embedding_dim, _weight=weight)
    return nn.Embedding(num_embeddings, embedding_dim)
