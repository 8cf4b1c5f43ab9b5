package dev.kdiv.streams;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * A Kafka Streams application as one hop of an audited pipeline (docs/pipeline-audit.md): it reads
 * a source topic, uppercases each record's value and writes it to a destination topic under the
 * same key, keeping the record's headers (the `kdiv-trace` header among them) except the input's
 * `div` header, which describes the upstream producer, not this one. The upstream writer's DIV
 * control records are its bookkeeping, not data: they are not forwarded.
 *
 * <p>An optional drop rule drops records whose key (UTF-8) is in a given set: a loss planted on
 * purpose, for showing and testing the audit.
 *
 * <pre>
 * java -cp kdiv-streams-hop.jar:lib/* dev.kdiv.streams.StreamsHop \
 *   --bootstrap HOST:PORT --application-id ID --source TOPIC --destination TOPIC \
 *   [--processing-guarantee at_least_once|exactly_once_v2] [--drop-keys K1,K2,...] \
 *   [--state-dir DIR] [--property NAME=VALUE]...
 * </pre>
 *
 * SIGTERM closes it cleanly (its last offsets committed), exit status 143 as any JVM's; 1 when the
 * application failed, 2 on bad arguments.
 */
public final class StreamsHop {
    public static final String DIV_HEADER = "div";
    public static final String TRACE_HEADER = "kdiv-trace";
    // The `div` header's kind byte follows its version byte; 0 is DATA (docs/wire-format.md).
    private static final int DIV_KIND_INDEX = 1;
    private static final byte DIV_KIND_DATA = 0;
    private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(30);

    private StreamsHop() {}

    /** The topology: source -> drop rule -> without DIV control records -> headers -> mapValues -> destination. */
    public static Topology topology(String source, String destination, Set<String> dropKeys) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(source, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .filterNot((key, value) -> key != null && dropKeys.contains(new String(key, StandardCharsets.UTF_8)))
                .processValues(WithoutInputDiv::new)
                // mapValues forwards the record's headers unchanged: the trace header travels.
                .mapValues(StreamsHop::transform)
                .to(destination, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        return builder.build();
    }

    /** The hop's work on a value: its UTF-8 text uppercased; a null value (a tombstone) stays null. */
    public static byte[] transform(byte[] value) {
        if (value == null) {
            return null;
        }
        return new String(value, StandardCharsets.UTF_8).toUpperCase(Locale.ROOT).getBytes(StandardCharsets.UTF_8);
    }

    /** True for a record whose one `div` header is a control record's (its kind is not DATA). */
    static boolean isDivControl(Headers headers) {
        Header found = null;
        for (Header header : headers.headers(DIV_HEADER)) {
            if (found != null) {
                return false; // two `div` headers: not readable, so data to forward, as kdiv judges it
            }
            found = header;
        }
        byte[] raw = found == null ? null : found.value();
        return raw != null && raw.length > DIV_KIND_INDEX && raw[DIV_KIND_INDEX] != DIV_KIND_DATA;
    }

    /** Drops DIV control records and the input's `div` header; every other header is kept. */
    static final class WithoutInputDiv implements FixedKeyProcessor<byte[], byte[], byte[]> {
        private FixedKeyProcessorContext<byte[], byte[]> context;

        @Override
        public void init(FixedKeyProcessorContext<byte[], byte[]> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<byte[], byte[]> record) {
            if (isDivControl(record.headers())) {
                return;
            }
            // A copy: the input record's headers are left as they were.
            Headers kept = new RecordHeaders(record.headers().toArray());
            kept.remove(DIV_HEADER);
            context.forward(record.withHeaders(kept));
        }
    }

    /** The Streams configuration the arguments give; IllegalArgumentException names what is wrong. */
    public static Properties config(Map<String, String> options, Map<String, String> extra) {
        Properties props = new Properties();
        props.putAll(extra);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, required(options, "bootstrap"));
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, required(options, "application-id"));
        String guarantee = options.getOrDefault("processing-guarantee", StreamsConfig.AT_LEAST_ONCE);
        if (!guarantee.equals(StreamsConfig.AT_LEAST_ONCE) && !guarantee.equals(StreamsConfig.EXACTLY_ONCE_V2)) {
            throw new IllegalArgumentException("--processing-guarantee must be at_least_once or exactly_once_v2, not "
                    + guarantee);
        }
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        if (options.containsKey("state-dir")) {
            props.put(StreamsConfig.STATE_DIR_CONFIG, options.get("state-dir"));
        }
        return props;
    }

    private static String required(Map<String, String> options, String name) {
        String value = options.get(name);
        if (value == null || value.isEmpty()) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    static Set<String> dropKeys(String option) {
        if (option == null || option.isEmpty()) {
            return Set.of();
        }
        return Set.copyOf(Arrays.asList(option.split(",", -1)));
    }

    private static final Set<String> OPTIONS = Set.of(
            "bootstrap", "application-id", "source", "destination", "processing-guarantee", "drop-keys", "state-dir");

    /** Parses `--name value` pairs into `options` and `--property NAME=VALUE` into `extra`. */
    static void parse(String[] args, Map<String, String> options, Map<String, String> extra) {
        for (int i = 0; i < args.length; i += 2) {
            String flag = args[i];
            if (!flag.startsWith("--")) {
                throw new IllegalArgumentException("expected an option, got " + flag);
            }
            if (i + 1 >= args.length) {
                throw new IllegalArgumentException(flag + " needs a value");
            }
            String name = flag.substring(2);
            String value = args[i + 1];
            if (name.equals("property")) {
                int eq = value.indexOf('=');
                if (eq <= 0) {
                    throw new IllegalArgumentException("--property takes NAME=VALUE, not " + value);
                }
                extra.put(value.substring(0, eq), value.substring(eq + 1));
            } else if (OPTIONS.contains(name)) {
                options.put(name, value);
            } else {
                throw new IllegalArgumentException("unknown option " + flag);
            }
        }
    }

    public static void main(String[] args) throws InterruptedException {
        Map<String, String> options = new LinkedHashMap<>();
        Map<String, String> extra = new LinkedHashMap<>();
        Properties props;
        Topology topology;
        try {
            parse(args, options, extra);
            props = config(options, extra);
            topology = topology(required(options, "source"), required(options, "destination"),
                    dropKeys(options.get("drop-keys")));
        } catch (IllegalArgumentException bad) {
            System.err.println("kdiv-streams-hop: " + bad.getMessage());
            System.exit(2);
            return;
        }
        KafkaStreams streams = new KafkaStreams(topology, props);
        CountDownLatch done = new CountDownLatch(1);
        AtomicBoolean failed = new AtomicBoolean(false);
        // The state on stdout, one line each: how a supervisor (or a test) sees it RUNNING.
        streams.setStateListener((now, before) -> {
            System.out.println("state " + now);
            System.out.flush();
            if (now == KafkaStreams.State.ERROR) {
                failed.set(true);
            }
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                done.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(exception -> {
            System.err.println("kdiv-streams-hop: failed: " + exception);
            failed.set(true);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(CLOSE_TIMEOUT);
            done.countDown();
        }));
        streams.start();
        done.await();
        streams.close(CLOSE_TIMEOUT);
        System.exit(failed.get() ? 1 : 0);
    }
}
