package dev.kdiv.streams;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.test.TestRecord;
import org.junit.jupiter.api.Test;

class StreamsHopTest {
    private static final byte[] TRACE = new byte[] {1, 2, 3, 4};

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    /** A `div` header of the given kind: version byte, kind byte, then the rest (not read here). */
    private static byte[] div(int kind) {
        byte[] header = new byte[38];
        header[0] = 1;
        header[1] = (byte) kind;
        return header;
    }

    private static List<TestRecord<byte[], byte[]>> run(Set<String> dropKeys, List<TestRecord<byte[], byte[]>> in) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "hop-test");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "unused:9092");
        try (TopologyTestDriver driver = new TopologyTestDriver(StreamsHop.topology("src", "dst", dropKeys), props)) {
            TestInputTopic<byte[], byte[]> source =
                    driver.createInputTopic("src", new ByteArraySerializer(), new ByteArraySerializer());
            TestOutputTopic<byte[], byte[]> destination =
                    driver.createOutputTopic("dst", new ByteArrayDeserializer(), new ByteArrayDeserializer());
            in.forEach(source::pipeInput);
            return destination.readRecordsToList();
        }
    }

    private static TestRecord<byte[], byte[]> traced(String key, String value, int divKind) {
        Headers headers = new RecordHeaders();
        headers.add("div", div(divKind));
        headers.add("kdiv-trace", TRACE);
        headers.add("app", bytes("kept"));
        return new TestRecord<>(key == null ? null : bytes(key), value == null ? null : bytes(value), headers);
    }

    @Test
    void theValueIsTransformedAndEveryHeaderButTheInputsDivKept() {
        List<TestRecord<byte[], byte[]>> out = run(Set.of(), List.of(traced("k1", "v1", 0)));
        assertEquals(1, out.size());
        TestRecord<byte[], byte[]> record = out.get(0);
        assertArrayEquals(bytes("k1"), record.key());
        assertArrayEquals(bytes("V1"), record.value());
        assertArrayEquals(TRACE, record.headers().lastHeader("kdiv-trace").value());
        assertArrayEquals(bytes("kept"), record.headers().lastHeader("app").value());
        assertNull(record.headers().lastHeader("div"));
    }

    @Test
    void divControlRecordsAreNotForwardedAndTombstonesAre() {
        List<TestRecord<byte[], byte[]>> out = run(
                Set.of(),
                List.of(traced("k1", "start", 1), traced("k1", "v1", 0), traced("k1", "end", 2), traced("k2", null, 0)));
        assertEquals(2, out.size());
        assertArrayEquals(bytes("V1"), out.get(0).value());
        assertNull(out.get(1).value());
        assertArrayEquals(TRACE, out.get(1).headers().lastHeader("kdiv-trace").value());
    }

    @Test
    void recordsWithoutADivHeaderOrWithTwoAreData() {
        Headers two = new RecordHeaders();
        two.add("div", div(1));
        two.add("div", div(1));
        List<TestRecord<byte[], byte[]>> out = run(
                Set.of(),
                List.of(new TestRecord<>(bytes("a"), bytes("x")), new TestRecord<>(bytes("b"), bytes("y"), two)));
        assertEquals(2, out.size());
        assertNull(out.get(1).headers().lastHeader("div"));
    }

    @Test
    void theDropRuleDropsExactlyTheRecordsOfItsKeys() {
        List<TestRecord<byte[], byte[]>> out = run(
                StreamsHop.dropKeys("k7,k77"),
                List.of(traced("k7", "a", 0), traced("k70", "b", 0), traced("k77", "c", 0), traced(null, "d", 0)));
        assertEquals(List.of("B", "D"), out.stream().map(r -> new String(r.value(), StandardCharsets.UTF_8)).toList());
    }

    @Test
    void argumentsAreCheckedInOneLine() {
        Map<String, String> options = new LinkedHashMap<>();
        Map<String, String> extra = new HashMap<>();
        StreamsHop.parse(
                new String[] {"--bootstrap", "b:9092", "--application-id", "app", "--property", "commit.interval.ms=5"},
                options,
                extra);
        Properties props = StreamsHop.config(options, extra);
        assertEquals("at_least_once", props.get(StreamsConfig.PROCESSING_GUARANTEE_CONFIG));
        assertEquals("5", props.get("commit.interval.ms"));
        options.put("processing-guarantee", "exactly_once");
        IllegalArgumentException bad = assertThrows(IllegalArgumentException.class, () -> StreamsHop.config(options, extra));
        assertTrue(bad.getMessage().contains("at_least_once or exactly_once_v2"), bad.getMessage());
        assertThrows(IllegalArgumentException.class, () -> StreamsHop.parse(new String[] {"--nope", "x"}, options, extra));
        assertThrows(IllegalArgumentException.class, () -> StreamsHop.parse(new String[] {"--source"}, options, extra));
        assertThrows(IllegalArgumentException.class, () -> StreamsHop.parse(new String[] {"--property", "x"}, options, extra));
        assertEquals(Set.of(), StreamsHop.dropKeys(null));
    }
}
