"""What a processor between two topics must do for the audit: forward the trace header.

The propagation rule: every hop of a route must forward its input record's `kdiv-trace`
header, unchanged, on the record(s) it writes. Kafka Streams forwards headers by default;
Faust agents and plain consume-produce loops must call `forward`. A hop that drops the
header makes every trace through it look LOST.

Only the trace header travels. DIV (the `div` header) is per hop: each processor stamps its
own records as their producer, so the input's `div` header is never forwarded, nor is any
other input header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kdiv.div.wire import HEADER_NAME as DIV_HEADER
from kdiv.trace.header import TRACE_HEADER, Headers

OutputHeaders = Sequence[tuple[str, bytes]] | Mapping[str, bytes]


def forward(input_headers: Headers | None, output_headers: OutputHeaders | None = ()) -> list[tuple[str, bytes]]:
    """The output record's headers: `output_headers` as pairs, plus the input's trace header.

    The input's trace header replaces any trace header in `output_headers`; without one, the
    output's own are kept (the processor may be the origin of another route). A malformed
    input trace header is forwarded as is, for the auditor to report: a processor must not
    fail on it (a null one travels as an empty value). An output `div` header equal to the
    input's is dropped: it is the input's stamp passed through (`forward(h, h)`), which would
    make the next hop's validator take the upstream producer's sequence for this hop's.
    None is no headers, as confluent-kafka's `Message.headers()` says it.
    """
    input_headers = input_headers or ()
    output_headers = output_headers or ()
    trace = None
    input_div = None
    pairs = input_headers.items() if isinstance(input_headers, Mapping) else input_headers
    for name, value in pairs:
        if name == TRACE_HEADER:
            # The last one, as Kafka's Headers.lastHeader reads it.
            trace = b"" if value is None else value
        elif name == DIV_HEADER:
            input_div = value
    output_pairs = output_headers.items() if isinstance(output_headers, Mapping) else output_headers
    forwarded = [
        (name, value)
        for name, value in output_pairs
        if not (name == TRACE_HEADER and trace is not None)
        and not (name == DIV_HEADER and input_div is not None and value == input_div)
    ]
    if trace is not None:
        forwarded.append((TRACE_HEADER, trace))
    return forwarded
