#!/usr/bin/env python3
"""Extracts whole RocketMQ remoting frames from the reference captures in
shared/protocols/captures into golden files (one hex frame per file) for the
codec tests. Run once by hand; the outputs are committed, the captures are not.

usage: extract.py CAPTURES_DIR OUT_DIR
"""
import os
import struct
import sys

sys.path.insert(0, sys.argv[1])
from rmq_pcap_decode import read_pcap  # noqa: E402

PICK = {
    # capture: how many frames per (direction, code, serialize type) to keep
    "rust_producer_sync.pcap": 1,
    "rust_producer_sync_binary.pcap": 1,
    "rust_producer_batch.pcap": 1,
    "rust_producer_oneway.pcap": 1,
    "rust_push_consumer.pcap": 1,
    "rust_push_consumer_binary.pcap": 1,
    "rust_push_consumer_tagfilter.pcap": 1,
    "rust_push_consumer_orderly.pcap": 1,
    "rust_lite_pull.pcap": 1,
    "rust_tx_producer.pcap": 1,
}


def frames(path):
    streams = {}
    for _t, conn, _seq, _flags, payload in read_pcap(path):
        if payload:
            streams.setdefault(conn, bytearray()).extend(payload)
    for conn, data in streams.items():
        direction = "req" if conn[3] in (9876, 10911) else "resp"
        off = 0
        while off + 8 <= len(data):
            n = struct.unpack(">I", data[off:off + 4])[0]
            if off + 4 + n > len(data):
                break
            yield direction, bytes(data[off:off + 4 + n])
            off += 4 + n


def main():
    src, out = sys.argv[1], sys.argv[2]
    for cap, per in PICK.items():
        seen = {}
        for direction, f in frames(os.path.join(src, cap)):
            hw = struct.unpack(">I", f[4:8])[0]
            st = hw >> 24
            if st == 0:
                import json
                h = json.loads(f[8:8 + (hw & 0xFFFFFF)])
                code = h.get("code")
            else:
                code = struct.unpack(">h", f[8:10])[0]
            key = (direction, code, st)
            if seen.get(key, 0) >= per:
                continue
            seen[key] = seen.get(key, 0) + 1
            name = f"{cap[:-5]}-{direction}-{code}-{'json' if st == 0 else 'bin'}.hex"
            with open(os.path.join(out, name), "w") as fh:
                fh.write(f.hex() + "\n")


main()
