//! The embedded local cluster: a manager and N servers as child processes on 127.0.0.1, their
//! data and logs under one directory, described by `DIR/cluster.toml`.

use crate::config::Config;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera_client::{Client, ServerState, TransportKind};

/// How long to wait for daemons to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// One daemon process of the local cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Process {
    /// Address it listens on.
    pub addr: String,
    /// Its data directory.
    pub dir: PathBuf,
    /// Process id, 0 when stopped.
    pub pid: u32,
}

/// A storage server of the local cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalServer {
    /// Server id.
    pub id: u32,
    /// Its process.
    #[serde(flatten)]
    pub process: Process,
}

/// `DIR/cluster.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Format version of this file.
    pub version: u32,
    /// The manager's address (what clients need).
    pub manager: String,
    /// The manager process.
    pub manager_process: Process,
    /// The storage servers.
    pub servers: Vec<LocalServer>,
    /// Transport the servers listen on ("udp" or "tcp").
    #[serde(default = "default_transport")]
    pub transport: String,
    /// Fixed datagram window the servers use, if any.
    #[serde(default)]
    pub window: Option<u32>,
    /// The largest datagram the servers send (`--datagram-bytes`), if capped.
    #[serde(default)]
    pub datagram_bytes: Option<usize>,
    /// Since version 2: the cluster secret's file (mode 0600), which the daemons and the
    /// admin's commands use.
    #[serde(default)]
    pub secret: Option<PathBuf>,
    /// Since version 2: the access key client commands use, `KEYID:SECRET`.
    #[serde(default)]
    pub key: Option<String>,
    /// Every replica's address, when the manager is replicated (`manager` is the first);
    /// clients and servers fail over between them. Empty: one manager at `manager`.
    #[serde(default)]
    pub managers: Vec<String>,
    /// The replica processes of a replicated manager, by id from 1 (the first is also
    /// `manager_process`).
    #[serde(default)]
    pub replicas: Vec<Process>,
    /// Replicas removed from the group (`tessera manager remove`), by id: listed in
    /// `replicas` still (ids stay positions), no longer in `managers`.
    #[serde(default)]
    pub removed_replicas: Vec<u16>,
    /// The S3 gateway's endpoint, when `up --s3` started one (`http://ADDR`).
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    /// The access key S3 requests are signed with.
    #[serde(default)]
    pub s3_access_key: Option<String>,
    /// Its secret key (this file is readable by its owner only).
    #[serde(default)]
    pub s3_secret_key: Option<String>,
    /// The gateway process.
    #[serde(default)]
    pub s3_process: Option<Process>,
    /// Where each daemon serves Prometheus metrics, when `up --metrics` asked for them: by
    /// daemon (`manager`, `manager-N` for replica N, `server-N`, `s3`), `ADDR` of
    /// `http://ADDR/metrics`. A daemon restarted keeps its address.
    #[serde(default)]
    pub metrics: BTreeMap<String, String>,
}

/// Version of `cluster.toml` this build writes (2 added `secret` and `key`).
const CLUSTER_FILE_VERSION: u32 = 2;

fn default_transport() -> String {
    TransportKind::Udp.name().into()
}

/// A local cluster rooted at a directory.
pub struct LocalCluster {
    /// The directory.
    pub dir: PathBuf,
    /// What `cluster.toml` says.
    pub file: ClusterFile,
}

pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    pid != 0 && unsafe { libc::kill(pid as i32, 0) } == 0 && !is_zombie(pid)
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn signal(pid: u32, sig: i32) {
    if pid != 0 {
        // SAFETY: sending a signal to a pid we started.
        unsafe {
            libc::kill(pid as i32, sig);
        }
    }
}

/// Wait for a pid to exit (reaping it if it is our child).
fn wait_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        // SAFETY: non-blocking reap of a possible child; harmless if it is not ours.
        unsafe {
            libc::waitpid(pid as i32, std::ptr::null_mut(), libc::WNOHANG);
        }
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn spawn_daemon(args: &[String], log: &Path) -> Result<u32> {
    spawn_daemon_with_env(args, &[], log)
}

/// A daemon with extra environment variables (secrets stay off its command line, which any
/// local user can read).
fn spawn_daemon_with_env(args: &[String], env: &[(&str, &str)], log: &Path) -> Result<u32> {
    let exe = std::env::current_exe().context("cannot find the tessera executable")?;
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open log {}", log.display()))?;
    let mut command = Command::new(exe);
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    // Own process group: a Ctrl-C at the terminal reaches `tessera up`, which stops the cluster
    // in order, rather than killing every daemon at once.
    use std::os::unix::process::CommandExt;
    command.process_group(0);
    let child = command.spawn().context("cannot start a daemon")?;
    Ok(child.id())
}

fn wait_for_addr(file: &Path, pid: u32) -> Result<String> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(addr) = std::fs::read_to_string(file) {
            if !addr.trim().is_empty() {
                return Ok(addr.trim().to_string());
            }
        }
        if !pid_alive(pid) {
            bail!(
                "daemon exited during start-up (see {})",
                file.with_file_name("log").display()
            );
        }
        if Instant::now() > deadline {
            bail!("daemon did not start within {START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl LocalCluster {
    pub fn cluster_file(dir: &Path) -> PathBuf {
        dir.join("cluster.toml")
    }

    /// Load `DIR/cluster.toml`.
    pub fn load(dir: &Path) -> Result<LocalCluster> {
        let path = Self::cluster_file(dir);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no local cluster at {}", path.display()))?;
        let file: ClusterFile =
            toml::from_str(&text).with_context(|| format!("{} is malformed", path.display()))?;
        Ok(LocalCluster {
            dir: dir.to_path_buf(),
            file,
        })
    }

    fn save(&self) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = Self::cluster_file(&self.dir);
        let tmp = path.with_extension("toml.tmp");
        // It holds an access key: readable by its owner only.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(toml::to_string(&self.file)?.as_bytes())?;
        drop(file);
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// The cluster secret's file, if this cluster has one.
    pub fn secret_path(&self) -> Option<PathBuf> {
        self.file.secret.clone()
    }

    /// A client of this cluster with the admin's credential.
    pub async fn admin_client(&self, config: &Config) -> Result<Client> {
        let credential = crate::credentials::admin(config, self.secret_path().as_deref())?;
        let managers = self.manager_addrs()?;
        crate::commands::connect_replicas(config, managers, Some(self.transport()), credential)
            .await
    }

    /// Keep the access key of an earlier run if the manager still knows it, else issue one.
    async fn ensure_key(&mut self, config: &Config, previous: Option<String>) -> Result<()> {
        if let Some(key) = previous {
            self.file.key = Some(key);
            if self.client(config).await.is_ok() {
                return Ok(());
            }
        }
        let admin = self.admin_client(config).await?;
        let (id, key) = admin.key_create("local cluster").await?;
        self.file.key = Some(tessera_client::format_access_key(id, &key));
        self.save()
    }

    /// The transport the cluster's servers listen on.
    pub fn transport(&self) -> TransportKind {
        self.file.transport.parse().unwrap_or_default()
    }

    /// A client of this cluster over its transport.
    pub async fn client(&self, config: &Config) -> Result<Client> {
        let (key, secret) = (self.file.key.as_deref(), self.secret_path());
        let credential = crate::credentials::client(config, key, secret.as_deref())?;
        let managers = self.manager_addrs()?;
        crate::commands::connect_replicas(config, managers, Some(self.transport()), credential)
            .await
    }

    /// Every replica's address (empty for a manager that is not replicated).
    pub fn manager_replicas(&self) -> Result<Vec<SocketAddr>> {
        self.file
            .managers
            .iter()
            .map(|addr| {
                addr.parse()
                    .map_err(|_| anyhow!("bad manager replica address '{addr}'"))
            })
            .collect()
    }

    pub fn manager_addr(&self) -> Result<SocketAddr> {
        self.file
            .manager
            .parse()
            .map_err(|_| anyhow!("bad manager address '{}'", self.file.manager))
    }

    /// Start a manager and `servers` servers under `dir` (reusing data already there), and wait
    /// until every server is up.
    pub async fn up(
        dir: &Path,
        servers: u32,
        managers: u16,
        metrics: bool,
        config: &Config,
    ) -> Result<LocalCluster> {
        let (transport, window) = (config.transport.unwrap_or_default(), config.window);
        let datagram_bytes = config.datagram_bytes;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", dir.display()))?;
        if let Ok(existing) = Self::load(&dir) {
            let replica_alive = existing.file.replicas.iter().any(|r| pid_alive(r.pid));
            if pid_alive(existing.file.manager_process.pid) || replica_alive {
                bail!(
                    "a cluster is already running in {} (stop it with: tessera down --dir {})",
                    dir.display(),
                    dir.display()
                );
            }
        }
        if servers == 0 {
            bail!("a cluster needs at least one server");
        }
        let previous = Self::load(&dir).ok();
        let metrics = metrics_addrs(previous.as_ref(), metrics, servers, managers)?;
        let secret = dir.join(crate::credentials::SECRET_FILE_NAME);
        crate::credentials::read_or_create_secret(&secret)?;
        let manager_dir = dir.join("manager");
        // Only a first start creates the manager's store: later, its servers hold the
        // cluster's data, and a new, empty store would disown it.
        let init = previous.is_none();
        let store = manager_dir.join("manager.redb");
        let store_missing = managers <= 1 && !init && !store.exists();
        std::fs::create_dir_all(&manager_dir)?;
        let (manager_process, replicas) = if managers > 1 {
            Self::start_replicas(&dir, managers, previous.as_ref(), &secret, init, &metrics)?
        } else {
            let metrics = metrics.get("manager").map(String::as_str);
            let single =
                Self::start_single(&manager_dir, previous.as_ref(), &secret, init, metrics);
            (single?, Vec::new())
        };
        // A restarted group keeps the replicas `tessera manager remove` took out of it.
        let removed_replicas = match previous.as_ref() {
            Some(p) if managers > 1 => p.file.removed_replicas.clone(),
            _ => Vec::new(),
        };
        let mut cluster = LocalCluster {
            dir: dir.clone(),
            file: ClusterFile {
                version: CLUSTER_FILE_VERSION,
                secret: Some(secret),
                key: None,
                manager: manager_process.addr.clone(),
                manager_process,
                servers: Vec::new(),
                transport: transport.name().into(),
                window,
                datagram_bytes,
                managers: (replicas.iter().enumerate())
                    .filter(|&(index, _)| !removed_replicas.contains(&(index as u16 + 1)))
                    .map(|(_, r)| r.addr.clone())
                    .collect(),
                replicas,
                removed_replicas,
                s3_endpoint: None,
                s3_access_key: previous.as_ref().and_then(|p| p.file.s3_access_key.clone()),
                s3_secret_key: previous.as_ref().and_then(|p| p.file.s3_secret_key.clone()),
                s3_process: None,
                metrics,
            },
        };
        for id in 1..=servers {
            let server_dir = dir.join(format!("server-{id}"));
            let addr = previous
                .as_ref()
                .and_then(|p| p.file.servers.iter().find(|s| s.id == id))
                .map(|s| s.process.addr.clone())
                .unwrap_or_else(|| "127.0.0.1:0".into());
            cluster.file.servers.push(LocalServer {
                id,
                process: Process {
                    addr,
                    dir: server_dir,
                    pid: 0,
                },
            });
        }
        cluster.save()?;
        let previous_key = previous.and_then(|p| p.file.key);
        // A manager without its store knows no keys; `manager recover` puts the local one back.
        if store_missing {
            cluster.file.key = previous_key;
            cluster.save()?;
        } else if let Err(e) = cluster.ensure_key(config, previous_key).await {
            cluster.down();
            return Err(e.context("cannot issue the local cluster's access key"));
        }
        for id in 1..=servers {
            if let Err(e) = cluster.start_server(id) {
                cluster.down();
                return Err(e);
            }
        }
        if store_missing {
            bail!(
                "the manager's store {} is missing, but the servers hold this cluster's data, so \
                 the manager refuses them rather than start a new, empty cluster. The manager \
                 and servers are running: rebuild the store from the servers with `tessera \
                 manager recover --dir {} --cluster {}` (the manager opens it at once), or stop \
                 them with `tessera down --dir {}`",
                store.display(),
                manager_dir.display(),
                dir.display(),
                dir.display()
            );
        }
        if let Err(e) = cluster.wait_all_up(config).await {
            cluster.down();
            return Err(e);
        }
        Ok(cluster)
    }

    /// Starts the one manager, on its old address if it can have it.
    fn start_single(
        manager_dir: &Path,
        previous: Option<&LocalCluster>,
        secret: &Path,
        init: bool,
        metrics: Option<&str>,
    ) -> Result<Process> {
        let addr_file = manager_dir.join("addr");
        let _ = std::fs::remove_file(&addr_file);
        let listen = previous
            .map(|p| p.file.manager.clone())
            .unwrap_or_else(|| "127.0.0.1:0".into());
        let manager_pid = match Self::start_manager(manager_dir, &listen, secret, init, metrics) {
            Ok(pid) => pid,
            // The old port may be taken now; any free one will do.
            Err(_) if listen != "127.0.0.1:0" => {
                Self::start_manager(manager_dir, "127.0.0.1:0", secret, init, metrics)?
            }
            Err(e) => return Err(e),
        };
        let addr = wait_for_addr(&addr_file, manager_pid)?;
        Ok(Process {
            addr,
            dir: manager_dir.to_path_buf(),
            pid: manager_pid,
        })
    }

    /// Starts `count` manager replicas (`DIR/manager-N`), on their old addresses if the
    /// cluster had them, else on free ports; the first and all of them.
    fn start_replicas(
        dir: &Path,
        count: u16,
        previous: Option<&LocalCluster>,
        secret: &Path,
        init: bool,
        metrics: &BTreeMap<String, String>,
    ) -> Result<(Process, Vec<Process>)> {
        if let Some(previous) = previous.filter(|p| !p.file.replicas.is_empty()) {
            return Self::restart_group(previous, count, secret, metrics);
        }
        let addrs = free_ports(usize::from(count))?;
        let mut replicas: Vec<Process> = (1..=count)
            .map(|id| Process {
                addr: addrs[usize::from(id) - 1].clone(),
                dir: dir.join(format!("manager-{id}")),
                pid: 0,
            })
            .collect();
        for id in 1..=count {
            let metrics = metrics.get(&format!("manager-{id}")).map(String::as_str);
            let pid = Self::spawn_replica(&replicas, id, secret, init, metrics)?;
            replicas[usize::from(id) - 1].pid = pid;
        }
        for replica in &replicas {
            wait_for_addr(&replica.dir.join("addr"), replica.pid)?;
        }
        Ok((replicas[0].clone(), replicas))
    }

    /// Starts the group `previous` recorded (`tessera manager add|remove` changed it since
    /// `up --managers N`): every replica not removed, in its directory, at its address; the
    /// first member and all the replicas (the removed ones not running). `count` must be the
    /// number of members.
    fn restart_group(
        previous: &LocalCluster,
        count: u16,
        secret: &Path,
        metrics: &BTreeMap<String, String>,
    ) -> Result<(Process, Vec<Process>)> {
        let removed = &previous.file.removed_replicas;
        let mut replicas = previous.file.replicas.clone();
        let members: Vec<u16> = (1..=replicas.len() as u16)
            .filter(|id| !removed.contains(id))
            .collect();
        if members.len() != usize::from(count) {
            bail!(
                "this cluster's manager group has {} members (replicas {members:?}), not {count}: \
                 start it with `tessera up --managers {}`, and change it with `tessera manager \
                 add|remove`",
                members.len(),
                members.len()
            );
        }
        for replica in &mut replicas {
            replica.pid = 0;
        }
        for &id in &members {
            let metrics = metrics.get(&format!("manager-{id}")).map(String::as_str);
            let pid = Self::spawn_replica(&replicas, id, secret, false, metrics)?;
            replicas[usize::from(id) - 1].pid = pid;
        }
        for &id in &members {
            let replica = &replicas[usize::from(id) - 1];
            wait_for_addr(&replica.dir.join("addr"), replica.pid)?;
        }
        let first = replicas[usize::from(members[0]) - 1].clone();
        Ok((first, replicas))
    }

    /// Spawns replica `id` of `replicas` (1-based).
    fn spawn_replica(
        replicas: &[Process],
        id: u16,
        secret: &Path,
        init: bool,
        metrics: Option<&str>,
    ) -> Result<u32> {
        Self::spawn_replica_joining(replicas, id, secret, init, false, metrics)
    }

    /// Spawns replica `id` of `replicas` (1-based), as a new member joining the running
    /// group if `join` (`tessera manager add`).
    fn spawn_replica_joining(
        replicas: &[Process],
        id: u16,
        secret: &Path,
        init: bool,
        join: bool,
        metrics: Option<&str>,
    ) -> Result<u32> {
        let replica = &replicas[usize::from(id) - 1];
        std::fs::create_dir_all(&replica.dir)?;
        let _ = std::fs::remove_file(replica.dir.join("addr"));
        let peers: Vec<&str> = replicas.iter().map(|r| r.addr.as_str()).collect();
        let mut args: Vec<String> = vec![
            "manager".into(),
            "--secret".into(),
            secret.display().to_string(),
            "--id".into(),
            id.to_string(),
            "--peers".into(),
            peers.join(","),
            "--dir".into(),
            replica.dir.display().to_string(),
            "--addr-file".into(),
            replica.dir.join("addr").display().to_string(),
        ];
        // Each replica's store is created with the replica: they start from the same
        // (empty) state, and a later start keeps them.
        if init || !replica.dir.join("manager.redb").exists() {
            args.push("--init".into());
        }
        if join {
            args.push("--join".into());
        }
        args.extend(metrics_args(metrics));
        spawn_daemon(&args, &replica.dir.join("log"))
    }

    /// Kills manager replica `id` at once, as a crash would.
    pub fn stop_replica(&mut self, id: u16) -> Result<()> {
        let index = self.replica_index(id)?;
        let pid = self.file.replicas[index].pid;
        if !pid_alive(pid) {
            bail!("manager replica {id} is not running");
        }
        signal(pid, libc::SIGKILL);
        wait_exit(pid, Duration::from_secs(5));
        self.file.replicas[index].pid = 0;
        if index == 0 {
            self.file.manager_process.pid = 0;
        }
        self.save()
    }

    /// Where daemon `name` serves metrics, if the cluster has them.
    fn metrics_of(&self, name: &str) -> Option<&str> {
        self.file.metrics.get(name).map(String::as_str)
    }

    /// Starts manager replica `id` again: it rejoins and catches up from the others.
    pub fn start_replica(&mut self, id: u16) -> Result<()> {
        let index = self.replica_index(id)?;
        if pid_alive(self.file.replicas[index].pid) {
            bail!("manager replica {id} is already running");
        }
        let secret = self
            .secret_path()
            .ok_or_else(|| anyhow!("this local cluster has no secret"))?;
        let metrics = self.metrics_of(&format!("manager-{id}"));
        let pid = Self::spawn_replica(&self.file.replicas, id, &secret, false, metrics)?;
        wait_for_addr(&self.file.replicas[index].dir.join("addr"), pid)?;
        self.file.replicas[index].pid = pid;
        if index == 0 {
            self.file.manager_process.pid = pid;
        }
        self.save()
    }

    /// Starts replica `id` as a new member joining the group (before it is added: it waits
    /// to be made one), with an empty store: the next id, or a removed one (its directory is
    /// wiped first), at `addr` or a free port; its address.
    pub fn start_joining_replica(&mut self, id: u16, addr: Option<String>) -> Result<String> {
        if self.file.replicas.is_empty() {
            bail!("this local cluster's manager is not replicated (tessera up --managers 3)");
        }
        let next = self.file.replicas.len() + 1;
        let index = usize::from(id).wrapping_sub(1);
        if usize::from(id) == next {
            let addr = match addr {
                Some(addr) => addr,
                None => free_ports(1)?.remove(0),
            };
            self.file.replicas.push(Process {
                addr,
                dir: self.dir.join(format!("manager-{id}")),
                pid: 0,
            });
        } else if self.file.removed_replicas.contains(&id) {
            let pid = self.file.replicas[index].pid;
            if pid_alive(pid) {
                bail!("removed replica {id} still runs (pid {pid})");
            }
            // A removed replica's store says so: it comes back as a new member, empty.
            let dir = &self.file.replicas[index].dir;
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("cannot wipe {}", dir.display()))?;
            if let Some(addr) = addr {
                self.file.replicas[index].addr = addr;
            }
        } else if index < self.file.replicas.len() {
            bail!("manager replica {id} is a member already");
        } else {
            bail!("manager replica ids are consecutive: the next is {next}");
        }
        let secret = self
            .secret_path()
            .ok_or_else(|| anyhow!("this local cluster has no secret"))?;
        let index = usize::from(id) - 1;
        let pid = Self::spawn_replica_joining(&self.file.replicas, id, &secret, true, true, None)?;
        self.file.replicas[index].pid = pid;
        self.save()?;
        wait_for_addr(&self.file.replicas[index].dir.join("addr"), pid)?;
        Ok(self.file.replicas[index].addr.clone())
    }

    /// Records the group after a change: `members` (id, address) are the replicas clients
    /// and servers use; a replica no longer among them is removed.
    pub fn set_members(&mut self, members: &[(u16, String)]) -> Result<()> {
        let ids: Vec<u16> = members.iter().map(|&(id, _)| id).collect();
        let count = self.file.replicas.len() as u16;
        self.file.removed_replicas = (1..=count).filter(|id| !ids.contains(id)).collect();
        self.file.managers = members.iter().map(|(_, addr)| addr.clone()).collect();
        let first = self.replica_index(*ids.first().context("a group without members")?)?;
        self.file.manager = self.file.replicas[first].addr.clone();
        self.file.manager_process = self.file.replicas[first].clone();
        self.save()
    }

    /// Kills replica `id` (removed from the group: its order node stopped already).
    pub fn kill_replica(&mut self, id: u16) -> Result<()> {
        let index = self.replica_index(id)?;
        let pid = self.file.replicas[index].pid;
        if pid_alive(pid) {
            signal(pid, libc::SIGKILL);
            wait_exit(pid, Duration::from_secs(5));
        }
        self.file.replicas[index].pid = 0;
        self.save()
    }

    fn replica_index(&self, id: u16) -> Result<usize> {
        let count = self.file.replicas.len();
        if count == 0 {
            bail!("this local cluster's manager is not replicated (tessera up --managers 3)");
        }
        if id == 0 || usize::from(id) > count {
            bail!("no manager replica {id}: this cluster has replicas 1 to {count}");
        }
        Ok(usize::from(id) - 1)
    }

    /// The addresses clients and servers reach the manager at.
    pub fn manager_addrs(&self) -> Result<Vec<SocketAddr>> {
        let replicas = self.manager_replicas()?;
        if replicas.is_empty() {
            Ok(vec![self.manager_addr()?])
        } else {
            Ok(replicas)
        }
    }

    fn start_manager(
        manager_dir: &Path,
        listen: &str,
        secret: &Path,
        init: bool,
        metrics: Option<&str>,
    ) -> Result<u32> {
        let mut args: Vec<String> = vec![
            "manager".into(),
            "--secret".into(),
            secret.display().to_string(),
            "--listen".into(),
            listen.into(),
            "--dir".into(),
            manager_dir.display().to_string(),
            "--addr-file".into(),
            manager_dir.join("addr").display().to_string(),
        ];
        if init {
            args.push("--init".into());
        }
        args.extend(metrics_args(metrics));
        let pid = spawn_daemon(&args, &manager_dir.join("log"))?;
        // A bind failure shows up as an early exit.
        std::thread::sleep(Duration::from_millis(50));
        if !pid_alive(pid) && !manager_dir.join("addr").exists() {
            bail!("manager failed to start on {listen}");
        }
        Ok(pid)
    }

    /// Start server `id` (again), on its old address if it can have it.
    pub fn start_server(&mut self, id: u32) -> Result<()> {
        let manager = if self.file.managers.is_empty() {
            self.file.manager.clone()
        } else {
            self.file.managers.join(",")
        };
        let index = self
            .file
            .servers
            .iter()
            .position(|s| s.id == id)
            .ok_or_else(|| anyhow!("no server {id} in this local cluster"))?;
        if pid_alive(self.file.servers[index].process.pid) {
            bail!("server {id} is already running");
        }
        let dir = self.file.servers[index].process.dir.clone();
        std::fs::create_dir_all(&dir)?;
        let addr_file = dir.with_extension("addr");
        let mut last_error = None;
        let wanted = self.file.servers[index].process.addr.clone();
        for listen in [wanted.as_str(), "127.0.0.1:0"] {
            let _ = std::fs::remove_file(&addr_file);
            let secret = self.secret_path().ok_or_else(|| {
                anyhow!(
                    "this local cluster has no secret (made by an older tessera); start it afresh"
                )
            })?;
            let args: Vec<String> = vec![
                "server".into(),
                "--secret".into(),
                secret.display().to_string(),
                "--manager".into(),
                manager.clone(),
                "--listen".into(),
                listen.into(),
                "--dir".into(),
                dir.display().to_string(),
                "--id".into(),
                id.to_string(),
                "--addr-file".into(),
                addr_file.display().to_string(),
                "--transport".into(),
                self.file.transport.clone(),
            ];
            let mut args = args;
            if let Some(window) = self.file.window {
                args.extend(["--window".into(), window.to_string()]);
            }
            if let Some(bytes) = self.file.datagram_bytes {
                args.extend(["--datagram-bytes".into(), bytes.to_string()]);
            }
            args.extend(metrics_args(self.metrics_of(&format!("server-{id}"))));
            let pid = spawn_daemon(&args, &dir.with_extension("log"))?;
            match wait_for_addr(&addr_file, pid) {
                Ok(addr) => {
                    let server = &mut self.file.servers[index];
                    server.process.addr = addr;
                    server.process.pid = pid;
                    return self.save();
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error
            .expect("tried")
            .context(format!("server {id} did not start")))
    }

    /// Kill server `id` at once, as a crash would.
    pub fn stop_server(&mut self, id: u32) -> Result<()> {
        let server = self
            .file
            .servers
            .iter_mut()
            .find(|s| s.id == id)
            .ok_or_else(|| anyhow!("no server {id} in this local cluster"))?;
        if !pid_alive(server.process.pid) {
            bail!("server {id} is not running");
        }
        signal(server.process.pid, libc::SIGKILL);
        wait_exit(server.process.pid, Duration::from_secs(5));
        server.process.pid = 0;
        self.save()
    }

    /// Wait until the manager sees every running server up (or stale).
    pub async fn wait_all_up(&self, config: &Config) -> Result<()> {
        let client = self.client(config).await?;
        let wanted = self
            .file
            .servers
            .iter()
            .filter(|s| s.process.pid != 0)
            .count();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let status = client.status().await?;
            let live = status
                .iter()
                .filter(|s| s.state != ServerState::Down)
                .count();
            if live >= wanted {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("only {live} of {wanted} servers registered within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Start the S3 gateway on `listen` (`127.0.0.1:0`: any free port), with the keys of an
    /// earlier run if there are any, else a new pair; the endpoint and keys go into
    /// `cluster.toml`.
    pub fn start_gateway(&mut self, listen: &str) -> Result<()> {
        let gateway_dir = self.dir.join("s3");
        std::fs::create_dir_all(&gateway_dir)?;
        let keys = match (&self.file.s3_access_key, &self.file.s3_secret_key) {
            (Some(access), Some(secret)) => tessera_s3::Keys {
                access: access.clone(),
                secret: secret.clone(),
            },
            _ => tessera_s3::Keys::generate(),
        };
        let addr_file = gateway_dir.join("addr");
        let _ = std::fs::remove_file(&addr_file);
        let config = Self::cluster_file(&self.dir);
        let args: Vec<String> = vec![
            "--cluster".into(),
            config.display().to_string(),
            "s3".into(),
            "--listen".into(),
            listen.into(),
            "--addr-file".into(),
            addr_file.display().to_string(),
        ];
        let args = [args, metrics_args(self.metrics_of("s3"))].concat();
        let env = [
            ("TESSERA_S3_ACCESS_KEY", keys.access.as_str()),
            ("TESSERA_S3_SECRET_KEY", keys.secret.as_str()),
        ];
        let pid = spawn_daemon_with_env(&args, &env, &gateway_dir.join("log"))?;
        let addr = wait_for_addr(&addr_file, pid)
            .with_context(|| format!("the S3 gateway did not start on {listen}"))?;
        self.file.s3_endpoint = Some(format!("http://{addr}"));
        self.file.s3_access_key = Some(keys.access);
        self.file.s3_secret_key = Some(keys.secret);
        self.file.s3_process = Some(Process {
            addr,
            dir: gateway_dir,
            pid,
        });
        self.save()
    }

    /// The process ids of the cluster's daemons (servers, manager, replicas), each once.
    pub fn daemon_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.file.servers.iter().map(|s| s.process.pid).collect();
        pids.push(self.file.manager_process.pid);
        pids.extend(self.file.replicas.iter().map(|r| r.pid));
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Stop every daemon (the gateway, then servers and managers), politely, then firmly.
    pub fn down(&mut self) {
        if let Some(gateway) = &mut self.file.s3_process {
            signal(gateway.pid, libc::SIGTERM);
            if !wait_exit(gateway.pid, Duration::from_secs(5)) {
                signal(gateway.pid, libc::SIGKILL);
                wait_exit(gateway.pid, Duration::from_secs(2));
            }
            gateway.pid = 0;
        }
        let pids = self.daemon_pids();
        for &pid in &pids {
            signal(pid, libc::SIGTERM);
        }
        for &pid in &pids {
            if !wait_exit(pid, Duration::from_secs(5)) {
                signal(pid, libc::SIGKILL);
                wait_exit(pid, Duration::from_secs(2));
            }
        }
        for s in &mut self.file.servers {
            s.process.pid = 0;
        }
        self.file.manager_process.pid = 0;
        for replica in &mut self.file.replicas {
            replica.pid = 0;
        }
        let _ = self.save();
    }
}

/// The `--metrics ADDR` arguments of a daemon that has a metrics address.
fn metrics_args(metrics: Option<&str>) -> Vec<String> {
    metrics.map_or_else(Vec::new, |addr| vec!["--metrics".into(), addr.into()])
}

/// The metrics addresses of every daemon of a cluster being started: none without `--metrics`
/// (unless the cluster had them: they stay), the old ones where the cluster had them, free
/// ports on 127.0.0.1 for the others.
fn metrics_addrs(
    previous: Option<&LocalCluster>,
    wanted: bool,
    servers: u32,
    managers: u16,
) -> Result<BTreeMap<String, String>> {
    let mut addrs = previous.map(|p| p.file.metrics.clone()).unwrap_or_default();
    if !wanted && addrs.is_empty() {
        return Ok(addrs);
    }
    let mut names = vec!["s3".to_string()];
    if managers > 1 {
        names.extend((1..=managers).map(|id| format!("manager-{id}")));
    } else {
        names.push("manager".into());
    }
    names.extend((1..=servers).map(|id| format!("server-{id}")));
    let missing: Vec<String> = names
        .into_iter()
        .filter(|n| !addrs.contains_key(n))
        .collect();
    for (name, addr) in missing.iter().zip(free_ports(missing.len())?) {
        addrs.insert(name.clone(), addr);
    }
    Ok(addrs)
}

/// `count` addresses on 127.0.0.1 whose port is free for TCP and for UDP alike (a manager
/// replica uses both).
fn free_ports(count: usize) -> Result<Vec<String>> {
    let mut addrs: Vec<String> = Vec::new();
    for _ in 0..count * 20 {
        if addrs.len() == count {
            break;
        }
        let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = tcp.local_addr()?;
        if std::net::UdpSocket::bind(addr).is_ok() && !addrs.contains(&addr.to_string()) {
            addrs.push(addr.to_string());
        }
    }
    if addrs.len() < count {
        bail!("cannot find {count} free ports on 127.0.0.1");
    }
    Ok(addrs)
}
