//! Checks the authentication examples of docs/PROTOCOL.md, whose bytes an encoder independent
//! of this code produced (docs/examples/auth_examples.py, from the document's text): the proof
//! verifies, the session keys derived here open the trailers, the fields are the documented
//! ones, and this code seals the same bytes. The other examples are checked by
//! `isa/tests/protocol_examples.rs`.

use netdam_auth::hello::{NONCE_BYTES, PROOF_BYTES};
use netdam_auth::trailer::{self, TrailerError, COUNTER_BYTES, TAG_BYTES};
use netdam_auth::{method, HelloAuth, TenantKey, TRAILER_BYTES};
use netdam_isa::control::{
    decode_hello_answer, decode_hello_auth, decode_hello_operand, encode_hello_operand_with, Cookie, HelloRequest,
    RegionInfo, HELLO_AUTH_LEN, HELLO_AUTH_MAC, HELLO_OPERAND_LEN, NO_COOKIE,
};
use netdam_isa::wire::{
    mark_sealed, peek_is_sealed, Instruction, Request, RequestBuilder, Response, ResponseWriter, FLAG_RESPONSE,
    FLAG_SEALED, HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN,
};
use netdam_isa::{Opcode, Status};

const PROTOCOL: &str = include_str!("../../docs/PROTOCOL.md");

/// Names of the authentication examples start with this; `isa/tests/protocol_examples.rs`
/// checks the others.
const PREFIX: &str = "```text example:auth-";

/// The fixed inputs the document states for its examples.
const KEY: TenantKey = TenantKey::from_bytes([0x11; 32]);
const TENANT: u32 = 2;
const KEY_VERSION: u32 = 1;
const NONCE: [u8; NONCE_BYTES] =
    [0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf];
const REQUESTED_BYTES: u32 = 9000;
const SESSION: u32 = 7;

/// The cookie of the `hello-retry` example, which the authenticated HELLO echoes.
fn cookie() -> Cookie {
    let mut cookie = NO_COOKIE;
    cookie[..8].copy_from_slice(&12345u64.to_le_bytes());
    cookie[8..].copy_from_slice(&[
        0x5f, 0x1c, 0x9a, 0x02, 0xe7, 0x44, 0xb3, 0x6d, 0x81, 0x0a, 0xc2, 0x3e, 0x97, 0x58, 0xf4, 0x21,
    ]);
    cookie
}

/// The bytes of the example block named `name`.
fn example(name: &str) -> Vec<u8> {
    let fence = format!("```text example:{name}\n");
    let start = PROTOCOL.find(&fence).unwrap_or_else(|| panic!("PROTOCOL.md has no example {name}")) + fence.len();
    let end = start + PROTOCOL[start..].find("```").expect("example block is closed");
    PROTOCOL[start..end]
        .split_whitespace()
        .map(|byte| u8::from_str_radix(byte, 16).unwrap_or_else(|_| panic!("{name}: {byte:?} is not a hex byte")))
        .collect()
}

/// The counter a sealed datagram's trailer carries.
fn counter(datagram: &[u8]) -> u64 {
    let at = datagram.len() - TRAILER_BYTES;
    u64::from_le_bytes(datagram[at..at + COUNTER_BYTES].try_into().unwrap())
}

/// The authentication area the example HELLO carries, decoded.
fn hello_area() -> HelloAuth {
    let hello = example("auth-hello-request");
    let request = Request::parse(&hello).unwrap();
    let instruction = request.instructions().next().unwrap();
    let (method, area) = decode_hello_auth(instruction.operand);
    assert_eq!(method, HELLO_AUTH_MAC);
    HelloAuth::decode(&area).expect("reserved bytes are zero")
}

#[test]
fn every_authentication_example_is_checked() {
    assert_eq!(PROTOCOL.matches(PREFIX).count(), 4, "a new auth- example in PROTOCOL.md needs its assertions here");
}

#[test]
fn the_authenticated_hello_carries_a_proof_of_the_tenant_key() {
    let bytes = example("auth-hello-request");
    assert_eq!(bytes.len(), HEADER_LEN + INSTRUCTION_HEADER_LEN + HELLO_OPERAND_LEN);
    assert!(!peek_is_sealed(&bytes), "a HELLO is never sealed: no session keys exist yet");
    let request = Request::parse(&bytes).expect("a HELLO carries a CRC like any unsealed datagram");
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (0, 3, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, Opcode::Hello as u8);
    assert_eq!(
        decode_hello_operand(instruction.operand),
        Ok(HelloRequest { max_datagram_bytes: REQUESTED_BYTES, cookie: cookie() })
    );
    assert_eq!(instruction.operand[4], method::MAC, "operand byte 4: the method");
    assert_eq!(method::MAC, HELLO_AUTH_MAC);

    let area = hello_area();
    assert_eq!((area.tenant, area.key_version, area.nonce), (TENANT, KEY_VERSION, NONCE));
    assert_eq!(area.proof.len(), PROOF_BYTES);
    assert!(area.verify(&KEY, &cookie(), method::MAC, REQUESTED_BYTES), "the independent encoder's proof verifies");
    assert!(!area.verify(&TenantKey::from_bytes([0x12; 32]), &cookie(), method::MAC, REQUESTED_BYTES), "another key");
    assert!(!area.verify(&KEY, &NO_COOKIE, method::MAC, REQUESTED_BYTES), "another cookie");
    assert!(!area.verify(&KEY, &cookie(), method::MAC, 4096), "another requested size");

    // This code's encoder makes the same operand from the same inputs.
    let ours = HelloAuth::with_nonce(&KEY, TENANT, KEY_VERSION, &cookie(), method::MAC, REQUESTED_BYTES, NONCE);
    assert_eq!(ours, area);
    let hello = HelloRequest { max_datagram_bytes: REQUESTED_BYTES, cookie: cookie() };
    let operand = encode_hello_operand_with(&hello, HELLO_AUTH_MAC, &ours.encode());
    assert_eq!(instruction.operand, operand);
    assert_eq!(&operand[32 + 56..], &[0; HELLO_AUTH_LEN - 56], "8 reserved zero bytes end the area");
}

#[test]
fn the_hello_answer_is_sealed_with_the_new_sessions_response_key() {
    let keys = hello_area().session_keys(&KEY, &cookie(), SESSION);
    let bytes = example("auth-hello-answer");
    assert!(peek_is_sealed(&bytes));
    assert_eq!(bytes[3], FLAG_RESPONSE | FLAG_SEALED);
    assert_eq!(&bytes[28..32], &[0; 4], "the CRC field of a sealed datagram is 0");
    assert_eq!(counter(&bytes), 0, "the first datagram the target seals in this session");
    assert_eq!(trailer::open(&keys.request, &bytes), Err(TrailerError::BadTag), "not the request key");
    let len = trailer::open(&keys.response, &bytes).expect("the response key opens it");
    assert_eq!(len, bytes.len() - COUNTER_BYTES - TAG_BYTES);
    let response = Response::parse_opened(&bytes[..len]).unwrap();
    assert_eq!(
        (response.header.session, response.header.sequence, response.header.count),
        (SESSION, 3, 1),
        "the header names the session it opens"
    );
    assert_eq!((response.header.ttl, response.header.service_time_ns), (64, 2500));
    assert_eq!(response.status(), Status::Ok);
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status), (Opcode::Hello as u8, Status::Ok));
    let answer = decode_hello_answer(result.data).unwrap();
    assert_eq!((answer.session, answer.max_datagram_bytes, answer.max_instructions), (SESSION, 9000, 64));
    assert_eq!(answer.target_flags, 0);
    assert_eq!(answer.regions, [RegionInfo { id: 0, name: "default".into(), size_bytes: 1 << 20, persistent: false }]);
    assert!(answer.namespaces.is_empty());
    // Unsealed, the same bytes are refused: a sealed datagram carries no CRC.
    assert!(Response::parse(&bytes[..len]).is_err());
}

/// A READ of 64 bytes at `0x1000` of region 0.
fn read() -> Instruction<'static> {
    Instruction { opcode: Opcode::Read as u8, flags: 0, space: 0, offset: 0x1000, length: 64, aux: 0, operand: &[] }
}

#[test]
fn a_sealed_read_and_its_sealed_answer() {
    let keys = hello_area().session_keys(&KEY, &cookie(), SESSION);

    let bytes = example("auth-read-request");
    assert_eq!(bytes.len(), HEADER_LEN + INSTRUCTION_HEADER_LEN + TRAILER_BYTES);
    assert_eq!((bytes[3], &bytes[28..32]), (FLAG_SEALED, &[0u8; 4][..]));
    assert_eq!(counter(&bytes), 0, "the initiator's first sealed datagram");
    assert_eq!(trailer::open(&keys.response, &bytes), Err(TrailerError::BadTag), "not the response key");
    let len = trailer::open(&keys.request, &bytes).expect("the request key opens it");
    assert!(Request::parse(&bytes[..len]).is_err(), "its CRC field is 0: only the MAC vouches for it");
    let request = Request::parse_opened(&bytes[..len]).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (SESSION, 4, 1));
    assert_eq!(request.instructions().next().unwrap(), read());
    for bit in [0, 8 * 4, 8 * 48, 8 * len, 8 * bytes.len() - 1] {
        let mut altered = bytes.clone();
        altered[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(trailer::open(&keys.request, &altered), Err(TrailerError::BadTag), "bit {bit}");
    }
    // This code seals the same bytes.
    let mut ours = vec![0u8; 256];
    let mut builder = RequestBuilder::new(&mut ours, SESSION, 4).unwrap();
    builder.push(&read()).unwrap();
    let plain = builder.finish();
    mark_sealed(&mut ours[..plain]);
    let sealed = trailer::seal(&keys.request, 0, &mut ours, plain).unwrap();
    assert_eq!(ours[..sealed], bytes[..]);

    let bytes = example("auth-read-response");
    assert_eq!(bytes.len(), HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + 64 + TRAILER_BYTES);
    assert_eq!(bytes[3], FLAG_RESPONSE | FLAG_SEALED);
    assert_eq!(counter(&bytes), 1, "counter 0 of the response key sealed the HELLO's answer");
    assert_eq!(trailer::open(&keys.request, &bytes), Err(TrailerError::BadTag));
    let len = trailer::open(&keys.response, &bytes).expect("the response key opens it");
    let response = Response::parse_opened(&bytes[..len]).unwrap();
    assert_eq!((response.header.session, response.header.sequence), (SESSION, 4));
    assert_eq!((response.header.ttl, response.header.service_time_ns), (64, 1500));
    let result = response.results().next().unwrap();
    let data: Vec<u8> = (0..64).collect();
    assert_eq!((result.opcode, result.status, result.data), (Opcode::Read as u8, Status::Ok, &data[..]));
    let mut ours = vec![0u8; 256];
    let mut writer = ResponseWriter::new(&mut ours[..256 - TRAILER_BYTES], SESSION, 4);
    writer.data_area()[..64].copy_from_slice(&data);
    writer.commit(Opcode::Read as u8, Status::Ok, 64);
    let plain = writer.finish(64, 1500, 0);
    mark_sealed(&mut ours[..plain]);
    let sealed = trailer::seal(&keys.response, 1, &mut ours, plain).unwrap();
    assert_eq!(ours[..sealed], bytes[..]);
}
