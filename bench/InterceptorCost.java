import dev.kdiv.interceptor.DivInterceptor;
import java.util.Map;
import java.util.Random;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The interceptor's CPU cost per record, without a broker: `onSend` on records with a
 * partition (no metadata lookup), against the baseline of building the same records and
 * serializing their value once, in the same JVM. Run by bench/interceptor.py --cpu as
 * `java -cp <kafka-clients, interceptor jar> bench/InterceptorCost.java RECORDS SIZE ROUNDS`.
 */
public final class InterceptorCost {
    public static void main(String[] args) {
        int records = Integer.parseInt(args[0]);
        int size = Integer.parseInt(args[1]);
        int rounds = Integer.parseInt(args[2]);
        byte[][] values = new byte[1024][];
        Random random = new Random(7);
        for (int i = 0; i < values.length; i++) {
            values[i] = new byte[size];
            random.nextBytes(values[i]);
        }
        ByteArraySerializer serializer = new ByteArraySerializer();
        long sink = 0;
        for (int round = 0; round < rounds; round++) {
            DivInterceptor interceptor = new DivInterceptor();
            interceptor.configure(Map.of(
                    "key.serializer", ByteArraySerializer.class.getName(),
                    "value.serializer", ByteArraySerializer.class.getName()));
            long start = System.nanoTime();
            for (int i = 0; i < records; i++) {
                ProducerRecord<Object, Object> record = new ProducerRecord<>("t", i % 3, null, values[i & 1023]);
                sink += serializer.serialize("t", (byte[]) record.value()).length;
            }
            long baseline = System.nanoTime() - start;
            start = System.nanoTime();
            for (int i = 0; i < records; i++) {
                ProducerRecord<Object, Object> record = new ProducerRecord<>("t", i % 3, null, values[i & 1023]);
                sink += interceptor.onSend(record).headers().lastHeader("div").value().length;
                sink += serializer.serialize("t", (byte[]) record.value()).length;
            }
            long stamped = System.nanoTime() - start;
            interceptor.close();
            System.out.printf("round %d baseline %.1f ns/record, with onSend %.1f ns/record%n",
                    round + 1, (double) baseline / records, (double) stamped / records);
        }
        if (sink == 42) {
            System.out.println();
        }
    }
}
