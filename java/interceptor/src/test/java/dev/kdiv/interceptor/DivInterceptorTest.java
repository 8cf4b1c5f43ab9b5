package dev.kdiv.interceptor;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Map;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.Test;

class DivInterceptorTest {
    private static final HexFormat HEX = HexFormat.of();

    @Test
    void recordCrcIsZlibsOverKindLengthsKeyAndValue() {
        // zlib.crc32(b"\x00" + b"\x00\x00\x00\x01k" + b"\x00\x00\x00\x01v"), docs/wire-format.md's example.
        assertEquals(0x0fbea089L, DivHeader.recordCrc((byte) 0, bytes("k"), bytes("v")));
        // Null key and value: -1 lengths.
        assertEquals(0xa26f14dbL, DivHeader.recordCrc((byte) 0, null, null));
    }

    @Test
    void headerIsVersion2DataInVersion1Layout() {
        byte[] guid = HEX.parseHex("000102030405060708090a0b0c0d0e0f");
        byte[] header = DivHeader.encode(guid, 2, 7, 1_700_000_000_000L, 0xfbea089L);
        assertArrayEquals(
                HEX.parseHex("0200" + "000102030405060708090a0b0c0d0e0f" + "00000002" + "00000007"
                        + "0000018bcfe56800" + "0fbea089"),
                header);
        // Unsigned 32-bit fields keep their top bit.
        byte[] high = DivHeader.encode(guid, 0xFFFFFFFFL, 0xFFFFFFFEL, -1, 0xFFFFFFFFL);
        assertEquals("fffffffffffffffe", HEX.formatHex(high, 18, 26));
    }

    @Test
    void seqsCountPerPartitionFromZeroUnderOneGuid() {
        DivInterceptor interceptor = configured(ByteArraySerializer.class.getName());
        ByteBuffer[] headers = new ByteBuffer[4];
        int[] partitions = {0, 1, 0, 0};
        for (int i = 0; i < partitions.length; i++) {
            ProducerRecord<Object, Object> sent =
                    interceptor.onSend(new ProducerRecord<>("t", partitions[i], bytes("k" + i), bytes("v" + i)));
            assertEquals(partitions[i], sent.partition());
            byte[] raw = sent.headers().lastHeader("div").value();
            assertEquals(DivHeader.SIZE, raw.length);
            headers[i] = ByteBuffer.wrap(raw);
            assertEquals(DivHeader.recordCrc((byte) 0, bytes("k" + i), bytes("v" + i)), headers[i].getInt(34) & 0xFFFFFFFFL);
        }
        assertEquals(0, headers[0].getInt(22));
        assertEquals(0, headers[1].getInt(22));
        assertEquals(1, headers[2].getInt(22));
        assertEquals(2, headers[3].getInt(22));
        assertEquals(interceptor.producerGuid(), HEX.formatHex(headers[3].array(), 2, 18));
        assertNotEquals(interceptor.producerGuid(), configured(ByteArraySerializer.class.getName()).producerGuid());
        interceptor.close();
    }

    @Test
    void crcIsOverTheConfiguredSerializersBytes() {
        DivInterceptor interceptor = configured(StringSerializer.class.getName());
        ProducerRecord<Object, Object> sent = interceptor.onSend(new ProducerRecord<>("t", 0, "ключ", "значение"));
        long crc = ByteBuffer.wrap(sent.headers().lastHeader("div").value()).getInt(34) & 0xFFFFFFFFL;
        assertEquals(DivHeader.recordCrc((byte) 0, bytes("ключ"), bytes("значение")), crc);
        interceptor.close();
    }

    @Test
    void aStampedRecordPassesUntouched() {
        DivInterceptor interceptor = configured(ByteArraySerializer.class.getName());
        ProducerRecord<Object, Object> sent = interceptor.onSend(new ProducerRecord<>("t", 0, null, bytes("v")));
        assertSame(sent, interceptor.onSend(sent));
        ProducerRecord<Object, Object> next = interceptor.onSend(new ProducerRecord<>("t", 0, null, bytes("w")));
        assertEquals(1, ByteBuffer.wrap(next.headers().lastHeader("div").value()).getInt(22));
        interceptor.close();
    }

    private static DivInterceptor configured(String serializer) {
        DivInterceptor interceptor = new DivInterceptor();
        interceptor.configure(Map.of("key.serializer", serializer, "value.serializer", serializer));
        return interceptor;
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
