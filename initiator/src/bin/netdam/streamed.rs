//! Reads handed to their output a bounded piece at a time, so that what `bread` and `read` hold
//! in memory does not grow with what they read: a 1 GiB `bread` held 1 GiB, and an 8 GiB one
//! was refused. The library pipelines each piece (many instructions in flight); the next piece
//! is read once this one is written out. A read that fails midway leaves what came before it
//! in the output, and says how much that is. Writes from a regular file go the same way
//! ([`stream_write_file`]).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use netdam_initiator::pieces::pieces;

/// The most bytes a read holds before it writes them out, or a write from a file before it
/// sends them. Between two pieces the pipeline drains once: a round trip (tens of µs) per
/// 16 MiB, which take tens of ms to move.
pub const PIECE_BYTES: u64 = 16 << 20;

/// Bytes on one line of a hex dump.
const HEX_LINE_BYTES: u64 = 16;

/// The bytes of one piece of a read in units of `unit_bytes` (a namespace's block; 1 for a
/// region): whole units, and whole lines of a hex dump, so that each piece starts a unit and a
/// line; at most [`PIECE_BYTES`] where a unit allows.
pub fn piece_bytes(unit_bytes: u32) -> u64 {
    let step = u64::from(unit_bytes.max(1)) * HEX_LINE_BYTES;
    (PIECE_BYTES / step).max(1) * step
}

/// Where the bytes read go.
pub enum Destination<'a> {
    /// Raw into a file, created (or emptied) when the first piece has been read, so that a read
    /// failing at once leaves it as it was.
    File(&'a Path),
    /// Raw to standard output (`--out -`).
    Stdout,
    /// A hex dump on standard output, its addresses counted from `address`.
    HexDump { address: u64 },
    /// One JSON object on standard output: these fields and `hex`, the bytes in hex.
    Json(serde_json::Value),
}

impl Destination<'_> {
    /// The destination as an error names it.
    fn name(&self) -> String {
        match self {
            Destination::File(path) => path.display().to_string(),
            _ => "standard output".to_string(),
        }
    }

    /// What it holds of a read of `len` bytes stopped after `written`.
    fn holds(&self, written: u64, len: u64) -> String {
        let part = format!("only the first {written} of the {len} bytes");
        match (self, written) {
            (Destination::File(path), 0) => format!("nothing was written to {}", path.display()),
            (Destination::File(path), _) => format!("{} holds {part}", path.display()),
            (Destination::Stdout, _) => format!("standard output got {part}"),
            (Destination::HexDump { .. }, _) => format!("the dump shows {part}"),
            (Destination::Json(_), _) => format!("the hex printed holds {part}"),
        }
    }
}

/// Reads `len` bytes in pieces of at most `piece_bytes`, `read(position, piece)` filling each
/// (`position` counted from the start of the range), and writes each to `destination` before
/// reading the next. An error starts with `command`; one midway says how much of the range
/// `destination` holds.
pub fn stream_read(
    command: &str,
    destination: &Destination,
    len: u64,
    piece_bytes: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut buffer = vec![0u8; usize::try_from(len.min(piece_bytes)).expect("a piece is at most 16 MiB")];
    let mut sink = Sink { destination, writer: None };
    for (_, position, piece_len) in pieces(0, len, piece_bytes) {
        let piece = &mut buffer[..piece_len as usize];
        if let Err(error) = read(position, piece) {
            // What went before reaches the output, and the user learns how much it is.
            sink.end_early(position);
            return Err(format!("{command}: {error}; {}", destination.holds(position, len)));
        }
        sink.write(position, piece).map_err(|error| {
            let after = match position {
                0 => String::new(),
                _ => format!(", after the first {position} of the {len} bytes"),
            };
            format!("{command}: writing {}: {error}{after}", destination.name())
        })?;
    }
    sink.finish().map_err(|error| format!("{command}: writing {}: {error}", destination.name()))
}

/// A regular file of more than one piece to write, opened, and its length: such a file is sent
/// a piece at a time ([`stream_write_file`]); `None` for any other input (shorter, `--data`,
/// stdin, a pipe or a device), which is read whole first. A file's length is known before
/// anything is sent, so its range is checked first as for a whole one; a stream's is not, and
/// reading it whole lets one longer than its room be refused before anything is written.
pub fn large_regular_file(path: Option<&Path>, piece_bytes: u64) -> Result<Option<(File, u64)>, String> {
    let Some(path) = path else { return Ok(None) };
    let opened = File::open(path).map_err(|error| format!("reading {}: {error}", path.display()))?;
    let metadata = opened.metadata().map_err(|error| format!("reading {}: {error}", path.display()))?;
    Ok((metadata.is_file() && metadata.len() > piece_bytes).then_some((opened, metadata.len())))
}

/// Sends the `len` bytes of `file` (named `source`) a piece of at most `piece_bytes` at a time,
/// `write(position, piece)` sending each, the last zero-padded to a multiple of `pad_to` bytes
/// (a block; 1 pads nothing). An error starts with `command` and says how much of the file was
/// written: the pieces before the one it failed in, and that piece perhaps in part.
pub fn stream_write_file(
    command: &str,
    file: &mut File,
    source: &str,
    len: u64,
    piece_bytes: u64,
    pad_to: u64,
    mut write: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut buffer = Vec::with_capacity(usize::try_from(piece_bytes).expect("a piece is at most 16 MiB"));
    let written = |position: u64| match position {
        0 => format!("nothing of {source} was written"),
        _ => format!("the first {position} of the {len} bytes of {source} were written"),
    };
    for (_, position, piece_len) in pieces(0, len, piece_bytes) {
        buffer.resize(piece_len as usize, 0);
        // Nothing of this piece is sent before it is read whole.
        file.read_exact(&mut buffer)
            .map_err(|error| format!("{command}: reading {source}: {error}; {}", written(position)))?;
        let padded = piece_len.next_multiple_of(pad_to.max(1));
        buffer.resize(padded as usize, 0);
        write(position, &buffer).map_err(|error| {
            let end = position + piece_len;
            format!(
                "{command}: {error}; {} before, and bytes {position} to {end} may be written in part",
                written(position)
            )
        })?;
    }
    Ok(())
}

/// A [`Destination`] being written, opened with the first piece.
struct Sink<'a> {
    destination: &'a Destination<'a>,
    writer: Option<Box<dyn Write + 'a>>,
}

impl Sink<'_> {
    /// Writes `piece`, which starts `position` bytes into the range.
    fn write(&mut self, position: u64, piece: &[u8]) -> std::io::Result<()> {
        let writer = match &mut self.writer {
            Some(writer) => writer,
            None => self.writer.insert(open(self.destination)?),
        };
        match self.destination {
            Destination::File(_) | Destination::Stdout => writer.write_all(piece),
            Destination::HexDump { address } => write_hex_dump(writer, address.saturating_add(position), piece),
            Destination::Json(_) => piece.iter().try_for_each(|byte| write!(writer, "{byte:02x}")),
        }
    }

    /// Ends the output of a read that completed.
    fn finish(mut self) -> std::io::Result<()> {
        let Some(mut writer) = self.writer.take() else { return Ok(()) };
        if let Destination::Json(_) = self.destination {
            writer.write_all(b"\"}\n")?;
        }
        writer.flush()
    }

    /// Ends the output of a read that failed after `written` bytes: what was written is
    /// flushed, and a JSON object left open is closed as valid JSON that says so
    /// (`"complete": false`, `"bytes_read"`), on a line of its own before the error object
    /// printed next.
    fn end_early(mut self, written: u64) {
        if let Some(mut writer) = self.writer.take() {
            if let Destination::Json(_) = self.destination {
                let _ = writeln!(writer, "\",\"complete\":false,\"bytes_read\":{written}}}");
            }
            let _ = writer.flush();
        }
    }
}

/// The writer for `destination`; a JSON object's fields and the start of its `hex` are written.
fn open<'a>(destination: &Destination) -> std::io::Result<Box<dyn Write + 'a>> {
    let stdout = || BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    Ok(match destination {
        Destination::File(path) => Box::new(File::create(path)?),
        Destination::Stdout | Destination::HexDump { .. } => Box::new(stdout()),
        Destination::Json(fields) => {
            let mut writer = stdout();
            let fields = fields.to_string();
            let open_object = fields.strip_suffix('}').expect("JSON fields are an object");
            let separator = if open_object.len() > 1 { "," } else { "" };
            write!(writer, "{open_object}{separator}\"hex\":\"")?;
            Box::new(writer)
        }
    })
}

/// Writes `bytes` as hex-dump lines whose addresses start at `address` (a multiple of 16
/// bytes into the dump, so that lines are whole across pieces).
pub fn write_hex_dump(writer: &mut dyn Write, address: u64, bytes: &[u8]) -> std::io::Result<()> {
    for (line, chunk) in bytes.chunks(HEX_LINE_BYTES as usize).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|byte| format!("{byte:02x}")).collect();
        let text: String = chunk
            .iter()
            .map(|byte| if byte.is_ascii_graphic() || *byte == b' ' { *byte as char } else { '.' })
            .collect();
        let line_address = address.saturating_add(line as u64 * HEX_LINE_BYTES);
        writeln!(writer, "{line_address:012x}  {:<47}  |{text}|", hex.join(" "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_is_whole_units_and_whole_dump_lines() {
        assert_eq!(piece_bytes(1), PIECE_BYTES);
        assert_eq!(piece_bytes(4096), PIECE_BYTES);
        let odd = piece_bytes(3000);
        assert!(odd.is_multiple_of(3000) && odd.is_multiple_of(16) && odd <= PIECE_BYTES, "{odd}");
        assert_eq!(piece_bytes(0), PIECE_BYTES, "a zero unit cannot make an empty piece");
    }

    /// Pieces read one after the other, each at the position it covers, and a failure after
    /// the first says how much the file holds: the bytes before it, written.
    #[test]
    fn a_read_failing_after_a_piece_leaves_that_piece_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let fill = |position: u64, piece: &mut [u8]| {
            piece.iter_mut().enumerate().for_each(|(at, byte)| *byte = (position as usize + at) as u8)
        };
        let mut asked = Vec::new();
        let destination = Destination::File(&path);
        let result = stream_read("bread", &destination, 100, 32, |position, piece| {
            asked.push((position, piece.len()));
            fill(position, piece);
            Ok(())
        });
        assert_eq!(result, Ok(()));
        assert_eq!(asked, [(0, 32), (32, 32), (64, 32), (96, 4)]);
        assert_eq!(std::fs::read(&path).unwrap(), (0..100u8).collect::<Vec<_>>());

        let failed = stream_read("bread", &destination, 100, 32, |position, piece| {
            if position >= 64 {
                return Err(format!("io_error at block {position}"));
            }
            fill(position, piece);
            Ok(())
        });
        let expected =
            format!("bread: io_error at block 64; {} holds only the first 64 of the 100 bytes", path.display());
        assert_eq!(failed, Err(expected));
        assert_eq!(std::fs::read(&path).unwrap(), (0..64u8).collect::<Vec<_>>());

        // A failure before anything was read leaves the file as it was.
        std::fs::write(&path, b"kept").unwrap();
        let failed = stream_read("bread", &destination, 100, 32, |_, _| Err("io_error".to_string()));
        assert_eq!(failed, Err(format!("bread: io_error; nothing was written to {}", path.display())));
        assert_eq!(std::fs::read(&path).unwrap(), b"kept");
    }

    /// A file written a piece at a time: each piece at its position, the last padded; a
    /// failure says what went before it and which bytes may be written in part; a file cut
    /// short under the write says how much was sent.
    #[test]
    fn a_file_written_in_pieces_pads_the_last_and_a_failure_says_what_went_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.bin");
        let bytes: Vec<u8> = (0..100u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let source = path.display().to_string();
        let mut sent = Vec::new();
        let mut file = File::open(&path).unwrap();
        let result = stream_write_file("bwrite", &mut file, &source, 100, 32, 8, |position, piece| {
            sent.push((position, piece.to_vec()));
            Ok(())
        });
        assert_eq!(result, Ok(()));
        let positions: Vec<(u64, usize)> = sent.iter().map(|(position, piece)| (*position, piece.len())).collect();
        assert_eq!(positions, [(0, 32), (32, 32), (64, 32), (96, 8)], "the last piece padded to 8 bytes");
        assert_eq!(sent[3].1, [96, 97, 98, 99, 0, 0, 0, 0]);

        let mut file = File::open(&path).unwrap();
        let failed = stream_write_file("bwrite", &mut file, &source, 100, 32, 1, |position, _| match position {
            64 => Err("io_error".to_string()),
            _ => Ok(()),
        });
        let said = format!("bwrite: io_error; the first 64 of the 100 bytes of {source} were written before, and bytes 64 to 96 may be written in part");
        assert_eq!(failed, Err(said));

        let mut file = File::open(&path).unwrap();
        let failed = stream_write_file("write", &mut file, &source, 200, 64, 1, |_, _| Ok(()));
        let error = failed.unwrap_err();
        assert!(error.starts_with(&format!("write: reading {source}: ")), "{error}");
        assert!(error.ends_with(&format!("; the first 64 of the 200 bytes of {source} were written")), "{error}");
    }

    #[test]
    fn dump_lines_count_their_addresses_on_from_the_piece() {
        let mut dump = Vec::new();
        write_hex_dump(&mut dump, 0x20, b"0123456789abcdefXY").unwrap();
        let lines = String::from_utf8(dump).unwrap();
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(
            lines,
            [
                "000000000020  30 31 32 33 34 35 36 37 38 39 61 62 63 64 65 66  |0123456789abcdef|",
                &format!("000000000030  {:<47}  |XY|", "58 59")
            ]
        );
    }
}
