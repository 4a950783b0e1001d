"""Greedy generation with a KV cache, one token a step, through ``gqa_flash.flash_decode``.

A language model that writes ``n`` tokens could run itself ``n`` times on the
whole sequence so far. Each run recomputes the keys and values of every earlier
token, though none of them has changed. :func:`generate_without_cache` does
exactly that, with PyTorch's SDPA: it is the reference that every generator
here must match, token for token.

A serving engine keeps each layer's K and V instead, in a *KV cache*
(:class:`KVCache`), and works in two phases:

* **prefill**: the prompt in one pass, causal attention over it (SDPA here),
  every layer writing the prompt's K and V into its cache;
* **decode**: one token a step. Each layer computes q, k and v of the new token
  only, appends k and v to its cache, and attends from q over the cache.
  ``cache_seqlens`` grows by one, in place.

:class:`CachedGenerator` does both. Its decode step attends in one of two ways:

``"flash_decode"``  ``gqa_flash.flash_decode(q, k_cache, v_cache, cache_seqlens,
                    k_new=k, v_new=v, max_seqlen=capacity)``: the append and the
                    attention in one call, over a contiguous cache ``[B, Hkv,
                    capacity, D]`` or a paged pool (``page_size``; the pages
                    shuffled in the pool, as an allocator leaves them after a while).
``"sdpa"``          an indexed write of k and v, then
                    ``F.scaled_dot_product_attention`` over the *whole capacity*
                    with a boolean mask of the valid positions (contiguous cache
                    only). The query heads of each GQA group are the rows of one
                    query, as in decode.py's Part 1. Every shape stays fixed from
                    step to step, so this step can be captured too; the price is
                    reading the unused end of the cache (a few positions when the
                    capacity is the prompt plus the new tokens).

Neither step reads anything back to the host: the new token's position comes
from ``cache_seqlens`` on the device, and the next token is an argmax on the
device, written in place. So on a GPU the whole step (every layer's kernels) can
be recorded once in a CUDA graph (``cuda_graph=True``) and replayed for each
token: one launch from the host per token instead of a few dozen. For a step
that reads a small cache, the host's launches cost more than the GPU's work,
and the graph removes them.

The model is :class:`gqa_flash.course.lab.tiny_model.TinyGQATransformer`, any size
and dtype; the generators only read its weights. Notebook 07 trains one for a
few seconds to sort digits (``tiny_model.trained_model``), so that its tokens
mean something; the course's tests and bench/generate_tokens.py use
seeded, untrained ones (their logits still differ from token to token, so a
wrong attention shows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTENTIONS = ("flash_decode", "sdpa")


def causal_sdpa(q, k, v):
    """Causal attention of q [B, Hq, N, D] over k, v [B, Hkv, N, D], K and V repeated to Hq heads (so that
    every SDPA backend accepts it, fp32 included)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def masked_sdpa(q, k_cache, v_cache, cache_seqlens):
    """One new token's attention q [B, Hq, 1, D] over a contiguous cache [B, Hkv, capacity, D], its first
    ``cache_seqlens[b]`` positions valid: shapes that do not depend on the lengths."""
    b, hq, n, d = q.shape
    hkv, capacity = k_cache.shape[1], k_cache.shape[2]
    valid = torch.arange(capacity, device=q.device) < cache_seqlens[:, None]  # [B, capacity]
    rows = q.reshape(b, hkv, hq // hkv * n, d)  # query head h is row h % group of KV head h // group
    out = F.scaled_dot_product_attention(rows, k_cache, v_cache, attn_mask=valid[:, None, None, :])
    return out.reshape(b, hq, n, d)


def _run(model, x, attend):
    """The model's blocks on embeddings x [B, N, dim], block i's attention being ``attend(i, q, k, v)``;
    returns the logits [B, N, vocab]."""
    for i, block in enumerate(model.blocks):
        q, k, v = block.project(x)
        x = block.finish(x, attend(i, q, k, v))
    return model.head(model.norm(x))


def _embed(model, tokens):
    return model.embed(tokens) + model.pos[: tokens.shape[1]]


@torch.no_grad()
def generate_without_cache(model, prompt, new_tokens):
    """Greedy: ``new_tokens`` times, run the model on the whole sequence and append the argmax of the last
    position. Returns the new tokens [B, new_tokens] and their logits [B, new_tokens, vocab]."""
    tokens, logits = prompt, []
    for _ in range(new_tokens):
        last = _run(model, _embed(model, tokens), lambda i, q, k, v: causal_sdpa(q, k, v))[:, -1]
        logits.append(last)
        tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prompt.shape[1]:], torch.stack(logits, dim=1)


@torch.no_grad()
def keys_and_values(model, tokens):
    """Every layer's K and V of ``tokens`` [B, N], as the model without a cache computes them:
    a list of (k, v), each [B, Hkv, N, D]."""
    kv = []

    def record(i, q, k, v):
        kv.append((k, v))
        return causal_sdpa(q, k, v)

    _run(model, _embed(model, tokens), record)
    return kv


class KVCache:
    """Every layer's K and V for ``batch`` sequences, and their lengths ``seqlens`` [B] int32.

    Contiguous (``page_size`` None): ``k[layer]`` is ``[B, Hkv, capacity, D]``. Paged: ``k[layer]`` is a pool
    ``[B * pages, page_size, Hkv, D]`` and ``block_table`` [B, pages] int32 lists each sequence's pages, a
    random permutation of the pool (``seed``). Every position starts as ``fill``.
    """

    def __init__(self, layers, batch, kv_heads, head_dim, capacity, page_size=None, dtype=torch.float32,
                 device="cpu", fill=0.0, seed=0):
        self.page_size, self.block_table = page_size, None
        if page_size is None:
            self.capacity, shape = capacity, (batch, kv_heads, capacity, head_dim)
        else:
            pages = -(-capacity // page_size)
            self.capacity, shape = pages * page_size, (batch * pages, page_size, kv_heads, head_dim)
            order = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(seed))
            self.block_table = order.view(batch, pages).to(device=device, dtype=torch.int32)
        self.k = [torch.full(shape, fill, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.full(shape, fill, dtype=dtype, device=device) for _ in range(layers)]
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)

    def _at(self, positions):
        """The index of ``positions`` [B, N] (int64) in a layer's tensor: it selects [B, N, Hkv, D]."""
        if self.block_table is None:
            return torch.arange(positions.shape[0], device=positions.device)[:, None], slice(None), positions
        pages = self.block_table.gather(1, positions // self.page_size).long()
        return pages, positions % self.page_size

    def write(self, layer, k, v, positions):
        """Write k, v [B, Hkv, N, D] at ``positions`` [B, N] of layer ``layer`` (no host read: capturable)."""
        at = self._at(positions)
        self.k[layer][at] = k.transpose(1, 2)
        self.v[layer][at] = v.transpose(1, 2)

    def read(self, layer, length):
        """Layer ``layer``'s first ``length`` positions of every sequence: k, v [B, Hkv, length, D]."""
        positions = torch.arange(length, device=self.seqlens.device).expand(self.seqlens.shape[0], length)
        at = self._at(positions)
        return self.k[layer][at].transpose(1, 2), self.v[layer][at].transpose(1, 2)


class CachedGenerator:
    """Greedy generation with a KV cache for ``batch`` sequences of up to ``capacity`` positions.

    ``attention`` is one of :data:`ATTENTIONS`; ``page_size`` makes the cache paged (flash_decode only);
    ``cuda_graph`` records the decode step once, at the first :meth:`decode` after a :meth:`prefill`, and
    replays it for every token (a CUDA GPU only). ``fill`` is what the cache holds before it is written (NaN
    shows that no step reads past ``cache_seqlens``; SDPA's mask would still multiply it by 0, so NaN is for
    flash_decode only). The state lives in fixed tensors, changed in place: ``cache`` (with
    ``cache.seqlens``), ``token`` [B] (the last token written) and ``logits`` [B, vocab] (its logits).
    """

    def __init__(self, model, batch, capacity, attention="flash_decode", page_size=None, cuda_graph=False,
                 fill=0.0, seed=0):
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}; got {attention!r}")
        if attention == "sdpa" and page_size is not None:
            raise ValueError("the SDPA step reads a contiguous cache: page_size must be None")
        weight = model.head.weight
        if cuda_graph and weight.device.type != "cuda":
            raise ValueError(f"cuda_graph needs the model on a CUDA GPU; it is on {weight.device}")
        cfg = model.blocks[0].cfg
        self.model, self.attention, self.cuda_graph, self.graph = model, attention, cuda_graph, None
        self.cache = KVCache(cfg.layers, batch, cfg.kv_heads, cfg.dim // cfg.q_heads, capacity, page_size,
                             weight.dtype, weight.device, fill, seed)
        self.token = torch.zeros(batch, dtype=torch.long, device=weight.device)
        self.logits = torch.zeros(batch, weight.shape[0], dtype=weight.dtype, device=weight.device)

    @torch.no_grad()
    def prefill(self, prompt):
        """Run the prompt [B, P] causally, write every layer's K and V at positions 0..P-1, set the lengths to
        P, and return the first new token [B] (the argmax of the last position's logits)."""
        n = prompt.shape[1]
        positions = torch.arange(n, device=prompt.device).expand(prompt.shape[0], n)

        def attend(i, q, k, v):
            self.cache.write(i, k, v, positions)
            return causal_sdpa(q, k, v)

        logits = _run(self.model, _embed(self.model, prompt), attend)[:, -1]
        self.cache.seqlens.fill_(n)
        self.logits.copy_(logits)
        self.token.copy_(logits.argmax(-1))
        return self.token

    def _attend_new(self, i, q, k, v):
        """Layer i's attention for the new token, whose K and V go to position cache_seqlens - 1."""
        import gqa_flash

        c = self.cache
        if self.attention == "flash_decode":
            return gqa_flash.flash_decode(q, c.k[i], c.v[i], c.seqlens, block_table=c.block_table,
                                          k_new=k, v_new=v, max_seqlen=c.capacity)
        c.write(i, k, v, (c.seqlens.long() - 1)[:, None])
        return masked_sdpa(q, c.k[i], c.v[i], c.seqlens)

    def _step(self):
        """One token: feed ``token`` at position ``cache_seqlens``, and overwrite ``token`` with the next."""
        self.cache.seqlens.add_(1)
        where = self.cache.seqlens.long() - 1  # [B], on the device: no host read
        x = (self.model.embed(self.token) + self.model.pos[where])[:, None]
        logits = _run(self.model, x, self._attend_new)[:, -1]
        self.logits.copy_(logits)
        self.token.copy_(logits.argmax(-1))

    def _capture(self):
        """Record :meth:`_step` in a CUDA graph. One step runs first, outside the graph, on a side stream
        (Triton compiles its kernels, the allocator warms up: neither may happen during a capture); then the
        lengths and the token are put back, so the graph's first replay redoes that step."""
        token = self.token.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.cache.seqlens.sub_(1)
        self.token.copy_(token)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()

    @torch.no_grad()
    def decode(self, steps, logits=None):
        """``steps`` more tokens after the last one: [B, steps]. With a list as ``logits``, each step's logits
        [B, vocab] are appended to it."""
        if self.cuda_graph and self.graph is None:
            self._capture()
        out = torch.empty(self.token.shape[0], steps, dtype=torch.long, device=self.token.device)
        for i in range(steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()
            out[:, i] = self.token
            if logits is not None:
                logits.append(self.logits.clone())
        return out

    def rewind(self, length, token):
        """Forget every position from ``length`` on and make ``token`` [B] the last token written (to time
        the same steps again after one prefill)."""
        self.cache.seqlens.fill_(length)
        self.token.copy_(token)

    def generate(self, prompt, new_tokens):
        """Prefill ``prompt`` [B, P], then decode: the new tokens [B, new_tokens] and their logits
        [B, new_tokens, vocab]."""
        cfg = self.model.blocks[0].cfg
        end = prompt.shape[1] + new_tokens - 1  # the last token is written, never fed back
        if end > min(self.cache.capacity, cfg.max_len):
            raise ValueError(f"a prompt of {prompt.shape[1]} and {new_tokens} new tokens need {end} positions; "
                             f"the cache holds {self.cache.capacity} and the model's max_len is {cfg.max_len}")
        logits = []
        first = self.prefill(prompt).clone()
        logits.append(self.logits.clone())
        rest = self.decode(new_tokens - 1, logits)
        return torch.cat([first[:, None], rest], dim=1), torch.stack(logits, dim=1)


LOOP_NAMES = {("sdpa", "contiguous", "eager"): "SDPA eager", ("sdpa", "contiguous", "cuda_graph"): "SDPA graph",
              ("flash_decode", "contiguous", "eager"): "flash_decode eager",
              ("flash_decode", "contiguous", "cuda_graph"): "flash_decode graph",
              ("flash_decode", "paged", "cuda_graph"): "paged graph"}


def tokens_table(rows) -> str:
    """bench/generate_tokens.py's rows (dicts of strings) as text: tokens/s of each loop for each batch and
    prompt, and whether every loop's fp32 tokens equal the generation without a cache."""
    shapes = sorted({(int(r["batch"]), int(r["prompt"])) for r in rows})
    by = {(int(r["batch"]), int(r["prompt"]), r["provider"], r["cache"], r["launch"]): r for r in rows}
    lines = [f"{'batch':>5} {'prompt':>6} " + " ".join(f"{name:>18}" for name in LOOP_NAMES.values())
             + "  fp32 tokens = no cache"]
    for batch, prompt in shapes:
        cells, equal = [], []
        for loop in LOOP_NAMES:
            r = by.get((batch, prompt, *loop))
            ok = r is not None and r["status"] == "ok"
            cells.append(f"{float(r['tokens_per_s']):18.0f}" if ok else f"{'-':>18}")
            if r is not None:
                equal.append(r["tokens_equal_no_cache_fp32"] == "True")
        same = "yes" if equal and all(equal) else ("no" if equal else "-")
        lines.append(f"{batch:5d} {prompt:6d} " + " ".join(cells) + f"  {same}")
    return "\n".join(lines)
