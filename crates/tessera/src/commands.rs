//! The client and cluster commands.

use crate::cluster::LocalCluster;
use crate::config::Config;
use crate::credentials;
use crate::reserve::{self, print_report, ReserveArgs};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_client::{Client, ClientError, Credential, LayoutRequest, TransportKind};
use tessera_wire::{ManagerError, ServerId, ServerState};

/// A client with `config`'s settings (see [`Config::client`]) of the manager given by every
/// replica's address, authenticated with `credential`, checked: the manager answers it.
pub async fn connect_replicas(
    config: &Config,
    managers: Vec<SocketAddr>,
    cluster_transport: Option<TransportKind>,
    credential: Credential,
) -> Result<Client> {
    let settings = config.client(cluster_transport, credential, None);
    Ok(Client::connect_replicated(managers, settings).await?)
}

/// A cluster as a client command finds it.
pub struct Target {
    /// The manager's address (the first replica's, if it is replicated).
    pub addr: SocketAddr,
    /// Every replica of a replicated manager (empty: `addr` only).
    pub managers: Vec<SocketAddr>,
    /// The local cluster's transport, if a cluster file said.
    pub transport: Option<TransportKind>,
    /// The local cluster's access key, if a cluster file holds one.
    pub key: Option<String>,
    /// The local cluster's secret file, if a cluster file names one.
    pub secret: Option<PathBuf>,
}

impl Target {
    /// The addresses to reach the manager at: every replica, or the one manager.
    pub fn replicas(&self) -> Vec<SocketAddr> {
        if self.managers.is_empty() {
            vec![self.addr]
        } else {
            self.managers.clone()
        }
    }

    /// The client credential for this cluster (see [`credentials::client`]).
    pub fn client_credential(&self, config: &Config) -> Result<Credential> {
        credentials::client(config, self.key.as_deref(), self.secret.as_deref())
            .with_context(|| format!("cluster at {}", self.addr))
    }

    /// The admin's credential for this cluster (see [`credentials::admin`]).
    pub fn admin_credential(&self, config: &Config) -> Result<Credential> {
        credentials::admin(config, self.secret.as_deref())
    }

    /// A client of this cluster with `config`'s settings. It makes no request: the command's
    /// first one finds out whether the manager answers (so a `put` makes two in all).
    fn client(
        &self,
        config: &Config,
        credential: Credential,
        reservation: Option<tessera_client::stream::Reservation>,
    ) -> Result<Client> {
        let settings = config.client(self.transport, credential, reservation);
        Ok(Client::new_replicated(self.replicas(), settings)?)
    }
}

/// The directory of the local cluster that a command starting or stopping its processes
/// acts on: `--dir` if given, else that of the cluster file `--cluster` (or
/// `TESSERA_CLUSTER`) names, else `./tessera-data`. So one way of naming a cluster works
/// for every command (`up` makes the directory a path names that does not exist yet); a
/// cluster named by its managers' addresses has no directory here, and the command refuses
/// rather than act on `./tessera-data`, which the user did not name.
pub fn local_dir(config: &Config, dir: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(dir) = dir {
        return Ok(dir);
    }
    let Some(spec) = &config.cluster else {
        return Ok(PathBuf::from("tessera-data"));
    };
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let addresses = spec
        .split(',')
        .all(|one| one.trim().to_socket_addrs().is_ok());
    if addresses && !path.exists() {
        bail!("'{spec}' names a cluster by address, not a local cluster's directory: give --dir");
    }
    if path.is_file() || spec.ends_with(".toml") {
        // A cluster file, or the one `up` is to write.
        let parent = path.parent().unwrap_or(Path::new("."));
        return Ok(if parent.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            parent.to_path_buf()
        });
    }
    Ok(path.to_path_buf())
}

/// Find the cluster: its manager, and what its cluster file says (transport, keys).
pub fn resolve(spec: Option<String>) -> Result<Target> {
    let bare = |addr| Target {
        addr,
        managers: Vec::new(),
        transport: None,
        key: None,
        secret: None,
    };
    let given = spec.is_some();
    let spec = spec.unwrap_or_else(|| "tessera-data/cluster.toml".into());
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok(bare(addr));
    }
    if spec.contains(',') {
        let managers = spec
            .split(',')
            .map(|one| {
                one.trim()
                    .parse::<SocketAddr>()
                    .map_err(|_| anyhow!("bad manager address '{one}' in '{spec}'"))
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(Target {
            managers: managers.clone(),
            ..bare(managers[0])
        });
    }
    let path = Path::new(&spec);
    let file = if path.is_dir() {
        path.join("cluster.toml")
    } else {
        path.to_path_buf()
    };
    if file.exists() {
        let dir = file.parent().unwrap_or(Path::new("."));
        let cluster = LocalCluster::load(dir)?;
        return Ok(Target {
            addr: cluster.manager_addr()?,
            managers: cluster.manager_replicas()?,
            transport: Some(cluster.transport()),
            key: cluster.file.key.clone(),
            secret: cluster.secret_path(),
        });
    }
    if given && spec.contains(':') {
        if let Ok(mut addrs) = spec.to_socket_addrs() {
            if let Some(addr) = addrs.next() {
                return Ok(bare(addr));
            }
        }
    }
    if given {
        bail!("no cluster at '{spec}': not an address and no such cluster file");
    }
    bail!(
        "no cluster found: {} does not exist (start one with `tessera up --detach`, or pass --cluster ADDR)",
        file.display()
    )
}

/// A client of the cluster `config` names, with a client's credential (see
/// [`Target::client`]: no request yet).
pub fn connect(config: &Config) -> Result<Client> {
    connect_reserved(config, None)
}

/// As [`connect`], checked: the manager answers it (for daemons, which should fail at start
/// if they cannot reach the cluster, not at their first request).
pub async fn connect_checked(config: &Config) -> Result<Client> {
    let client = connect(config)?;
    client.status().await?;
    Ok(client)
}

/// As [`connect`], for one reserved stream.
pub fn connect_reserved(
    config: &Config,
    reservation: Option<tessera_client::stream::Reservation>,
) -> Result<Client> {
    let target = resolve(config.cluster.clone())?;
    let credential = target.client_credential(config)?;
    target.client(config, credential, reservation)
}

/// A client of the cluster `config` names, with the admin's credential.
pub fn connect_admin(config: &Config) -> Result<Client> {
    let target = resolve(config.cluster.clone())?;
    let credential = target.admin_credential(config)?;
    target.client(config, credential, None)
}

/// Parse a size such as `65536`, `64K`, `64KiB`, `1M`.
pub fn parse_size(text: &str) -> Result<u32> {
    let bytes = parse_bytes(text)?;
    u32::try_from(bytes).map_err(|_| anyhow!("size '{text}' is too large"))
}

/// A byte count with an optional unit (K, M, G, powers of 1024), e.g. 65536, 64K, 256M, 1G.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let t = text.trim();
    let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
    let unit = t[digits.len()..].trim().to_ascii_lowercase();
    let bad = || anyhow!("bad size '{text}' (expected e.g. 65536, 64K, 1M)");
    let value: u64 = digits.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| anyhow!("size '{text}' is too large"))
}

fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

fn open_input(local: &str) -> Result<(Box<dyn Read + Send>, Option<u64>)> {
    if local == "-" {
        return Ok((Box::new(std::io::stdin()), None));
    }
    let file = std::fs::File::open(local).with_context(|| format!("cannot open {local}"))?;
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot read {local}"))?;
    if metadata.is_dir() {
        bail!("cannot read {local}: it is a directory");
    }
    let len = Some(metadata.len());
    Ok((
        Box::new(std::io::BufReader::with_capacity(1 << 20, file)),
        len,
    ))
}

pub(crate) fn open_output(local: &str) -> Result<Box<dyn Write>> {
    if local == "-" {
        return Ok(Box::new(std::io::BufWriter::new(std::io::stdout().lock())));
    }
    let file = std::fs::File::create(local).with_context(|| format!("cannot create {local}"))?;
    // Unbuffered: a transfer writes the servers' answers as they came, a stripe unit or more
    // at a time, which a buffer would only copy once more.
    Ok(Box::new(file))
}

/// The progress bar's counter as a transfer's progress callback.
fn advance(bar: &ProgressBar) -> impl FnMut(u64) + '_ {
    |bytes| bar.inc(bytes)
}

/// `tessera put`: two manager round trips in all (the create and the commit, which carries
/// the size), none per chunk.
pub async fn put(
    config: &Config,
    local: &str,
    remote: &str,
    layout: LayoutRequest,
    reserve: &ReserveArgs,
) -> Result<()> {
    let reservation = reserve.reservation()?;
    // A source that cannot be read fails here, before anything at the destination changes.
    let (mut input, len) = open_input(local)?;
    let client = connect_reserved(config, reservation)?;
    // Written as a new, unnamed file and given the path only once all of it is durable: a put
    // that fails or is killed leaves the old file whole (and the manager removes the new one
    // when its lease runs out, if this process is not there to).
    let (pending, open) = client.create_pending_open(remote, layout).await?;
    // Synced as it goes: the commit's sync then has only the last bytes to write out.
    let mut open = open.sync_ahead();
    let bar = progress_bar(len.unwrap_or(0), "put");
    let mut stream = reservation.map(|r| client.start_stream(r));
    let stored = client
        .keep_pending(&pending, async {
            let admission = reserve::admit(&client, &pending.file, reservation).await?;
            let mut progress = advance(&bar);
            let sent = client.upload(&mut open, 0, &mut input, stream.as_mut(), &mut progress);
            sent.await?;
            reserve::release(admission).await;
            // Synced on the servers, then committed with its size (durably, in one step).
            client
                .commit_upload(&open)
                .await
                .map_err(anyhow::Error::new)
        })
        .await;
    bar.finish_and_clear();
    let failed = match stored {
        Ok(()) => {
            if let Some(stream) = stream {
                print_report(&stream.finish(), reserve.json, false);
            }
            return Ok(());
        }
        Err(e) => e,
    };
    // The manager did not answer: the commit may have been applied and its answer lost (the
    // pending file, if not, goes when its lease runs out).
    if let Some(ClientError::ManagerUnreachable { .. }) = failed.downcast_ref::<ClientError>() {
        return Err(failed.context(format!("cannot tell whether {remote} was replaced")));
    }
    // A pending file that vanished under the writer lost its lease (the writer was stopped or
    // cut off for that long): say so, rather than "no such file: <id>".
    let id = pending.file.id;
    let failed = match failed.downcast_ref::<ClientError>() {
        Some(ClientError::Metadata(ManagerError::NotFound(what))) if *what == id.to_string() => {
            anyhow::Error::new(ManagerError::NotPending(id))
        }
        _ => failed,
    };
    // Best effort: if this fails too, the lease runs out and the manager removes it.
    let _ = client.abandon_pending(&pending).await;
    Err(failed.context(format!("{remote} is unchanged")))
}
/// `tessera get`: one manager round trip (the open), none per chunk.
pub async fn get(config: &Config, remote: &str, local: &str, reserve: &ReserveArgs) -> Result<()> {
    let reservation = reserve.reservation()?;
    let client = connect_reserved(config, reservation)?;
    let open = client.open_file(remote).await?;
    let admission = reserve::admit(&client, open.file(), reservation).await?;
    let mut out = open_output(local)?;
    let bar = progress_bar(open.size(), "get");
    let mut stream = reservation.map(|r| client.start_stream(r));
    let mut progress = advance(&bar);
    let got = client
        .download(
            &open,
            0,
            open.size(),
            &mut out,
            stream.as_mut(),
            &mut progress,
        )
        .await;
    reserve::release(admission).await;
    bar.finish_and_clear();
    if got.is_err() && local != "-" {
        // Leave no partial copy behind that could pass for the file.
        drop(out);
        let _ = std::fs::remove_file(local);
    }
    got?;
    if let Some(stream) = stream {
        print_report(&stream.finish(), reserve.json, local == "-");
    }
    Ok(())
}

/// `tessera write`: the open, one size update if the file grew, and the sync.
pub async fn write(
    config: &Config,
    remote: &str,
    offset: u64,
    local: &str,
    reserve: &ReserveArgs,
) -> Result<()> {
    let reservation = reserve.reservation()?;
    let (mut input, len) = open_input(local)?;
    let client = connect_reserved(config, reservation)?;
    let mut open = client.open_file(remote).await?;
    open.check_range(offset, len.unwrap_or(0))?;
    let admission = reserve::admit(&client, open.file(), reservation).await?;
    let bar = progress_bar(len.unwrap_or(0), "write");
    let mut stream = reservation.map(|r| client.start_stream(r));
    let mut progress = advance(&bar);
    let sent = client.upload(
        &mut open,
        offset,
        &mut input,
        stream.as_mut(),
        &mut progress,
    );
    let written = sent.await;
    reserve::release(admission).await;
    bar.finish_and_clear();
    written?;
    client.sync_open(&mut open).await?;
    if let Some(stream) = stream {
        print_report(&stream.finish(), reserve.json, false);
    }
    Ok(())
}

/// `tessera read`: the open, then the bytes.
pub async fn read(
    config: &Config,
    remote: &str,
    offset: u64,
    length: u64,
    local: &str,
    reserve: &ReserveArgs,
) -> Result<()> {
    let reservation = reserve.reservation()?;
    let client = connect_reserved(config, reservation)?;
    let open = client.open_file(remote).await?;
    let admission = reserve::admit(&client, open.file(), reservation).await?;
    let mut out = open_output(local)?;
    let mut stream = reservation.map(|r| client.start_stream(r));
    let got = client
        .download(
            &open,
            offset,
            length,
            &mut out,
            stream.as_mut(),
            &mut |_| {},
        )
        .await;
    reserve::release(admission).await;
    got?;
    if let Some(stream) = stream {
        print_report(&stream.finish(), reserve.json, local == "-");
    }
    Ok(())
}

/// A file's path, id, size and layout as JSON: `ls --json`'s entries, which `stat --json`
/// extends.
fn file_json(meta: &tessera_wire::FileMeta) -> serde_json::Value {
    serde_json::json!({
        "path": meta.path,
        "id": meta.id,
        "size": meta.size,
        "scheme": meta.layout.scheme.name(),
        "stripe_unit": meta.layout.stripe_unit,
        "width": meta.layout.width,
    })
}

pub async fn ls(config: &Config, prefix: &str, json: bool) -> Result<()> {
    let client = connect(config)?;
    let files = client.list(prefix).await?;
    if json {
        let files: Vec<_> = files.iter().map(file_json).collect();
        println!("{}", serde_json::to_string_pretty(&files)?);
        return Ok(());
    }
    for meta in files {
        println!(
            "{:>14}  {:<6}  {}",
            meta.size,
            meta.layout.scheme.name(),
            meta.path
        );
    }
    Ok(())
}

pub async fn rm(config: &Config, remote: &str) -> Result<()> {
    let client = connect(config)?;
    client.remove(remote).await?;
    Ok(())
}

pub async fn truncate(config: &Config, remote: &str, size: &str) -> Result<()> {
    let size = parse_bytes(size)?;
    let client = connect(config)?;
    let file = client.open(remote).await?;
    client
        .truncate(&file, size)
        .await
        .with_context(|| format!("truncate {remote} to {size} bytes"))?;
    Ok(())
}

pub async fn stat(config: &Config, remote: &str, json: bool) -> Result<()> {
    let client = connect(config)?;
    let stat = client.stat(remote).await?;
    let meta = &stat.meta;
    if json {
        let mut value = file_json(meta);
        value["servers"] = serde_json::json!(meta.servers);
        value["stored_bytes"] = serde_json::json!(stat.stored_bytes);
        value["snapshot_bytes"] = serde_json::json!(stat.snapshot_bytes);
        value["unreachable_servers"] = serde_json::json!(stat.unreachable);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let ratio = if meta.size > 0 {
            format!(" ({:.2}x)", stat.stored_bytes as f64 / meta.size as f64)
        } else {
            String::new()
        };
        println!("path         {}", meta.path);
        println!("size         {}", meta.size);
        println!("scheme       {}", meta.layout.scheme);
        println!("stripe unit  {}", meta.layout.stripe_unit);
        println!("width        {}", meta.layout.width);
        let servers: Vec<String> = meta.servers.iter().map(|s| s.to_string()).collect();
        println!("servers      {}", servers.join(" "));
        println!("stored       {}{ratio}", stat.stored_bytes);
        if stat.snapshot_bytes > 0 {
            println!("snapshots    {}", stat.snapshot_bytes);
        }
        if !stat.unreachable.is_empty() {
            println!(
                "unreachable  {:?} (their bytes are not counted)",
                stat.unreachable
            );
        }
    }
    Ok(())
}

pub async fn status(config: &Config, json: bool) -> Result<()> {
    let target = resolve(config.cluster.clone())?;
    let addr = target.addr;
    let replicated = !target.managers.is_empty();
    let credential = target.client_credential(config)?;
    let client = connect_replicas(config, target.replicas(), target.transport, credential).await?;
    let servers = client.status().await?;
    let replicas = if replicated {
        client.replicas().await
    } else {
        Vec::new()
    };
    let group = if replicated {
        client.replica_group().await.ok()
    } else {
        None
    };
    if json {
        let list: Vec<_> = servers
            .iter()
            .map(|s| serde_json::json!({"id": s.id, "addr": s.addr, "state": s.state.name()}))
            .collect();
        let managers: Vec<_> = replicas
            .iter()
            .map(|(addr, status)| match status {
                Ok(r) => serde_json::json!({"addr": addr.to_string(), "id": r.id,
                    "role": r.role, "view": r.view, "epoch": r.epoch, "applied": r.applied}),
                Err(e) => serde_json::json!({"addr": addr.to_string(), "error": e.to_string()}),
            })
            .collect();
        let group = group.as_ref().map(|(epoch, members)| {
            let members: Vec<_> = (members.iter())
                .map(|(id, addr)| serde_json::json!({"id": id, "addr": addr}))
                .collect();
            serde_json::json!({"changes": epoch, "members": members})
        });
        let value = serde_json::json!({"manager": addr.to_string(), "managers": managers,
            "group": group, "servers": list});
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        if replicated {
            println!(
                "{:>4}  {:<22}  {:<12}  {:>6}  {:>5}  applied",
                "mgr", "address", "role", "view", "epoch"
            );
            for (addr, status) in &replicas {
                match status {
                    Ok(r) => println!(
                        "{:>4}  {:<22}  {:<12}  {:>6}  {:>5}  {}",
                        r.id, addr, r.role, r.view, r.epoch, r.applied
                    ),
                    Err(e) => println!("{:>4}  {:<22}  down ({e})", "-", addr),
                }
            }
            if let Some((epoch, members)) = &group {
                print_group(*epoch, members);
            }
        } else {
            println!("manager {addr}");
        }
        println!("{:>4}  {:<22}  state", "id", "address");
        for s in servers {
            println!("{:>4}  {:<22}  {}", s.id, s.addr, s.state.name());
        }
    }
    Ok(())
}

pub async fn rebuild(config: &Config, id: u32) -> Result<()> {
    // Clearing a server's debt is the admin's (a false one would serve stale bytes).
    let client = connect_admin(config)?;
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("rebuild [{bar:30}] {pos}/{len} stripes {msg}")
                .expect("template")
                .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let done = client
        .rebuild(id, |p| {
            bar.set_length(p.stripes_total);
            bar.set_position(p.stripes_done);
            bar.set_message(format!("({}/{} files)", p.files_done, p.files_total));
        })
        .await;
    bar.finish_and_clear();
    let done = done?;
    println!(
        "server {id} rebuilt: {} stripes in {} files ({} stripes never written, nothing to rebuild)",
        done.stripes_done, done.files_total, done.stripes_unallocated
    );
    Ok(())
}

pub async fn scrub(config: &Config, remote: Option<&str>) -> Result<()> {
    let client = connect(config)?;
    let report = client.scrub(remote).await?;
    println!(
        "scrubbed {} files, {} stripes checked, {} skipped (server down or owed), {} never written",
        report.files, report.stripes_checked, report.stripes_skipped, report.stripes_unallocated
    );
    println!(
        "repaired: {} corrupt blocks, {} parity mismatches, {} mirror mismatches",
        report.corrupt_repaired, report.parity_repaired, report.mirrors_repaired
    );
    for line in &report.unrepairable {
        println!("unrepairable: {line}");
    }
    if !report.unrepairable.is_empty() {
        bail!(
            "{} problems could not be repaired",
            report.unrepairable.len()
        );
    }
    Ok(())
}

/// What `tessera up` starts.
pub struct UpDaemons<'a> {
    /// Storage servers.
    pub servers: u32,
    /// Manager replicas (1: one manager).
    pub managers: u16,
    /// The S3 gateway's address, if one is started.
    pub s3: Option<&'a str>,
    /// Whether every daemon serves Prometheus metrics.
    pub metrics: bool,
}

/// After a start: servers that came back owing data (a power loss with writes not synced
/// renews a store, which then owes everything it held), each with the command that rebuilds
/// it. Best effort: a cluster that cannot say is started all the same.
async fn print_owing_servers(cluster: &LocalCluster, config: &Config) {
    let Ok(client) = cluster.client(config).await else {
        return;
    };
    let Ok(status) = client.status().await else {
        return;
    };
    for server in status.iter().filter(|s| s.state == ServerState::Stale) {
        let files = client
            .debts_of(server.id)
            .await
            .map_or(0, |debts| debts.len());
        println!(
            "server {id} owes {files} file(s) it missed or lost (down during writes, or a \
             power loss with writes not synced): run `tessera rebuild {id}`",
            id = server.id
        );
    }
}

pub async fn up(config: &Config, dir: &Path, daemons: UpDaemons<'_>, detach: bool) -> Result<()> {
    let UpDaemons {
        servers,
        managers,
        s3,
        metrics,
    } = daemons;
    if managers == 0 || usize::from(managers) > tessera_manager::replica::REPLICAS_MAX {
        bail!(
            "--managers {managers}: a cluster has 1 to {} manager replicas",
            tessera_manager::replica::REPLICAS_MAX
        );
    }
    let mut cluster = LocalCluster::up(dir, servers, managers, metrics, config).await?;
    let manager = if cluster.file.managers.is_empty() {
        format!("manager at {}", cluster.file.manager)
    } else {
        format!(
            "{managers} manager replicas at {}",
            cluster.file.managers.join(",")
        )
    };
    println!(
        "tessera: {manager} with {servers} servers, data in {}",
        cluster.dir.display()
    );
    print_owing_servers(&cluster, config).await;
    if let Some(listen) = s3 {
        if let Err(e) = cluster.start_gateway(listen) {
            cluster.down();
            return Err(e);
        }
        let file = &cluster.file;
        println!(
            "S3 gateway at {} (access key {}, secret key {}; also in {})",
            file.s3_endpoint.as_deref().unwrap_or("?"),
            file.s3_access_key.as_deref().unwrap_or("?"),
            file.s3_secret_key.as_deref().unwrap_or("?"),
            LocalCluster::cluster_file(&cluster.dir).display()
        );
    }
    let running = |name: &String| name != "s3" || cluster.file.s3_process.is_some();
    let endpoints: Vec<String> = (cluster.file.metrics.iter())
        .filter(|(name, _)| running(name))
        .map(|(name, addr)| format!("{name} http://{addr}/metrics"))
        .collect();
    if !endpoints.is_empty() {
        println!("metrics: {}", endpoints.join(", "));
    }
    if detach {
        println!("stop it with: tessera down --dir {}", dir.display());
        return Ok(());
    }
    println!("press Ctrl-C to stop");
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for Ctrl-C")?;
    cluster.down();
    Ok(())
}

pub fn down(dir: &Path) -> Result<()> {
    let mut cluster = LocalCluster::load(dir)?;
    cluster.down();
    Ok(())
}

pub fn manager_stop(dir: &Path, id: u16) -> Result<()> {
    LocalCluster::load(dir)?.stop_replica(id)
}

pub fn manager_start(dir: &Path, id: u16) -> Result<()> {
    LocalCluster::load(dir)?.start_replica(id)
}

/// `tessera manager add ID [ADDR]`: on a local cluster, starts the replica as a joining
/// member first (stopped again if the change fails), then orders the change.
pub async fn manager_add(config: &Config, dir: &Path, id: u16, addr: Option<String>) -> Result<()> {
    let local = LocalCluster::cluster_file(dir).exists() && config.cluster.is_none();
    if !local {
        let addr = addr.context("tessera manager add ID ADDR: the new replica's address")?;
        let (epoch, members) = admin_of(config)
            .await?
            .replica_change(id, Some(addr))
            .await?;
        print_group(epoch, &members);
        return Ok(());
    }
    let mut cluster = LocalCluster::load(dir)?;
    let addr = cluster.start_joining_replica(id, addr)?;
    let changed = async {
        let admin = cluster.admin_client(config).await?;
        anyhow::Ok(admin.replica_change(id, Some(addr.clone())).await?)
    }
    .await;
    let (epoch, members) = match changed {
        Ok(group) => group,
        Err(error) => {
            cluster.kill_replica(id)?;
            return Err(error.context(format!("replica {id} was not added (stopped again)")));
        }
    };
    cluster.set_members(&members)?;
    print_group(epoch, &members);
    Ok(())
}

/// `tessera manager remove ID`: orders the change; on a local cluster, stops the replica
/// once it left (its order node stops when the new group runs).
pub async fn manager_remove(config: &Config, dir: &Path, id: u16) -> Result<()> {
    let local = LocalCluster::cluster_file(dir).exists() && config.cluster.is_none();
    if !local {
        let (epoch, members) = admin_of(config).await?.replica_change(id, None).await?;
        print_group(epoch, &members);
        return Ok(());
    }
    let mut cluster = LocalCluster::load(dir)?;
    let admin = cluster.admin_client(config).await?;
    let (epoch, members) = admin.replica_change(id, None).await?;
    cluster.set_members(&members)?;
    print_group(epoch, &members);
    let removed: SocketAddr = cluster.file.replicas[usize::from(id) - 1].addr.parse()?;
    let began = std::time::Instant::now();
    while began.elapsed() < Duration::from_secs(10) {
        // Asked directly: the admin client learned the group without it.
        let status = admin.replica_at(removed).await;
        let left = status.as_ref().map_or(true, |s| s.role == "removed");
        if left {
            return cluster.kill_replica(id);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("replica {id} has not stopped its part in the order within 10 s: left running");
    Ok(())
}

/// An admin client of the cluster `config` names.
async fn admin_of(config: &Config) -> Result<Client> {
    let target = resolve(config.cluster.clone())?;
    let credential = target.admin_credential(config)?;
    connect_replicas(config, target.replicas(), target.transport, credential).await
}

fn print_group(epoch: u32, members: &[(u16, String)]) {
    let list: Vec<String> = (members.iter())
        .map(|(id, addr)| format!("{id} at {addr}"))
        .collect();
    println!("manager group (change {epoch}): {}", list.join(", "));
}

pub fn server_stop(dir: &Path, id: u32) -> Result<()> {
    LocalCluster::load(dir)?.stop_server(id)
}

pub async fn server_start(config: &Config, dir: &Path, id: u32) -> Result<()> {
    let mut cluster = LocalCluster::load(dir)?;
    cluster.start_server(id)?;
    cluster.wait_all_up(config).await
}

pub(crate) fn write_addr_file(addr_file: Option<PathBuf>, addr: SocketAddr) -> Result<()> {
    if let Some(path) = addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, addr.to_string())?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

pub(crate) async fn until_terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// The manager's cluster secret: `--secret FILE`, else `DIR/cluster.secret`; with `init`,
/// created (mode 0600) if it does not exist yet.
fn manager_secret(config: &Config, dir: &Path, init: bool) -> Result<tessera_client::Secret> {
    let path = (config.secret.clone()).unwrap_or_else(|| dir.join(credentials::SECRET_FILE_NAME));
    if init {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let created = !path.exists();
        let secret = credentials::read_or_create_secret(&path)?;
        if created {
            eprintln!(
                "created the cluster secret {} (copy it to every server)",
                path.display()
            );
        }
        return Ok(secret);
    }
    if !path.exists() {
        bail!(
            "no cluster secret at {}: create one with `tessera manager --init` (or pass --secret FILE)",
            path.display()
        );
    }
    credentials::read_secret(&path)
}

/// A replica's settings from `--id` and `--peers`.
pub fn replica_config(
    id: u16,
    peers: &[String],
    join: bool,
) -> Result<tessera_manager::replica::ReplicaConfig> {
    let peers = peers
        .iter()
        .map(|peer| {
            peer.trim()
                .parse::<SocketAddr>()
                .map_err(|_| anyhow!("bad replica address '{peer}' in --peers"))
        })
        .collect::<Result<Vec<_>>>()?;
    let config = tessera_manager::replica::ReplicaConfig {
        id,
        peers,
        order: tessera_manager::replica::order_config(),
        catch_up_piece_bytes: tessera_manager::replica::SNAPSHOT_PIECE_BYTES_MAX as u32,
        join,
    };
    config.validate()?;
    Ok(config)
}

/// The manager's configuration from its flags: the pending lease in milliseconds and what
/// reserved streams may take of each link.
pub fn manager_config(
    pending_lease_ms: Option<u64>,
    links: tessera_manager::reservations::LinkCapacity,
) -> Result<tessera_manager::ManagerConfig> {
    let mut config = tessera_manager::ManagerConfig {
        links,
        ..tessera_manager::ManagerConfig::default()
    };
    if let Some(ms) = pending_lease_ms {
        if ms == 0 {
            bail!("--pending-lease-ms must be at least 1");
        }
        config.pending_lease = std::time::Duration::from_millis(ms);
    }
    Ok(config)
}

pub async fn run_manager(
    config: &Config,
    at: ServerAt<'_>,
    settings: tessera_manager::ManagerConfig,
    limits: tessera_transport::TcpLimits,
    init: bool,
    replica: Option<tessera_manager::replica::ReplicaConfig>,
) -> Result<()> {
    let ServerAt {
        listen,
        dir,
        addr_file,
        metrics,
    } = at;
    let listen: SocketAddr = listen
        .parse()
        .map_err(|_| anyhow!("bad listen address '{listen}'"))?;
    let secret = manager_secret(config, dir, init)?;
    let manager = match replica {
        Some(replica) => {
            tessera_manager::daemon::start_replica(replica, dir, settings, init, limits, &secret)
                .await?
        }
        None => {
            tessera_manager::daemon::start_limited(listen, dir, settings, init, limits, &secret)
                .await?
        }
    };
    let handle = manager.metrics();
    let scrape = crate::metrics_http::serve_if(metrics, move || {
        let handle = handle.clone();
        async move { handle.text().await }
    })
    .await?;
    write_addr_file(addr_file, manager.addr)?;
    eprintln!("manager listening on {}", manager.addr);
    until_terminated().await;
    drop(scrape);
    manager
        .shutdown()
        .await
        .context("cannot make metadata durable on shutdown")?;
    Ok(())
}

/// Where a daemon (a server, or the manager) listens and keeps its data.
pub struct ServerAt<'a> {
    /// Address to listen on.
    pub listen: &'a str,
    /// Data directory.
    pub dir: &'a Path,
    /// Write the bound address here once listening.
    pub addr_file: Option<PathBuf>,
    /// Serve Prometheus metrics here (servers only).
    pub metrics: Option<&'a str>,
}

/// What a server lets its peers hold: TCP connections and frames, datagram sessions and
/// their memory (the datagram settings also carry the window choice).
pub struct ServerLimits {
    /// Connections, idle time, memory for frames.
    pub tcp: tessera_transport::TcpLimits,
    /// The datagram protocol's settings, its limits included.
    pub datagram: tessera_transport::DatagramConfig,
}

/// Runs a storage server until SIGTERM or SIGINT.
pub async fn run_server(
    config: &Config,
    manager: &str,
    at: ServerAt<'_>,
    id: Option<u32>,
    limits: ServerLimits,
    schedule: tessera_server::ScheduleConfig,
) -> Result<()> {
    let ServerAt {
        listen,
        dir,
        addr_file,
        metrics,
    } = at;
    let target = resolve(Some(manager.to_string()))?;
    let (manager, manager_replicas) = (target.addr, target.managers);
    let listen: SocketAddr = listen
        .parse()
        .map_err(|_| anyhow!("bad listen address '{listen}'"))?;
    let secret_path = config.secret.clone().ok_or_else(|| {
        anyhow!("tessera server needs --secret FILE (the cluster secret the manager was given)")
    })?;
    let secret = credentials::read_secret(&secret_path)?;
    let managers = std::iter::once(manager)
        .chain(manager_replicas.iter().copied())
        .collect();
    let credential = Credential {
        claim: tessera_client::Claim::Admin,
        key: secret.admin_key(),
    };
    let server = tessera_server::start(tessera_server::ServerConfig {
        secret,
        manager,
        manager_replicas,
        listen,
        advertise: None,
        dir: dir.to_path_buf(),
        id,
        transport: config.transport.unwrap_or_default(),
        datagram: limits.datagram,
        tcp: limits.tcp,
        schedule,
    })
    .await?;
    let handle = server.metrics();
    let scrape = crate::metrics_http::serve_if(metrics, move || {
        let handle = handle.clone();
        async move { handle.text().await }
    })
    .await?;
    write_addr_file(addr_file, server.addr)?;
    eprintln!("server listening on {}", server.addr);
    // SIGTERM is heard from here on, also while the server waits to be registered (a
    // manager down at start must not make the daemon deaf to `down`); the resolver starts
    // once the server has an id.
    let resolver = async {
        let id = server.registered().await;
        resolve_torn_stripes(config, id, managers, credential).await
    };
    tokio::select! {
        () = resolver => {}
        () = until_terminated() => {}
    }
    drop(scrape);
    // Everything acknowledged is in the page cache; make it durable before going.
    server
        .shutdown()
        .await
        .context("cannot sync the store on shutdown")?;
    Ok(())
}

/// How often a server's daemon looks for torn stripes its store holds orphaned stale-parity
/// records of (a few leases: a record is orphaned 600 ms after its writer's last renewal).
const TORN_RESOLVE_EVERY: Duration = Duration::from_secs(2);

/// In the background of a server's daemon: resolve the torn stripes of interrupted
/// full-stripe writes whose parity this server holds, as soon as their writer's lease ran out
/// (`tessera-store`'s `stale` module argues why here). A client of its own (the admin's
/// credential, from the cluster secret the server was given), connected on first need.
async fn resolve_torn_stripes(
    config: &Config,
    server: ServerId,
    managers: Vec<SocketAddr>,
    credential: Credential,
) {
    let mut client = None;
    loop {
        tokio::time::sleep(TORN_RESOLVE_EVERY).await;
        if client.is_none() {
            client = connect_replicas(config, managers.clone(), None, credential)
                .await
                .ok();
        }
        let Some(client) = &client else { continue };
        match client.resolve_torn(server).await {
            Ok(done) if done.stripes > 0 => tracing::info!(
                "resolved {} torn stripes of interrupted full-stripe writes ({} left for later)",
                done.resolved,
                done.left
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!("torn stripes not looked at: {e}"),
        }
    }
}

/// `tessera key create NAME`: issue an access key and print it (once).
pub async fn key_create(config: &Config, name: &str) -> Result<()> {
    let client = connect_admin(config)?;
    let (id, key) = client.key_create(name).await?;
    println!("{}", tessera_client::format_access_key(id, &key));
    Ok(())
}

/// `tessera key ls`: the live access keys.
pub async fn key_ls(config: &Config) -> Result<()> {
    let client = connect_admin(config)?;
    for key in client.key_list().await? {
        println!("{}  {}", key.id, key.name);
    }
    Ok(())
}

/// `tessera key rm KEYID`: revoke an access key.
pub async fn key_rm(config: &Config, id: &str) -> Result<()> {
    let id: tessera_client::KeyId = id
        .parse()
        .map_err(|_| anyhow!("bad key id '{id}' (expected k followed by 16 hex digits)"))?;
    let client = connect_admin(config)?;
    client.key_remove(id).await?;
    println!("revoked {id}");
    Ok(())
}
