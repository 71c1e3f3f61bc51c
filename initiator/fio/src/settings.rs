//! The engine's fio options, checked once: every error names the option at fault and what to
//! do, because fio shows the user nothing else about an engine's options.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use netdam_initiator::volume::MAX_VOLUME_SESSIONS;
use netdam_initiator::ClientPoll;

/// Where fio's I/O goes when neither `target=` nor `NETDAM_TARGET` is given: the address
/// `netdam-target` serves on by default.
pub const DEFAULT_TARGET: &str = "127.0.0.1:7800";

/// The environment variable that names the target when `target=` is not given, as for the
/// netdam CLI. A job file cannot leave `target=${NETDAM_TARGET}` empty (fio refuses an option
/// with no value), so it leaves `target=` out and the engine reads the variable.
pub const TARGET_VARIABLE: &str = "NETDAM_TARGET";

/// The options as fio parsed them (`None`: not given).
#[derive(Debug, Clone, Copy, Default)]
pub struct RawSettings<'a> {
    /// `target=HOST:PORT`.
    pub target: Option<&'a str>,
    /// `namespace=NAME`.
    pub namespace: Option<&'a str>,
    /// `region=NAME`.
    pub region: Option<&'a str>,
    /// `sessions=N`.
    pub sessions: u32,
    /// `poll=busy|adaptive|blocking`.
    pub poll: Option<&'a str>,
    /// `key=FILE`.
    pub key: Option<&'a str>,
    /// `encrypt=1`.
    pub encrypt: bool,
    /// `coalesce=1` (fio's default for it).
    pub coalesce: bool,
    /// fio's `sync=1` (`sync`, `dsync`): writes carry FUA.
    pub fua: bool,
}

/// What fio's I/O addresses on the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceName {
    /// A block namespace, by name or id.
    Namespace(String),
    /// A byte-addressable memory region, by name or id.
    Region(String),
}

impl SpaceName {
    /// The option that named it, as the user wrote it (`namespace=disk`): the prefix of every
    /// message about it.
    pub fn option(&self) -> String {
        match self {
            SpaceName::Namespace(name) => format!("namespace={name}"),
            SpaceName::Region(name) => format!("region={name}"),
        }
    }
}

/// The checked options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The target's address.
    pub target: SocketAddr,
    /// Where the address came from and what it said, `target=HOST:PORT` or
    /// `NETDAM_TARGET=HOST:PORT` (for messages: it may be a host name).
    target_option: String,
    /// The namespace or region.
    pub space: SpaceName,
    /// Sessions to spread I/O over.
    pub sessions: usize,
    /// How to wait for completions.
    pub poll: ClientPoll,
    /// The tenant's key (`key=`, `$NETDAM_KEY`, or the default tenant's key file).
    pub credentials: Option<netdam_auth::Credentials>,
    /// Encrypted sessions (`encrypt=1`): every datagram's body, both ways; only with a key.
    pub encrypt: bool,
    /// Let a datagram with room wait briefly for the next I/O while many are in flight.
    pub coalesce: bool,
    /// Writes to a namespace carry FUA (fio's `sync=`): durable when they complete.
    pub fua: bool,
}

/// An option that cannot work; the message starts with the option (`sessions=0: ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

impl Settings {
    /// How the engine's sessions connect: with the tenant's key when there is one.
    pub fn client_options(&self) -> netdam_initiator::ClientOptions {
        // The engine waits on the sockets itself, as `poll` says (`Engine::reap`); the sessions
        // know it too, so that a spinning one reads an answer that follows an empty poll without
        // its kernel timestamp.
        let mut options =
            netdam_initiator::ClientOptions { poll: self.poll, ..netdam_initiator::ClientOptions::default() };
        options.session.credentials = self.credentials;
        options.session.encrypt = self.encrypt;
        options
    }

    /// `target=` (or `NETDAM_TARGET=`) as the user wrote it: the prefix of messages about the
    /// target.
    pub fn target_option(&self) -> &str {
        &self.target_option
    }

    /// Checks the options. Resolves the target (a host name is looked up here, once):
    /// `target=`, else `$NETDAM_TARGET` where set and not empty, else [`DEFAULT_TARGET`].
    pub fn parse(raw: &RawSettings<'_>) -> Result<Settings, SettingsError> {
        let variable = std::env::var(TARGET_VARIABLE).ok();
        Settings::parse_with_target_variable(raw, variable.as_deref())
    }

    /// [`Settings::parse`], with `target_variable` for the value of `$NETDAM_TARGET`.
    fn parse_with_target_variable(
        raw: &RawSettings<'_>,
        target_variable: Option<&str>,
    ) -> Result<Settings, SettingsError> {
        let (option, target_text) = match (given(raw.target), given(target_variable)) {
            (Some(target), _) => ("target", target),
            (None, Some(target)) => (TARGET_VARIABLE, target),
            (None, None) => ("target", DEFAULT_TARGET),
        };
        let target_option = format!("{option}={target_text}");
        let target = resolve(&target_option, target_text)?;
        let space = match (given(raw.namespace), given(raw.region)) {
            (Some(namespace), None) => SpaceName::Namespace(namespace.to_string()),
            (None, Some(region)) => SpaceName::Region(region.to_string()),
            (Some(namespace), Some(region)) => {
                return Err(SettingsError(format!(
                    "namespace={namespace} and region={region}: give exactly one (a block namespace or a memory region)"
                )))
            }
            (None, None) => {
                return Err(SettingsError(
                    "namespace= or region= is missing: name the block namespace or memory region to run on \
                     (`netdam namespaces` and `netdam regions` list them)"
                        .to_string(),
                ))
            }
        };
        let sessions = raw.sessions as usize;
        if !(1..=MAX_VOLUME_SESSIONS).contains(&sessions) {
            return Err(SettingsError(format!("sessions={sessions}: must be between 1 and {MAX_VOLUME_SESSIONS}")));
        }
        // Adaptive by default: fio is run to measure, and a thread that sleeps between answers
        // pays a halted CPU's wake-up on each (23.9 against 8.6 µs p50 at depth 1 on a VM,
        // docs/DECISIONS.md); it spins only while an answer is due soon.
        let poll = match given(raw.poll).unwrap_or("adaptive") {
            "busy" => ClientPoll::Busy,
            "blocking" => ClientPoll::Blocking,
            "adaptive" => ClientPoll::Adaptive,
            other => return Err(SettingsError(format!("poll={other}: must be busy, adaptive or blocking"))),
        };
        let key = given(raw.key).map(std::path::PathBuf::from).or_else(|| netdam_key_variable().map(Into::into));
        let option = if given(raw.key).is_some() { "key" } else { "NETDAM_KEY" };
        let credentials = netdam_initiator::keys::resolve(key.as_deref()).map_err(|error| {
            SettingsError(format!(
                "{option}={}: {error}",
                key.as_deref().map_or(String::new(), |path| path.display().to_string())
            ))
        })?;
        if raw.encrypt && credentials.is_none() {
            // `key=none` asks for no key on purpose: the two options contradict each other.
            let refused_on_purpose = key.as_deref().is_some_and(|path| path.as_os_str() == "none");
            let message = if refused_on_purpose {
                format!(
                    "encrypt=1 with {option}=none: encryption needs a tenant key, and {option}=none says to \
                     present none; give the tenant's key file, or leave encrypt= out (a target with \
                     auth = \"none\" cannot encrypt)"
                )
            } else {
                "encrypt=1: encryption needs a tenant key, and none was found: give key=FILE or set NETDAM_KEY \
                 (`netdam-target tenant create` writes one; a target with auth = \"none\" cannot encrypt)"
                    .to_string()
            };
            return Err(SettingsError(message));
        }
        Ok(Settings {
            target,
            target_option,
            space,
            sessions,
            poll,
            credentials,
            encrypt: raw.encrypt,
            coalesce: raw.coalesce,
            fua: raw.fua,
        })
    }
}

/// `$NETDAM_KEY`, where set and not empty (an empty one means none, as for the CLI).
fn netdam_key_variable() -> Option<std::ffi::OsString> {
    std::env::var_os("NETDAM_KEY").filter(|value| !value.is_empty())
}

/// A text option with its blanks trimmed; `None` when missing or blank.
fn given(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|value| !value.is_empty())
}

/// `HOST:PORT` to one address (the first the resolver gives); `option` (`target=HOST:PORT`)
/// starts a message about it.
fn resolve(option: &str, target: &str) -> Result<SocketAddr, SettingsError> {
    let wrong = |why: String| SettingsError(format!("{option}: {why}"));
    if !target.contains(':') {
        return Err(wrong("expected HOST:PORT, e.g. 127.0.0.1:7800 (the port is missing)".to_string()));
    }
    let mut addresses = target.to_socket_addrs().map_err(|error| wrong(format!("cannot resolve it: {error}")))?;
    addresses.next().ok_or_else(|| wrong("the name resolves to no address".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>() -> RawSettings<'a> {
        RawSettings { namespace: Some("disk"), sessions: 1, ..RawSettings::default() }
    }

    #[test]
    fn defaults_are_the_local_target_one_session_and_adaptive_waits() {
        let settings = Settings::parse_with_target_variable(&raw(), None).unwrap();
        assert_eq!(settings.target, DEFAULT_TARGET.parse().unwrap());
        assert_eq!(settings.target_option(), format!("target={DEFAULT_TARGET}"));
        assert_eq!(settings.space, SpaceName::Namespace("disk".into()));
        assert_eq!((settings.sessions, settings.poll), (1, ClientPoll::Adaptive));
    }

    #[test]
    fn netdam_target_names_the_target_when_target_is_not_given() {
        let from_variable = Settings::parse_with_target_variable(&raw(), Some("127.0.0.1:7943")).unwrap();
        assert_eq!(from_variable.target, "127.0.0.1:7943".parse().unwrap());
        assert_eq!(from_variable.target_option(), "NETDAM_TARGET=127.0.0.1:7943");
        let given = RawSettings { target: Some("127.0.0.1:7944"), ..raw() };
        let over_variable = Settings::parse_with_target_variable(&given, Some("127.0.0.1:7943")).unwrap();
        assert_eq!(over_variable.target, "127.0.0.1:7944".parse().unwrap(), "target= wins");
        let empty = Settings::parse_with_target_variable(&raw(), Some(" ")).unwrap();
        assert_eq!(empty.target, DEFAULT_TARGET.parse().unwrap(), "an empty variable means the default");
        let wrong = Settings::parse_with_target_variable(&raw(), Some("localhost")).unwrap_err();
        assert!(wrong.0.starts_with("NETDAM_TARGET=localhost: expected HOST:PORT"), "{}", wrong.0);
    }

    #[test]
    fn every_error_names_its_option() {
        let cases = [
            (RawSettings { namespace: None, ..raw() }, "namespace= or region= is missing"),
            (RawSettings { region: Some("scratch"), ..raw() }, "namespace=disk and region=scratch"),
            (RawSettings { sessions: 0, ..raw() }, "sessions=0:"),
            (RawSettings { sessions: 65, ..raw() }, "sessions=65:"),
            (RawSettings { poll: Some("spin"), ..raw() }, "poll=spin:"),
            (RawSettings { target: Some("localhost"), ..raw() }, "target=localhost: expected HOST:PORT"),
            (RawSettings { target: Some("127.0.0.1:port"), ..raw() }, "target=127.0.0.1:port: cannot resolve"),
            (RawSettings { key: Some("/nonexistent/alice.key"), ..raw() }, "key=/nonexistent/alice.key:"),
        ];
        for (raw, expected) in cases {
            let error = Settings::parse_with_target_variable(&raw, None).unwrap_err();
            assert!(error.0.starts_with(expected), "{expected:?} not at the start of {:?}", error.0);
        }
    }

    #[test]
    fn encrypt_takes_the_key_and_reaches_the_sessions_and_names_itself_without_one() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("alice.key");
        let file = netdam_auth::KeyFile {
            tenant: "alice".into(),
            id: 4,
            version: 1,
            key: netdam_auth::TenantKey::from_bytes([7; 32]),
        };
        file.write(&path, false).unwrap();
        let key = path.to_str().unwrap();
        let settings = Settings::parse(&RawSettings { key: Some(key), encrypt: true, ..raw() }).unwrap();
        assert!(settings.encrypt);
        let options = settings.client_options();
        assert!(options.session.encrypt, "the sessions are asked to encrypt");
        assert_eq!(options.session.credentials, Some(file.credentials()));
        let plain = Settings::parse(&RawSettings { key: Some(key), ..raw() }).unwrap();
        assert!(!plain.client_options().session.encrypt, "MAC only unless asked");
        // Without a key the refusal names the option; where this machine has a default tenant's
        // key file (a target started here with its embedded default), there is a key.
        match (Settings::parse(&RawSettings { encrypt: true, ..raw() }), netdam_key_variable()) {
            (Err(error), None) => {
                assert!(error.0.starts_with("encrypt=1: encryption needs a tenant key"), "{}", error.0)
            }
            (Err(error), Some(_)) => assert!(error.0.starts_with("NETDAM_KEY="), "{}", error.0),
            (Ok(settings), _) => assert!(settings.credentials.is_some() && settings.encrypt),
        }
        // key=none contradicts encrypt=1, and the refusal says so rather than "none was found".
        let error = Settings::parse(&RawSettings { key: Some("none"), encrypt: true, ..raw() }).unwrap_err();
        assert!(error.0.starts_with("encrypt=1 with key=none: "), "{}", error.0);
    }

    #[test]
    fn a_region_and_busy_polling_are_taken() {
        let raw = RawSettings {
            namespace: Some(" "),
            region: Some("scratch"),
            poll: Some("busy"),
            sessions: 2,
            target: Some("localhost:7801"),
            key: None,
            encrypt: false,
            coalesce: true,
            fua: true,
        };
        let settings = Settings::parse(&raw).unwrap();
        assert!(settings.fua, "fio's sync=1 is carried through");
        assert_eq!(settings.space, SpaceName::Region("scratch".into()));
        assert_eq!(settings.space.option(), "region=scratch");
        assert_eq!((settings.sessions, settings.poll, settings.target.port()), (2, ClientPoll::Busy, 7801));
        assert!(settings.coalesce);
        assert_eq!(settings.client_options().poll, ClientPoll::Busy);
    }

    #[test]
    fn each_polling_mode_is_taken_and_reaches_the_sessions() {
        for (given, poll) in
            [("adaptive", ClientPoll::Adaptive), ("blocking", ClientPoll::Blocking), ("busy", ClientPoll::Busy)]
        {
            let settings = Settings::parse(&RawSettings { poll: Some(given), ..raw() }).unwrap();
            assert_eq!((settings.poll, settings.client_options().poll), (poll, poll), "poll={given}");
        }
        assert_eq!(Settings::parse(&raw()).unwrap().client_options().poll, ClientPoll::Adaptive);
    }
}
