//! Commands as values: built first (so tests can read them), then run.
//!
//! Every external program the lab starts (`ip`, `tc`, `ethtool`, the tessera daemons) goes
//! through [`Cmd`]. Children are put in their own process group, so a Ctrl-C at the terminal
//! reaches only the lab, which then stops them itself in order and tears the network down.

use crate::LabError;
use std::fmt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often waits poll a child and the cancel flag.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    /// The program, looked up on `PATH` unless it holds a slash.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables it must not inherit.
    pub env_removed: Vec<String>,
}

impl Cmd {
    /// `program` with no arguments yet.
    pub fn new(program: impl Into<String>) -> Cmd {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            env_removed: Vec::new(),
        }
    }

    /// Do not pass environment variable `name` on.
    pub fn without_env(mut self, name: impl Into<String>) -> Cmd {
        self.env_removed.push(name.into());
        self
    }

    /// Append one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Cmd {
        self.args.push(arg.into());
        self
    }

    /// Append arguments.
    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// This command run inside network namespace `namespace` (`ip netns exec NS ...`).
    /// `ip netns exec` replaces itself with the program, so the child's pid is the program's.
    pub fn in_namespace(self, namespace: &str) -> Cmd {
        Cmd {
            env_removed: self.env_removed,
            ..Cmd::new("ip")
                .args(["netns", "exec", namespace])
                .arg(self.program)
                .args(self.args)
        }
    }

    /// A `std` command for it, in its own process group.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).process_group(0);
        for name in &self.env_removed {
            command.env_remove(name);
        }
        command
    }

    /// Run to completion; its stdout on success, an error with its stderr otherwise.
    pub fn run(&self) -> Result<String, LabError> {
        let output = self
            .command()
            .stdin(Stdio::null())
            .output()
            .map_err(|source| LabError::Spawn {
                command: self.to_string(),
                source,
            })?;
        if !output.status.success() {
            return Err(LabError::CommandFailed {
                command: self.to_string(),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Start it with the given stdout and stderr.
    pub fn spawn(&self, stdout: Stdio, stderr: Stdio) -> Result<Child, LabError> {
        self.command()
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|source| LabError::Spawn {
                command: self.to_string(),
                source,
            })
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for arg in &self.args {
            if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || c == '"') {
                write!(f, " '{arg}'")?;
            } else {
                write!(f, " {arg}")?;
            }
        }
        Ok(())
    }
}

/// A flag that asks a running experiment to stop; set by a signal handler at the edge.
/// Waits check it, and the experiment then returns [`LabError::Interrupted`] through its
/// guards, which tear everything down.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not yet set.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Ask the experiment to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether stopping was asked for.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// [`LabError::Interrupted`] if stopping was asked for.
    pub fn check(&self) -> Result<(), LabError> {
        if self.is_cancelled() {
            return Err(LabError::Interrupted);
        }
        Ok(())
    }

    /// Sleep up to `duration`, waking early (with an error) if stopping is asked for.
    pub fn sleep(&self, duration: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + duration;
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }
}

/// Wait for `child` to exit, at most `timeout`; kills it on timeout or cancel.
pub fn wait_child(
    child: &mut Child,
    timeout: Duration,
    cancel: &Cancel,
    what: &str,
) -> Result<ExitStatus, LabError> {
    let start = Instant::now();
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(LabError::io(format!("wait for {what}")))?
        {
            return Ok(status);
        }
        if cancel.is_cancelled() || start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            cancel.check()?;
            return Err(LabError::Timeout {
                what: what.to_string(),
                seconds: timeout.as_secs_f64(),
            });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Check that the lab can run here: root, and `ip`, `tc` and `ethtool` installed.
pub fn require_lab_host() -> Result<(), LabError> {
    if !is_root() {
        return Err(LabError::NotRoot);
    }
    for (program, package) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("ethtool", "ethtool"),
    ] {
        if find_program(program).is_none() {
            return Err(LabError::MissingProgram { program, package });
        }
    }
    Ok(())
}

/// The path of `program` on `PATH` (plus the sbin directories, which a non-login root shell
/// may lack).
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(Into::into))
        .map(|dir: std::path::PathBuf| dir.join(program))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_namespace_wraps_with_ip_netns_exec() {
        let cmd = Cmd::new("ethtool")
            .args(["-K", "eth0", "tso", "off"])
            .in_namespace("tl-1-0-cli");
        assert_eq!(cmd.program, "ip");
        assert_eq!(
            cmd.args,
            [
                "netns",
                "exec",
                "tl-1-0-cli",
                "ethtool",
                "-K",
                "eth0",
                "tso",
                "off"
            ]
        );
    }

    #[test]
    fn display_quotes_arguments_with_spaces() {
        let cmd = Cmd::new("tessera").args(["lab-client", "--job", "{\"a\": 1}", ""]);
        assert_eq!(cmd.to_string(), "tessera lab-client --job '{\"a\": 1}' ''");
    }

    #[test]
    fn failed_command_reports_its_stderr() {
        let err = Cmd::new("sh")
            .args(["-c", "echo oops >&2; exit 3"])
            .run()
            .unwrap_err();
        match err {
            LabError::CommandFailed { stderr, status, .. } => {
                assert_eq!(stderr, "oops");
                assert!(status.contains('3'), "{status}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn cancel_interrupts_a_sleep() {
        let cancel = Cancel::new();
        cancel.cancel();
        let start = Instant::now();
        assert!(matches!(
            cancel.sleep(Duration::from_secs(5)),
            Err(LabError::Interrupted)
        ));
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
