import numpy as np
import pytest

from media import codecs
from media.codecs import AudioFormatError, decode_input, encode_output
from media.frames import AudioChunk


def test_pcm16_round_trip_is_little_endian() -> None:
    pcm = np.array([0, 1, -1, 32767, -32768, 258], dtype=np.int16)
    data = codecs.array_to_pcm16(pcm)
    assert data[:4] == b"\x00\x00\x01\x00"
    assert data[-2:] == b"\x02\x01"
    assert np.array_equal(codecs.pcm16_to_array(data), pcm)


def test_odd_byte_count_is_a_format_error() -> None:
    with pytest.raises(AudioFormatError):
        decode_input("audio/pcm", b"\x00\x00\x00")
    assert issubclass(AudioFormatError, ValueError)


def test_unknown_format_is_a_format_error() -> None:
    with pytest.raises(AudioFormatError):
        decode_input("audio/opus", b"")
    with pytest.raises(AudioFormatError):
        encode_output("audio/mp3", AudioChunk.silence(20, 24000))


def test_beta_names_are_aliases() -> None:
    assert codecs.canonical_format("pcm16") == "audio/pcm"
    assert codecs.FORMAT_RATES[codecs.canonical_format("g711_ulaw")] == 8000
    assert codecs.FORMAT_RATES[codecs.canonical_format("g711_alaw")] == 8000


# Reference values from ITU-T G.711 (identical to what audioop produced before its removal).
def test_ulaw_known_values() -> None:
    pcm = np.array([0, 1000, -1000, 32767, -32768], dtype=np.int16)
    assert codecs.ulaw_encode(pcm) == bytes([0xFF, 0xCE, 0x4E, 0x80, 0x00])
    assert codecs.ulaw_decode(bytes([0x00, 0x80, 0xFF, 0x7F])).tolist() == [-32124, 32124, 0, 0]


def test_alaw_known_values() -> None:
    pcm = np.array([0, 1000, -1000, 32767, -32768], dtype=np.int16)
    assert codecs.alaw_encode(pcm) == bytes([0xD5, 0xFA, 0x7A, 0xAA, 0x2A])
    assert codecs.alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])).tolist() == [8, -8, 32256, -32256]


@pytest.mark.parametrize("encode,decode", [(codecs.ulaw_encode, codecs.ulaw_decode), (codecs.alaw_encode, codecs.alaw_decode)])
def test_g711_round_trip_error_is_small(encode, decode) -> None:
    pcm = np.arange(-32768, 32768, 7, dtype=np.int16)
    back = decode(encode(pcm)).astype(np.int32)
    # Logarithmic quantisation: the error grows with the magnitude but stays under ~1/16 of it.
    err = np.abs(back - pcm.astype(np.int32))
    assert np.all(err <= np.maximum(np.abs(pcm.astype(np.int32)) / 16, 16) + 1)
    # Decoded values are fixed points of the codec.
    assert np.array_equal(decode(encode(back.astype(np.int16))), back)


@pytest.mark.parametrize("fmt,rate", [("audio/pcm", 24000), ("audio/pcmu", 8000), ("audio/pcma", 8000)])
def test_decode_input_and_encode_output(fmt: str, rate: int) -> None:
    t = np.arange(rate // 50) / rate
    chunk = AudioChunk((np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16), rate)
    data = encode_output(fmt, chunk)
    assert len(data) == chunk.samples * (2 if fmt == "audio/pcm" else 1)
    back = decode_input(fmt, data)
    assert back.sample_rate == rate and back.samples == chunk.samples
    assert np.max(np.abs(back.pcm.astype(np.int32) - chunk.pcm)) <= (0 if fmt == "audio/pcm" else 300)


def test_encode_output_refuses_the_wrong_rate() -> None:
    with pytest.raises(AudioFormatError, match="resample"):
        encode_output("audio/pcmu", AudioChunk.silence(20, 24000))
