# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
# (Written from the course's completed traffic.py by its release tool.)
#
#   specification  its notebook's measured L2 model
#   notebook       notebooks/05_performance.ipynb, checked by checks.check_traffic_model()
#   graded by      nothing: a practice file
"""How many bytes reach DRAM: a small model of L2, for two launch orders (notebook 05, practice).

A practice exercise: notebook 05 checks it, the grader never reads it.

The fast forward kernel launches one program per (query head, query block).
Each program reads its Q tile once, then the K and V tiles of its causal
prefix, from key 0 up to its own diagonal. Programs of the same KV head read
the same K and V tiles, so a tile that one program brought in may still be in
the GPU's L2 cache when another needs it; only a miss costs DRAM traffic.
Which programs run at the same time, and so which tiles compete for L2, is
decided by the order in which the programs are launched:

``group_major``  for each query block, heaviest first; for each KV head; each
                 of its query heads. The programs running at once cover every
                 KV head.
``head_major``   for each query head; each of its query blocks, heaviest
                 first. The programs running at once share one or two KV
                 heads. (The graded kernel walks heads in this order.)

"Heaviest" is the last query block: under the causal mask it sees the most
keys. With ``block_m`` query rows a block and ``block_n`` keys a tile, query
block ``b`` reads the key tiles ``0 .. (b + 1) * block_m / block_n - 1``.

The model (what :func:`dram_bytes` computes):

* programs run in *waves* of ``concurrent`` programs, in launch order: the
  first wave is the first ``concurrent`` programs, and so on (the last wave
  may be smaller); a wave ends before the next begins;
* within a wave the programs move in step: at step ``j`` every program of the
  wave that has a ``j``-th key tile reads it, in launch order, then step
  ``j + 1`` begins;
* L2 is a least-recently-used (LRU) cache of ``cache_bytes`` bytes whose
  entries are (KV head, key tile) pairs; one entry is that tile of K and that
  tile of V, ``2 * block_n * head_dim * elem_bytes`` bytes, so the cache holds
  ``cache_bytes // tile_bytes`` entries. A read of an entry in the cache is a
  hit and makes it the most recently used; a miss costs ``tile_bytes`` of DRAM
  traffic and puts the entry in the cache, evicting the least recently used
  one when the cache would hold more entries than it can;
* every program also reads its own Q tile, ``block_m * head_dim * elem_bytes``
  bytes, once, from DRAM (no other program reads it).

Writes (O and the LSE) are not modelled: compare with the bytes *read*.
The model is deliberately crude (real programs start one by one as others
finish, and a real L2 is neither one LRU nor fully associative); it is there
to explain the direction of a measurement, which decides.
"""

import numbers
from collections import OrderedDict

ORDERS = ("group_major", "head_major")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_heads(n_q_heads, n_kv_heads):
    _positive_int("n_q_heads", n_q_heads)
    _positive_int("n_kv_heads", n_kv_heads)
    if n_q_heads % n_kv_heads:
        raise ValueError(f"n_q_heads ({n_q_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")


def launch_order(order, n_q_heads, n_kv_heads, n_q_blocks):
    """The programs of one causal launch, in launch order: a list of ``(query head, query block)`` pairs.

    ``order`` is ``"group_major"`` or ``"head_major"`` (the module's docstring
    says what each means). Query head ``h`` reads KV head
    ``h // (n_q_heads // n_kv_heads)``; query blocks are numbered ``0 ..
    n_q_blocks - 1`` from the start of the sequence.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}; got {order!r}")
    _check_heads(n_q_heads, n_kv_heads)
    _positive_int("n_q_blocks", n_q_blocks)
    group_size = n_q_heads // n_kv_heads
    programs = []

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # Fill `programs` with one (q_head, q_block) pair per program, in the
    # order the GPU would start them. Why it matters: the programs that run
    # at the same time are neighbours in this list, and whether they share a
    # KV head decides how much of L2 their K and V tiles need.
    # group_major: the outermost loop is over query blocks (the heaviest, the
    #   last block, first); inside it every KV head in turn, and inside that
    #   the group_size query heads that read it.
    # head_major: the outermost loop is over query heads; inside it every
    #   query block of that head, heaviest first.
    # Invariants: n_q_heads * n_q_blocks pairs, each exactly once; both orders
    # start with a pair whose q_block is n_q_blocks - 1.
    # Hint: the query heads of KV head j are j * group_size up to
    # j * group_size + group_size - 1.
    raise NotImplementedError("Part 1 of traffic.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---
    return programs


def dram_bytes(programs, n_q_heads, n_kv_heads, head_dim, *, cache_bytes, concurrent, block_m=128, block_n=64,
               elem_bytes=2):
    """The DRAM bytes the model reads for these programs, launched in this order (an int).

    ``programs`` is a list of ``(query head, query block)`` pairs in launch
    order, as :func:`launch_order` returns (any list of such pairs will do).
    ``cache_bytes`` is the size of the modelled L2, ``concurrent`` the number
    of programs in a wave; ``block_m`` query rows a program, ``block_n`` keys a
    K/V tile, ``elem_bytes`` bytes a number (2 for bf16). The module's
    docstring states the model.
    """
    _check_heads(n_q_heads, n_kv_heads)
    for name, value in (("head_dim", head_dim), ("concurrent", concurrent), ("block_m", block_m),
                        ("block_n", block_n), ("elem_bytes", elem_bytes)):
        _positive_int(name, value)
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, numbers.Integral):
        raise TypeError(f"cache_bytes must be an integer, got {type(cache_bytes).__name__} {cache_bytes!r}")
    if cache_bytes < 0:
        raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes!r}")
    if block_m % block_n:
        raise ValueError(f"block_m ({block_m}) must be a multiple of block_n ({block_n})")
    programs = list(programs)
    for i, pair in enumerate(programs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in pair)):
            raise TypeError(f"programs[{i}] must be a (query head, query block) pair of integers, got {pair!r}")
        if not (0 <= pair[0] < n_q_heads and pair[1] >= 0):
            raise ValueError(f"programs[{i}] = {pair!r}: the query head must be in 0..{n_q_heads - 1} "
                             "and the query block >= 0")
    group_size = n_q_heads // n_kv_heads
    tile_bytes = 2 * block_n * head_dim * elem_bytes  # one tile of K and the same tile of V
    capacity = cache_bytes // tile_bytes  # how many (KV head, key tile) entries the cache holds

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # Run the model of the module's docstring and set `total` to the DRAM
    # bytes it reads: tile_bytes for every miss, plus every program's Q tile.
    # Why: a launch order cannot change how many tiles the programs read,
    # only how many of those reads find their tile still in L2.
    # Shapes: a wave is a slice of `programs`; program (q_head, q_block)
    # reads key tiles 0 .. (q_block + 1) * block_m // block_n - 1, one a step;
    # a cache entry is keyed (q_head // group_size, key tile).
    # Invariants: the cache never holds more than `capacity` entries (with
    # capacity 0 every read misses); a hit, not only a miss, makes its entry
    # the most recently used; with a cache large enough for everything, total
    # is Q once plus each distinct (KV head, key tile) once.
    # Hint: collections.OrderedDict keeps its keys in order: move_to_end(key)
    # makes one the newest, and popitem(last=False) removes the oldest.
    raise NotImplementedError("Part 2 of traffic.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---
    return total
