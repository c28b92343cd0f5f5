"""Left-padded batches as a tokenizer with ``padding_side='left'`` returns them, and each row's new tokens back
out of a padded ``generate`` output: what the batch benchmark (``tools/batch_bench.py``) and the device check's
batch section hand HF's padded ``generate`` and ``autolade.generate`` alike."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def padded(rows: Sequence[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [B, T] and attention mask [B, T] from prompts [1, T_b]."""
    t = max(r.shape[1] for r in rows)
    ids = torch.full((len(rows), t), pad, dtype=torch.long, device=rows[0].device)
    mask = torch.zeros((len(rows), t), dtype=torch.long, device=rows[0].device)
    for b, r in enumerate(rows):
        ids[b, t - r.shape[1] :], mask[b, t - r.shape[1] :] = r[0], 1
    return ids, mask


def new_rows(seq: torch.Tensor, width: int, eos: Iterable[int]) -> list[list[int]]:
    """Each row's new tokens from a padded [B, T + n] output (``width`` = T): up to its first eos (kept);
    what follows (the padding a finished row gets) is dropped."""
    stop = set(eos)
    out = []
    for row in seq[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
        out.append(row[:end])
    return out
