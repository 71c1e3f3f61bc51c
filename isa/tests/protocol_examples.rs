//! Decodes every example datagram of docs/PROTOCOL.md and checks it says what the document says,
//! so the document and the code cannot drift apart.

use netdam_isa::control::decode_hello_operand;
use netdam_isa::fuzzing::check_decode_round_trip;
use netdam_isa::wire::{Request, Response};
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

#[test]
fn every_example_in_the_document_is_checked() {
    let named = PROTOCOL.matches("```text example:").count();
    assert_eq!(named, 7, "a new example in PROTOCOL.md needs its assertions here");
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

#[test]
fn hello_request() {
    let bytes = example("hello-request");
    check_decode_round_trip(&bytes);
    let request = Request::parse(&bytes).unwrap();
    let instruction = request.instructions().next().unwrap();
    assert_eq!(instruction.opcode, Opcode::Hello as u8);
    assert_eq!(decode_hello_operand(instruction.operand), Ok(9000));
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
fn unsupported_version_answer() {
    let bytes = example("unsupported-version-answer");
    check_decode_round_trip(&bytes);
    let response = Response::parse(&bytes).unwrap();
    assert_eq!(response.status(), Status::UnsupportedVersion);
    assert_eq!((response.header.session, response.header.sequence, response.header.count), (7, 5, 0));
}
