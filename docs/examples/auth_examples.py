#!/usr/bin/env python3
"""The authentication examples of docs/PROTOCOL.md, from an encoder independent of the Rust code.

It is written from the text of PROTOCOL.md ("Authentication" and the datagram layout) with
nothing but the standard library's hmac, hashlib and struct and the AES-GCM of the
`cryptography` package, so the examples check the document against the Rust implementation
(auth/tests/protocol_examples.rs decodes and verifies them) rather than the Rust code against
itself.

    python3 docs/examples/auth_examples.py                          # print the example blocks
    python3 docs/examples/auth_examples.py --check docs/PROTOCOL.md  # compare with the document
"""

import hashlib
import hmac
import struct
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

# --- The fixed inputs of the examples --------------------------------------------------------

TENANT_KEY = bytes([0x11] * 32)
TENANT = 2
KEY_VERSION = 1
# The cookie of the `hello-retry` example: issue time 12345 ns, then the target's 16-byte MAC.
COOKIE = struct.pack("<Q", 12345) + bytes.fromhex("5f1c9a02e744b36d810ac23e9758f421")
NONCE = bytes(range(0xA0, 0xB0))
REQUESTED_DATAGRAM_BYTES = 9000
METHOD_MAC = 1
SESSION = 7
HELLO_SEQUENCE = 3
READ_SEQUENCE = 4
READ_OFFSET = 0x1000
READ_BYTES = 64
READ_DATA = bytes(range(READ_BYTES))
REGION_BYTES = 1 << 20

# --- Protocol constants (PROTOCOL.md) ---------------------------------------------------------

MAGIC = b"ND"
VERSION = 1
FLAG_RESPONSE = 0x01
FLAG_SEALED = 0x02
OP_HELLO = 0x01
OP_READ = 0x10
STATUS_OK = 0x00
PROOF_LABEL = b"netdam-hello-v1"
SESSION_SALT = b"netdam-session-v1"
TTL = 64


def crc32c(data):
    """CRC-32C, Castagnoli (reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def header(flags, session, sequence, count, status=0, ttl=0, service_ns=0, depth=0, queueing_us=0):
    """The 32-byte header with its CRC field 0."""
    return struct.pack(
        "<2sBBIQHBBIHHI", MAGIC, VERSION, flags, session, sequence, count, status, ttl, service_ns, depth, queueing_us, 0
    )


def with_crc(datagram):
    """An unsealed datagram: the CRC over bytes 0..28 and 32..end goes into bytes 28..32."""
    crc = crc32c(datagram[:28] + datagram[32:])
    return datagram[:28] + struct.pack("<I", crc) + datagram[32:]


def instruction(opcode, space=0, offset=0, length=0, aux=0, flags=0, operand=b""):
    return struct.pack("<BBHIQII", opcode, flags, space, len(operand), offset, length, aux) + operand


def result(opcode, status, data=b""):
    return struct.pack("<BBHI", opcode, status, 0, len(data)) + data


def hkdf_sha256(salt, ikm, info, length):
    """RFC 5869."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


def proof(key, cookie, nonce, tenant, key_version, method, requested_bytes):
    message = PROOF_LABEL + cookie + nonce + struct.pack("<IIBI", tenant, key_version, method, requested_bytes)
    return hmac.new(key, message, hashlib.sha256).digest()


def session_keys(key, cookie, nonce, tenant, session):
    """(request key, response key) of session `session`."""
    okm = hkdf_sha256(SESSION_SALT, key, cookie + nonce + struct.pack("<II", tenant, session), 64)
    return okm[:32], okm[32:]


def seal(direction_key, counter, datagram):
    """Sets FLAG_SEALED, zeroes the CRC field and appends counter and tag: the tag AES-256-GCM
    gives for the body (after the 32-byte header) as plaintext, with header and counter as
    associated data. The ciphertext is not sent."""
    flags = datagram[3] | FLAG_SEALED
    head = datagram[:3] + bytes([flags]) + datagram[4:28] + bytes(4)
    body = datagram[32:]
    counter_bytes = struct.pack("<Q", counter)
    nonce = counter_bytes + bytes(4)
    tag = AESGCM(direction_key).encrypt(nonce, body, head + counter_bytes)[-16:]
    assert len(tag) == 16
    return head + body + counter_bytes + tag


def examples():
    area = (
        struct.pack("<II", TENANT, KEY_VERSION)
        + NONCE
        + proof(TENANT_KEY, COOKIE, NONCE, TENANT, KEY_VERSION, METHOD_MAC, REQUESTED_DATAGRAM_BYTES)
        + bytes(8)
    )
    assert len(area) == 64
    operand = struct.pack("<IB3x", REQUESTED_DATAGRAM_BYTES, METHOD_MAC) + COOKIE + area
    assert len(operand) == 96
    hello = with_crc(header(0, 0, HELLO_SEQUENCE, 1) + instruction(OP_HELLO, operand=operand))

    request_key, response_key = session_keys(TENANT_KEY, COOKIE, NONCE, TENANT, SESSION)

    # The `ok` answer: session 7, 9000 bytes, 64 instructions, one region "default" of 1 MiB, no
    # namespace, target flags 0. Its header names the new session (the keys are derived with its
    # id); it is the first datagram sealed with the response key: counter 0.
    name = b"default"
    data = struct.pack("<IIHHHH", SESSION, REQUESTED_DATAGRAM_BYTES, 64, 1, 0, 0)
    data += struct.pack("<HBBQ", 0, 0, len(name), REGION_BYTES) + name
    hello_answer = seal(
        response_key,
        0,
        header(FLAG_RESPONSE, SESSION, HELLO_SEQUENCE, 1, ttl=TTL, service_ns=2500) + result(OP_HELLO, STATUS_OK, data),
    )

    # The first request of the session: the initiator's counter 0.
    read = seal(
        request_key,
        0,
        header(0, SESSION, READ_SEQUENCE, 1) + instruction(OP_READ, offset=READ_OFFSET, length=READ_BYTES),
    )
    # Its answer: the target's second sealed datagram, counter 1.
    read_answer = seal(
        response_key,
        1,
        header(FLAG_RESPONSE, SESSION, READ_SEQUENCE, 1, ttl=TTL, service_ns=1500) + result(OP_READ, STATUS_OK, READ_DATA),
    )
    return [
        ("auth-hello-request", hello),
        ("auth-hello-answer", hello_answer),
        ("auth-read-request", read),
        ("auth-read-response", read_answer),
    ]


def block(name, datagram):
    lines = [" ".join(f"{byte:02x}" for byte in datagram[at : at + 16]) for at in range(0, len(datagram), 16)]
    return f"```text example:{name}\n" + "\n".join(lines) + "\n```\n"


def main(argv):
    blocks = [block(name, datagram) for name, datagram in examples()]
    if len(argv) == 3 and argv[1] == "--check":
        with open(argv[2], encoding="utf-8") as document:
            text = document.read()
        missing = [one.splitlines()[0] for one in blocks if one not in text]
        for fence in missing:
            print(f"{argv[2]}: {fence} differs from the encoder's (or is missing)", file=sys.stderr)
        return 1 if missing else 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(blocks), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
