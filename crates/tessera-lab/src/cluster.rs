//! Tessera's real daemons on the lab's hosts, and the measurement client as jobs.
//!
//! The manager runs in the `mgr` namespace, server `k` in `sK`, each started as
//! `ip netns exec NS TESSERA manager|server ...` from the same binary as the lab (the caller
//! passes it, normally `std::env::current_exe()`). Measurements run as
//! `tessera lab-client --job JSON` in the `cli` namespace (see [`crate::job`]). Flags the lab
//! does not know are passed through: [`ClusterSpec::server_args`] and friends.

use crate::cmd::{wait_child, Cancel, Cmd};
use crate::job::{ClientJob, ClientReport, FileSpec, Op, Sample};
use crate::net::{server_host, Network, Topology, CLIENT_HOST, MANAGER_HOST};
use crate::LabError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The manager's port.
pub const MANAGER_PORT: u16 = 7000;
/// Every server's port.
pub const SERVER_PORT: u16 = 7100;
/// How long a daemon may take to start listening.
const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long all servers may take to be reported up once listening.
const SERVERS_UP_TIMEOUT: Duration = Duration::from_secs(20);
/// Lines of a log quoted in an error.
const LOG_TAIL_LINES: usize = 8;
/// Variables the tessera binary reads in place of flags the lab sets itself: the lab's
/// daemons and client must not pick them up from whoever started the lab.
const LAB_SET_ENV: [&str; 5] = [
    "TESSERA_TRANSPORT",
    "TESSERA_WINDOW",
    "TESSERA_CLUSTER",
    "TESSERA_KEY",
    "TESSERA_SECRET",
];

/// `tessera` with none of [`LAB_SET_ENV`].
fn tessera(spec: &ClusterSpec) -> Cmd {
    LAB_SET_ENV
        .iter()
        .fold(Cmd::new(spec.exe.display().to_string()), |cmd, name| {
            cmd.without_env(*name)
        })
}

/// How clients and servers talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// The pipelined TCP transport.
    Tcp,
    /// The datagram transport with a fixed window: at most `window` datagrams in flight per
    /// session (1 is stop-and-wait).
    Datagram {
        /// Datagrams in flight per session.
        window: u32,
    },
    /// The datagram transport with its window adapting (congestion control).
    Adaptive,
}

impl Transport {
    /// Short label, e.g. `tcp` or `window 3`.
    pub fn label(&self) -> String {
        match self {
            Transport::Tcp => "tcp".into(),
            Transport::Datagram { window } => format!("window {window}"),
            Transport::Adaptive => "udp, adaptive".into(),
        }
    }

    /// The window, for the datagram transport.
    pub fn window(&self) -> Option<u32> {
        match self {
            Transport::Tcp | Transport::Adaptive => None,
            Transport::Datagram { window } => Some(*window),
        }
    }

    /// Flags for `tessera COMMAND` whose help is `flags`. Servers and the measurement client
    /// must understand the transport they are asked for (`required`); the manager gets what
    /// it understands. A binary without `--transport` speaks TCP only, so TCP needs no flag.
    pub fn daemon_args(
        &self,
        command: &str,
        flags: &DaemonFlags,
        required: bool,
    ) -> Result<Vec<String>, LabError> {
        let unsupported = |flag| LabError::UnsupportedFlag {
            command: command.to_string(),
            flag,
            why: "the datagram transport cannot be measured (try --transport tcp)",
        };
        let mut args = Vec::new();
        match self {
            Transport::Tcp => {
                if flags.transport {
                    args.extend(["--transport".into(), "tcp".into()]);
                }
            }
            Transport::Datagram { .. } | Transport::Adaptive => {
                if flags.transport {
                    args.extend(["--transport".into(), "udp".into()]);
                } else if required {
                    return Err(unsupported("--transport"));
                }
                if let Some(window) = self.window() {
                    if flags.window {
                        args.extend(["--window".into(), window.to_string()]);
                    } else if required {
                        return Err(unsupported("--window"));
                    }
                }
            }
        }
        Ok(args)
    }
}

/// Which of the flags the lab may pass a daemon command has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DaemonFlags {
    /// `--transport udp|tcp`.
    pub transport: bool,
    /// `--window N`.
    pub window: bool,
    /// `--init` (a manager creates its store only when asked, since issue 15).
    pub init: bool,
}

impl DaemonFlags {
    /// Ask `exe COMMAND --help`.
    pub fn probe(exe: &Path, command: &str) -> Result<DaemonFlags, LabError> {
        let help = Cmd::new(exe.display().to_string())
            .args([command, "--help"])
            .run()?;
        Ok(DaemonFlags::from_help(&help))
    }

    /// From the text of a `--help`.
    pub fn from_help(help: &str) -> DaemonFlags {
        let has = |flag: &str| {
            help.split(|c: char| c.is_whitespace() || c == ',' || c == '=')
                .any(|word| word == flag)
        };
        DaemonFlags {
            transport: has("--transport"),
            window: has("--window"),
            init: has("--init"),
        }
    }
}

/// A cluster to start on a lab network.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The tessera binary.
    pub exe: PathBuf,
    /// Servers 1..=N, on hosts `s1`..`sN` (the network may have more hosts).
    pub servers: u32,
    /// How clients and servers talk.
    pub transport: Transport,
    /// More flags for `tessera manager`, after the lab's.
    pub manager_args: Vec<String>,
    /// More flags for every `tessera server`, after the lab's.
    pub server_args: Vec<String>,
    /// More flags for `tessera lab-client`, after the lab's.
    pub client_args: Vec<String>,
}

impl ClusterSpec {
    /// `servers` servers over `transport`, no extra flags.
    pub fn new(exe: PathBuf, servers: u32, transport: Transport) -> ClusterSpec {
        ClusterSpec {
            exe,
            servers,
            transport,
            manager_args: Vec::new(),
            server_args: Vec::new(),
            client_args: Vec::new(),
        }
    }
}

/// The manager's address on the lab network.
pub fn manager_addr(topology: &Topology) -> Result<SocketAddr, LabError> {
    Ok(SocketAddr::V4(SocketAddrV4::new(
        topology.host(MANAGER_HOST)?.addr,
        MANAGER_PORT,
    )))
}

/// `tessera manager` in the manager's namespace, data under `dir`.
pub fn manager_command(
    topology: &Topology,
    spec: &ClusterSpec,
    flags: &DaemonFlags,
    dir: &Path,
) -> Result<Cmd, LabError> {
    let listen = manager_addr(topology)?;
    Ok(tessera(spec)
        .args(["manager", "--listen", &listen.to_string()])
        .args([
            "--dir".to_string(),
            dir.join("manager").display().to_string(),
        ])
        .args([
            "--addr-file".to_string(),
            addr_file(dir, "manager").display().to_string(),
        ])
        // Each lab run starts a new cluster in a fresh directory: `--init` makes its store and
        // the run's cluster secret, which the servers and the client use.
        .args([
            "--init".to_string(),
            "--secret".to_string(),
            secret_file(dir),
        ])
        .args(spec.transport.daemon_args("manager", flags, false)?)
        .args(spec.manager_args.iter().cloned())
        .in_namespace(&topology.namespace(MANAGER_HOST)))
}

/// `tessera server` number `id` in its namespace, data under `dir`.
pub fn server_command(
    topology: &Topology,
    spec: &ClusterSpec,
    flags: &DaemonFlags,
    dir: &Path,
    id: u32,
) -> Result<Cmd, LabError> {
    let host = server_host(id);
    let listen = SocketAddrV4::new(topology.host(&host)?.addr, SERVER_PORT);
    let name = format!("server-{id}");
    Ok(tessera(spec)
        .args(["server", "--manager", &manager_addr(topology)?.to_string()])
        .args(["--listen".to_string(), listen.to_string()])
        .args(["--dir".to_string(), dir.join(&name).display().to_string()])
        .args(["--id".to_string(), id.to_string()])
        .args([
            "--addr-file".to_string(),
            addr_file(dir, &name).display().to_string(),
        ])
        .args(["--secret".to_string(), secret_file(dir)])
        .args(spec.transport.daemon_args("server", flags, true)?)
        .args(spec.server_args.iter().cloned())
        .in_namespace(&topology.namespace(&host)))
}

/// `tessera lab-client` doing `job` in the client's namespace, connecting over `transport`
/// (normally the cluster's; servers of the datagram transport serve TCP as well).
pub fn client_command(
    topology: &Topology,
    spec: &ClusterSpec,
    transport: Transport,
    flags: &DaemonFlags,
    job: &ClientJob,
) -> Result<Cmd, LabError> {
    client_command_on(topology, spec, transport, flags, job, CLIENT_HOST)
}

/// As [`client_command`], in the namespace of host `host`.
pub fn client_command_on(
    topology: &Topology,
    spec: &ClusterSpec,
    transport: Transport,
    flags: &DaemonFlags,
    job: &ClientJob,
    host: &str,
) -> Result<Cmd, LabError> {
    topology.host(host)?;
    let job = serde_json::to_string(job).expect("jobs serialize");
    Ok(tessera(spec)
        .arg("lab-client")
        .args(transport.daemon_args("lab-client", flags, true)?)
        .args(spec.client_args.iter().cloned())
        .args(["--manager".to_string(), manager_addr(topology)?.to_string()])
        .args(["--job".to_string(), job])
        .in_namespace(&topology.namespace(host)))
}

/// The run's cluster secret: the lab's client acts as the admin with it (no access key to
/// issue first).
fn secret_file(dir: &Path) -> String {
    dir.join("cluster.secret").display().to_string()
}

fn addr_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.addr"))
}

/// Timed repetitions of one op, and what the network dropped meanwhile.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Every repetition on every file.
    pub samples: Vec<Sample>,
    /// Frames the network's `tbf` queues dropped during the job.
    pub drops: u64,
}

/// A running daemon; dropping it kills it.
struct Daemon {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn spawn(name: String, command: &Cmd, log: PathBuf) -> Result<Daemon, LabError> {
        let file = std::fs::File::create(&log)
            .map_err(LabError::io(format!("create {}", log.display())))?;
        let child = command.spawn(Stdio::null(), Stdio::from(file))?;
        Ok(Daemon { name, child, log })
    }

    /// An error if it has exited.
    fn check(&mut self) -> Result<(), LabError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(LabError::DaemonExited {
                daemon: self.name.clone(),
                status: status.to_string(),
                log_tail: tail(&self.log),
            }),
            Ok(None) => Ok(()),
            Err(e) => Err(LabError::io(format!("wait for {}", self.name))(e)),
        }
    }

    /// Wait until it has written `path` (its address file), checking it stays alive.
    fn wait_listening(&mut self, path: &Path, cancel: &Cancel) -> Result<(), LabError> {
        let start = Instant::now();
        loop {
            cancel.check()?;
            self.check()?;
            if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
                return Ok(());
            }
            if start.elapsed() >= DAEMON_START_TIMEOUT {
                return Err(LabError::Timeout {
                    what: format!("{} to listen (log: {})", self.name, tail(&self.log)),
                    seconds: DAEMON_START_TIMEOUT.as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last lines of a log, on one line.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(LOG_TAIL_LINES);
    let out = lines[from..].join(" | ");
    if out.is_empty() {
        "(empty)".into()
    } else {
        out
    }
}

/// A manager and servers running on a lab network; dropping it kills them and removes their
/// data.
pub struct Cluster<'n> {
    network: &'n Network,
    spec: ClusterSpec,
    cancel: Cancel,
    client_flags: DaemonFlags,
    // Daemons before the directory, servers before the manager: fields drop in order, so
    // servers stop first and everything stops before its data goes.
    servers: BTreeMap<u32, Daemon>,
    manager: Daemon,
    jobs_run: u32,
    dir: tempfile::TempDir,
}

impl<'n> Cluster<'n> {
    /// Start the manager, then the servers, and wait until the manager reports all up.
    pub fn start(
        network: &'n Network,
        spec: ClusterSpec,
        cancel: &Cancel,
    ) -> Result<Cluster<'n>, LabError> {
        let topology = network.topology();
        let manager_flags = DaemonFlags::probe(&spec.exe, "manager")?;
        let server_flags = DaemonFlags::probe(&spec.exe, "server")?;
        let client_flags = DaemonFlags::probe(&spec.exe, "lab-client")?;
        let dir = tempfile::Builder::new()
            .prefix(&crate::net::run_dir_prefix())
            .tempdir()
            .map_err(LabError::io("make a temporary directory"))?;
        let command = manager_command(topology, &spec, &manager_flags, dir.path())?;
        let mut manager =
            Daemon::spawn("manager".into(), &command, dir.path().join("manager.log"))?;
        manager.wait_listening(&addr_file(dir.path(), "manager"), cancel)?;
        let mut servers = BTreeMap::new();
        for id in 1..=spec.servers {
            let command = server_command(topology, &spec, &server_flags, dir.path(), id)?;
            let log = dir.path().join(format!("server-{id}.log"));
            servers.insert(id, Daemon::spawn(format!("server {id}"), &command, log)?);
        }
        for id in 1..=spec.servers {
            let file = addr_file(dir.path(), &format!("server-{id}"));
            servers
                .get_mut(&id)
                .expect("started")
                .wait_listening(&file, cancel)?;
        }
        let mut cluster = Cluster {
            network,
            spec,
            cancel: cancel.clone(),
            client_flags,
            servers,
            manager,
            jobs_run: 0,
            dir,
        };
        let all: Vec<u32> = (1..=cluster.spec.servers).collect();
        cluster.wait_servers(&all, &[], SERVERS_UP_TIMEOUT)?;
        Ok(cluster)
    }

    /// What was started.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The manager's address.
    pub fn manager_addr(&self) -> Result<SocketAddr, LabError> {
        manager_addr(self.network.topology())
    }

    /// Kill server `id` (SIGKILL, like a machine that stops), as Swift/RAID's degraded-mode
    /// experiments terminate a node.
    pub fn stop_server(&mut self, id: u32) -> Result<(), LabError> {
        let daemon = self.servers.remove(&id).ok_or_else(|| LabError::BadValue {
            what: "server id",
            text: id.to_string(),
            expected: "a running server of this cluster",
        })?;
        drop(daemon);
        Ok(())
    }

    /// An error if any daemon has exited.
    pub fn check_daemons(&mut self) -> Result<(), LabError> {
        self.manager.check()?;
        for daemon in self.servers.values_mut() {
            daemon.check()?;
        }
        Ok(())
    }

    /// Wait until the manager reports `up` up and `down` down.
    pub fn wait_servers(
        &mut self,
        up: &[u32],
        down: &[u32],
        timeout: Duration,
    ) -> Result<ClientReport, LabError> {
        let job = ClientJob::WaitServers {
            up: up.to_vec(),
            down: down.to_vec(),
            timeout_ms: timeout.as_millis() as u64,
        };
        self.run_job(&job, timeout + Duration::from_secs(10))
    }

    /// Time `op` on each of `files` (prepared), `repetitions` times, as one job, counting the
    /// frames the network drops meanwhile.
    pub fn measure(
        &mut self,
        files: &[FileSpec],
        op: Op,
        repetitions: u32,
        timeout: Duration,
    ) -> Result<Measurement, LabError> {
        let job = ClientJob::Measure {
            files: files.to_vec(),
            ops: vec![op],
            repetitions,
        };
        let drops_before = self.network.tbf_drops()?;
        let report = self.run_job(&job, timeout)?;
        let drops = self.network.tbf_drops()?.saturating_sub(drops_before);
        match report {
            ClientReport::Measured { samples } => Ok(Measurement { samples, drops }),
            _ => Err(LabError::WrongReport {
                job: job.kind().into(),
            }),
        }
    }

    /// Run `job` on the client host and return its report.
    pub fn run_job(
        &mut self,
        job: &ClientJob,
        timeout: Duration,
    ) -> Result<ClientReport, LabError> {
        self.run_job_over(job, self.spec.transport, timeout)
    }

    /// Run `job` on the client host with the client connecting over `transport`, which
    /// may differ from the cluster's (servers of the datagram transport also serve TCP).
    pub fn run_job_over(
        &mut self,
        job: &ClientJob,
        transport: Transport,
        timeout: Duration,
    ) -> Result<ClientReport, LabError> {
        let mut running = self.spawn_job(job, transport, CLIENT_HOST)?;
        let status = wait_child(
            &mut running.child,
            timeout,
            &self.cancel,
            &format!("lab client job '{}'", job.kind()),
        )?;
        self.finish_job(running, status)
    }

    /// Run `jobs` at once, each on its host (a measurement client in that host's
    /// namespace), over `transport`, calling `meanwhile` about every `every` until all have
    /// exited (or `timeout`); returns each job's report or failure, in order.
    pub fn run_jobs_on(
        &mut self,
        jobs: &[(String, ClientJob)],
        transport: Transport,
        timeout: Duration,
        every: Duration,
        meanwhile: &mut dyn FnMut() -> Result<(), LabError>,
    ) -> Result<Vec<Result<ClientReport, LabError>>, LabError> {
        let mut running = Vec::with_capacity(jobs.len());
        for (host, job) in jobs {
            running.push(Some(self.spawn_job(job, transport, host)?));
        }
        let mut statuses = vec![None; jobs.len()];
        let start = Instant::now();
        while statuses.iter().any(Option::is_none) {
            self.cancel.check()?;
            for (status, job) in statuses.iter_mut().zip(&mut running) {
                if status.is_none() {
                    let child = &mut job.as_mut().expect("running").child;
                    *status = child
                        .try_wait()
                        .map_err(LabError::io("wait for a lab client job"))?;
                }
            }
            if start.elapsed() >= timeout {
                // Dropping the running jobs kills them.
                return Err(LabError::Timeout {
                    what: format!("{} lab client jobs", jobs.len()),
                    seconds: timeout.as_secs_f64(),
                });
            }
            meanwhile()?;
            std::thread::sleep(every);
        }
        let mut reports = Vec::with_capacity(jobs.len());
        for (job, status) in running.iter_mut().zip(statuses) {
            let job = job.take().expect("each job finishes once");
            reports.push(self.finish_job(job, status.expect("exited")));
        }
        Ok(reports)
    }

    /// Start `job` on `host`, its output going to files of the cluster's directory.
    fn spawn_job(
        &mut self,
        job: &ClientJob,
        transport: Transport,
        host: &str,
    ) -> Result<RunningJob, LabError> {
        self.jobs_run += 1;
        let out = self
            .dir
            .path()
            .join(format!("client-{}.out", self.jobs_run));
        let err = self
            .dir
            .path()
            .join(format!("client-{}.err", self.jobs_run));
        let create = |p: &Path| {
            std::fs::File::create(p).map_err(LabError::io(format!("create {}", p.display())))
        };
        let command = client_command_on(
            self.network.topology(),
            &self.spec,
            transport,
            &self.client_flags,
            job,
            host,
        )?
        .args(["--secret".to_string(), secret_file(self.dir.path())]);
        let child = command.spawn(Stdio::from(create(&out)?), Stdio::from(create(&err)?))?;
        Ok(RunningJob {
            kind: job.kind(),
            child: KillOnDrop(child),
            out,
            err,
        })
    }

    /// The report of a job that exited with `status`.
    fn finish_job(
        &mut self,
        job: RunningJob,
        status: std::process::ExitStatus,
    ) -> Result<ClientReport, LabError> {
        if !status.success() {
            // A daemon that died is the likelier cause; name it first.
            self.check_daemons()?;
            return Err(LabError::ClientFailed {
                job: job.kind.into(),
                status: status.to_string(),
                stderr: tail(&job.err),
            });
        }
        let out = std::fs::read_to_string(&job.out)
            .map_err(LabError::io(format!("read {}", job.out.display())))?;
        serde_json::from_str(&out).map_err(|source| LabError::BadReport {
            job: job.kind.into(),
            source,
        })
    }
}

/// A measurement client started and not yet reaped.
struct RunningJob {
    kind: &'static str,
    child: KillOnDrop,
    out: PathBuf,
    err: PathBuf,
}

/// A child process killed and reaped when dropped, unless it has exited.
struct KillOnDrop(Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{FileSpec, Op};
    use crate::net::{LinkSpec, Rate, RunPrefix};

    fn topology() -> Topology {
        Topology::cluster(RunPrefix::new(), 3, LinkSpec::new(Rate::mbit(100))).unwrap()
    }

    fn spec(transport: Transport) -> ClusterSpec {
        ClusterSpec::new("/bin/tessera".into(), 3, transport)
    }

    #[test]
    fn help_text_tells_which_flags_exist() {
        let help = "Options:\n      --listen <LISTEN>\n      --transport <TRANSPORT>  udp or tcp\n  -h, --help";
        assert_eq!(
            DaemonFlags::from_help(help),
            DaemonFlags {
                transport: true,
                window: false,
                init: false,
            }
        );
        assert_eq!(DaemonFlags::from_help("--windows"), DaemonFlags::default());
        assert!(DaemonFlags::from_help("--window=<N>").window);
    }

    #[test]
    fn tcp_needs_no_flag_from_a_binary_without_transports() {
        let none = DaemonFlags::default();
        let all = DaemonFlags {
            transport: true,
            window: true,
            init: true,
        };
        assert!(Transport::Tcp
            .daemon_args("server", &none, true)
            .unwrap()
            .is_empty());
        assert_eq!(
            Transport::Tcp.daemon_args("server", &all, true).unwrap(),
            ["--transport", "tcp"]
        );
        let window = Transport::Datagram { window: 3 };
        assert_eq!(
            window.daemon_args("server", &all, true).unwrap(),
            ["--transport", "udp", "--window", "3"]
        );
        assert!(matches!(
            window.daemon_args("server", &none, true),
            Err(LabError::UnsupportedFlag {
                flag: "--transport",
                ..
            })
        ));
        assert!(window
            .daemon_args("manager", &none, false)
            .unwrap()
            .is_empty());
        assert_eq!(
            Transport::Adaptive
                .daemon_args("server", &all, true)
                .unwrap(),
            ["--transport", "udp"]
        );
        assert_eq!(window.label(), "window 3");
    }

    #[test]
    fn daemon_commands_run_in_their_namespaces() {
        let t = topology();
        let flags = DaemonFlags::default();
        let mut s = spec(Transport::Tcp);
        s.server_args = vec!["--extra".into()];
        let dir = Path::new("/tmp/run");
        let ns = |h: &str| t.namespace(h);
        let manager = manager_command(&t, &s, &flags, dir).unwrap();
        assert_eq!(
            manager.to_string(),
            format!(
                "ip netns exec {} /bin/tessera manager --listen 10.77.0.1:7000 --dir /tmp/run/manager --addr-file /tmp/run/manager.addr --init --secret /tmp/run/cluster.secret",
                ns("mgr")
            )
        );
        let server = server_command(&t, &s, &flags, dir, 2).unwrap();
        assert_eq!(
            server.to_string(),
            format!(
                "ip netns exec {} /bin/tessera server --manager 10.77.0.1:7000 --listen 10.77.0.12:7100 --dir /tmp/run/server-2 --id 2 --addr-file /tmp/run/server-2.addr --secret /tmp/run/cluster.secret --extra",
                ns("s2")
            )
        );
        assert!(
            server_command(&t, &s, &flags, dir, 4).is_err(),
            "no host s4"
        );
        assert_eq!(server.env_removed, LAB_SET_ENV, "the lab sets these itself");
    }

    #[test]
    fn client_command_carries_the_job_as_json() {
        let t = topology();
        let s = spec(Transport::Datagram { window: 2 });
        let flags = DaemonFlags {
            transport: true,
            window: true,
            init: true,
        };
        let job = ClientJob::Measure {
            files: vec![FileSpec {
                path: "f".into(),
                scheme: tessera_client::Scheme::Raid4,
                stripe_unit_bytes: 65536,
                bytes: 1 << 20,
                seed: 1,
                width: None,
            }],
            ops: vec![Op::Read],
            repetitions: 2,
        };
        let cmd = client_command(&t, &s, s.transport, &flags, &job).unwrap();
        let n = cmd.args.len();
        assert_eq!(
            cmd.args[..n - 1],
            [
                "netns",
                "exec",
                &t.namespace("cli"),
                "/bin/tessera",
                "lab-client",
                "--transport",
                "udp",
                "--window",
                "2",
                "--manager",
                "10.77.0.1:7000",
                "--job"
            ]
        );
        let parsed: ClientJob = serde_json::from_str(&cmd.args[n - 1]).unwrap();
        assert_eq!(parsed, job);
        let tcp = client_command(
            &t,
            &spec(Transport::Tcp),
            Transport::Tcp,
            &DaemonFlags::default(),
            &job,
        )
        .unwrap();
        assert_eq!(
            tcp.args[4..6],
            ["lab-client", "--manager"],
            "no flags the binary lacks"
        );
        let over_tcp = client_command(&t, &s, Transport::Tcp, &flags, &job).unwrap();
        assert_eq!(
            over_tcp.args[4..7],
            ["lab-client", "--transport", "tcp"],
            "a datagram cluster's client over TCP"
        );
    }
}
