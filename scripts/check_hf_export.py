#!/usr/bin/env python3
"""Loads a `tpc export --hf` directory in Hugging Face transformers and compares its logits with tpc's.

usage: check_hf_export.py HF_DIR LOGITS.safetensors
LOGITS.safetensors comes from `tpc sample --load CKPT --prompt ... --dump-logits FILE` (tensors 'logits'
[T, vocab] and 'tokens' [T]). Prints the worst absolute and relative differences; exits 1 above 1e-4 relative.
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel


def main():
    hf_dir, logits_path = sys.argv[1], sys.argv[2]
    ref = load_file(logits_path)
    tokens = ref["tokens"].long().unsqueeze(0)
    model = GPT2LMHeadModel.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(tokens).logits[0].float()
    tpc = ref["logits"].float()
    diff = (logits - tpc).abs().max().item()
    rel = diff / tpc.abs().max().item()
    same_argmax = bool((logits.argmax(-1) == tpc.argmax(-1)).all())
    print(f"hf-export: {tokens.shape[1]} tokens, vocab {tpc.shape[1]}: max |hf - tpc| = {diff:.3e} "
          f"(relative {rel:.3e}), same argmax at every position: {same_argmax}")
    sys.exit(0 if rel <= 1e-4 and same_argmax else 1)


if __name__ == "__main__":
    main()
