//! Option haggling, sans-IO: the fixed-newstyle handshake as a state machine that takes the
//! client's bytes and writes the server's replies into a buffer. The driver (the server's
//! connection task) reads the client flags and each option, hands them here, writes what comes
//! back, and acts on the returned [`Step`]. Every bound on what a client may send is checked
//! here, before the driver reads (and allocates for) an option's payload.

use crate::nbd::codec::{
    self, encode_option_error, encode_option_reply, option_label, option_name, InfoRequest, MetaContextRequest,
    OptionHeader, ReplyStyle, WireError, BASE_ALLOCATION, EXPORT_NAME_PADDING_LEN, FLAG_CAN_MULTI_CONN,
    FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_HAS_FLAGS, FLAG_NO_ZEROES, FLAG_READ_ONLY,
    FLAG_SEND_DF, FLAG_SEND_FAST_ZERO, FLAG_SEND_FLUSH, FLAG_SEND_FUA, FLAG_SEND_TRIM, FLAG_SEND_WRITE_ZEROES,
    INFO_BLOCK_SIZE, INFO_DESCRIPTION, INFO_EXPORT, INFO_NAME, OPT_ABORT, OPT_EXPORT_NAME, OPT_EXTENDED_HEADERS,
    OPT_GO, OPT_INFO, OPT_LIST, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_STARTTLS, OPT_STRUCTURED_REPLY,
    REP_ACK, REP_ERR_EXT_HEADER_REQD, REP_ERR_INVALID, REP_ERR_POLICY, REP_ERR_TOO_BIG, REP_ERR_UNKNOWN, REP_ERR_UNSUP,
    REP_INFO, REP_META_CONTEXT, REP_SERVER,
};
use crate::nbd::limits::{MAX_OPTIONS, MAX_OPTION_BYTES, MAX_STRING_BYTES};
use crate::nbd::transmission::Session;

/// What the handshake tells clients about the one export, fixed for the server's lifetime.
/// The server builds it from the backend and the options, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export's name; the empty name (the default export) also selects it.
    pub name: String,
    /// Shown to humans by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`.
    pub description: Option<String>,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Writes are refused with `EPERM`.
    pub read_only: bool,
    /// Minimum block size: offsets and lengths must be multiples of it.
    pub min_block_bytes: u32,
    /// Preferred block size.
    pub preferred_block_bytes: u32,
    /// Largest read or write payload.
    pub max_payload_bytes: u32,
    /// Trimmed ranges read back as zeroes ([`crate::nbd::NbdBackend::trim_reads_zeroes`]), so
    /// zeroing may trim, and fast zeroing can be done.
    pub trim_reads_zeroes: bool,
    /// The backend tells holes from data
    /// ([`crate::nbd::NbdBackend::can_report_allocation`]): `base:allocation` is offered.
    pub reports_allocation: bool,
}

/// The id `NBD_OPT_SET_META_CONTEXT` gives `base:allocation`, the only context offered. Ids
/// are opaque to clients; `NBD_OPT_LIST_META_CONTEXT` answers 0, which the spec reserves there.
pub const BASE_ALLOCATION_ID: u32 = 1;

impl ExportInfo {
    /// The transmission flags for a client that negotiated `style`.
    ///
    /// FLUSH and FUA are offered even read-only (they are harmless there, as in qemu-nbd).
    /// CAN_MULTI_CONN: the backend's flush covers the writes of every connection. FAST_ZERO:
    /// zeroing that may deallocate is done by trim, which is fast; a fast request that forbids
    /// holes (or any fast request, if trim does not zero) fails at once with `ENOTSUP`, which
    /// the spec allows (see [`crate::nbd::transmission`]). DF: every read is
    /// answered with one data chunk, so "don't fragment" always holds once chunks exist.
    pub fn transmission_flags(&self, style: ReplyStyle) -> u16 {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_CAN_MULTI_CONN;
        if self.read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        if style != ReplyStyle::Simple {
            flags |= FLAG_SEND_DF;
        }
        flags
    }

    /// Whether a client's export name selects this export.
    pub fn is_named(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

/// A client broke the handshake in a way that ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    /// The client set flags the server did not offer (the spec says: drop the connection).
    #[error("client flags 0x{0:08x} include bits the server did not offer (it offers FIXED_NEWSTYLE and NO_ZEROES)")]
    UnknownClientFlags(u32),
    /// Bytes that are not an option.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// More options than any real client sends.
    #[error("client sent more than {limit} options")]
    TooManyOptions {
        /// The bound.
        limit: u32,
    },
    /// An option longer than any legitimate one.
    #[error("{option} of {length} bytes exceeds the limit of {limit} bytes")]
    OptionTooLong {
        /// The option's name, or its number (`option_label`).
        option: String,
        /// Its claimed length.
        length: u32,
        /// The bound.
        limit: u32,
    },
    /// A client that did not agree to fixed newstyle sent an option other than EXPORT_NAME.
    #[error("client without fixed newstyle sent {option} (only NBD_OPT_EXPORT_NAME is possible)")]
    NotFixedNewstyle {
        /// The option's name.
        option: &'static str,
    },
    /// `NBD_OPT_EXPORT_NAME` named an export that does not exist (it cannot be answered with an
    /// error, so the connection is closed).
    #[error("NBD_OPT_EXPORT_NAME asked for export {requested:?}; this server exports {exported:?}")]
    UnknownExport {
        /// The name asked for (lossily decoded).
        requested: String,
        /// The name served.
        exported: String,
    },
    /// `NBD_OPT_EXPORT_NAME` after extended headers were agreed, which the spec forbids.
    #[error("NBD_OPT_EXPORT_NAME after NBD_OPT_EXTENDED_HEADERS (a client must use NBD_OPT_GO then)")]
    ExportNameAfterExtendedHeaders,
}

/// What the driver does after an option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send the replies, then read the next option.
    Continue,
    /// Send the replies, then close: the client ended the session (`NBD_OPT_ABORT`).
    Close,
    /// Send the replies, then enter transmission with these parameters.
    Transmission(Session),
    /// Send the replies (if any), then close: the client broke the protocol.
    Fail(NegotiationError),
}

/// The state of one client's handshake.
#[derive(Debug)]
pub struct Negotiation<'a> {
    export: &'a ExportInfo,
    fixed_newstyle: bool,
    no_zeroes: bool,
    style: ReplyStyle,
    options_received: u32,
    /// `base:allocation` was selected by the last `NBD_OPT_SET_META_CONTEXT`.
    allocation_selected: bool,
    /// An export name asked for that this server does not have, until the driver takes it
    /// ([`Negotiation::take_unknown_export`]) to log it.
    unknown_export: Option<String>,
}

impl<'a> Negotiation<'a> {
    /// A handshake for `export`.
    pub fn new(export: &'a ExportInfo) -> Negotiation<'a> {
        Negotiation {
            export,
            fixed_newstyle: false,
            no_zeroes: false,
            style: ReplyStyle::Simple,
            options_received: 0,
            allocation_selected: false,
            unknown_export: None,
        }
    }

    /// The export name the last option asked for, if this server does not have it (answered
    /// `NBD_REP_ERR_UNKNOWN`): the client's mistake, for the driver to log.
    pub fn take_unknown_export(&mut self) -> Option<String> {
        self.unknown_export.take()
    }

    /// The greeting the server sends first.
    pub fn greeting(&self, out: &mut Vec<u8>) {
        codec::encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES, out);
    }

    /// Takes the client's 32-bit flags.
    pub fn client_flags(&mut self, flags: u32) -> Result<(), NegotiationError> {
        if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(NegotiationError::UnknownClientFlags(flags));
        }
        self.fixed_newstyle = flags & FLAG_C_FIXED_NEWSTYLE != 0;
        self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
        Ok(())
    }

    /// Checks an option header before its payload is read. On an error the connection must be
    /// closed after sending `out` (an error reply where the protocol allows one): the payload is
    /// never read, so nothing is allocated for a length the client made up.
    pub fn option_header(&mut self, header: &OptionHeader, out: &mut Vec<u8>) -> Result<(), NegotiationError> {
        self.options_received += 1;
        let can_reply = self.fixed_newstyle && header.option != OPT_EXPORT_NAME;
        if self.options_received > MAX_OPTIONS {
            if can_reply {
                let message = format!("too many options (limit {MAX_OPTIONS}); closing the connection");
                encode_option_error(header.option, REP_ERR_POLICY, &message, out);
            }
            return Err(NegotiationError::TooManyOptions { limit: MAX_OPTIONS });
        }
        // An export name is a string; anything else is bounded by the longest legitimate option.
        let limit = if header.option == OPT_EXPORT_NAME { MAX_STRING_BYTES as u32 } else { MAX_OPTION_BYTES };
        if header.length > limit {
            if can_reply {
                let message = format!(
                    "{} of {} bytes is over the limit of {limit}; closing",
                    option_label(header.option),
                    header.length
                );
                encode_option_error(header.option, REP_ERR_TOO_BIG, &message, out);
            }
            return Err(NegotiationError::OptionTooLong {
                option: option_label(header.option),
                length: header.length,
                limit,
            });
        }
        Ok(())
    }

    /// Handles one option whose header passed [`Negotiation::option_header`] and whose payload
    /// is `data`, writing the replies into `out`.
    pub fn option(&mut self, header: &OptionHeader, data: &[u8], out: &mut Vec<u8>) -> Step {
        debug_assert_eq!(data.len(), header.length as usize, "the driver reads exactly the option's payload");
        let option = header.option;
        if option == OPT_EXPORT_NAME {
            return self.export_name(data, out);
        }
        if !self.fixed_newstyle {
            // Without fixed newstyle the client cannot understand an error reply.
            return Step::Fail(NegotiationError::NotFixedNewstyle { option: option_name(option) });
        }
        match option {
            OPT_ABORT => {
                // The spec asks for an ACK (the client may already be gone; the driver copes).
                encode_option_reply(option, REP_ACK, &[], out);
                Step::Close
            }
            OPT_LIST => {
                if data.is_empty() {
                    self.list(out);
                } else {
                    encode_option_error(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data", out);
                }
                Step::Continue
            }
            OPT_STARTTLS => {
                encode_option_error(option, REP_ERR_UNSUP, "this server does not support TLS", out);
                Step::Continue
            }
            OPT_INFO | OPT_GO => self.info(option, data, out),
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    encode_option_error(option, REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data", out);
                } else if self.style == ReplyStyle::Extended {
                    let message = "extended headers are already negotiated and take precedence";
                    encode_option_error(option, REP_ERR_EXT_HEADER_REQD, message, out);
                } else {
                    self.style = ReplyStyle::Structured;
                    encode_option_reply(option, REP_ACK, &[], out);
                }
                Step::Continue
            }
            OPT_EXTENDED_HEADERS => {
                if data.is_empty() {
                    self.style = ReplyStyle::Extended;
                    encode_option_reply(option, REP_ACK, &[], out);
                } else {
                    encode_option_error(option, REP_ERR_INVALID, "NBD_OPT_EXTENDED_HEADERS takes no data", out);
                }
                Step::Continue
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data, out);
                Step::Continue
            }
            _ => {
                let message = format!("option {option} ({}) is not supported by this server", option_name(option));
                encode_option_error(option, REP_ERR_UNSUP, &message, out);
                Step::Continue
            }
        }
    }

    fn export_name(&mut self, name: &[u8], out: &mut Vec<u8>) -> Step {
        if self.style == ReplyStyle::Extended {
            return Step::Fail(NegotiationError::ExportNameAfterExtendedHeaders);
        }
        if !self.export.is_named(name) {
            return Step::Fail(NegotiationError::UnknownExport {
                requested: String::from_utf8_lossy(name).into_owned(),
                exported: self.export.name.clone(),
            });
        }
        out.extend_from_slice(&self.export.size_bytes.to_be_bytes());
        out.extend_from_slice(&self.export.transmission_flags(self.style).to_be_bytes());
        if !self.no_zeroes {
            out.extend_from_slice(&[0u8; EXPORT_NAME_PADDING_LEN]);
        }
        Step::Transmission(self.session())
    }

    /// The transmission session this handshake agreed on.
    fn session(&self) -> Session {
        let context = self.allocation_selected.then_some(BASE_ALLOCATION_ID);
        Session::new(self.export, self.style, context)
    }

    fn list(&self, out: &mut Vec<u8>) {
        let name = self.export.name.as_bytes();
        let description = self.export.description.as_deref().unwrap_or("").as_bytes();
        encode_option_reply(OPT_LIST, REP_SERVER, &[&(name.len() as u32).to_be_bytes(), name, description], out);
        encode_option_reply(OPT_LIST, REP_ACK, &[], out);
    }

    fn info(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Step {
        let request = match InfoRequest::parse(option_name(option), data) {
            Ok(request) => request,
            Err(error) => {
                encode_option_error(option, REP_ERR_INVALID, &error.to_string(), out);
                return Step::Continue;
            }
        };
        if !self.export.is_named(request.name) {
            let message = format!(
                "export {:?} not present (this server exports {:?})",
                String::from_utf8_lossy(request.name),
                self.export.name
            );
            encode_option_error(option, REP_ERR_UNKNOWN, &message, out);
            self.unknown_export = Some(String::from_utf8_lossy(request.name).into_owned());
            return Step::Continue;
        }
        let export = self.export;
        // Duplicate requests are the client's mistake; each item is sent at most once.
        if request.info_types.contains(&INFO_NAME) {
            encode_option_reply(option, REP_INFO, &[&INFO_NAME.to_be_bytes(), export.name.as_bytes()], out);
        }
        if let (true, Some(description)) = (request.info_types.contains(&INFO_DESCRIPTION), &export.description) {
            encode_option_reply(option, REP_INFO, &[&INFO_DESCRIPTION.to_be_bytes(), description.as_bytes()], out);
        }
        // Block sizes go to every client, asked or not: the spec says a server with non-default
        // constraints should advertise them. A client that did not ask and then sends unaligned
        // requests gets clean EINVAL errors, which the spec allows; so there is no need for
        // NBD_REP_ERR_BLOCK_SIZE_REQD, which would lock out older clients.
        encode_option_reply(
            option,
            REP_INFO,
            &[
                &INFO_BLOCK_SIZE.to_be_bytes(),
                &export.min_block_bytes.to_be_bytes(),
                &export.preferred_block_bytes.to_be_bytes(),
                &export.max_payload_bytes.to_be_bytes(),
            ],
            out,
        );
        encode_option_reply(
            option,
            REP_INFO,
            &[
                &INFO_EXPORT.to_be_bytes(),
                &export.size_bytes.to_be_bytes(),
                &export.transmission_flags(self.style).to_be_bytes(),
            ],
            out,
        );
        encode_option_reply(option, REP_ACK, &[], out);
        if option == OPT_GO {
            Step::Transmission(self.session())
        } else {
            Step::Continue
        }
    }

    /// Lists or selects metadata contexts. The only one offered is `base:allocation`, and only
    /// when the backend can tell holes from data. It matches the queries `base:allocation` and
    /// (when listing) `base:`, and listing with no query; other queries, of `base:` or of any
    /// other namespace, select nothing, as the spec asks. A backend that cannot tell offers no
    /// context: every well-formed request is answered with an ACK alone, so a client never
    /// sends `NBD_CMD_BLOCK_STATUS` and treats the whole export as allocated data, which is
    /// true. `NBD_OPT_SET_META_CONTEXT` replaces the selection even when it fails.
    fn meta_context(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) {
        let setting = option == OPT_SET_META_CONTEXT;
        if setting {
            self.allocation_selected = false;
        }
        if self.style == ReplyStyle::Simple {
            let message = format!("{} needs structured replies or extended headers first", option_name(option));
            encode_option_error(option, REP_ERR_INVALID, &message, out);
            return;
        }
        let request = match MetaContextRequest::parse(option_name(option), data) {
            Ok(request) => request,
            Err(error) => {
                encode_option_error(option, REP_ERR_INVALID, &error.to_string(), out);
                return;
            }
        };
        if !self.export.is_named(request.name) {
            let message = format!("export {:?} not present", String::from_utf8_lossy(request.name));
            encode_option_error(option, REP_ERR_UNKNOWN, &message, out);
            self.unknown_export = Some(String::from_utf8_lossy(request.name).into_owned());
            return;
        }
        let matches = |query: &[u8]| query == BASE_ALLOCATION.as_bytes() || (!setting && query == b"base:");
        let offered = self.export.reports_allocation
            && ((!setting && request.queries.is_empty()) || request.queries.iter().any(|query| matches(query)));
        if offered {
            // Listing answers a reserved id of 0; selecting gives the id requests will carry.
            let id = if setting { BASE_ALLOCATION_ID } else { 0 };
            encode_option_reply(option, REP_META_CONTEXT, &[&id.to_be_bytes(), BASE_ALLOCATION.as_bytes()], out);
            self.allocation_selected = setting;
        }
        encode_option_reply(option, REP_ACK, &[], out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::codec::OPTION_REPLY_MAGIC;

    fn export() -> ExportInfo {
        ExportInfo {
            name: "disk".into(),
            description: Some("a test disk".into()),
            size_bytes: 1 << 20,
            read_only: false,
            min_block_bytes: 512,
            preferred_block_bytes: 4096,
            max_payload_bytes: 32 << 20,
            trim_reads_zeroes: true,
            reports_allocation: false,
        }
    }

    /// One parsed option reply: (option, type, payload).
    fn replies(mut bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut all = Vec::new();
        while !bytes.is_empty() {
            assert_eq!(&bytes[..8], &OPTION_REPLY_MAGIC.to_be_bytes());
            let option = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
            let kind = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
            all.push((option, kind, bytes[20..20 + len].to_vec()));
            bytes = &bytes[20 + len..];
        }
        all
    }

    fn send(negotiation: &mut Negotiation<'_>, option: u32, data: &[u8]) -> (Step, Vec<u8>) {
        let header = OptionHeader { option, length: data.len() as u32 };
        let mut out = Vec::new();
        negotiation.option_header(&header, &mut out).unwrap();
        let step = negotiation.option(&header, data, &mut out);
        (step, out)
    }

    fn go_data(name: &[u8], info: &[u16]) -> Vec<u8> {
        let mut data = Vec::new();
        InfoRequest { name, info_types: info.to_vec() }.encode(&mut data);
        data
    }

    fn fixed(export: &ExportInfo) -> Negotiation<'_> {
        let mut negotiation = Negotiation::new(export);
        negotiation.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).unwrap();
        negotiation
    }

    #[test]
    fn unknown_client_flags_end_the_handshake() {
        let export = export();
        let mut negotiation = Negotiation::new(&export);
        assert_eq!(negotiation.client_flags(4), Err(NegotiationError::UnknownClientFlags(4)));
        assert!(negotiation.client_flags(FLAG_C_FIXED_NEWSTYLE).is_ok());
    }

    #[test]
    fn go_answers_block_size_and_export_then_enters_transmission() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (step, out) = send(&mut negotiation, OPT_GO, &go_data(b"disk", &[INFO_BLOCK_SIZE]));
        let Step::Transmission(session) = step else { panic!("GO must enter transmission: {step:?}") };
        assert_eq!(session.style, ReplyStyle::Simple);
        let replies = replies(&out);
        assert_eq!(replies.len(), 3);
        let (_, kind, payload) = &replies[0];
        assert_eq!(*kind, REP_INFO);
        assert_eq!(payload[..2], INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(payload[2..6], 512u32.to_be_bytes());
        assert_eq!(payload[6..10], 4096u32.to_be_bytes());
        assert_eq!(payload[10..14], (32u32 << 20).to_be_bytes());
        let (_, kind, payload) = &replies[1];
        assert_eq!(*kind, REP_INFO);
        assert_eq!(payload.len(), 12);
        assert_eq!(payload[..2], INFO_EXPORT.to_be_bytes());
        assert_eq!(payload[2..10], (1u64 << 20).to_be_bytes());
        let flags = u16::from_be_bytes(payload[10..12].try_into().unwrap());
        assert_eq!(flags, export.transmission_flags(ReplyStyle::Simple));
        assert_eq!(flags & FLAG_SEND_DF, 0, "no DF without structured replies");
        assert_ne!(flags & FLAG_SEND_FAST_ZERO, 0);
        assert_eq!(replies[2].1, REP_ACK);
    }

    #[test]
    fn block_sizes_are_sent_even_when_not_asked_for() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (step, out) = send(&mut negotiation, OPT_INFO, &go_data(b"", &[]));
        assert_eq!(step, Step::Continue, "INFO stays in negotiation");
        let kinds: Vec<u16> =
            replies(&out).iter().filter(|r| r.1 == REP_INFO).map(|r| u16::from_be_bytes([r.2[0], r.2[1]])).collect();
        assert_eq!(kinds, vec![INFO_BLOCK_SIZE, INFO_EXPORT]);
    }

    #[test]
    fn name_and_description_are_sent_when_asked() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (_, out) = send(&mut negotiation, OPT_INFO, &go_data(b"", &[INFO_NAME, INFO_DESCRIPTION, INFO_NAME, 99]));
        let all = replies(&out);
        assert_eq!(all.last().unwrap().1, REP_ACK);
        let replies: Vec<_> = all.into_iter().filter(|r| r.1 == REP_INFO).collect();
        let name = replies.iter().find(|r| r.2[..2] == INFO_NAME.to_be_bytes()).unwrap();
        assert_eq!(&name.2[2..], b"disk");
        let description = replies.iter().find(|r| r.2[..2] == INFO_DESCRIPTION.to_be_bytes()).unwrap();
        assert_eq!(&description.2[2..], b"a test disk");
        assert_eq!(replies.iter().filter(|r| r.2[..2] == INFO_NAME.to_be_bytes()).count(), 1);
    }

    #[test]
    fn unknown_export_is_an_error_reply_for_go() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (step, out) = send(&mut negotiation, OPT_GO, &go_data(b"other", &[]));
        assert_eq!(step, Step::Continue);
        let replies = replies(&out);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].1, REP_ERR_UNKNOWN);
        assert!(String::from_utf8_lossy(&replies[0].2).contains("other"));
        // The driver learns the name, once, to log it.
        assert_eq!(negotiation.take_unknown_export().as_deref(), Some("other"));
        assert_eq!(negotiation.take_unknown_export(), None);
        let (_, _) = send(&mut negotiation, OPT_GO, &go_data(b"", &[]));
        assert_eq!(negotiation.take_unknown_export(), None, "the default export is known");
    }

    #[test]
    fn malformed_go_is_invalid() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (step, out) = send(&mut negotiation, OPT_GO, &[0, 0, 0, 40, b'x']);
        assert_eq!(step, Step::Continue);
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
    }

    #[test]
    fn export_name_honours_no_zeroes() {
        let export = export();
        for (flags, expected_len) in [(FLAG_C_FIXED_NEWSTYLE, 10 + 124), (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES, 10)]
        {
            let mut negotiation = Negotiation::new(&export);
            negotiation.client_flags(flags).unwrap();
            let (step, out) = send(&mut negotiation, OPT_EXPORT_NAME, b"");
            assert!(matches!(step, Step::Transmission(_)));
            assert_eq!(out.len(), expected_len);
            assert_eq!(out[..8], (1u64 << 20).to_be_bytes());
        }
    }

    #[test]
    fn export_name_of_an_unknown_export_closes() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (step, out) = send(&mut negotiation, OPT_EXPORT_NAME, b"nope");
        assert!(matches!(step, Step::Fail(NegotiationError::UnknownExport { .. })));
        assert!(out.is_empty(), "EXPORT_NAME has no error reply");
    }

    #[test]
    fn export_name_after_extended_headers_closes() {
        let export = export();
        let mut negotiation = fixed(&export);
        send(&mut negotiation, OPT_EXTENDED_HEADERS, b"");
        let (step, _) = send(&mut negotiation, OPT_EXPORT_NAME, b"");
        assert_eq!(step, Step::Fail(NegotiationError::ExportNameAfterExtendedHeaders));
    }

    #[test]
    fn reply_styles_are_negotiated() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (_, out) = send(&mut negotiation, OPT_STRUCTURED_REPLY, b"");
        assert_eq!(replies(&out)[0].1, REP_ACK);
        let (_, out) = send(&mut negotiation, OPT_STRUCTURED_REPLY, b"x");
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
        let (_, out) = send(&mut negotiation, OPT_EXTENDED_HEADERS, b"");
        assert_eq!(replies(&out)[0].1, REP_ACK);
        let (_, out) = send(&mut negotiation, OPT_STRUCTURED_REPLY, b"");
        assert_eq!(replies(&out)[0].1, REP_ERR_EXT_HEADER_REQD, "no downgrade from extended headers");
        let (step, out) = send(&mut negotiation, OPT_GO, &go_data(b"disk", &[]));
        let Step::Transmission(session) = step else { panic!("{step:?}") };
        assert_eq!(session.style, ReplyStyle::Extended);
        let export_info = replies(&out).into_iter().find(|r| r.2[..2] == INFO_EXPORT.to_be_bytes()).unwrap();
        let flags = u16::from_be_bytes(export_info.2[10..12].try_into().unwrap());
        assert_ne!(flags & FLAG_SEND_DF, 0);
    }

    #[test]
    fn meta_contexts_are_listed_as_none() {
        let export = export();
        let mut negotiation = fixed(&export);
        let mut data = Vec::new();
        data.extend(4u32.to_be_bytes());
        data.extend(b"disk");
        data.extend(1u32.to_be_bytes());
        data.extend(15u32.to_be_bytes());
        data.extend(b"base:allocation");
        let (_, out) = send(&mut negotiation, OPT_SET_META_CONTEXT, &data);
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID, "structured replies come first");
        send(&mut negotiation, OPT_STRUCTURED_REPLY, b"");
        for option in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
            let (_, out) = send(&mut negotiation, option, &data);
            let replies = replies(&out);
            assert!(replies.iter().all(|r| r.1 != REP_META_CONTEXT));
            assert_eq!(replies, vec![(option, REP_ACK, vec![])]);
        }
        let (_, out) = send(&mut negotiation, OPT_SET_META_CONTEXT, &data[..data.len() - 2]);
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
        let (step, _) = send(&mut negotiation, OPT_GO, &go_data(b"disk", &[]));
        let Step::Transmission(session) = step else { panic!("{step:?}") };
        assert_eq!(session.allocation_context, None, "nothing to select");
    }

    /// A meta-context option's data: the export name and the queries.
    fn meta_data(name: &[u8], queries: &[&[u8]]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend((name.len() as u32).to_be_bytes());
        data.extend(name);
        data.extend((queries.len() as u32).to_be_bytes());
        for query in queries {
            data.extend((query.len() as u32).to_be_bytes());
            data.extend(*query);
        }
        data
    }

    /// The `NBD_REP_META_CONTEXT` replies of a meta-context option, as (id, name), and whether
    /// it ended with an ACK.
    fn contexts(out: &[u8]) -> (Vec<(u32, String)>, bool) {
        let all = replies(out);
        let acked = all.last().is_some_and(|reply| reply.1 == REP_ACK);
        let contexts = all
            .iter()
            .filter(|reply| reply.1 == REP_META_CONTEXT)
            .map(|reply| {
                let id = u32::from_be_bytes(reply.2[..4].try_into().unwrap());
                (id, String::from_utf8(reply.2[4..].to_vec()).unwrap())
            })
            .collect();
        (contexts, acked)
    }

    #[test]
    fn base_allocation_is_listed_and_selected_when_the_backend_can_tell() {
        let export = ExportInfo { reports_allocation: true, ..export() };
        let mut negotiation = fixed(&export);
        let allocation = (0, BASE_ALLOCATION.to_string());
        let selected = (BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string());
        // Structured replies come first.
        let (_, out) = send(&mut negotiation, OPT_LIST_META_CONTEXT, &meta_data(b"disk", &[]));
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
        send(&mut negotiation, OPT_STRUCTURED_REPLY, b"");
        for queries in [&[][..], &[&b"base:"[..]], &[&b"base:allocation"[..]], &[&b"qemu:dirty-bitmap:x"[..], b"base:"]]
        {
            let (_, out) = send(&mut negotiation, OPT_LIST_META_CONTEXT, &meta_data(b"", queries));
            assert_eq!(contexts(&out), (vec![allocation.clone()], true), "queries {queries:?}");
        }
        for queries in [&[&b"qemu:allocation-depth"[..]][..], &[&b"base:other"[..]], &[&b"nocolon"[..]]] {
            let (_, out) = send(&mut negotiation, OPT_LIST_META_CONTEXT, &meta_data(b"disk", queries));
            assert_eq!(contexts(&out), (vec![], true), "queries {queries:?} match nothing");
        }
        // Selecting: `base:` is ignored, no query selects nothing; each SET replaces the last.
        for (queries, expected) in [
            (&[][..], vec![]),
            (&[&b"base:"[..]][..], vec![]),
            (&[&b"base:allocation"[..], b"base:allocation"][..], vec![selected.clone()]),
        ] {
            let (_, out) = send(&mut negotiation, OPT_SET_META_CONTEXT, &meta_data(b"disk", queries));
            assert_eq!(contexts(&out), (expected, true), "queries {queries:?}");
        }
        let (step, _) = send(&mut negotiation, OPT_GO, &go_data(b"disk", &[]));
        let Step::Transmission(session) = step else { panic!("{step:?}") };
        assert_eq!(session.allocation_context, Some(BASE_ALLOCATION_ID));

        // A later SET that fails, or selects nothing, leaves nothing selected.
        for data in [meta_data(b"other", &[b"base:allocation"]), meta_data(b"disk", &[b"base:"])] {
            let mut negotiation = fixed(&export);
            send(&mut negotiation, OPT_EXTENDED_HEADERS, b"");
            let (_, out) = send(&mut negotiation, OPT_SET_META_CONTEXT, &meta_data(b"", &[b"base:allocation"]));
            assert_eq!(contexts(&out), (vec![selected.clone()], true), "extended headers do as well");
            send(&mut negotiation, OPT_SET_META_CONTEXT, &data);
            let (step, _) = send(&mut negotiation, OPT_GO, &go_data(b"", &[]));
            let Step::Transmission(session) = step else { panic!("{step:?}") };
            assert_eq!(session.allocation_context, None);
        }
    }

    #[test]
    fn list_names_the_export_with_its_description() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (step, out) = send(&mut negotiation, OPT_LIST, b"");
        assert_eq!(step, Step::Continue);
        let replies = replies(&out);
        assert_eq!(replies.len(), 2);
        assert_eq!(replies[0].1, REP_SERVER);
        assert_eq!(codec::parse_rep_server(&replies[0].2), Ok((&b"disk"[..], &b"a test disk"[..])));
        assert_eq!(replies[1].1, REP_ACK);
    }

    #[test]
    fn unknown_options_and_tls_are_unsupported() {
        let export = export();
        let mut negotiation = fixed(&export);
        for option in [OPT_STARTTLS, 4, 12, 0xdead_beef] {
            let (step, out) = send(&mut negotiation, option, b"");
            assert_eq!(step, Step::Continue);
            assert_eq!(replies(&out)[0].1, REP_ERR_UNSUP, "option {option}");
        }
    }

    #[test]
    fn abort_is_acknowledged_and_closes() {
        let export = export();
        let mut negotiation = fixed(&export);
        let (step, out) = send(&mut negotiation, OPT_ABORT, b"");
        assert_eq!(step, Step::Close);
        assert_eq!(replies(&out)[0].1, REP_ACK);
    }

    #[test]
    fn huge_option_lengths_are_refused_before_reading() {
        let export = export();
        let mut negotiation = fixed(&export);
        let mut out = Vec::new();
        let header = OptionHeader { option: OPT_GO, length: u32::MAX };
        let error = negotiation.option_header(&header, &mut out).unwrap_err();
        assert!(matches!(error, NegotiationError::OptionTooLong { length: u32::MAX, .. }));
        assert_eq!(replies(&out)[0].1, REP_ERR_TOO_BIG);

        let header = OptionHeader { option: OPT_EXPORT_NAME, length: MAX_STRING_BYTES as u32 + 1 };
        out.clear();
        assert!(negotiation.option_header(&header, &mut out).is_err());
        assert!(out.is_empty(), "EXPORT_NAME cannot be answered with an error");

        // An option the server does not know is named by its number.
        let header = OptionHeader { option: 231_551_481, length: MAX_OPTION_BYTES + 1 };
        out.clear();
        let error = negotiation.option_header(&header, &mut out).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("option 231551481 of {} bytes exceeds the limit of {MAX_OPTION_BYTES} bytes", MAX_OPTION_BYTES + 1)
        );
        let message = String::from_utf8_lossy(&out[20..]).into_owned();
        assert!(message.starts_with("option 231551481 of "), "{message}");
    }

    #[test]
    fn endless_options_are_cut_off() {
        let export = export();
        let mut negotiation = fixed(&export);
        for _ in 0..MAX_OPTIONS {
            let (step, _) = send(&mut negotiation, OPT_LIST, b"");
            assert_eq!(step, Step::Continue);
        }
        let mut out = Vec::new();
        let header = OptionHeader { option: OPT_LIST, length: 0 };
        assert_eq!(
            negotiation.option_header(&header, &mut out),
            Err(NegotiationError::TooManyOptions { limit: MAX_OPTIONS })
        );
        assert_eq!(replies(&out)[0].1, REP_ERR_POLICY);
    }

    #[test]
    fn a_client_without_fixed_newstyle_may_only_name_the_export() {
        let export = export();
        let mut negotiation = Negotiation::new(&export);
        negotiation.client_flags(0).unwrap();
        let (step, out) = send(&mut negotiation, OPT_LIST, b"");
        assert!(matches!(step, Step::Fail(NegotiationError::NotFixedNewstyle { .. })));
        assert!(out.is_empty());
        let mut negotiation = Negotiation::new(&export);
        negotiation.client_flags(0).unwrap();
        let (step, _) = send(&mut negotiation, OPT_EXPORT_NAME, b"disk");
        assert!(matches!(step, Step::Transmission(_)));
    }

    #[test]
    fn read_only_exports_advertise_no_writes() {
        let export = ExportInfo { read_only: true, ..export() };
        let flags = export.transmission_flags(ReplyStyle::Structured);
        assert_ne!(flags & FLAG_READ_ONLY, 0);
        assert_eq!(flags & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO), 0);
        assert_ne!(flags & FLAG_CAN_MULTI_CONN, 0);
    }
}
