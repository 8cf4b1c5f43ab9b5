package dev.kdiv.interceptor;

/**
 * One producer's position in one partition: its segment and the next sequence number.
 * The caller holds its lock while taking a number and appending the record.
 */
final class PartitionState {
    static final long MAX_SEQ = 0xFFFFFFFFL;

    private long segment;
    private long nextSeq;

    /** The (segment, seq) of the next record; past the last uint32 seq, the next segment at seq 0. */
    synchronized long[] next() {
        if (nextSeq > MAX_SEQ) {
            segment++;
            nextSeq = 0;
        }
        long[] position = {segment, nextSeq};
        nextSeq++;
        return position;
    }
}
