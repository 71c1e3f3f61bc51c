//! Decode of encode is identity; decode never panics on arbitrary or mutated bytes.

use netdam_isa::fuzzing::check_decode_round_trip;
use netdam_isa::wire::{DecodeError, Instruction, Request, RequestBuilder, Response, ResponseWriter, HEADER_LEN};
use netdam_isa::Status;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct OwnedInstruction {
    opcode: u8,
    flags: u8,
    space: u16,
    offset: u64,
    length: u32,
    aux: u32,
    operand: Vec<u8>,
}

fn instruction_strategy() -> impl Strategy<Value = OwnedInstruction> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(opcode, flags, space, offset, length, aux, operand)| OwnedInstruction {
            opcode,
            flags,
            space,
            offset,
            length,
            aux,
            operand,
        })
}

fn encode(session: u32, sequence: u64, instructions: &[OwnedInstruction]) -> Vec<u8> {
    let mut buf = vec![0u8; 65_536];
    let mut builder = RequestBuilder::new(&mut buf, session, sequence).unwrap();
    for owned in instructions {
        builder
            .push(&Instruction {
                opcode: owned.opcode,
                flags: owned.flags,
                space: owned.space,
                offset: owned.offset,
                length: owned.length,
                aux: owned.aux,
                operand: &owned.operand,
            })
            .unwrap();
    }
    let len = builder.finish();
    buf.truncate(len);
    buf
}

proptest! {
    #[test]
    fn request_decode_of_encode_is_identity(session: u32, sequence: u64, instructions in proptest::collection::vec(instruction_strategy(), 1..16)) {
        let bytes = encode(session, sequence, &instructions);
        let request = Request::parse(&bytes).unwrap();
        prop_assert_eq!(request.header.session, session);
        prop_assert_eq!(request.header.sequence, sequence);
        let decoded: Vec<_> = request.instructions().collect();
        prop_assert_eq!(decoded.len(), instructions.len());
        for (got, want) in decoded.iter().zip(&instructions) {
            prop_assert_eq!(got.opcode, want.opcode);
            prop_assert_eq!(got.flags, want.flags);
            prop_assert_eq!(got.space, want.space);
            prop_assert_eq!(got.offset, want.offset);
            prop_assert_eq!(got.length, want.length);
            prop_assert_eq!(got.aux, want.aux);
            prop_assert_eq!(got.operand, &want.operand[..]);
        }
        check_decode_round_trip(&bytes);
    }

    #[test]
    fn response_decode_of_encode_is_identity(
        session: u32, sequence: u64, ttl: u8, service: u32, depth: u16,
        results in proptest::collection::vec((any::<u8>(), 0usize..14, proptest::collection::vec(any::<u8>(), 0..64)), 0..16),
    ) {
        let mut buf = vec![0u8; 65_536];
        let mut writer = ResponseWriter::new(&mut buf, session, sequence);
        for (opcode, status, data) in &results {
            writer.data_area()[..data.len()].copy_from_slice(data);
            writer.commit(*opcode, Status::ALL[*status], data.len());
        }
        let len = writer.finish(ttl, service, depth);
        let response = Response::parse(&buf[..len]).unwrap();
        prop_assert_eq!(response.header.ttl, ttl);
        prop_assert_eq!(response.header.service_time_ns, service);
        prop_assert_eq!(response.header.queue_depth, depth);
        let decoded: Vec<_> = response.results().collect();
        prop_assert_eq!(decoded.len(), results.len());
        for (got, (opcode, status, data)) in decoded.iter().zip(&results) {
            prop_assert_eq!(got.opcode, *opcode);
            prop_assert_eq!(got.status, Status::ALL[*status]);
            prop_assert_eq!(got.data, &data[..]);
        }
        // Read again without the checks, as a reply is: the same header and results.
        let again = Response::parse_checked_before(&buf[..len]);
        prop_assert_eq!(again.header, response.header);
        prop_assert!(again.results().eq(response.results()));
        check_decode_round_trip(&buf[..len]);
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_decode_round_trip(&bytes);
    }

    #[test]
    fn decode_never_panics_on_mutated_requests(
        instructions in proptest::collection::vec(instruction_strategy(), 1..4),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut bytes = encode(1, 2, &instructions);
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        check_decode_round_trip(&bytes);
        let cut = cut % (bytes.len() + 1);
        check_decode_round_trip(&bytes[..cut]);
    }
}

#[test]
fn framing_errors_are_named() {
    let good = encode(
        1,
        1,
        &[OwnedInstruction { opcode: 0x10, flags: 0, space: 0, offset: 0, length: 8, aux: 0, operand: vec![] }],
    );
    assert!(Request::parse(&good).is_ok());
    assert_eq!(Request::parse(&good[..HEADER_LEN - 1]).unwrap_err(), DecodeError::TooShort);
    let mut bad_magic = good.clone();
    bad_magic[0] = 0;
    assert_eq!(Request::parse(&bad_magic).unwrap_err(), DecodeError::BadMagic);
    let mut version = good.clone();
    version[2] = 9;
    assert_eq!(Request::parse(&version).unwrap_err(), DecodeError::UnsupportedVersion(9));
    let mut garbled = good.clone();
    garbled[40] ^= 1;
    assert_eq!(Request::parse(&garbled).unwrap_err(), DecodeError::BadCrc);
    // A trailing byte under a CRC that covers it is a framing error, not a CRC error.
    let mut trailing = good.clone();
    trailing.push(0);
    let crc = netdam_isa::wire::datagram_crc(&trailing);
    trailing[28..32].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(Request::parse(&trailing).unwrap_err(), DecodeError::TrailingBytes);
    // A response is never taken for a request.
    let mut response = vec![0u8; 64];
    let len = ResponseWriter::new(&mut response, 1, 1).finish(0, 0, 0);
    assert_eq!(Request::parse(&response[..len]).unwrap_err(), DecodeError::WrongDirection);
}
