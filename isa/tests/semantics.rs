//! Reference semantics of every memory and compute instruction, and the status of each bad form.

use netdam_isa::memory::SharedMemory;
use netdam_isa::opcode::VADD_FLAG_RETURN_RESULT;
use netdam_isa::semantics::{bf16_to_f32, execute, f32_to_bf16, AddressSpaces, Outcome, Written};
use netdam_isa::wire::Instruction;
use netdam_isa::{LaneType, Opcode, Status};

struct Spaces<'a> {
    regions: Vec<SharedMemory<'a>>,
}

impl AddressSpaces for Spaces<'_> {
    fn memory(&self, space: u16) -> Option<SharedMemory<'_>> {
        self.regions.get(usize::from(space)).copied()
    }
}

fn instruction(opcode: Opcode, offset: u64, length: u32, operand: &[u8]) -> Instruction<'_> {
    Instruction { opcode: opcode as u8, flags: 0, space: 0, offset, length, aux: 0, operand }
}

fn bytes_of(memory: &SharedMemory<'_>, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    memory.read(offset, &mut out);
    out
}

#[test]
fn read_write_fill_memcpy_crc() {
    let mut words_a = vec![0u64; 512];
    let mut words_b = vec![0u64; 512];
    let spaces =
        Spaces { regions: vec![SharedMemory::from_words(&mut words_a), SharedMemory::from_words(&mut words_b)] };
    let mut out = vec![0u8; 4096];

    let data: Vec<u8> = (0..100u8).collect();
    let outcome = execute(&instruction(Opcode::Write, 10, 100, &data), &spaces, &mut out).unwrap();
    assert_eq!(outcome, Outcome { data_len: 0, written: Some(Written { space: 0, offset: 10, len: 100 }) });

    let outcome = execute(&instruction(Opcode::Read, 10, 100, &[]), &spaces, &mut out).unwrap();
    assert_eq!(&out[..outcome.data_len], &data[..]);

    let fill = Instruction { aux: 0xAB, ..instruction(Opcode::Fill, 200, 50, &[]) };
    execute(&fill, &spaces, &mut out).unwrap();
    assert_eq!(bytes_of(&spaces.regions[0], 200, 50), vec![0xAB; 50]);
    assert_eq!(bytes_of(&spaces.regions[0], 250, 1), vec![0]);

    // Copy region 0 [10..110) into region 1 at 1000.
    let mut operand = [0u8; 16];
    operand[0..2].copy_from_slice(&0u16.to_le_bytes());
    operand[8..16].copy_from_slice(&10u64.to_le_bytes());
    let copy = Instruction { space: 1, ..instruction(Opcode::Memcpy, 1000, 100, &operand) };
    execute(&copy, &spaces, &mut out).unwrap();
    assert_eq!(bytes_of(&spaces.regions[1], 1000, 100), data);

    // An overlapping copy within one region behaves like memmove.
    execute(&instruction(Opcode::Memcpy, 20, 100, &operand), &spaces, &mut out).unwrap();
    assert_eq!(bytes_of(&spaces.regions[0], 20, 100), data);

    let outcome = execute(&instruction(Opcode::Crc32, 20, 100, &[]), &spaces, &mut out).unwrap();
    assert_eq!(outcome.data_len, 4);
    assert_eq!(u32::from_le_bytes(out[..4].try_into().unwrap()), crc32fast::hash(&data));
}

#[test]
fn atomics_return_the_old_value() {
    let mut words = vec![0u64; 4];
    let spaces = Spaces { regions: vec![SharedMemory::from_words(&mut words)] };
    let mut out = [0u8; 8];
    let add = |addend: u64| addend.to_le_bytes();
    execute(&instruction(Opcode::FetchAdd, 8, 8, &add(5)), &spaces, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out), 0);
    execute(&instruction(Opcode::FetchAdd, 8, 8, &add(u64::MAX)), &spaces, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out), 5);
    // 5 + (2^64 - 1) wrapped to 4.
    let cas = |expected: u64, desired: u64| {
        let mut operand = [0u8; 16];
        operand[..8].copy_from_slice(&expected.to_le_bytes());
        operand[8..].copy_from_slice(&desired.to_le_bytes());
        operand
    };
    let failed = execute(&instruction(Opcode::Cas, 8, 8, &cas(3, 9)), &spaces, &mut out).unwrap();
    assert_eq!((u64::from_le_bytes(out), failed.written), (4, None));
    let swapped = execute(&instruction(Opcode::Cas, 8, 8, &cas(4, 9)), &spaces, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out), 4);
    assert!(swapped.written.is_some());
    assert_eq!(bytes_of(&spaces.regions[0], 8, 8), 9u64.to_le_bytes());
}

#[test]
fn vadd_adds_each_lane_type() {
    let mut words = vec![0u64; 4096];
    let spaces = Spaces { regions: vec![SharedMemory::from_words(&mut words)] };
    let mut out = vec![0u8; 8192];

    let lanes: Vec<f32> = (0..2048).map(|i| i as f32 * 0.5).collect();
    let operand: Vec<u8> = lanes.iter().flat_map(|v| v.to_le_bytes()).collect();
    let vadd = Instruction {
        flags: VADD_FLAG_RETURN_RESULT,
        aux: LaneType::F32 as u32,
        ..instruction(Opcode::Vadd, 0, 8192, &operand)
    };
    execute(&vadd, &spaces, &mut out).unwrap();
    let outcome = execute(&vadd, &spaces, &mut out).unwrap();
    assert_eq!(outcome.data_len, 8192);
    for (index, chunk) in out.chunks_exact(4).enumerate() {
        assert_eq!(f32::from_le_bytes(chunk.try_into().unwrap()), lanes[index] * 2.0);
    }

    let ints: Vec<u8> = [i32::MAX, -3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let add_ints = Instruction { aux: LaneType::I32 as u32, ..instruction(Opcode::Vadd, 16384, 8, &ints) };
    execute(&add_ints, &spaces, &mut out).unwrap();
    let outcome = execute(&add_ints, &spaces, &mut out).unwrap();
    assert_eq!(outcome.data_len, 0, "no result without the return flag");
    let stored = bytes_of(&spaces.regions[0], 16384, 8);
    assert_eq!(i32::from_le_bytes(stored[..4].try_into().unwrap()), i32::MAX.wrapping_add(i32::MAX));
    assert_eq!(i32::from_le_bytes(stored[4..].try_into().unwrap()), -6);

    let halves: Vec<u8> = [1.5f32, -2.25].iter().flat_map(|v| f32_to_bf16(*v).to_le_bytes()).collect();
    let add_bf16 = Instruction { aux: LaneType::Bf16 as u32, ..instruction(Opcode::Vadd, 16400, 4, &halves) };
    execute(&add_bf16, &spaces, &mut out).unwrap();
    execute(&add_bf16, &spaces, &mut out).unwrap();
    let stored = bytes_of(&spaces.regions[0], 16400, 4);
    assert_eq!(bf16_to_f32(u16::from_le_bytes([stored[0], stored[1]])), 3.0);
    assert_eq!(bf16_to_f32(u16::from_le_bytes([stored[2], stored[3]])), -4.5);
}

#[test]
fn bad_instructions_get_their_status_and_touch_nothing() {
    let mut words = vec![0u64; 16];
    let spaces = Spaces { regions: vec![SharedMemory::from_words(&mut words)] };
    let mut out = [0u8; 64];
    let eight = [1u8; 8];
    let cases: Vec<(Instruction<'_>, Status)> = vec![
        (Instruction { opcode: 0x7F, ..instruction(Opcode::Read, 0, 8, &[]) }, Status::UnknownOpcode),
        (instruction(Opcode::BlockRead, 0, 1, &[]), Status::NotSupported),
        (Instruction { space: 9, ..instruction(Opcode::Read, 0, 8, &[]) }, Status::NoSuchSpace),
        (instruction(Opcode::Read, 120, 16, &[]), Status::OutOfRange),
        (instruction(Opcode::Read, u64::MAX, 16, &[]), Status::OutOfRange),
        (instruction(Opcode::Write, u64::MAX - 3, 8, &eight), Status::OutOfRange),
        (instruction(Opcode::Write, 0, 7, &eight), Status::Malformed),
        (Instruction { flags: 1, ..instruction(Opcode::Write, 0, 8, &eight) }, Status::Malformed),
        (instruction(Opcode::FetchAdd, 4, 8, &eight), Status::Unaligned),
        (instruction(Opcode::FetchAdd, 128, 8, &eight), Status::OutOfRange),
        (instruction(Opcode::Cas, 0, 8, &eight), Status::Malformed),
        (Instruction { aux: 7, ..instruction(Opcode::Vadd, 0, 8, &eight) }, Status::Malformed),
        (Instruction { aux: LaneType::F32 as u32, ..instruction(Opcode::Vadd, 2, 8, &eight) }, Status::Unaligned),
        (Instruction { aux: 0x100, ..instruction(Opcode::Fill, 0, 8, &[]) }, Status::Malformed),
        (instruction(Opcode::Read, 0, 129, &[]), Status::OutOfRange),
        (instruction(Opcode::Read, 0, 128, &[]), Status::TooLarge),
    ];
    for (bad, status) in cases {
        assert_eq!(execute(&bad, &spaces, &mut out), Err(status), "{bad:?}");
    }
    assert!(bytes_of(&spaces.regions[0], 0, 128).iter().all(|byte| *byte == 0), "a refused instruction wrote memory");
}

#[test]
fn concurrent_fetch_add_and_vadd_lose_no_update() {
    let mut words = vec![0u64; 8];
    let spaces = Spaces { regions: vec![SharedMemory::from_words(&mut words)] };
    let one_i32 = 1i32.to_le_bytes();
    let one_u64 = 1u64.to_le_bytes();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let mut out = [0u8; 8];
                for _ in 0..10_000 {
                    execute(&instruction(Opcode::FetchAdd, 0, 8, &one_u64), &spaces, &mut out).unwrap();
                    let vadd = Instruction { aux: LaneType::I32 as u32, ..instruction(Opcode::Vadd, 8, 4, &one_i32) };
                    execute(&vadd, &spaces, &mut out).unwrap();
                }
            });
        }
    });
    assert_eq!(u64::from_le_bytes(bytes_of(&spaces.regions[0], 0, 8).try_into().unwrap()), 40_000);
    assert_eq!(i32::from_le_bytes(bytes_of(&spaces.regions[0], 8, 4).try_into().unwrap()), 40_000);
}

/// Lanes of `lane` that cross VADD's exclusion chunks: several workers add full 2048-lane
/// operands (returning the results) while others FETCH_ADD words inside the same lanes. Every
/// i32 lane ends exactly at the number of adds it received, and every returned result is one
/// the lane really held (a multiple of the operand, never torn or lost).
#[test]
fn concurrent_full_vadds_and_atomics_on_the_same_lanes_lose_no_update() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 300;
    const LANES: usize = 2048;
    // Starts 12 bytes into the region, so lanes straddle every chunk boundary's neighbourhood.
    const START: usize = 12;
    let mut words = vec![0u64; (START + LANES * 4) / 8 + 1];
    let spaces = Spaces { regions: vec![SharedMemory::from_words(&mut words)] };
    let operand: Vec<u8> = (0..LANES as i32).flat_map(|lane| (lane % 7 + 1).to_le_bytes()).collect();
    // FETCH_ADD of 1 on the aligned word at byte 16 adds 1 to the i32 lane at byte 16 (the
    // word's low half) as long as that lane does not carry into its neighbour.
    let fetch_add_word = 16usize;
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                let mut out = vec![0u8; LANES * 4];
                let vadd = Instruction {
                    flags: VADD_FLAG_RETURN_RESULT,
                    aux: LaneType::I32 as u32,
                    ..instruction(Opcode::Vadd, START as u64, (LANES * 4) as u32, &operand)
                };
                for _ in 0..ROUNDS {
                    execute(&vadd, &spaces, &mut out).unwrap();
                    for (lane, result) in out.chunks_exact(4).enumerate() {
                        let result = i32::from_le_bytes(result.try_into().unwrap());
                        let step = lane as i32 % 7 + 1;
                        let extra = if START + lane * 4 == fetch_add_word { THREADS * ROUNDS } else { 0 } as i32;
                        assert!(result > 0 && result <= step * (THREADS * ROUNDS) as i32 + extra, "lane {lane}");
                        if extra == 0 {
                            assert_eq!(result % step, 0, "lane {lane} returned a value it never held");
                        }
                    }
                    let one = 1u64.to_le_bytes();
                    execute(&instruction(Opcode::FetchAdd, fetch_add_word as u64, 8, &one), &spaces, &mut out).unwrap();
                }
            });
        }
    });
    let stored = bytes_of(&spaces.regions[0], START, LANES * 4);
    for (lane, value) in stored.chunks_exact(4).enumerate() {
        let value = i32::from_le_bytes(value.try_into().unwrap());
        let mut expected = (lane as i32 % 7 + 1) * (THREADS * ROUNDS) as i32;
        if START + lane * 4 == fetch_add_word {
            expected += (THREADS * ROUNDS) as i32;
        }
        assert_eq!(value, expected, "lane {lane}");
    }
}

/// f32 and bf16 sums equal the scalar reference lane by lane, including infinities, NaN and
/// rounding ties, and the returned result is what memory holds afterwards.
#[test]
fn vector_float_lanes_match_the_scalar_reference() {
    let mut words = vec![0u64; 4096];
    let spaces = Spaces { regions: vec![SharedMemory::from_words(&mut words)] };
    let mut out = vec![0u8; 8192];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, f32::MAX, f32::MIN_POSITIVE];
    let stored_f32: Vec<f32> =
        (0..2048).map(|i| if i % 97 == 0 { specials[i % 7] } else { f32::from_bits(next() as u32 >> 2) }).collect();
    let added_f32: Vec<f32> =
        (0..2048).map(|i| if i % 89 == 0 { specials[i % 5] } else { (next() % 1000) as f32 * 0.37 }).collect();
    let as_bytes = |values: &[f32]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    spaces.regions[0].write(0, &as_bytes(&stored_f32));
    let operand = as_bytes(&added_f32);
    let vadd = Instruction {
        flags: VADD_FLAG_RETURN_RESULT,
        aux: LaneType::F32 as u32,
        ..instruction(Opcode::Vadd, 0, 8192, &operand)
    };
    execute(&vadd, &spaces, &mut out).unwrap();
    assert_eq!(bytes_of(&spaces.regions[0], 0, 8192), out, "the result is what memory holds");
    for (lane, result) in out.chunks_exact(4).enumerate() {
        let result = f32::from_le_bytes(result.try_into().unwrap());
        let expected = stored_f32[lane] + added_f32[lane];
        assert!(result.to_bits() == expected.to_bits() || (result.is_nan() && expected.is_nan()), "f32 lane {lane}");
    }

    let stored_bf16: Vec<u16> = (0..4096).map(|_| next() as u16).collect();
    let added_bf16: Vec<u16> = (0..4096).map(|_| next() as u16).collect();
    let bf16_bytes = |values: &[u16]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    spaces.regions[0].write(0, &bf16_bytes(&stored_bf16));
    let operand = bf16_bytes(&added_bf16);
    let vadd = Instruction { aux: LaneType::Bf16 as u32, ..instruction(Opcode::Vadd, 0, 8192, &operand) };
    assert_eq!(execute(&vadd, &spaces, &mut out).unwrap().data_len, 0);
    for (lane, stored) in bytes_of(&spaces.regions[0], 0, 8192).chunks_exact(2).enumerate() {
        let result = bf16_to_f32(u16::from_le_bytes([stored[0], stored[1]]));
        let expected = bf16_to_f32(f32_to_bf16(bf16_to_f32(stored_bf16[lane]) + bf16_to_f32(added_bf16[lane])));
        assert!(result.to_bits() == expected.to_bits() || (result.is_nan() && expected.is_nan()), "bf16 lane {lane}");
    }
}

#[test]
fn vadd_bounds_are_checked_before_anything_is_added() {
    let mut words = vec![0u64; 2048];
    let spaces = Spaces { regions: vec![SharedMemory::from_words(&mut words)] };
    let mut small_out = [0u8; 64];
    static LANES: [u8; 8192] = [1; 8192];
    static TOO_MANY: [u8; 8196] = [1; 8196];
    let (lanes, too_many) = (&LANES, &TOO_MANY);
    let f32_vadd = |offset: u64, operand: &'static [u8]| Instruction {
        aux: LaneType::F32 as u32,
        ..instruction(Opcode::Vadd, offset, operand.len() as u32, operand)
    };
    let cases = [
        // Past the region's end by one lane, and an offset that wraps.
        (f32_vadd(16384 - 8188, &lanes[..]), Status::OutOfRange),
        (f32_vadd(u64::MAX - 3, &lanes[..8]), Status::OutOfRange),
        (f32_vadd(0, &too_many[..]), Status::TooLarge),
        (Instruction { flags: VADD_FLAG_RETURN_RESULT, ..f32_vadd(0, &lanes[..128]) }, Status::TooLarge),
        (Instruction { flags: 0x02, ..f32_vadd(0, &lanes[..8]) }, Status::Malformed),
        (Instruction { length: 4, ..f32_vadd(0, &lanes[..8]) }, Status::Malformed),
        (Instruction { aux: LaneType::Bf16 as u32, ..f32_vadd(1, &lanes[..8]) }, Status::Unaligned),
    ];
    for (bad, status) in cases {
        assert_eq!(execute(&bad, &spaces, &mut small_out), Err(status), "{bad:?}");
    }
    assert!(bytes_of(&spaces.regions[0], 0, 16384).iter().all(|byte| *byte == 0), "a refused VADD added something");
}
