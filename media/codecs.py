"""Wire audio formats of the Realtime API: PCM16 little-endian and G.711 µ-law / A-law.

G.711 goes through lookup tables built once with numpy (audioop is gone in Python 3.13).
"""

from __future__ import annotations

import numpy as np

from media.frames import AudioChunk

PCM = "audio/pcm"
PCMU = "audio/pcmu"
PCMA = "audio/pcma"

FORMAT_RATES: dict[str, int] = {PCM: 24000, PCMU: 8000, PCMA: 8000}
# Names from the beta Realtime API that clients still send.
_ALIASES: dict[str, str] = {"pcm16": PCM, "g711_ulaw": PCMU, "g711_alaw": PCMA}


class AudioFormatError(ValueError):
    """Audio bytes or a format name that cannot be decoded."""


def canonical_format(fmt: str) -> str:
    name = _ALIASES.get(fmt, fmt)
    if name not in FORMAT_RATES:
        raise AudioFormatError(f"unsupported audio format {fmt!r}; expected one of {sorted(FORMAT_RATES)}")
    return name


def pcm16_to_array(data: bytes) -> np.ndarray:
    if len(data) % 2:
        raise AudioFormatError(f"pcm16 audio needs an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.int16)


def array_to_pcm16(pcm: np.ndarray) -> bytes:
    return np.asarray(pcm, dtype=np.int16).astype("<i2").tobytes()


def _ulaw_encode_all(x: np.ndarray) -> np.ndarray:
    """µ-law of every int16 value, on the 14-bit magnitude as G.711 defines it (bias 33, clip 8159)."""
    v = x.astype(np.int32) >> 2
    sign = np.where(v < 0, 0x80, 0)
    mag = np.minimum(np.abs(v), 8159) + 33
    seg_ends = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
    seg = np.searchsorted(seg_ends, mag, side="left").astype(np.int32)
    # Past the last segment the code word saturates at the largest magnitude.
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0x0F))
    return (~(sign | code) & 0xFF).astype(np.uint8)


def _ulaw_decode_all() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    mag = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -mag, mag).astype(np.int16)


def _alaw_encode_all(x: np.ndarray) -> np.ndarray:
    """A-law of every int16 value, on the 13-bit magnitude as G.711 defines it."""
    v = x.astype(np.int32) >> 3
    mask = np.where(v >= 0, 0xD5, 0x55)
    v = np.where(v >= 0, v, -v - 1)
    # Segment = how many of the 8 segment end points (0x1F, 0x3F, ..., 0xFFF) lie below v.
    seg_ends = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)
    seg = np.searchsorted(seg_ends, v, side="left").astype(np.int32)
    shift = np.where(seg < 2, 1, seg)
    aval = (np.minimum(seg, 7) << 4) | ((v >> shift) & 0x0F)
    aval = np.where(seg >= 8, 0x7F, aval)
    return ((aval ^ mask) & 0xFF).astype(np.uint8)


def _alaw_decode_all() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, t + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


# Encode tables are indexed by the int16 sample's bit pattern read as uint16.
_ALL_INT16 = np.arange(65536, dtype=np.uint16).view(np.int16)
_ULAW_ENCODE = _ulaw_encode_all(_ALL_INT16)
_ULAW_DECODE = _ulaw_decode_all()
_ALAW_ENCODE = _alaw_encode_all(_ALL_INT16)
_ALAW_DECODE = _alaw_decode_all()


def ulaw_encode(pcm: np.ndarray) -> bytes:
    return _ULAW_ENCODE[np.asarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_encode(pcm: np.ndarray) -> bytes:
    return _ALAW_ENCODE[np.asarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def decode_input(fmt: str, data: bytes) -> AudioChunk:
    """Wire bytes of one Realtime input format to mono int16 at that format's rate."""
    name = canonical_format(fmt)
    if name == PCM:
        pcm = pcm16_to_array(data)
    elif name == PCMU:
        pcm = ulaw_decode(data)
    else:
        pcm = alaw_decode(data)
    return AudioChunk(pcm, FORMAT_RATES[name])


def encode_output(fmt: str, chunk: AudioChunk) -> bytes:
    """The chunk must already be at the format's rate: resampling here would click at every chunk edge."""
    name = canonical_format(fmt)
    rate = FORMAT_RATES[name]
    if chunk.sample_rate != rate:
        raise AudioFormatError(f"{name} is {rate} Hz but the chunk is {chunk.sample_rate} Hz; resample first")
    if name == PCM:
        return array_to_pcm16(chunk.pcm)
    if name == PCMU:
        return ulaw_encode(chunk.pcm)
    return alaw_encode(chunk.pcm)
