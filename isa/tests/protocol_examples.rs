//! Decodes every example datagram of docs/PROTOCOL.md and checks it says what the document says,
//! so the document and the code cannot drift apart. The authentication examples (`auth-…`) are
//! checked by `auth/tests/protocol_examples.rs`.

use netdam_isa::block::{decode_extents, Extent, EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};
use netdam_isa::control::{decode_hello_operand, Cookie, HelloRequest, COOKIE_LEN, HELLO_OPERAND_LEN, NO_COOKIE};
use netdam_isa::fuzzing::check_decode_round_trip;
use netdam_isa::wire::{Request, Response, HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};
use netdam_isa::{Opcode, Status};

const PROTOCOL: &str = include_str!("../../docs/PROTOCOL.md");

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

/// Examples named `auth-…` are checked by `auth/tests/protocol_examples.rs`, which can open
/// their MAC trailers.
const AUTH_PREFIX: &str = "```text example:auth-";

#[test]
fn every_example_in_the_document_is_checked() {
    let named = PROTOCOL.matches("```text example:").count() - PROTOCOL.matches(AUTH_PREFIX).count();
    assert_eq!(named, 19, "a new example in PROTOCOL.md needs its assertions here (or in the auth crate's)");
}

#[test]
fn ping_request_and_response() {
    let bytes = example("ping-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (0, 1, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, Opcode::Ping as u8);

    let bytes = example("ping-response");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!(response.header.ttl, 64);
    assert_eq!(response.header.service_time_ns, 1500);
    assert_eq!(response.status(), Status::Ok);
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status, result.data.len()), (Opcode::Ping as u8, Status::Ok, 0));
}

/// The cookie of the `hello-retry` example: issue time 12345 ns, then 16 MAC bytes. Only the
/// target that issued a cookie can check its MAC (it needs the target's secret), so this test
/// checks the layout, not the MAC.
fn example_cookie() -> Cookie {
    let mut cookie = NO_COOKIE;
    cookie[..8].copy_from_slice(&12345u64.to_le_bytes());
    cookie[8..].copy_from_slice(&[
        0x5f, 0x1c, 0x9a, 0x02, 0xe7, 0x44, 0xb3, 0x6d, 0x81, 0x0a, 0xc2, 0x3e, 0x97, 0x58, 0xf4, 0x21,
    ]);
    cookie
}

#[test]
fn hello_exchange_with_a_cookie() {
    let first = example("hello-request");
    check_decode_round_trip(&first);
    assert_eq!(first.len(), HEADER_LEN + INSTRUCTION_HEADER_LEN + HELLO_OPERAND_LEN);
    assert_eq!(first.len(), 152);
    let request = Request::parse(&first).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (0, 2, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, Opcode::Hello as u8);
    assert_eq!(
        decode_hello_operand(instruction.operand),
        Ok(HelloRequest { max_datagram_bytes: 9000, cookie: NO_COOKIE })
    );

    let retry = example("hello-retry");
    check_decode_round_trip(&retry);
    assert_eq!(retry.len(), HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + COOKIE_LEN);
    assert_eq!(retry.len(), 64);
    assert!(retry.len() <= first.len(), "the cookie answer is no longer than the HELLO: no amplification");
    let response = Response::parse(&retry).unwrap();
    assert_eq!((response.header.session, response.header.sequence, response.header.count), (0, 2, 1));
    assert_eq!((response.header.ttl, response.header.service_time_ns), (64, 1200));
    assert_eq!(response.status(), Status::Ok, "the datagram was executed; its HELLO was not granted");
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status), (Opcode::Hello as u8, Status::Retry));
    assert_eq!(result.data, example_cookie(), "a retry's data is the cookie");
    assert_eq!(u64::from_le_bytes(result.data[..8].try_into().unwrap()), 12345, "issue time in ns");

    let second = example("hello-with-cookie");
    check_decode_round_trip(&second);
    assert_eq!(second.len(), first.len(), "the first HELLO is as long as the second");
    let request = Request::parse(&second).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (0, 3, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, Opcode::Hello as u8);
    let hello = decode_hello_operand(instruction.operand).unwrap();
    assert_eq!(hello, HelloRequest { max_datagram_bytes: 9000, cookie: example_cookie() });
    assert_eq!(&instruction.operand[8..32], result.data, "the cookie is echoed at operand bytes 8..32");
}

#[test]
fn close_request_and_response() {
    let bytes = example("close-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (7, 6, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, Opcode::Close as u8);
    assert_eq!(
        (instruction.flags, instruction.space, instruction.offset, instruction.length, instruction.aux),
        (0, 0, 0, 0, 0),
        "CLOSE addresses nothing"
    );
    assert!(instruction.operand.is_empty());
    assert!(Opcode::Close.is_idempotent());

    let bytes = example("close-response");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!((response.header.session, response.header.sequence), (7, 6));
    assert_eq!((response.header.ttl, response.header.service_time_ns), (64, 900));
    assert_eq!(response.status(), Status::Ok);
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status, result.data.len()), (Opcode::Close as u8, Status::Ok, 0));
}

#[test]
fn new_numbers_are_the_documented_ones() {
    assert_eq!(Opcode::Close as u8, 0x04);
    assert_eq!((Status::Retry as u8, Status::Retry.name()), (0x0E, "retry"));
    assert_eq!((Status::SessionLimit as u8, Status::SessionLimit.name()), (0x0F, "session_limit"));
    assert_eq!((Status::NoSpace as u8, Status::NoSpace.name()), (0x10, "no_space"));
    assert_eq!((Status::AuthFailed as u8, Status::AuthFailed.name()), (0x12, "auth_failed"));
    assert_eq!((Status::NoSuchKey as u8, Status::NoSuchKey.name()), (0x13, "no_such_key"));
}

#[test]
fn encrypt_and_decrypt_exchange() {
    use netdam_isa::crypto::{self, Destination, Nonce, Seal, CRYPTO_FLAG_TO_DESTINATION, SEAL_LEN};

    let bytes = example("encrypt-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (7, 10, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, Opcode::Encrypt as u8);
    assert_eq!((instruction.space, instruction.offset, instruction.length), (0, 0x2000, 4096));
    let encrypt = crypto::decode(&instruction).unwrap();
    assert_eq!((encrypt.decrypt, encrypt.slot, encrypt.seal, encrypt.destination), (false, 1, None, None));
    assert_eq!(encrypt.aad, b"vol7");
    assert!(!instruction.is_idempotent(), "ENCRYPT is at most once");

    let bytes = example("encrypt-response");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!((response.header.sequence, response.header.service_time_ns), (10, 3100));
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status, result.data.len()), (Opcode::Encrypt as u8, Status::Ok, SEAL_LEN));
    let seal = Seal::from_bytes(result.data).unwrap();
    assert_eq!(seal.nonce, Nonce { key_version: 1, counter: 65_536 });
    assert_eq!(seal.tag[0], 0x9c);

    let bytes = example("decrypt-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    assert_eq!((request.header.session, request.header.sequence), (7, 11));
    let instruction = request.instructions().next().unwrap();
    assert_eq!((instruction.opcode, instruction.flags), (Opcode::Decrypt as u8, CRYPTO_FLAG_TO_DESTINATION));
    assert_eq!((instruction.space, instruction.offset, instruction.length, instruction.aux), (0, 0x2000, 4096, 1));
    let decrypt = crypto::decode(&instruction).unwrap();
    assert_eq!(decrypt.seal, Some(seal), "DECRYPT carries ENCRYPT's seal back");
    assert_eq!(decrypt.destination, Some(Destination { space: 1, offset: 0x400 }));
    assert_eq!(decrypt.aad, b"vol7");
    assert!(instruction.is_idempotent(), "DECRYPT to a separate destination may run again");

    let bytes = example("decrypt-response");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!((response.header.sequence, response.header.service_time_ns), (11, 2900));
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status, result.data.len()), (Opcode::Decrypt as u8, Status::AuthFailed, 0));
}

#[test]
fn read_request() {
    let bytes = example("read-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    assert_eq!((request.header.session, request.header.sequence), (7, 3));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(
        (instruction.opcode, instruction.space, instruction.offset, instruction.length),
        (Opcode::Read as u8, 0, 0x1000, 64)
    );
}

#[test]
fn two_instructions_and_their_results() {
    let bytes = example("write-fetch-add-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    let instructions: Vec<_> = request.instructions().collect();
    assert_eq!(instructions.len(), 2);
    assert_eq!(
        (instructions[0].opcode, instructions[0].offset, instructions[0].operand),
        (Opcode::Write as u8, 16, &b"netdam!!"[..])
    );
    assert_eq!((instructions[1].opcode, instructions[1].offset), (Opcode::FetchAdd as u8, 8));
    assert_eq!(instructions[1].operand, 1u64.to_le_bytes());

    let bytes = example("write-fetch-add-response");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!((response.header.sequence, response.header.service_time_ns, response.header.queue_depth), (4, 2100, 1));
    let results: Vec<_> = response.results().collect();
    assert_eq!((results[0].opcode, results[0].status, results[0].data.len()), (Opcode::Write as u8, Status::Ok, 0));
    assert_eq!((results[1].opcode, results[1].data), (Opcode::FetchAdd as u8, &41u64.to_le_bytes()[..]));
}

#[test]
fn block_status_request_and_its_extents() {
    let bytes = example("block-status-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (7, 8, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(
        (
            instruction.opcode,
            instruction.flags,
            instruction.space,
            instruction.offset,
            instruction.length,
            instruction.aux
        ),
        (Opcode::BlockStatus as u8, 0, 0, 0, 256, 0)
    );
    assert!(instruction.operand.is_empty());
    assert!(Opcode::BlockStatus.is_idempotent() && Opcode::BlockStatus.is_block());
    assert_eq!(Opcode::BlockStatus as u8, 0x45);

    let bytes = example("block-status-response");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!((response.header.session, response.header.sequence), (7, 8));
    assert_eq!((response.header.ttl, response.header.service_time_ns), (64, 4200));
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status, result.data.len()), (Opcode::BlockStatus as u8, Status::Ok, 24));
    let extents = decode_extents(result.data, instruction.length).unwrap();
    assert_eq!(
        extents,
        [
            Extent { num_blocks: 8, flags: 0 },
            Extent { num_blocks: 120, flags: EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO },
            Extent { num_blocks: 128, flags: 0 },
        ]
    );
    assert_eq!(extents.iter().map(|extent| extent.num_blocks).sum::<u32>(), 256, "the whole range is covered");
}

#[test]
fn unsupported_version_answer() {
    let bytes = example("unsupported-version-answer");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!(response.status(), Status::UnsupportedVersion);
    assert_eq!((response.header.session, response.header.sequence, response.header.count), (7, 5, 0));
}

#[test]
fn reduce_request_and_answer() {
    use netdam_isa::extension::reduce::{reduce_aux, ReduceOp, REDUCE_ANSWER_BYTES, REDUCE_OPCODE};
    let bytes = example("reduce-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    assert_eq!((request.header.session, request.header.sequence, request.header.count), (7, 9, 1));
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, REDUCE_OPCODE);
    assert_eq!((instruction.space, instruction.offset, instruction.length), (0, 0x100, 16));
    assert_eq!(instruction.aux, reduce_aux(netdam_isa::LaneType::I32, ReduceOp::Sum));
    assert!(instruction.operand.is_empty());

    let bytes = example("reduce-response");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!(response.header.service_time_ns, 1200);
    let result = response.results().next().unwrap();
    assert_eq!((result.opcode, result.status, result.data.len()), (REDUCE_OPCODE, Status::Ok, REDUCE_ANSWER_BYTES));
    assert_eq!(i64::from_le_bytes(result.data.try_into().unwrap()), 42);
}
