"""What passes between the judge and the executor: plain values and tensors, in a format that carries no code.

The judge (the graded tests, the grader) never imports a student's module; the
executor runs it and sends back what it returned. Neither side unpickles
anything the other wrote: a message is a JSON header and raw byte blobs::

    [8 bytes: header length][header: JSON][blob 0][blob 1]...

The header holds ``None``, booleans, ints, floats (``{"$f": "nan"}`` for the
ones JSON lacks), strings, lists, ``{"$tuple": [...]}``, dicts with string
keys, dtypes (``{"$dtype": "float16"}``) and tensors (``{"$t": blob index,
...}``). Anything else the student returned travels as ``{"$other": its type's
name}`` and reaches the judge as a :class:`Foreign` of that name, which no
check accepts as a tensor.

A tensor goes to the executor as a view of its whole storage (shape, strides,
offset, dtype, device), so the kernel sees the strides and the padding the
test chose. A tensor comes back dense: :func:`decode` with ``dense=True``
refuses any other, and returns a fresh CPU tensor of the stated shape and
dtype, built from bytes only.
"""

from __future__ import annotations

import json
import math
import struct

import torch

MAX_HEADER = 1 << 24  # bytes of JSON: a reply is tensors and a few lines of text
MAX_TOTAL = 1 << 31  # bytes of one message, blobs included
MAX_DEPTH = 32

DTYPES = {name: getattr(torch, name) for name in
          ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")}
_NAME_OF = {dtype: name for name, dtype in DTYPES.items()}


class WireError(ValueError):
    """A message that is not what the other side must send: the call it answers fails."""


class Foreign:
    """A value the student returned that the wire does not carry (a tensor subclass, a NumPy array...).

    Its class is named after the original's type, so ``type(x).__name__`` in a failure message reads as the
    student would expect ("got MyTensor")."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} the executor could not send>"


_foreign: dict[str, type] = {}


def _foreign_of(name: str) -> Foreign:
    name = name if name.isidentifier() and len(name) < 80 else "Unknown"
    if name not in _foreign:
        _foreign[name] = type(name, (Foreign,), {})
    return _foreign[name]()


# --- encoding ------------------------------------------------------------------------------------------------


def encode(value, *, dense: bool = False) -> bytes:
    """One message holding ``value``. ``dense``: tensors as contiguous CPU bytes (what the executor sends
    back), else as views of their whole storage (what the judge sends)."""
    blobs: list[bytes] = []
    header = json.dumps(_plain(value, blobs, dense, 0), allow_nan=False).encode()
    return b"".join([struct.pack("<Q", len(header)), header, *blobs])


def _plain(value, blobs, dense, depth):
    if depth > MAX_DEPTH:
        raise WireError("nested too deeply")
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"$f": repr(value)}
    if kind is torch.Tensor:
        return _tensor(value, blobs, dense)
    if kind is torch.dtype:
        return {"$dtype": _NAME_OF.get(value, str(value))}
    if kind in (list, tuple):
        items = [_plain(v, blobs, dense, depth + 1) for v in value]
        return items if kind is list else {"$tuple": items}
    if kind is dict and all(type(k) is str and not k.startswith("$") for k in value):
        return {k: _plain(v, blobs, dense, depth + 1) for k, v in value.items()}
    return {"$other": kind.__name__}


def _tensor(t: torch.Tensor, blobs: list[bytes], dense: bool) -> dict:
    if t.dtype not in _NAME_OF:
        return {"$other": f"Tensor of {t.dtype}"}
    t = t.detach()
    if dense:
        flat = t.to("cpu").contiguous().reshape(-1)
        blobs.append(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        return {"$t": len(blobs) - 1, "dtype": _NAME_OF[t.dtype], "shape": list(t.shape)}
    storage = t.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
    blobs.append(raw.cpu().numpy().tobytes())
    return {"$t": len(blobs) - 1, "dtype": _NAME_OF[t.dtype], "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset(), "nbytes": len(blobs[-1]), "device": t.device.type}


# --- decoding ------------------------------------------------------------------------------------------------


def decode(data: bytes, *, dense: bool = False, device: str | None = None):
    """The value of one message. ``dense``: every tensor must be a dense one (the judge reading a reply);
    else tensors are rebuilt as the views they were, on ``device`` (default: as sent)."""
    if len(data) < 8:
        raise WireError("a message shorter than its length field")
    (size,) = struct.unpack("<Q", data[:8])
    if size > MAX_HEADER or 8 + size > len(data):
        raise WireError("a header longer than the message")
    try:
        header = json.loads(data[8:8 + size])
    except ValueError as e:
        raise WireError(f"a header that is not JSON: {e}") from None
    blobs = _Blobs(data, 8 + size)
    value = _value(header, blobs, dense, device, 0)
    if blobs.at != len(data):
        raise WireError("bytes past the message's last tensor")
    return value


class _Blobs:
    """The blobs after the header, taken in order."""

    def __init__(self, data: bytes, at: int):
        self.data, self.at, self.taken = data, at, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise WireError("a tensor longer than the message")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk


def _value(node, blobs: _Blobs, dense, device, depth):
    if depth > MAX_DEPTH:
        raise WireError("nested too deeply")
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [_value(v, blobs, dense, device, depth + 1) for v in node]
    if type(node) is not dict:
        raise WireError(f"an unexpected JSON value {type(node).__name__}")
    if "$f" in node:
        if node["$f"] not in ("nan", "inf", "-inf"):
            raise WireError("a float that is not nan or inf")
        return float(node["$f"])
    if "$tuple" in node:
        return tuple(_value(v, blobs, dense, device, depth + 1) for v in _list(node["$tuple"]))
    if "$dtype" in node:
        if node["$dtype"] not in DTYPES:
            raise WireError(f"an unknown dtype {node['$dtype']!r}")
        return DTYPES[node["$dtype"]]
    if "$other" in node:
        return _foreign_of(str(node["$other"]))
    if "$t" in node:
        if node["$t"] != blobs.taken:
            raise WireError("tensors out of order")
        blobs.taken += 1
        return _rebuild(node, blobs, dense, device)
    return {str(k): _value(v, blobs, dense, device, depth + 1) for k, v in node.items()}


def _list(x) -> list:
    if type(x) is not list:
        raise WireError("a tuple that is not a list")
    return x


def _ints(x, what) -> list[int]:
    if type(x) is not list or not all(type(i) is int and i >= 0 for i in x) or len(x) > 8:
        raise WireError(f"a tensor's {what} that is not a list of at most 8 whole numbers >= 0")
    return x


def _rebuild(node: dict, blobs: _Blobs, dense, device) -> torch.Tensor:
    dtype = DTYPES.get(node.get("dtype"))
    if dtype is None:
        raise WireError(f"a tensor of an unknown dtype {node.get('dtype')!r}")
    shape = _ints(node.get("shape"), "shape")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    numel = math.prod(shape)
    if numel * itemsize > MAX_TOTAL:
        raise WireError("a tensor larger than a message may be")
    if dense:
        if set(node) != {"$t", "dtype", "shape"}:
            raise WireError("a reply's tensor must be dense: dtype and shape only")
        raw = bytearray(blobs.take(numel * itemsize))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(shape).clone()
    stride = _ints(node.get("stride"), "strides")
    offset = node.get("offset")
    if len(stride) != len(shape) or type(offset) is not int or offset < 0:
        raise WireError("a tensor's strides do not match its shape")
    nbytes = node.get("nbytes")
    if type(nbytes) is not int or node.get("device") not in ("cpu", "cuda"):
        raise WireError("a tensor view without its storage's size or device")
    raw = bytearray(blobs.take(nbytes))
    if len(raw) % itemsize:
        raise WireError("a storage that is not a whole number of elements")
    base = (torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)).view(dtype)
    reach = offset + sum((s - 1) * st for s, st in zip(shape, stride)) if numel else 0
    if numel and reach >= base.numel():
        raise WireError("a view past the end of its storage")
    base = base.to(device or node.get("device", "cpu"))
    return torch.as_strided(base, shape, stride, offset)



# --- a stream of messages: the executor's pipes ------------------------------------------------------------------


def send(stream, value, *, dense: bool = False) -> None:
    """Write one message, its total length first, and flush."""
    message = encode(value, dense=dense)
    stream.write(struct.pack("<Q", len(message)) + message)
    stream.flush()


def recv(stream, *, dense: bool = False, device: str | None = None):
    """Read one message (EOFError when the other side has closed, or died, before a whole one)."""
    size = _exactly(stream, 8)
    (n,) = struct.unpack("<Q", size)
    if n > MAX_TOTAL:
        raise WireError(f"a message of {n} bytes, more than {MAX_TOTAL}")
    return decode(_exactly(stream, n), dense=dense, device=device)


def _exactly(stream, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("the other side closed the stream")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
