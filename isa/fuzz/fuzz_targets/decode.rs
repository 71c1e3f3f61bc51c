//! Decoding untrusted bytes never panics, and whatever decodes re-encodes to the same bytes.
//! The corpus in `corpus/decode/` is replayed by `isa/tests/fuzz_corpus.rs` in every test run.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    netdam_isa::fuzzing::check_decode_round_trip(bytes);
});
