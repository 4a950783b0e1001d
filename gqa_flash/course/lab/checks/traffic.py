"""Notebook 05 (practice, not graded): the checks of traffic.py, one per part.

* Part 1, :func:`check_launch_order`: the two launch orders, for GQA, MHA and
  MQA shapes, against orders this check builds by sorting every program by a
  key (not by nested loops, as the exercise does).
* Part 2, :func:`check_traffic_model`: the DRAM bytes of the L2 model on small
  launches whose programs this check lists itself (so Part 2 is checked
  whether or not Part 1 works), against its own replay of the model: every
  tile read written out in order, and an LRU cache kept as a dictionary of
  last-use times.

On a wrong answer each check replays the usual mistakes (the orders swapped,
the heaviest block not first, a hit that does not refresh its entry, Q not
counted...) and names the one your result matches.
"""

from __future__ import annotations

import itertools
import numbers

from gqa_flash.course.lab.checks.common import (
    Mistake, Stop, Verdict, fail, load, prints_verdict, run_student, what_of,
)

MODULE = "traffic"


# --- Part 1 -------------------------------------------------------------------------------------------------


def _sorted_programs(n_q_heads, n_kv_heads, n_q_blocks, key):
    """Every (q_head, q_block) of a launch, sorted by key(q_head, q_block, group_size, n_kv_heads)."""
    group = n_q_heads // n_kv_heads
    every = itertools.product(range(n_q_heads), range(n_q_blocks))
    return sorted(every, key=lambda hb: key(hb[0], hb[1], group, n_kv_heads))


# What each order sorts by; then the usual mistakes, each as a sort key and what to tell the student.
_KEYS = {
    "group_major": lambda h, b, g, k: (-b, h),  # a KV group's heads are consecutive numbers: h orders them
    "head_major": lambda h, b, g, k: (h, -b),
}
_NOT_NEIGHBOURS = ("the query heads of one KV head are not neighbours: KV head j's heads are j * group_size "
                   "up to j * group_size + group_size - 1, one after another")
_ORDER_MISTAKES = {  # each bug is the sort key of the order the mistake gives
    "group_major": [
        Mistake(lambda h, b, g, k: (h, -b),
                "the two orders are swapped: this is head_major (query head outermost); "
                "group_major puts the query blocks outermost"),
        Mistake(lambda h, b, g, k: (b, h),
                "heaviest-first is missing: the query blocks must count down from "
                "n_q_blocks - 1 (the last block sees the most keys and should start first)"),
        Mistake(lambda h, b, g, k: (h // g, -b, h % g),
                "the KV head is the outermost loop: in group_major the query "
                "block is, so that the heaviest tiles of every head start first"),
        Mistake(lambda h, b, g, k: (-b, h % k, h // k),
                _NOT_NEIGHBOURS + " (% for //: this order gives KV head j the heads j, j + n_kv_heads, ...)"),
        Mistake(lambda h, b, g, k: (-b, h % g, h // g),
                _NOT_NEIGHBOURS + " (this order takes one head of each KV head in turn)"),
    ],
    "head_major": [
        Mistake(lambda h, b, g, k: (-b, h),
                "the two orders are swapped: this is group_major (query block outermost); "
                "head_major puts the query heads outermost"),
        Mistake(lambda h, b, g, k: (h, b),
                "heaviest-first is missing: within each head the query blocks must count "
                "down from n_q_blocks - 1"),
        Mistake(lambda h, b, g, k: (b, h),
                "the loops are the wrong way round and heaviest-first is missing: the "
                "query head is the outer loop, and its blocks count down from n_q_blocks - 1"),
    ],
}

_ORDER_CASES = [  # (order, n_q_heads, n_kv_heads, n_q_blocks, what the case is)
    ("group_major", 8, 2, 3, "GQA 8:2, 3 query blocks"),
    ("head_major", 8, 2, 3, "GQA 8:2, 3 query blocks"),
    ("group_major", 6, 3, 4, "GQA 6:3, 4 query blocks"),
    ("head_major", 6, 3, 4, "GQA 6:3, 4 query blocks"),
    ("group_major", 3, 3, 2, "MHA 3:3, 2 query blocks"),
    ("head_major", 4, 1, 2, "MQA 4:1, 2 query blocks"),
    ("group_major", 4, 1, 1, "MQA 4:1, one query block"),
]


def _as_pairs(out, label):
    """The student's list as a list of (int, int) tuples, or a FAIL that says what is wrong with it."""
    if not isinstance(out, (list, tuple)):
        raise Stop(fail(MODULE, 1, f"launch_order returned a {type(out).__name__}; expected a list of "
                                   "(q_head, q_block) pairs", where=label))
    pairs = []
    for i, item in enumerate(out):
        ok = (isinstance(item, (tuple, list)) and len(item) == 2
              and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in item))
        if not ok:
            raise Stop(fail(MODULE, 1, f"item {i} of the list is {item!r}; expected a (q_head, q_block) pair "
                                       "of integers", where=label))
        pairs.append((int(item[0]), int(item[1])))
    return pairs


def _order_cause(got, order, n_q_heads, n_kv_heads, n_q_blocks):
    expected = _sorted_programs(n_q_heads, n_kv_heads, n_q_blocks, _KEYS[order])
    if sorted(got) != sorted(expected):
        if sorted((b, h) for h, b in got) == sorted(expected):
            return "the pairs are the wrong way round: each is (q_head, q_block), the head first"
        missing = sorted(set(expected) - set(got))
        doubled = sorted({p for p in got if got.count(p) > 1})
        extra = sorted(set(got) - set(expected))
        if doubled:
            return f"a program is listed more than once, e.g. {doubled[0]}: every (q_head, q_block) exactly once"
        if extra:
            return f"{extra[0]} is not a program of this launch (query heads 0..{n_q_heads - 1}, blocks " \
                   f"0..{n_q_blocks - 1})"
        return f"a program is missing, e.g. {missing[0]}: every (q_head, q_block) exactly once"
    for mistake in _ORDER_MISTAKES[order]:
        if got == _sorted_programs(n_q_heads, n_kv_heads, n_q_blocks, mistake.bug):
            return mistake.cause
    return None


@prints_verdict
def check_launch_order():
    """traffic.py Part 1: the programs of a causal launch in group_major and head_major order."""
    mod = load(MODULE)
    for order, hq, hkv, nb, name in _ORDER_CASES:
        label = f'case "{name}", order {order!r}'
        out = run_student(MODULE, mod.launch_order, order, hq, hkv, nb, part=1)
        got = _as_pairs(out, label)
        expected = _sorted_programs(hq, hkv, nb, _KEYS[order])
        if got == expected:
            continue
        if len(got) != len(expected):
            where = f"{label}: {len(got)} programs, expected {len(expected)} ({hq} query heads x {nb} blocks)"
        else:
            i = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            where = f"{label}: position {i} holds {got[i]}, expected {expected[i]}"
        raise Stop(fail(MODULE, 1, "the launch order is not the expected one", where=where,
                        cause=_order_cause(got, order, hq, hkv, nb)))
    return Verdict(True, what_of(MODULE, 1), f"both orders right for {len(_ORDER_CASES)} launches (GQA, MHA, MQA)")


# --- Part 2 -------------------------------------------------------------------------------------------------


def _replay(programs, n_q_heads, n_kv_heads, head_dim, cache_bytes, concurrent, block_m, block_n, elem_bytes,
            refresh=True, owner="kv", lockstep=True, prefix="causal", victim="least_recent", keep_misses=True,
            capacity_shift=0, kv_together=True, q_counted=True):
    """The model's DRAM bytes, and its misses, replayed with one known mistake switched on (defaults: right).

    First the whole sequence of (owner, key tile) reads in the order the model makes them; then a cache of
    last-use times over that sequence.
    """
    group = n_q_heads // n_kv_heads
    per_block = block_m // block_n
    last_block = max((b for _, b in programs), default=0)
    reach = {"causal": lambda b: (b + 1) * per_block, "no_diagonal": lambda b: b * per_block,
             "everything": lambda b: (last_block + 1) * per_block}[prefix]
    label = {"kv": lambda h: h // group, "q": lambda h: h, "none": lambda h: 0}[owner]
    sequence = []
    for start in range(0, len(programs), concurrent):
        rows = [[(label(h), t) for t in range(reach(b))] for h, b in programs[start:start + concurrent]]
        if lockstep:  # column by column: step t of every program, then step t + 1
            sequence += [read for column in itertools.zip_longest(*rows) for read in column if read is not None]
        else:  # row by row: each program's whole prefix, one program after another
            sequence += [read for row in rows for read in row]
    full_tile = 2 * block_n * head_dim * elem_bytes
    room = cache_bytes // full_tile + capacity_shift
    stamps, clock, misses = {}, 0, 0
    for read in sequence:
        clock += 1
        if read in stamps:
            if refresh:
                stamps[read] = clock
            continue
        misses += 1
        if keep_misses:
            stamps[read] = clock
            while len(stamps) > max(room, 0):
                pick = min if victim == "least_recent" else max
                del stamps[pick(stamps, key=stamps.get)]
    charged = full_tile if kv_together else full_tile // 2
    q_tiles = len(programs) * block_m * head_dim * elem_bytes if q_counted else 0
    return misses * charged + q_tiles, misses


_MODEL_MISTAKES = [  # each bug is the switches of _replay that replay it
    Mistake(dict(q_counted=False), "Q is not counted: every program also reads its own Q tile, "
                                   "block_m * head_dim * elem_bytes bytes, once"),
    Mistake(dict(kv_together=False), "a miss costs a tile of K and a tile of V: tile_bytes, not half of it"),
    Mistake(dict(refresh=False), "a hit does not refresh its entry (that is FIFO, not LRU): a hit must make its "
                                 "entry the most recently used"),
    Mistake(dict(victim="most_recent"), "the wrong entry is evicted: drop the least recently used one (the oldest), "
                                        "not the newest"),
    Mistake(dict(keep_misses=False), "a miss is not put in the cache, so nothing is ever a hit"),
    Mistake(dict(owner="q"), "the cache is keyed by query head: the query heads of one KV head read the same K and V "
                             "tiles, so key an entry by (q_head // group_size, key tile)"),
    Mistake(dict(owner="none"), "the cache is keyed by the key tile alone: two KV heads hold different K and V, so "
                                "key an entry by (KV head, key tile)"),
    Mistake(dict(prefix="no_diagonal"), "the diagonal tiles are missing: query block b reads key tiles "
                                        "0 .. (b + 1) * block_m // block_n - 1, its own block included"),
    Mistake(dict(prefix="everything"), "every program reads every key tile: under the causal mask query block b "
                                       "reads only up to its own block"),
    Mistake(dict(lockstep=False), "the programs of a wave run one after another: in the model they move in step "
                                  "(step j: every program of the wave reads its j-th tile, then step j + 1)"),
    Mistake(dict(capacity_shift=1), "the cache holds one entry too many: evict as soon as it holds more than "
                                    "capacity entries"),
    Mistake(dict(capacity_shift=-1), "the cache holds one entry too few: it may hold exactly capacity entries"),
]


def _case(name, order_key, n_q_heads, n_kv_heads, n_q_blocks, cache_tiles, concurrent, head_dim=4, block_m=2,
          block_n=1, elem_bytes=2):
    programs = _sorted_programs(n_q_heads, n_kv_heads, n_q_blocks, _KEYS[order_key])
    tile = 2 * block_n * head_dim * elem_bytes
    kwargs = dict(cache_bytes=cache_tiles * tile + tile // 2, concurrent=concurrent, block_m=block_m,
                  block_n=block_n, elem_bytes=elem_bytes)  # a cache a little larger than cache_tiles tiles
    return name, programs, (n_q_heads, n_kv_heads, head_dim), kwargs


_MODEL_CASES = [
    _case("a cache that holds everything: GQA 6:3, 3 query blocks, head_major, waves of 4", "head_major",
          6, 3, 3, cache_tiles=100, concurrent=4),
    _case("no cache at all (every read misses): GQA 4:2, 2 query blocks, head_major, waves of 3", "head_major",
          4, 2, 2, cache_tiles=0, concurrent=3),
    _case("a cache of 4 tiles: GQA 4:2, 4 query blocks, group_major, waves of 3", "group_major",
          4, 2, 4, cache_tiles=4, concurrent=3),
    _case("a cache of 4 tiles: GQA 4:2, 3 query blocks, head_major, waves of 3", "head_major",
          4, 2, 3, cache_tiles=4, concurrent=3),
    _case("a cache of 6 tiles: GQA 8:2, 4 query blocks, group_major, waves of 5, two tiles a block",
          "group_major", 8, 2, 4, cache_tiles=6, concurrent=5, block_m=4, block_n=2),
    _case("a cache of 12 tiles: GQA 8:2, 6 query blocks, head_major, waves of 7, two tiles a block",
          "head_major", 8, 2, 6, cache_tiles=12, concurrent=7, head_dim=8, block_m=4, block_n=2),
]


@prints_verdict
def check_traffic_model():
    """traffic.py Part 2: the DRAM bytes of the L2 model, on launches this check lists itself."""
    mod = load(MODULE)
    for name, programs, (hq, hkv, d), kwargs in _MODEL_CASES:
        out = run_student(MODULE, mod.dram_bytes, list(programs), hq, hkv, d, part=2, **kwargs)
        if isinstance(out, bool) or not isinstance(out, numbers.Real):
            raise Stop(fail(MODULE, 2, f"dram_bytes returned a {type(out).__name__}; expected a number of bytes",
                            where=f'case "{name}"'))
        expected, misses = _replay(programs, hq, hkv, d, **kwargs)
        if out == expected:
            continue
        q_bytes = len(programs) * kwargs["block_m"] * d * kwargs["elem_bytes"]
        tile = 2 * kwargs["block_n"] * d * kwargs["elem_bytes"]
        where = (f'case "{name}": got {out} bytes, expected {expected} '
                 f"({misses} misses of {tile} bytes, plus {q_bytes} bytes of Q)")
        cause = next((mistake.cause for mistake in _MODEL_MISTAKES
                      if _replay(programs, hq, hkv, d, **kwargs, **mistake.bug)[0] == out), None)
        raise Stop(fail(MODULE, 2, "the DRAM bytes differ from the check's own replay of the model",
                        where=where, cause=cause))
    return Verdict(True, what_of(MODULE, 2), f"the DRAM bytes match the check's replay of the model in "
                                             f"{len(_MODEL_CASES)} launches (LRU, waves in step, GQA sharing)")
