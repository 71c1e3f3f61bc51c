//! Parsing of byte counts and offsets as people write them: `4096`, `0x1000`, `64KiB`, `1MiB`.

/// Parses a byte count or offset: a decimal or `0x` hexadecimal number, optionally followed by
/// `K`/`KiB`, `M`/`MiB`, `G`/`GiB` or `T`/`TiB` (powers of 1024).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| c.is_ascii_alphabetic() && !trimmed.starts_with("0x")).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let value = if let Some(hex) = number.strip_prefix("0x").or_else(|| number.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else {
        number.trim().parse::<u64>()
    }
    .map_err(|_| format!("{text:?} is not a byte count (examples: 4096, 0x1000, 64KiB, 1MiB)"))?;
    let multiplier: u64 = match suffix.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        other => return Err(format!("{text:?}: unknown unit {other:?} (use KiB, MiB, GiB or TiB)")),
    };
    value.checked_mul(multiplier).ok_or_else(|| format!("{text:?} does not fit in 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn parses_what_people_write() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("0x1000"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert!(parse_bytes("12 bananas").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("17179869184TiB").unwrap_err().contains("64 bits"));
    }
}
