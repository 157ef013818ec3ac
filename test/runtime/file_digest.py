#!/usr/bin/env python3
"""The digest in a stratagem HDF5 file's user block (src/io/file_digest.hpp), written
independently of the C++ code, for the tests:

  file_digest.py check FILE   exit 0 if FILE's digest, recomputed here, matches what it holds
  file_digest.py seal FILE [BLOCK_BYTES]
                              rewrites FILE's digest for its current bytes (a test that edits
                              a checkpoint with h5py reseals it, so that the edit reaches the
                              checks behind the digest: dataset checksums, metadata); a file
                              without one yet needs its user block's size
"""
import struct
import sys

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
MAGIC = b"STRATAGEM-DIGEST"
HEADER = 64


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def rnd(acc, lane):
    return (rotl((acc + lane * P2) & M, 31) * P1) & M


def xxh64(data, seed):
    n = len(data)
    i = 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        lanes = struct.unpack_from("<%dQ" % (n // 32 * 4), data)
        for j in range(0, len(lanes), 4):
            v[0] = rnd(v[0], lanes[j])
            v[1] = rnd(v[1], lanes[j + 1])
            v[2] = rnd(v[2], lanes[j + 2])
            v[3] = rnd(v[3], lanes[j + 3])
        i = n // 32 * 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for a in v:
            h = (((h ^ rnd(0, a)) * P1) + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while n - i >= 8:
        (k,) = struct.unpack_from("<Q", data, i)
        h = (rotl(h ^ rnd(0, k), 27) * P1 + P4) & M
        i += 8
    if n - i >= 4:
        (k,) = struct.unpack_from("<I", data, i)
        h = (rotl(h ^ ((k * P1) & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ ((data[i] * P5) & M), 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return h ^ (h >> 32)


def digest(data, block, chunk):
    room = (block - HEADER) // 8
    count = lambda c: (len(data) - block + c - 1) // c
    while count(chunk) > room:
        chunk *= 2
    hashes = [xxh64(data[block + i * chunk:block + (i + 1) * chunk], i) for i in range(count(chunk))]
    head = MAGIC + struct.pack("<5Q", 1, block, len(data), chunk, len(hashes))
    body = struct.pack("<%dQ" % len(hashes), *hashes)
    out = head + struct.pack("<Q", xxh64(head + body, 0)) + body
    return out + bytes(block - len(out))  # the rest of the user block: zeros


def main():
    mode, path = sys.argv[1], sys.argv[2]
    data = open(path, "rb").read()
    if data[:16] == MAGIC:
        _, block, _, chunk, _ = struct.unpack_from("<5Q", data, 16)
    elif mode == "seal" and len(sys.argv) > 3:  # a file with a user block of that size
        block, chunk = int(sys.argv[3]), 64 << 20
    else:
        sys.exit(path + ": no digest")
    want = digest(data, block, chunk)
    if mode == "check":
        if data[:len(want)] != want:
            sys.exit(path + ": digest differs from the one recomputed here")
    elif mode == "seal":
        with open(path, "r+b") as f:
            f.write(want)
    else:
        sys.exit("usage: file_digest.py check|seal FILE [BLOCK_BYTES]")


if __name__ == "__main__":
    main()
