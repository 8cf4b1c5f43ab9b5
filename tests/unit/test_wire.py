import struct
import zlib

import pytest

from kdiv.div.wire import (
    COMMON_SIZE,
    EOS_SIZE,
    SOS_SIZE,
    ChecksumType,
    DivHeader,
    Kind,
    MalformedHeader,
    adhash_add,
    control_key,
    decode,
    encode,
    record_crc,
)
from tests.harness.streams import GUID_A


def test_record_crc_covers_kind_lengths_key_and_value_exactly():
    expected = zlib.crc32(b"\x00" + b"\x00\x00\x00\x03key" + b"\x00\x00\x00\x05value")
    assert record_crc(0, b"key", b"value") == expected


def test_record_crc_marks_null_key_and_value_with_minus_one_length():
    assert record_crc(1, None, None) == zlib.crc32(b"\x01" + b"\xff\xff\xff\xff" * 2)
    # Null and empty differ: a tombstone is not an empty value.
    assert record_crc(0, b"k", None) != record_crc(0, b"k", b"")


def test_adhash_wraps_modulo_2_64():
    assert adhash_add((1 << 64) - 1, 2) == 1


def test_control_key_is_guid_segment_seq_big_endian():
    assert control_key(GUID_A, 7, 9) == GUID_A + struct.pack(">II", 7, 9)
    assert len(control_key(GUID_A, 0, 0)) == 24


@pytest.mark.parametrize(
    "header,size",
    [
        (DivHeader(Kind.DATA, GUID_A, 3, 17, -5, 0xDEADBEEF), COMMON_SIZE),
        (DivHeader(Kind.START_OF_SEGMENT, GUID_A, 0, 0, 1, 2, checksum_type=ChecksumType.NONE), SOS_SIZE),
        (DivHeader(Kind.START_OF_SEGMENT, GUID_A, 1, 0, 1, 2, checksum_type=ChecksumType.ADHASH), SOS_SIZE),
        (
            DivHeader(
                Kind.END_OF_SEGMENT,
                GUID_A,
                2**32 - 1,
                2**32 - 1,
                2**63 - 1,
                2**32 - 1,
                segment_checksum=2**64 - 1,
                final_segment=True,
            ),
            EOS_SIZE,
        ),
        (DivHeader(Kind.END_OF_SEGMENT, GUID_A, 0, 5, 0, 0, segment_checksum=0, final_segment=False), EOS_SIZE),
        (DivHeader(Kind.START_OF_PUSH, GUID_A, 0, 1, 0, 0), COMMON_SIZE),
        (DivHeader(Kind.END_OF_PUSH, GUID_A, 0, 2, 0, 0), COMMON_SIZE),
        (DivHeader(Kind.DATA, GUID_A, 0, 0, 7, 0xCAFE, implicit_segment=True), COMMON_SIZE),
    ],
)
def test_round_trip(header, size):
    raw = encode(header)
    assert len(raw) == size
    assert decode(raw) == header


def test_layout_is_big_endian_at_documented_offsets():
    raw = encode(
        DivHeader(
            Kind.END_OF_SEGMENT,
            GUID_A,
            0x01020304,
            0x05060708,
            0x1112131415161718,
            0xA1A2A3A4,
            segment_checksum=0xB1B2B3B4B5B6B7B8,
            final_segment=True,
        )
    )
    assert raw[0] == 1 and raw[1] == 2
    assert raw[2:18] == GUID_A
    assert raw[18:22] == bytes.fromhex("01020304")
    assert raw[22:26] == bytes.fromhex("05060708")
    assert raw[26:34] == bytes.fromhex("1112131415161718")
    assert raw[34:38] == bytes.fromhex("a1a2a3a4")
    assert raw[38:46] == bytes.fromhex("b1b2b3b4b5b6b7b8")
    assert raw[46] == 1


DATA = encode(DivHeader(Kind.DATA, GUID_A, 0, 1, 0, 0))
SOS = encode(DivHeader(Kind.START_OF_SEGMENT, GUID_A, 0, 0, 0, 0, checksum_type=ChecksumType.ADHASH))
EOS = encode(DivHeader(Kind.END_OF_SEGMENT, GUID_A, 0, 2, 0, 0, segment_checksum=5, final_segment=False))


@pytest.mark.parametrize(
    "raw,message",
    [
        (None, "null value"),
        (b"", "shorter than"),
        (DATA[:-1], "shorter than"),
        (DATA + b"\x00", "kind DATA is 39 bytes, expected 38"),
        (SOS[:-1], "kind START_OF_SEGMENT is 38 bytes, expected 39"),
        (EOS[:-1], "kind END_OF_SEGMENT is 46 bytes, expected 47"),
        (b"\x03" + DATA[1:], "format version 3 is neither 1 nor 2"),
        (b"\x02" + SOS[1:], "format version 2 has kind 1, not 0"),
        (b"\x02" + DATA[1:] + b"\x00", "format version 2 is 39 bytes, expected 38"),
        (DATA[:1] + b"\x05" + DATA[2:], "kind 5 is unknown"),
        (SOS[:-1] + b"\x01", "checksum type 1"),
        (EOS[:-1] + b"\x02", "final-segment flag 2"),
    ],
)
def test_malformed_headers_say_what_is_wrong(raw, message):
    with pytest.raises(MalformedHeader, match=message):
        decode(raw)


def test_implicit_segment_header_is_version_1_data_layout_with_version_2():
    plain = encode(DivHeader(Kind.DATA, GUID_A, 4, 9, 11, 0xA1A2A3A4))
    implicit = encode(DivHeader(Kind.DATA, GUID_A, 4, 9, 11, 0xA1A2A3A4, implicit_segment=True))
    assert implicit[0] == 2 and implicit[1:] == plain[1:]


def test_implicit_segment_holds_data_only():
    with pytest.raises(ValueError, match="DATA records only"):
        encode(DivHeader(Kind.END_OF_PUSH, GUID_A, 0, 0, 0, 0, implicit_segment=True))
