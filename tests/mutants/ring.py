"""Classic bugs of ring.py: see catalog.py for what a mutant is.

Each shows in ordinary use (every causal ring of more than one rank), so each fails the ring on 2 and 3
processes (6 of the 10 points) and its part's own test: the floor is half the module.
"""

from mutants.catalog import _m

MUTANTS = [
    _m("ring_turns_the_wrong_way", "ring.py", "the source rank of each step counted the wrong way round the ring",
       ("return (rank - step) % world_size", "return (rank + step) % world_size"), loses=5),
    _m("ring_merge_without_lse", "ring.py", "merges two blocks' outputs by averaging them, ignoring the LSE",
       ("    o = torch.nan_to_num(o) * w[..., None] + torch.nan_to_num(o_blk) * w_blk[..., None]\n",
        "    o = torch.where(torch.isneginf(lse)[..., None], o_blk, (o + o_blk) / 2)\n"), loses=5),
    _m("ring_diagonal_unmasked", "ring.py", "the diagonal chunk pair attended without the causal mask",
       ("                pairs.append((i, j, True))", "                pairs.append((i, j, False))"), loses=5),
    _m("ring_zigzag_halves_swapped", "ring.py", "the visiting block's two zigzag chunks taken in the wrong order",
       ("    theirs = context_parallel.chunk_ids(source, world_size, layout)\n",
        "    theirs = context_parallel.chunk_ids(source, world_size, layout)[::-1]\n"), loses=5),
]
