#!/usr/bin/env python3
"""A checkpoint written by PyTorch, for tests/tests/torch_checkpoint.rs.

Builds a small GPT out of PyTorch's own modules — nn.Embedding for tokens
and positions, nn.TransformerEncoderLayer(norm_first=True, activation="gelu",
batch_first=True) blocks run causally, a final nn.LayerNorm and an output
nn.Linear tied to the token embedding — whose state_dict keys are the ones
`kiln::gpt::Gpt` uses. For each of bias=False (nanoGPT's recipe, kiln's
default) and bias=True it writes

    torch_gpt_{nobias,bias}.safetensors           the state_dict (every key,
                                                  "head.weight" included)
    torch_gpt_{nobias,bias}_expected.safetensors  tokens, targets, PyTorch's
                                                  logits, loss and gradients

with safetensors.torch.save_file. The test loads the first into kiln and
compares kiln's logits, loss and gradients with the second; it needs no
Python. Regenerate (from the repository root) with

    python tests/reference/make_torch_gpt.py

Needs torch >= 2.1 (bias=False in TransformerEncoderLayer) and safetensors.
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 11, 8, 2, 2, 16
BATCH, TOKENS = 3, 7  # fewer tokens than the context: positions 0..6


class TorchGpt(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, WIDTH)
        self.pos_emb = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(
                    WIDTH, HEADS, 4 * WIDTH, dropout=0.0, activation="gelu",
                    batch_first=True, norm_first=True, bias=bias,
                )
                for _ in range(LAYERS)
            ]
        )
        self.ln_f = nn.LayerNorm(WIDTH, bias=bias)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tok_emb.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.ln_f(x))


def write(bias, out_dir):
    torch.manual_seed(11 if bias else 10)
    model = TorchGpt(bias)
    # Values away from the defaults (layer norms at 1/0, biases at 0), so
    # that a parameter loaded into the wrong place changes the outputs.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 and p.shape[0] == WIDTH else 0.0))
    model.train()  # dropout is 0; train mode keeps PyTorch off its fused fast path
    idx = torch.randint(0, VOCAB, (BATCH, TOKENS))
    targets = torch.randint(0, VOCAB, (BATCH, TOKENS))
    logits = model(idx)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    name = "bias" if bias else "nobias"
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out_dir, f"torch_gpt_{name}.safetensors"), metadata={"format": "pt"})
    expected = {
        "tokens": idx.to(torch.int32),
        "targets": targets.to(torch.int32),
        "logits": logits.detach().contiguous(),
        "loss": loss.detach().reshape(1),
    }
    for k, p in model.named_parameters():  # the tied table once, as tok_emb.weight
        expected["grad." + k] = p.grad.detach().clone().contiguous()
    save_file(expected, os.path.join(out_dir, f"torch_gpt_{name}_expected.safetensors"),
              metadata={"torch": torch.__version__})
    print(f"{name}: {len(state)} tensors, loss {loss.item():.6f}")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for bias in (False, True):
        write(bias, here)
