"""Lower-precision loading: same values as `.to(dtype)`, and the fp32 pages do not stay resident."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest
import torch

from workers.model import checkpoint_dtype, cpu_linear
from workers.model.checkpoint import read_state_dict
from workers.model.directory import ModelDirectory
from workers.model.loader import load_model

LINUX = sys.platform.startswith("linux")


def _write(path: Path, state: dict[str, torch.Tensor]) -> Path:
    torch.save(state, path)
    return path


def test_converted_values_are_those_of_to_dtype(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    rows = 3 * checkpoint_dtype.CHUNK_ELEMENTS // 1000 + 7  # past three chunks
    state = {
        "big": torch.randn(rows, 1000, generator=generator),
        "strided": torch.randn(64, 48, generator=generator).t(),  # saved non-contiguous
        "ids": torch.arange(10),
        "kept": torch.randn(5, generator=generator),
        "empty": torch.zeros(0, 4),
    }
    path = _write(tmp_path / "w.pt", state)
    for mmap in (True, False):
        read = read_state_dict(path, mmap=mmap, dtype=torch.bfloat16, keep=("kept",))
        assert set(read) == set(state)
        for name in ("big", "strided", "empty"):
            assert read[name].dtype is torch.bfloat16
            assert torch.equal(read[name], state[name].to(torch.bfloat16)), name
        assert read["ids"].dtype is torch.int64 and torch.equal(read["ids"], state["ids"])
        assert read["kept"].dtype is torch.float32 and torch.equal(read["kept"], state["kept"])
    # the file's pages were only dropped from this process, never changed
    again = read_state_dict(path)
    assert all(torch.equal(again[name], state[name]) for name in state)


@pytest.mark.skipif(not LINUX, reason="page release (madvise) is implemented for Linux only")
def test_fp32_pages_are_released_while_converting(tmp_path: Path) -> None:
    """Converting 128 MB of fp32 adds about its 64 MB of bf16 to RSS, not 64 + 128."""
    tensors = {f"w{i}": torch.full((8 * 1024 * 1024,), float(i)) for i in range(4)}
    fp32_bytes = sum(t.nbytes for t in tensors.values())
    path = _write(tmp_path / "big.pt", tensors)
    del tensors
    process = psutil.Process()
    before = process.memory_info().rss
    read = read_state_dict(path, dtype=torch.bfloat16)
    grown = process.memory_info().rss - before
    assert all(t.dtype is torch.bfloat16 for t in read.values())
    assert grown < 0.75 * fp32_bytes, f"RSS grew {grown / 1e6:.0f} MB for {fp32_bytes / 1e6:.0f}"


def test_bf16_model_keeps_the_head_tied_and_f0_in_fp32(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir, dtype=torch.bfloat16)
    backbone = loaded.llm.llm.model
    assert backbone.lm_head.weight is backbone.model.embed_tokens.weight
    table = backbone.model.embed_tokens.weight
    assert {p.dtype for p in loaded.llm.parameters() if p is not table} == {torch.bfloat16}
    assert loaded.flow is not None and loaded.hift is not None
    assert {p.dtype for p in loaded.flow.parameters()} == {torch.bfloat16}
    assert loaded.hift.m_source.l_linear.weight.dtype is torch.float32
    assert loaded.hift.f0_predictor.classifier.weight.dtype is torch.float32
    fp32 = read_state_dict(ModelDirectory(tiny_model_dir).checkpoint("llm"))
    key = "llm.model.model.layers.0.mlp.up_proj.weight"
    mlp = backbone.model.layers[0].mlp
    if cpu_linear.bf16_packing_available():  # gate/up fused: up is the second half
        assert mlp.gate_up_proj is not None
        # packed, or plain under the "gemv" kernel (AMX hosts)
        assert mlp.gate_up_proj.weight.is_mkldnn is (mlp.gate_up_proj.kernel == "onednn")
        up = mlp.gate_up_proj.weight.to_dense().chunk(2)[1]
    else:
        up = mlp.up_proj.weight
    assert torch.equal(up, fp32[key].to(torch.bfloat16))


def test_bf16_model_reads_its_text_table_from_the_mapped_file(tiny_model_dir: Path) -> None:
    """The text table stays fp32 in the checkpoint's mapping (its pages resident only where
    rows are read), and the rows it gives are those of the table converted to bf16."""
    loaded = load_model(tiny_model_dir, dtype=torch.bfloat16)
    embed = loaded.llm.backbone.embed_tokens
    fp32 = read_state_dict(ModelDirectory(tiny_model_dir).checkpoint("llm"))
    stored = fp32["llm.model.model.embed_tokens.weight"]
    assert embed.weight.dtype is torch.float32 and torch.equal(embed.weight, stored)
    ids = torch.tensor([0, 5, 3, stored.shape[0] - 1])
    rows = embed(ids)
    assert rows.dtype is torch.bfloat16
    assert torch.equal(rows, stored.to(torch.bfloat16)[ids])
    # fp32 models and the prefix the LLM builds are unchanged by it
    prefix = loaded.llm.prefix_embeddings(ids[:2], ids[2:], torch.tensor([1, 2]))
    assert prefix.dtype is torch.bfloat16
    plain = load_model(tiny_model_dir).llm.backbone.embed_tokens
    assert plain.output_dtype is None and plain(ids).dtype is torch.float32
