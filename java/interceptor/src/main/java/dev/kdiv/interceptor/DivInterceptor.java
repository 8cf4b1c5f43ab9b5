package dev.kdiv.interceptor;

import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Stamps the `div` header (format version 2, docs/wire-format.md) on every record a Java
 * producer sends: one random producer GUID per producer instance, one implicit segment per
 * partition, consecutive sequence numbers from 0, the record CRC32 over the serialized key
 * and value. Configured only through producer properties (docs/java-producers.md):
 *
 * <pre>
 * interceptor.classes=dev.kdiv.interceptor.DivInterceptor
 * kdiv.metadata.timeout.ms=10000      # bound on looking up a topic's partition count
 * kdiv.metadata.max.age.ms=300000     # how long a topic's partition count is reused
 * </pre>
 *
 * An interceptor sees records before serialization and partitioning, so it serializes the
 * key and value with its own instances of the producer's configured serializers (which must
 * be deterministic) and, for a record without a partition, chooses it as the producer's
 * default partitioner would for a keyed record (murmur2 of the key bytes), for an unkeyed one
 * a partition it sticks to for about a batch of records (`batch.size`), and sends the record
 * to that partition explicitly.
 */
public final class DivInterceptor implements ProducerInterceptor<Object, Object> {
    public static final String METADATA_TIMEOUT_MS = "kdiv.metadata.timeout.ms";
    public static final String METADATA_MAX_AGE_MS = "kdiv.metadata.max.age.ms";
    private static final long DEFAULT_METADATA_TIMEOUT_MS = 10_000;
    private static final long DEFAULT_METADATA_MAX_AGE_MS = 300_000;

    private final byte[] guid = randomGuid();
    private final Map<TopicPartition, PartitionState> partitions = new ConcurrentHashMap<>();
    private final Map<String, PartitionCount> partitionCounts = new ConcurrentHashMap<>();
    private final Map<String, StickyPartition> unkeyed = new ConcurrentHashMap<>();
    private Serializer<Object> keySerializer;
    private Serializer<Object> valueSerializer;
    private Map<String, Object> adminConfigs;
    private Admin admin;
    private long metadataTimeoutMs = DEFAULT_METADATA_TIMEOUT_MS;
    private long metadataMaxAgeMs = DEFAULT_METADATA_MAX_AGE_MS;
    private int batchSize = DEFAULT_BATCH_SIZE;
    private static final int DEFAULT_BATCH_SIZE = 16_384;
    private static final int RECORD_FRAMING_BYTES = 24;

    private record PartitionCount(int count, long fetchedAtMs) {}

    @Override
    public void configure(Map<String, ?> configs) {
        keySerializer = serializer(configs, ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, true);
        valueSerializer = serializer(configs, ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, false);
        metadataTimeoutMs = positiveLong(configs, METADATA_TIMEOUT_MS, DEFAULT_METADATA_TIMEOUT_MS);
        metadataMaxAgeMs = positiveLong(configs, METADATA_MAX_AGE_MS, DEFAULT_METADATA_MAX_AGE_MS);
        batchSize = (int) Math.min(Integer.MAX_VALUE,
                positiveLong(configs, ProducerConfig.BATCH_SIZE_CONFIG, DEFAULT_BATCH_SIZE));
        // The admin client reaches the producer's cluster the way the producer does (bootstrap,
        // security); it is created on the first record without a partition.
        adminConfigs = new HashMap<>();
        for (String name : AdminClientConfig.configNames()) {
            if (configs.containsKey(name) && !name.equals(AdminClientConfig.CLIENT_ID_CONFIG)) {
                adminConfigs.put(name, configs.get(name));
            }
        }
        Object clientId = configs.get(ProducerConfig.CLIENT_ID_CONFIG);
        adminConfigs.put(AdminClientConfig.CLIENT_ID_CONFIG, (clientId == null ? "producer" : clientId) + "-kdiv");
    }

    /** The producer GUID this interceptor stamps (hex), for logs and tests. */
    public String producerGuid() {
        StringBuilder hex = new StringBuilder(32);
        for (byte b : guid) {
            hex.append(String.format("%02x", b));
        }
        return hex.toString();
    }

    @Override
    public ProducerRecord<Object, Object> onSend(ProducerRecord<Object, Object> record) {
        Headers headers = record.headers();
        if (headers.lastHeader(DivHeader.NAME) != null) {
            // Already stamped: the application re-sends a record it sent before, which kdiv
            // then reports as the DUPLICATE it is, or one stamped upstream keeps its origin.
            return record;
        }
        String topic = record.topic();
        // A copy: headers a serializer adds here must not reach the record (the producer's own
        // serializer call adds them again).
        Headers scratch = new RecordHeaders(headers.toArray());
        byte[] key = keySerializer.serialize(topic, scratch, record.key());
        byte[] value = valueSerializer.serialize(topic, scratch, record.value());
        Integer partition = record.partition();
        if (partition == null) {
            partition = choosePartition(topic, key, value);
        }
        long crc = DivHeader.recordCrc(DivHeader.KIND_DATA, key, value);
        PartitionState state = partitions.computeIfAbsent(new TopicPartition(topic, partition), tp -> new PartitionState());
        long[] position = state.next();
        headers.add(DivHeader.NAME, DivHeader.encode(guid, position[0], position[1], System.currentTimeMillis(), crc));
        return new ProducerRecord<>(topic, partition, record.timestamp(), record.key(), record.value(), headers);
    }

    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception) {}

    @Override
    public void close() {
        synchronized (this) {
            if (admin != null) {
                admin.close(java.time.Duration.ofMillis(metadataTimeoutMs));
                admin = null;
            }
        }
        Utils.closeQuietly(keySerializer, "kdiv key serializer");
        Utils.closeQuietly(valueSerializer, "kdiv value serializer");
    }

    private int choosePartition(String topic, byte[] key, byte[] value) {
        int count = partitionCount(topic);
        if (key == null) {
            // What the record takes in a batch: its value, the `div` header and the record's
            // framing (varints, attributes), so that batches fill before the switch.
            int bytes = (value == null ? 0 : value.length) + DivHeader.SIZE + RECORD_FRAMING_BYTES;
            return unkeyed.computeIfAbsent(topic, t -> new StickyPartition()).next(count, bytes, batchSize);
        }
        // The producer's default partitioner's choice for a keyed record (BuiltInPartitioner).
        return Utils.toPositive(Utils.murmur2(key)) % count;
    }

    /**
     * Unkeyed records stick to one partition until about a batch (`batch.size`) of their bytes
     * went there, then move to the next, as the default partitioner's sticky choice does, so
     * batches stay full.
     */
    private static final class StickyPartition {
        private int partition = -1;
        private long bytes;

        synchronized int next(int count, int recordBytes, int batchSize) {
            if (partition < 0 || partition >= count || bytes >= batchSize) {
                partition = partition < 0 ? (int) (Math.random() * count) : (partition + 1) % count;
                bytes = 0;
            }
            bytes += recordBytes;
            return partition;
        }
    }

    private int partitionCount(String topic) {
        long now = System.currentTimeMillis();
        PartitionCount known = partitionCounts.get(topic);
        if (known != null && now - known.fetchedAtMs() < metadataMaxAgeMs) {
            return known.count();
        }
        try {
            TopicDescription description = admin()
                    .describeTopics(java.util.List.of(topic))
                    .topicNameValues()
                    .get(topic)
                    .get(metadataTimeoutMs, TimeUnit.MILLISECONDS);
            int count = description.partitions().size();
            partitionCounts.put(topic, new PartitionCount(count, now));
            return count;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new KafkaException("kdiv: interrupted looking up the partitions of topic " + topic, e);
        } catch (Exception e) {
            // The producer logs this and sends the record unstamped (kdiv: UNTRACKED).
            throw new KafkaException(
                    "kdiv: cannot look up the partitions of topic " + topic + " within " + metadataTimeoutMs
                            + " ms (" + METADATA_TIMEOUT_MS + "): " + e,
                    e);
        }
    }

    private synchronized Admin admin() {
        if (admin == null) {
            admin = Admin.create(adminConfigs);
        }
        return admin;
    }

    @SuppressWarnings("unchecked")
    private static Serializer<Object> serializer(Map<String, ?> configs, String name, boolean isKey) {
        Object configured = configs.get(name);
        if (configured == null) {
            throw new ConfigException(name, null, "kdiv's interceptor serializes records as the producer does: set " + name);
        }
        try {
            Class<?> type = configured instanceof Class<?> c
                    ? c
                    : Class.forName(configured.toString().trim(), true, Utils.getContextOrKafkaClassLoader());
            Serializer<Object> serializer = (Serializer<Object>) Utils.newInstance(type);
            serializer.configure(configs, isKey);
            return serializer;
        } catch (ClassNotFoundException | ClassCastException e) {
            throw new ConfigException(name, configured, "kdiv's interceptor cannot instantiate it: " + e);
        }
    }

    private static long positiveLong(Map<String, ?> configs, String name, long defaultValue) {
        Object configured = configs.get(name);
        if (configured == null) {
            return defaultValue;
        }
        try {
            long value = Long.parseLong(configured.toString().trim());
            if (value <= 0) {
                throw new ConfigException(name, configured, "must be a positive number of milliseconds");
            }
            return value;
        } catch (NumberFormatException e) {
            throw new ConfigException(name, configured, "must be a positive number of milliseconds");
        }
    }

    private static byte[] randomGuid() {
        UUID uuid = UUID.randomUUID();
        return ByteBuffer.allocate(16)
                .putLong(uuid.getMostSignificantBits())
                .putLong(uuid.getLeastSignificantBits())
                .array();
    }
}
