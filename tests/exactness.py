"""Token-for-token comparison against ``model.generate(do_sample=False)``, with the top-2 gap rule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

NOISE_GAP = 1e-4  # fp32: a packed forward differs from a one-token forward by ~1e-5


@dataclass(frozen=True)
class Comparison:
    exact: bool  # identical to the reference for the compared length
    diverged_at: int | None  # first differing index, if any
    gap: float | None  # the reference's top-2 logit gap there

    def acceptable(self, noise: float = NOISE_GAP) -> bool:
        return self.exact or (self.gap is not None and self.gap < noise)


def reference(model, ids: torch.Tensor, n: int, eos_ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """HF greedy tokens and their logits [n, V] (unprocessed)."""
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=eos_ids or None,
        pad_token_id=eos_ids[0] if eos_ids else 0,
    )
    toks = out.sequences[0, ids.shape[1] :].tolist()
    return toks, torch.stack([lg[0] for lg in out.logits]).float()


def compare(ours: list[int], ref: list[int], ref_logits: torch.Tensor) -> Comparison:
    n = min(len(ours), len(ref))
    for i in range(n):
        if ours[i] != ref[i]:
            top2 = ref_logits[i].topk(2).values
            return Comparison(False, i, float(top2[0] - top2[1]))
    if len(ours) != len(ref):
        return Comparison(False, n, None)
    return Comparison(True, None, None)
