//! Replays the fuzz corpus (`isa/fuzz/corpus/decode/`) through the fuzz target's property, so
//! every input the fuzzer ever kept stays checked by a plain `cargo test`.

use std::path::Path;

use netdam_isa::fuzzing::check_decode_round_trip;
use netdam_isa::wire::{Request, Response};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/decode");

#[test]
fn fuzz_corpus_replays_clean() {
    let mut inputs = 0;
    let mut decoded = 0;
    for entry in std::fs::read_dir(CORPUS).expect("the fuzz corpus is checked in") {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        check_decode_round_trip(&bytes);
        inputs += 1;
        if Request::parse(&bytes).is_ok() || Response::parse(&bytes).is_ok() {
            decoded += 1;
        }
    }
    println!("replayed {inputs} corpus inputs, {decoded} of them well-formed");
    assert!(inputs >= 20, "the corpus holds at least the seed inputs");
    assert!(decoded >= 10, "the corpus reaches past the framing checks");
}

/// Writes the seed inputs: one well-formed request per opcode, responses, and framing errors.
/// Run with `cargo test -p netdam-isa --test fuzz_corpus -- --ignored` after changing the format.
#[test]
#[ignore]
fn regenerate_seed_corpus() {
    use netdam_isa::wire::{Instruction, RequestBuilder, ResponseWriter};
    use netdam_isa::{Opcode, Status};
    let dir = Path::new(CORPUS);
    std::fs::create_dir_all(dir).unwrap();
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    for opcode in Opcode::ALL {
        let operand = [0x11u8; 16];
        let mut buffer = [0u8; 256];
        let mut builder = RequestBuilder::new(&mut buffer, 7, 42).unwrap();
        let instruction =
            Instruction { opcode: opcode as u8, flags: 0, space: 1, offset: 64, length: 16, aux: 0, operand: &operand };
        builder.push(&instruction).unwrap();
        builder
            .push(&Instruction {
                opcode: Opcode::Ping as u8,
                length: 0,
                offset: 0,
                space: 0,
                operand: &[],
                ..instruction
            })
            .unwrap();
        let len = builder.finish();
        write(&format!("request-{}", opcode.name()), &buffer[..len]);
        let mut short = buffer;
        short[2] = 2;
        write(&format!("version-{}", opcode.name()), &short[..len]);
    }
    for status in Status::ALL {
        let mut buffer = [0u8; 128];
        let mut writer = ResponseWriter::new(&mut buffer, 7, 42);
        writer.data_area()[..4].copy_from_slice(&[1, 2, 3, 4]);
        writer.commit(Opcode::Read as u8, status, 4);
        let len = writer.finish(64, 1234, 2);
        write(&format!("response-{}", status.name()), &buffer[..len]);
    }
    write("empty", &[]);
    write("magic-only", &[0x4E, 0x44, 0x01]);
}
