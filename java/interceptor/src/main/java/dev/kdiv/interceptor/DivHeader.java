package dev.kdiv.interceptor;

import java.nio.ByteBuffer;
import java.util.zip.CRC32;

/**
 * The `div` header of a record in an implicit segment: format version 2 of docs/wire-format.md,
 * the 38-byte layout of version 1 with kind DATA. Pure: no I/O, the time is passed in.
 */
public final class DivHeader {
    public static final String NAME = "div";
    /** Version 2: the segment was opened by its first record (seq 0); no END_OF_SEGMENT follows. */
    public static final byte IMPLICIT_SEGMENT_VERSION = 2;
    public static final byte KIND_DATA = 0;
    public static final int SIZE = 38;

    private DivHeader() {}

    /** CRC32 (IEEE) over kind byte, int32 key length (-1 if null), key, int32 value length, value. */
    public static long recordCrc(byte kind, byte[] key, byte[] value) {
        CRC32 crc = new CRC32();
        byte[] lengths = new byte[5];
        lengths[0] = kind;
        putInt(lengths, 1, key == null ? -1 : key.length);
        crc.update(lengths, 0, 5);
        if (key != null) {
            crc.update(key);
        }
        putInt(lengths, 0, value == null ? -1 : value.length);
        crc.update(lengths, 0, 4);
        if (value != null) {
            crc.update(value);
        }
        return crc.getValue();
    }

    private static void putInt(byte[] into, int at, int value) {
        into[at] = (byte) (value >>> 24);
        into[at + 1] = (byte) (value >>> 16);
        into[at + 2] = (byte) (value >>> 8);
        into[at + 3] = (byte) value;
    }

    /** The header's bytes; `guid` is 16 bytes, `segment` and `seq` unsigned 32-bit. */
    public static byte[] encode(byte[] guid, long segment, long seq, long producerTimestampMs, long crc) {
        if (guid.length != 16) {
            throw new IllegalArgumentException("a producer GUID is 16 bytes, not " + guid.length);
        }
        ByteBuffer out = ByteBuffer.allocate(SIZE);
        out.put(IMPLICIT_SEGMENT_VERSION)
                .put(KIND_DATA)
                .put(guid)
                .putInt((int) segment)
                .putInt((int) seq)
                .putLong(producerTimestampMs)
                .putInt((int) crc);
        return out.array();
    }
}
