"""TiCDC row checksums: recompute the CRC-32 TiCDC attaches to each row and say whether it holds.

`kdiv.ticdc.avro` reads Avro-protocol values, `kdiv.ticdc.simple` Simple-protocol messages; both
build on the column encodings of `kdiv.ticdc.checksum`. Pure: no I/O, no Kafka, no clock.
"""
