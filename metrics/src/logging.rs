//! Logs of the long-running processes: `tracing` to standard error, filtered like `RUST_LOG`,
//! as text or as one JSON object per line.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Whether log lines may carry colour: only when standard error is a terminal. A log file, a
/// pipe or journald would get the escape codes as text.
fn colour() -> bool {
    std::io::stderr().is_terminal()
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The filter in force: `NETDAM_LOG` if set, else `RUST_LOG`, else `info`; both take
/// `RUST_LOG` syntax (`info`, `netdam_target=debug,warn`, ...). A filter that does not parse
/// is reported on standard error and `info` is used instead.
pub fn filter_from_env() -> EnvFilter {
    filter_from_env_or("info")
}

/// As [`filter_from_env`], with `default` where neither variable is set (or one does not parse).
fn filter_from_env_or(default: &str) -> EnvFilter {
    for variable in ["NETDAM_LOG", "RUST_LOG"] {
        match std::env::var(variable) {
            Ok(text) if !text.trim().is_empty() => match EnvFilter::try_new(&text) {
                Ok(filter) => return filter,
                Err(error) => eprintln!("warning: {variable}={text:?} is not a log filter ({error}); using {default}"),
            },
            _ => {}
        }
    }
    EnvFilter::new(default)
}

/// Installs a quiet subscriber for one-shot commands (`netdam read`, ...): warnings and errors
/// only unless `NETDAM_LOG` or `RUST_LOG` say otherwise, without timestamps or module paths,
/// so a command that waits on a silent target says why.
pub fn init_for_command() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter_from_env_or("warn"))
        .with_ansi(colour())
        .without_time()
        .with_target(false)
        .try_init();
}

/// Installs the process's log subscriber (once; a second call does nothing).
pub fn init(format: LogFormat) {
    let builder =
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter_from_env()).with_ansi(colour());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
