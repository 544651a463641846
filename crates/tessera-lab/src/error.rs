//! The lab's one error type.

use std::path::PathBuf;

/// Why a lab operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The lab creates namespaces, links and qdiscs, which needs root.
    #[error(
        "the network lab needs root (it creates network namespaces, veth links and tbf qdiscs)"
    )]
    NotRoot,
    /// A program the lab runs is not installed.
    #[error("`{program}` is not installed (Debian package {package})")]
    MissingProgram {
        /// The program.
        program: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// A command could not be started at all.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed to stderr, trimmed.
        stderr: String,
    },
    /// A file or socket operation of the lab itself failed.
    #[error("cannot {action}: {source}")]
    Io {
        /// What the lab was doing, e.g. "write results/x.csv".
        action: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A daemon exited before the lab stopped it.
    #[error("{daemon} exited ({status}); its log ends with: {log_tail}")]
    DaemonExited {
        /// Which daemon, e.g. "server 2".
        daemon: String,
        /// Its exit status.
        status: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {seconds:.1} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the lab waited.
        seconds: f64,
    },
    /// The measurement client (`tessera lab-client`) failed.
    #[error("lab client job '{job}' failed ({status}): {stderr}")]
    ClientFailed {
        /// The job's kind.
        job: String,
        /// Its exit status.
        status: String,
        /// The last lines it printed to stderr.
        stderr: String,
    },
    /// The measurement client's output is not a report.
    #[error("lab client job '{job}' printed no report: {source}")]
    BadReport {
        /// The job's kind.
        job: String,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// The measurement client answered a job with a report of another kind.
    #[error("lab client job '{job}' answered with a report of another kind")]
    WrongReport {
        /// The job's kind.
        job: String,
    },
    /// A Tessera operation of the measurement client failed.
    #[error(transparent)]
    Client(#[from] tessera_client::ClientError),
    /// Bytes read back differ from the bytes written.
    #[error("{path}: bytes read back differ from bytes written")]
    Corrupt {
        /// The file.
        path: String,
    },
    /// The tessera binary lacks a flag that an experiment needs.
    #[error("`tessera {command}` has no {flag} flag in this build, so {why}")]
    UnsupportedFlag {
        /// The subcommand, e.g. "server".
        command: String,
        /// The flag, e.g. "--window".
        flag: &'static str,
        /// What cannot be measured without it.
        why: &'static str,
    },
    /// A setting's value is not understood or out of range.
    #[error("bad {what} '{text}': {expected}")]
    BadValue {
        /// Which setting.
        what: &'static str,
        /// The value given.
        text: String,
        /// What is expected instead.
        expected: &'static str,
    },
    /// Drawing a plot failed.
    #[error("cannot draw {path}: {reason}")]
    Plot {
        /// The PNG being drawn.
        path: PathBuf,
        /// The plotting library's message.
        reason: String,
    },
    /// The measurement client could not make a client of the cluster (credentials, socket).
    #[error("cannot connect to the cluster: {0}")]
    Connect(String),
    /// The run was interrupted (Ctrl-C or SIGTERM) and torn down.
    #[error("interrupted; the lab network is torn down")]
    Interrupted,
    /// Teardown could not remove everything.
    #[error("teardown left namespaces behind: {} (try `tessera lab cleanup --all`)", .0.join(", "))]
    Leftovers(Vec<String>),
}

impl LabError {
    /// An [`LabError::Io`] for `action`.
    pub(crate) fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
        let action = action.into();
        move |source| LabError::Io { action, source }
    }
}
