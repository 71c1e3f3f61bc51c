//! Logs of the long-running processes: `tracing` to standard error, filtered like `RUST_LOG`,
//! as text or as one JSON object per line.

use tracing_subscriber::EnvFilter;

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
    for variable in ["NETDAM_LOG", "RUST_LOG"] {
        match std::env::var(variable) {
            Ok(text) if !text.trim().is_empty() => match EnvFilter::try_new(&text) {
                Ok(filter) => return filter,
                Err(error) => eprintln!("warning: {variable}={text:?} is not a log filter ({error}); using info"),
            },
            _ => {}
        }
    }
    EnvFilter::new("info")
}

/// Installs the process's log subscriber (once; a second call does nothing).
pub fn init(format: LogFormat) {
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter_from_env());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
