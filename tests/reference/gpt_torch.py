"""The char-level GPT of `kiln train --model gpt`, in PyTorch, on the same data.

A reference for issue 11's acceptance figure: the same model (token and
position embeddings, pre-norm causal blocks with exact GELU, a final layer
norm, an output layer tied to the token embedding; no biases in the blocks
and norms unless --bias, as nanoGPT's train.py), the same initialisation
distributions, AdamW with the same groups and schedule (nanoGPT's warm-up
and cosine), the same global gradient clipping, and — through a Python copy
of kiln's SplitMix64 — the very same training batches and validation
windows as kiln's native/src/gpt.rs and gpt_cli.rs. Only the initial
weights differ (torch's generator, same distributions).

    python gpt_torch.py --data ../shared/data/shakespeare/shakespeare_plays.txt.gz \
        --steps 2000 --seed 1337 --threads 2

Timing only (no evaluation), e.g. interleaved with kiln runs:

    python gpt_torch.py --data FILE --steps 100 --time-only

Evaluate a checkpoint written by `kiln train --model gpt` (no training):

    python gpt_torch.py --data FILE --evaluate kiln-gpt.safetensors
"""

import argparse
import gzip
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


class SplitMix64:
    """kiln::rng::SplitMix64, bit for bit."""

    def __init__(self, seed):
        self.state = seed & MASK

    @staticmethod
    def for_stream(seed, stream):
        return SplitMix64(mix64(seed ^ mix64((stream + GOLDEN_GAMMA) & MASK)))

    def next_u64(self):
        self.state = (self.state + GOLDEN_GAMMA) & MASK
        return mix64(self.state)


def load_text(path):
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


def random_batch(ids, batch, context, rng):
    """kiln's gpt::random_batch: `batch` windows, starts from `rng`."""
    span = len(ids) - context - 1
    starts = [rng.next_u64() % span for _ in range(batch)]
    x = torch.stack([ids[s : s + context] for s in starts])
    y = torch.stack([ids[s + 1 : s + context + 1] for s in starts])
    return x, y


class Block(nn.Module):
    """Pre-norm causal block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, width, heads, layers, bias):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, bias=bias)
        self.in_proj = nn.Linear(width, 3 * width, bias=bias)
        self.out_proj = nn.Linear(width, width, bias=bias)
        self.norm2 = nn.LayerNorm(width, bias=bias)
        self.linear1 = nn.Linear(width, 4 * width, bias=bias)
        self.linear2 = nn.Linear(4 * width, width, bias=bias)
        proj_std = 0.02 / math.sqrt(2 * layers)
        for lin, std in [(self.in_proj, 0.02), (self.out_proj, proj_std), (self.linear1, 0.02), (self.linear2, proj_std)]:
            nn.init.normal_(lin.weight, 0.0, std)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.in_proj(self.norm1(x)).split(c, dim=2)
        split = lambda z: z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.out_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, width, bias=False):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(context, width)
        nn.init.normal_(self.tok_emb.weight, 0.0, 0.02)
        nn.init.normal_(self.pos_emb.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList([Block(width, heads, layers, bias) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width, bias=bias)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        # The output layer is the token embedding (tied, no bias).
        return F.linear(self.ln_f(x), self.tok_emb.weight)


def lm_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def lr_factor(step, warmup, total, min_factor):
    """kiln's gpt::optimizer_for (nanoGPT's get_lr): (step+1)/(warmup+1)
    during the warm-up, then a cosine from 1 to min_factor."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    s, n = step - warmup, total - warmup
    if s >= n:
        return min_factor
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * s / n))


@torch.no_grad()
def estimate_loss(model, ids, batch, context, batches, seed):
    """kiln's gpt::estimate_loss: mean loss over `batches` windows drawn in
    sequence from SplitMix64(seed)."""
    model.eval()
    rng = SplitMix64(seed)
    total = 0.0
    for _ in range(batches):
        x, y = random_batch(ids, batch, context, rng)
        total += lm_loss(model, x, y).item()
    model.train()
    return total / batches


@torch.no_grad()
def split_loss(model, ids, batch, context):
    """kiln's gpt::split_loss: the mean loss over every non-overlapping
    window of the split, `batch` windows at a time."""
    model.eval()
    windows = (len(ids) - 1) // context
    total = 0.0
    for first in range(0, windows, batch):
        rows = range(first, min(windows, first + batch))
        x = torch.stack([ids[w * context : (w + 1) * context] for w in rows])
        y = torch.stack([ids[w * context + 1 : (w + 1) * context + 1] for w in rows])
        total += lm_loss(model, x, y).item() * len(rows)
    model.train()
    return total / windows, windows


def kiln_state_dict(path):
    """A `kiln train --model gpt` checkpoint as this module's state dict."""
    from safetensors.torch import load_file

    renames = [("self_attn.in_proj_weight", "in_proj.weight"), ("self_attn.in_proj_bias", "in_proj.bias"),
               ("self_attn.out_proj.", "out_proj.")]
    state = {}
    for key, value in load_file(path).items():
        for old, new in renames:
            key = key.replace(old, new)
        state[key] = value
    return state


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-interval", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--final-eval-batches", type=int, default=0,
                    help="final validation over N random batches instead of the whole split (0); training loss over N (200 if 0)")
    ap.add_argument("--bias", action="store_true", help="biases in the blocks' linear layers and layer norms")
    ap.add_argument("--evaluate", metavar="CKPT", help="only evaluate this kiln checkpoint")
    ap.add_argument("--init-from", metavar="CKPT",
                    help="start from this kiln checkpoint's parameters (e.g. kiln's initial ones: kiln train --steps 0)")
    ap.add_argument("--time-only", action="store_true", help="train --steps steps, print ms/step, no evaluation")
    ap.add_argument("--profile", action="store_true",
                    help="with --time-only: torch.profiler's table of the ops of the steps after the first 20 (self CPU time), "
                         "to set beside KILN_OP_PROFILE=1 kiln train's")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    text = load_text(args.data)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = len(ids) * 9 // 10
    train, val = ids[:split], ids[split:]
    if args.evaluate or args.init_from:
        state = kiln_state_dict(args.evaluate or args.init_from)
        args.bias = any(k.endswith("bias") for k in state)
    model = Gpt(len(chars), args.context, args.layers, args.heads, args.width, args.bias)
    if args.evaluate or args.init_from:
        model.load_state_dict(state, strict=True)
    if args.evaluate:
        vl, windows = split_loss(model, val, args.batch, args.context)
        sampled = estimate_loss(model, val, args.batch, args.context, 200, 7)
        print(f"{args.evaluate}: validation loss {vl:.4f} (whole split, {windows} windows), "
              f"{sampled:.4f} (200 random batches)")
        return
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.99),
        eps=1e-8,
    )
    warmup, min_factor = 100, 0.1
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads: {args.layers} layers, {args.heads} heads, "
        f"width {args.width}, context {args.context}, bias {args.bias}, {sum(p.numel() for p in model.parameters())} parameters; "
        f"{len(text)} chars, vocabulary {len(chars)}, batch {args.batch}, {args.steps} steps",
        flush=True,
    )
    started = time.perf_counter()
    profiler = None
    for step in range(args.steps):
        if args.profile and step == min(20, args.steps - 1):
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            profiler.__enter__()
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_factor(step, warmup, args.steps, min_factor)
        x, y = random_batch(train, args.batch, args.context, SplitMix64.for_stream(args.seed, step))
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if not args.time_only and args.eval_interval > 0 and done % args.eval_interval == 0 and done < args.steps:
            v = estimate_loss(model, val, args.batch, args.context, args.eval_batches, 7)
            print(f"step {done:>5}: train loss {loss.item():.4f}, validation loss {v:.4f}", flush=True)
    seconds = time.perf_counter() - started
    if profiler is not None:
        profiler.__exit__(None, None, None)
        table = profiler.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40)
        print(table)
    print(f"{args.steps} steps in {seconds:.1f} s ({seconds * 1e3 / args.steps:.1f} ms/step, {args.threads} threads)")
    if args.time_only:
        return
    train_batches = args.final_eval_batches or 200
    tl = estimate_loss(model, train, args.batch, args.context, train_batches, 11)
    if args.final_eval_batches == 0:
        vl, windows = split_loss(model, val, args.batch, args.context)
        over = f"validation: the whole split, {windows} windows of {args.context}"
    else:
        vl = estimate_loss(model, val, args.batch, args.context, args.final_eval_batches, 7)
        over = f"validation: {args.final_eval_batches} random batches"
    print(
        f"after {args.steps} steps: train loss {tl:.4f}, "
        f"validation loss {vl:.4f} nats/char ({over}; train: {train_batches} random batches)"
    )


if __name__ == "__main__":
    main()
