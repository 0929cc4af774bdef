#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/).

The files are committed; rerun this only when a wire format changes:
    python3 tests/fuzz/make_corpus.py
Layouts: transports/tcp/include/cclite/tcp/store_protocol.hpp and hello.hpp,
include/cclite/train/checkpoint.hpp (all integers little-endian).
"""
import hashlib
import hmac
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC = 0x54534343  # "CCST"
VERSION = 2


def auth(kind, payload):
    return struct.pack("<IBBH", MAGIC, VERSION, kind, 0) + payload


def proof(token=b"", nonce=bytes(range(32))):
    mac = hmac.new(token, b"cclite-store-auth-v1" + nonce, hashlib.sha256).digest()
    return auth(0x11, mac)


def req(op, key, value=b"", wait_ms=0, key_len=None, value_len=None):
    kl = len(key) if key_len is None else key_len
    vl = len(value) if value_len is None else value_len
    return struct.pack("<IBBHIII", MAGIC, VERSION, op, 0, kl, vl, wait_ms) + key + value


def rep(status, value=b"", value_len=None):
    vl = len(value) if value_len is None else value_len
    return struct.pack("<IBBHI", MAGIC, VERSION, status, 0, vl) + value


def hello(magic=b"CCTC", version=1, job=0x1234_5678_9ABC_DEF0, frm=0, to=1, idx=0, nsocks=2, block=131072):
    return magic + struct.pack("<IQiiIIII", version, job, frm, to, idx, nsocks, block, 0)


STORE = {
    "set_get": b"\0" + proof() + req(1, b"k", b"v") + req(2, b"k", wait_ms=30000),
    "add_wait_check": b"\0" + proof(b"tok") + req(3, b"n", struct.pack("<q", -5)) + req(4, b"n", wait_ms=5) + req(5, b"n"),
    "binary_key": b"\0" + proof() + req(1, b"x\0y/../\xff", b"\0\1\2"),
    "max_key": b"\0" + proof() + req(5, b"k" * 4096),
    "oversized_key_len": b"\0" + proof() + req(1, b"", key_len=0xFFFFFFFF),
    "oversized_value_len": b"\0" + proof() + req(1, b"k", value_len=0xFFFFFFFF),
    "truncated_frame": b"\0" + proof() + req(1, b"key", b"v" * 100)[:40],
    "unknown_op": b"\0" + proof() + req(9, b"k"),
    "http_instead_of_proof": b"\0GET / HTTP/1.1\r\nHost: node0:29400\r\nAccept: */*\r\n\r\n",
    "half_proof": b"\0" + proof()[:13],
    "client_get_ok": b"\1" + auth(0x10, bytes(range(32))) + rep(0) + rep(0, b"value"),
    "client_refused": b"\1" + auth(0x10, b"\xaa" * 32) + rep(3, b"wrong job token"),
    "client_error": b"\1" + auth(0x10, b"\x55" * 32) + rep(0) + rep(2, b"store full"),
    "client_huge_value_len": b"\1" + auth(0x10, bytes(32)) + rep(0) + rep(0, value_len=0x7FFFFFFF),
}

HELLO = {
    "hello_valid": hello(),
    "ack": hello(magic=b"CCTA", frm=1, to=0),
    "hello_with_receiver": hello() + struct.pack("<IIQ", 1, 1, 0x1234_5678_9ABC_DEF0),
    "not_cclite": b"GET / HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
    "nsocks_17": hello(nsocks=17, idx=16),
    "bad_block": hello(block=4097),
    "negative_from": hello(frm=-1),
    "truncated": hello()[:39],
    # found by hello_fuzz: to_rank INT_MIN made reject_reason compute INT_MIN - 1
    "regress_to_rank_int_min": hello(job=0x1232A08765432110, frm=0x2500, to=-0x80000000, idx=1, nsocks=0x200,
                                     block=0x2000000) + b"\0",
}


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def payload(sections):
    out = b""
    for name, data in sections:
        out += struct.pack("<I", len(name)) + name + struct.pack("<Q", len(data)) + data
    return out


def ckpt_file(sections):
    body = payload(sections)
    head = b"CCLTCKPT" + struct.pack("<IIQI", 1, len(sections), len(body), crc32c(body))
    return head + struct.pack("<I", crc32c(head)) + body


def floats(*v):
    return struct.pack("<%df" % len(v), *v)


def u64(v):
    return struct.pack("<Q", v)


# What checkpoint_fuzz.cpp restores: a 3-2-2 MLP (fc1 2x3, fc2 2x2), SGD and
# AdamW state, a sampler over 10 samples (the sample's section names).
PARAMS = [(b"fc1.weight", 6), (b"fc1.bias", 2), (b"fc2.weight", 4), (b"fc2.bias", 2)]
MODEL = [(b"param." + n, floats(*[0.25 * i for i in range(k)])) for n, k in PARAMS]
SGD = [(b"optim.kind.sgd", u64(3))] + [(b"optim." + n + b".momentum", floats(*[0.5] * k)) for n, k in PARAMS]
ADAMW = [(b"optim.kind.adamw", u64(3))] + [
    (b"optim." + n + suffix, floats(*[0.125] * k)) for n, k in PARAMS for suffix in (b".exp_avg", b".exp_avg_sq")]
SAMPLER = [(b"sampler." + k, u64(v)) for k, v in
           ((b"seed", 7), (b"epoch", 2), (b"position", 3), (b"world_size", 2), (b"dataset_size", 10))]
# First byte even: the whole file; odd: a payload the harness wraps (second byte: section count).
CHECKPOINT = {
    "sgd_file": b"\0" + ckpt_file(MODEL + SGD + SAMPLER),
    "adamw_file": b"\0" + ckpt_file(MODEL + ADAMW + SAMPLER),
    "sgd_payload": b"\1" + bytes([len(MODEL + SGD + SAMPLER)]) + payload(MODEL + SGD + SAMPLER),
    "adamw_payload": b"\1" + bytes([len(MODEL + ADAMW + SAMPLER)]) + payload(MODEL + ADAMW + SAMPLER),
    "truncated_file": b"\0" + ckpt_file(MODEL + SGD)[:-5],
    "empty_file": b"\0" + ckpt_file([]),
}


def write(target, files):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


write("store_frame", STORE)
write("hello", HELLO)
write("checkpoint", CHECKPOINT)
