//! The client and cluster commands.

use crate::cluster::LocalCluster;
use crate::credentials;
use crate::reserve::{self, print_report, ReserveArgs, StreamClock};
use anyhow::{anyhow, bail, Context, Result};
use futures::stream::{FuturesUnordered, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tessera_client::{
    Client, ClientConfig, ClientError, CongestionKind, Credential, DatagramConfig, File,
    LayoutRequest, Scheme, TransportKind,
};
use tessera_wire::{ManagerError, ServerId};

/// The network choices given on the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Network {
    /// `--transport`, if given.
    pub transport: Option<TransportKind>,
    /// `--window`, if given.
    pub window: Option<u32>,
    /// `--receive-budget`, if given (0: off).
    pub receive_budget: Option<u32>,
}

static NETWORK: OnceLock<Network> = OnceLock::new();

/// Record the command line's network choices (once, at start-up).
pub fn set_network(network: Network) {
    let _ = NETWORK.set(network);
}

/// The command line's network choices.
pub fn network() -> Network {
    NETWORK.get().copied().unwrap_or_default()
}

/// The datagram protocol's settings for a window choice.
pub fn datagram_config(window: Option<u32>) -> DatagramConfig {
    let mut config = DatagramConfig::default();
    if let Some(n) = window {
        config.congestion = CongestionKind::Fixed(n);
    }
    config
}

/// The datagram protocol's settings for a client: the window choice and the receive budget.
pub fn client_datagram_config(net: Network) -> DatagramConfig {
    let mut config = datagram_config(net.window);
    config.receive_budget_packets = match net.receive_budget {
        Some(0) => None,
        Some(n) => Some(n),
        None => Some(tessera_client::RECEIVE_BUDGET_PACKETS),
    };
    config
}

/// A client with the transport chosen on the command line, else the cluster's, else UDP,
/// authenticated with `credential`.
pub async fn connect_to(
    addr: SocketAddr,
    cluster_transport: Option<TransportKind>,
    credential: Credential,
) -> Result<Client> {
    connect_replicas(vec![addr], cluster_transport, credential).await
}

/// As [`connect_to`], to a manager given by every replica's address.
pub async fn connect_replicas(
    managers: Vec<SocketAddr>,
    cluster_transport: Option<TransportKind>,
    credential: Credential,
) -> Result<Client> {
    connect_replicas_reserved(managers, cluster_transport, credential, None).await
}

/// As [`connect_replicas`], with every datagram session to a server reserved at
/// `reservation` (see [`ClientConfig::reservation`]).
pub async fn connect_replicas_reserved(
    managers: Vec<SocketAddr>,
    cluster_transport: Option<TransportKind>,
    credential: Credential,
    reservation: Option<tessera_client::stream::Reservation>,
) -> Result<Client> {
    let net = network();
    let config = ClientConfig {
        transport: net.transport.or(cluster_transport).unwrap_or_default(),
        datagram: client_datagram_config(net),
        credential: Some(credential),
        reservation,
        ..ClientConfig::default()
    };
    Ok(Client::connect_replicated(managers, config).await?)
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
    pub fn client_credential(&self) -> Result<Credential> {
        credentials::client(self.key.as_deref(), self.secret.as_deref())
            .with_context(|| format!("cluster at {}", self.addr))
    }

    /// The admin's credential for this cluster (see [`credentials::admin`]).
    pub fn admin_credential(&self) -> Result<Credential> {
        credentials::admin(self.secret.as_deref())
    }
}

/// Bytes moved by one client call in a streaming transfer (whole stripes where possible).
const TRANSFER_CHUNK_BYTES: u64 = 8 << 20;
/// Transfer calls kept in flight at once.
const TRANSFERS_IN_FLIGHT: usize = 3;

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

/// A client of the cluster `spec` names, with a client's credential.
pub async fn connect(spec: Option<String>) -> Result<Client> {
    connect_reserved(spec, None).await
}

/// As [`connect`], for one reserved stream.
pub async fn connect_reserved(
    spec: Option<String>,
    reservation: Option<tessera_client::stream::Reservation>,
) -> Result<Client> {
    let target = resolve(spec)?;
    let credential = target.client_credential()?;
    connect_replicas_reserved(target.replicas(), target.transport, credential, reservation).await
}

/// A client of the cluster `spec` names, with the admin's credential.
pub async fn connect_admin(spec: Option<String>) -> Result<Client> {
    let target = resolve(spec)?;
    let credential = target.admin_credential()?;
    connect_replicas(target.replicas(), target.transport, credential).await
}

/// Parse a size such as `65536`, `64K`, `64KiB`, `1M`.
pub fn parse_size(text: &str) -> Result<u32> {
    let t = text.trim();
    let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
    let unit = t[digits.len()..].trim().to_ascii_lowercase();
    let value: u64 = digits
        .parse()
        .map_err(|_| anyhow!("bad size '{text}' (expected e.g. 65536, 64K, 1M)"))?;
    let scale = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        _ => bail!("bad size '{text}' (expected e.g. 65536, 64K, 1M)"),
    };
    u32::try_from(value * scale).map_err(|_| anyhow!("size '{text}' is too large"))
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

/// Chunk size for a file: whole stripes, about `TRANSFER_CHUNK_BYTES`, or for a reserved
/// stream about a quarter of its budget per period (whole stripes still), so that chunks
/// released at the rate finish within the period whose bytes they carry.
pub async fn chunk_bytes(
    client: &Client,
    file: &File,
    stream: Option<&StreamClock>,
) -> Result<u64> {
    // By id: a pending file has no path yet, and the path may name another file.
    let stripe = client.meta(file).await?.layout.stripe_bytes();
    let target = stream.map_or(TRANSFER_CHUNK_BYTES, |stream| {
        (stream.budget_bytes() / 4).min(TRANSFER_CHUNK_BYTES)
    });
    Ok(stripe * (target / stripe).max(1))
}

/// Write everything `source` yields at `offset`, several chunks in flight.
pub async fn upload(
    client: &Client,
    file: &File,
    mut offset: u64,
    source: &mut dyn Read,
    bar: &ProgressBar,
    mut stream: Option<&mut StreamClock>,
) -> Result<u64> {
    let chunk = chunk_bytes(client, file, stream.as_deref()).await? as usize;
    let mut in_flight = FuturesUnordered::new();
    let mut total = 0u64;
    loop {
        let mut buf = vec![0u8; chunk];
        let mut filled = 0;
        while filled < chunk {
            let n = source
                .read(&mut buf[filled..])
                .context("cannot read input")?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        buf.truncate(filled);
        if !buf.is_empty() {
            if let Some(stream) = &stream {
                // Chunks complete out of order: the ledger counts bytes as they complete.
                stream.wait(total).await;
            }
            let at = offset;
            // Past `u64` the write of this chunk is refused, so the next offset never matters.
            offset = offset.saturating_add(filled as u64);
            total += filled as u64;
            in_flight.push(async move {
                client.write_at(file, at, &buf).await?;
                Ok::<u64, anyhow::Error>(buf.len() as u64)
            });
        }
        while in_flight.len() >= TRANSFERS_IN_FLIGHT || (filled < chunk && !in_flight.is_empty()) {
            let done = in_flight.next().await.expect("non-empty")?;
            bar.inc(done);
            if let Some(stream) = stream.as_deref_mut() {
                stream.done(done);
            }
        }
        if filled < chunk {
            return Ok(total);
        }
    }
}

/// Read `len` bytes at `offset` into `sink`, in order, several chunks in flight.
pub async fn download(
    client: &Client,
    file: &File,
    offset: u64,
    len: u64,
    sink: &mut dyn Write,
    bar: &ProgressBar,
    mut stream: Option<&mut StreamClock>,
) -> Result<u64> {
    client.check_range(file, offset, len).await?;
    let chunk = chunk_bytes(client, file, stream.as_deref()).await?;
    let pacing = stream.as_ref().map(|stream| stream.pacing());
    let chunks = (0..len.div_ceil(chunk)).map(|i| {
        let at = offset + i * chunk;
        let n = chunk.min(offset + len - at);
        let pacing = pacing.clone();
        async move {
            if let Some(pacing) = pacing {
                tokio::time::sleep_until(pacing.release(i * chunk)).await;
            }
            client.read_at(file, at, n).await
        }
    });
    let mut reads = futures::stream::iter(chunks).buffered(TRANSFERS_IN_FLIGHT);
    let mut total = 0;
    while let Some(bytes) = reads.next().await {
        let bytes = bytes?;
        sink.write_all(&bytes).context("cannot write output")?;
        bar.inc(bytes.len() as u64);
        total += bytes.len() as u64;
        if let Some(stream) = stream.as_deref_mut() {
            stream.done(bytes.len() as u64);
        }
        if (bytes.len() as u64) < chunk {
            break;
        }
    }
    sink.flush().context("cannot write output")?;
    Ok(total)
}

fn open_input(local: &str) -> Result<(Box<dyn Read>, Option<u64>)> {
    if local == "-" {
        return Ok((Box::new(std::io::stdin().lock()), None));
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
    Ok(Box::new(std::io::BufWriter::with_capacity(1 << 20, file)))
}

pub async fn put(
    cluster: Option<String>,
    local: &str,
    remote: &str,
    scheme: &str,
    stripe_unit: &str,
    width: Option<u32>,
    reserve: &ReserveArgs,
) -> Result<()> {
    let scheme: Scheme = scheme.parse()?;
    let stripe_unit = parse_size(stripe_unit)?;
    let reservation = reserve.reservation()?;
    // A source that cannot be read fails here, before anything at the destination changes.
    let (mut input, len) = open_input(local)?;
    let client = connect_reserved(cluster, reservation).await?;
    // Written as a new, unnamed file and given the path only once all of it is durable: a put
    // that fails or is killed leaves the old file whole (and the manager removes the new one
    // when its lease runs out, if this process is not there to).
    let layout = LayoutRequest {
        scheme,
        stripe_unit,
        width,
    };
    let pending = client.create_pending(remote, layout).await?;
    let bar = progress_bar(len.unwrap_or(0), "put");
    let mut stream = reservation.map(StreamClock::start);
    let stored = client
        .keep_pending(&pending, async {
            let admission = reserve::admit(&client, &pending.file, reservation).await?;
            upload(&client, &pending.file, 0, &mut input, &bar, stream.as_mut()).await?;
            client.sync(&pending.file).await?;
            reserve::release(admission).await;
            anyhow::Ok(())
        })
        .await;
    bar.finish_and_clear();
    let failed = match stored {
        Ok(()) => match client.commit_pending(&pending.file).await {
            Ok(()) => {
                if let Some(stream) = stream {
                    print_report(&stream.finish(), reserve.json, false);
                }
                return Ok(());
            }
            // The commit may have been applied and its answer lost.
            Err(e @ ClientError::ManagerUnreachable { .. }) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("cannot tell whether {remote} was replaced")));
            }
            Err(e) => e.into(),
        },
        Err(e) => e,
    };
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

pub async fn get(
    cluster: Option<String>,
    remote: &str,
    local: &str,
    reserve: &ReserveArgs,
) -> Result<()> {
    let reservation = reserve.reservation()?;
    let client = connect_reserved(cluster, reservation).await?;
    let file = client.open(remote).await?;
    let size = client.size(&file).await?;
    let admission = reserve::admit(&client, &file, reservation).await?;
    let mut out = open_output(local)?;
    let bar = progress_bar(size, "get");
    let mut stream = reservation.map(StreamClock::start);
    let got = download(&client, &file, 0, size, &mut out, &bar, stream.as_mut()).await;
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

pub async fn write(
    cluster: Option<String>,
    remote: &str,
    offset: u64,
    local: &str,
    reserve: &ReserveArgs,
) -> Result<()> {
    let reservation = reserve.reservation()?;
    let (mut input, len) = open_input(local)?;
    let client = connect_reserved(cluster, reservation).await?;
    let file = client.open(remote).await?;
    client.check_range(&file, offset, len.unwrap_or(0)).await?;
    let admission = reserve::admit(&client, &file, reservation).await?;
    let bar = progress_bar(len.unwrap_or(0), "write");
    let mut stream = reservation.map(StreamClock::start);
    let written = upload(&client, &file, offset, &mut input, &bar, stream.as_mut()).await;
    reserve::release(admission).await;
    bar.finish_and_clear();
    written?;
    client.sync(&file).await?;
    if let Some(stream) = stream {
        print_report(&stream.finish(), reserve.json, false);
    }
    Ok(())
}

pub async fn read(
    cluster: Option<String>,
    remote: &str,
    offset: u64,
    length: u64,
    local: &str,
    reserve: &ReserveArgs,
) -> Result<()> {
    let reservation = reserve.reservation()?;
    let client = connect_reserved(cluster, reservation).await?;
    let file = client.open(remote).await?;
    let admission = reserve::admit(&client, &file, reservation).await?;
    let mut out = open_output(local)?;
    let mut stream = reservation.map(StreamClock::start);
    let got = download(
        &client,
        &file,
        offset,
        length,
        &mut out,
        &ProgressBar::hidden(),
        stream.as_mut(),
    )
    .await;
    reserve::release(admission).await;
    got?;
    if let Some(stream) = stream {
        print_report(&stream.finish(), reserve.json, local == "-");
    }
    Ok(())
}

pub async fn ls(cluster: Option<String>, prefix: &str) -> Result<()> {
    let client = connect(cluster).await?;
    for meta in client.list(prefix).await? {
        println!(
            "{:>14}  {:<6}  {}",
            meta.size,
            meta.layout.scheme.name(),
            meta.path
        );
    }
    Ok(())
}

pub async fn rm(cluster: Option<String>, remote: &str) -> Result<()> {
    let client = connect(cluster).await?;
    client.remove(remote).await?;
    Ok(())
}

pub async fn stat(cluster: Option<String>, remote: &str, json: bool) -> Result<()> {
    let client = connect(cluster).await?;
    let stat = client.stat(remote).await?;
    let meta = &stat.meta;
    if json {
        let value = serde_json::json!({
            "path": meta.path,
            "id": meta.id,
            "size": meta.size,
            "scheme": meta.layout.scheme.name(),
            "stripe_unit": meta.layout.stripe_unit,
            "width": meta.layout.width,
            "servers": meta.servers,
            "stored_bytes": stat.stored_bytes,
            "snapshot_bytes": stat.snapshot_bytes,
            "unreachable_servers": stat.unreachable,
        });
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

pub async fn status(cluster: Option<String>, json: bool) -> Result<()> {
    let target = resolve(cluster.clone())?;
    let addr = target.addr;
    let replicated = !target.managers.is_empty();
    let credential = target.client_credential()?;
    let client = connect_replicas(target.replicas(), target.transport, credential).await?;
    let servers = client.status().await?;
    let replicas = if replicated {
        client.replicas().await
    } else {
        Vec::new()
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
        let value = serde_json::json!({"manager": addr.to_string(), "managers": managers,
            "servers": list});
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

pub async fn rebuild(cluster: Option<String>, id: u32) -> Result<()> {
    // Clearing a server's debt is the admin's (a false one would serve stale bytes).
    let client = connect_admin(cluster).await?;
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

pub async fn scrub(cluster: Option<String>, remote: Option<&str>) -> Result<()> {
    let client = connect(cluster).await?;
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

pub async fn up(
    dir: &Path,
    servers: u32,
    managers: u16,
    detach: bool,
    s3: Option<&str>,
) -> Result<()> {
    if managers == 0 || usize::from(managers) > tessera_manager::replica::REPLICAS_MAX {
        bail!(
            "--managers {managers}: a cluster has 1 to {} manager replicas",
            tessera_manager::replica::REPLICAS_MAX
        );
    }
    let net = network();
    let transport = net.transport.unwrap_or_default();
    let mut cluster = LocalCluster::up(dir, servers, managers, transport, net.window).await?;
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

pub fn server_stop(dir: &Path, id: u32) -> Result<()> {
    LocalCluster::load(dir)?.stop_server(id)
}

pub async fn server_start(dir: &Path, id: u32) -> Result<()> {
    let mut cluster = LocalCluster::load(dir)?;
    cluster.start_server(id)?;
    cluster.wait_all_up().await
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
fn manager_secret(dir: &Path, init: bool) -> Result<tessera_client::Secret> {
    let path =
        credentials::secret_flag().unwrap_or_else(|| dir.join(credentials::SECRET_FILE_NAME));
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
    listen: &str,
    dir: &Path,
    addr_file: Option<PathBuf>,
    config: tessera_manager::ManagerConfig,
    limits: tessera_transport::TcpLimits,
    init: bool,
    replica: Option<tessera_manager::replica::ReplicaConfig>,
) -> Result<()> {
    let listen: SocketAddr = listen
        .parse()
        .map_err(|_| anyhow!("bad listen address '{listen}'"))?;
    let secret = manager_secret(dir, init)?;
    let manager = match replica {
        Some(replica) => {
            tessera_manager::daemon::start_replica(replica, dir, config, init, limits, &secret)
                .await?
        }
        None => {
            tessera_manager::daemon::start_limited(listen, dir, config, init, limits, &secret)
                .await?
        }
    };
    write_addr_file(addr_file, manager.addr)?;
    eprintln!("manager listening on {}", manager.addr);
    until_terminated().await;
    manager
        .shutdown()
        .await
        .context("cannot make metadata durable on shutdown")?;
    Ok(())
}

/// Where a server daemon listens and keeps its data.
pub struct ServerAt<'a> {
    /// Address to listen on.
    pub listen: &'a str,
    /// Data directory.
    pub dir: &'a Path,
    /// Write the bound address here once listening.
    pub addr_file: Option<PathBuf>,
    /// Serve Prometheus metrics here.
    pub metrics: Option<&'a str>,
}

pub async fn run_server(
    manager: &str,
    at: ServerAt<'_>,
    id: Option<u32>,
    limits: tessera_transport::TcpLimits,
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
    let net = network();
    let secret_path = credentials::secret_flag().ok_or_else(|| {
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
        transport: net.transport.unwrap_or_default(),
        datagram: datagram_config(net.window),
        tcp: limits,
        schedule,
    })
    .await?;
    let scrape = match metrics {
        Some(addr) => {
            let handle = server.metrics();
            Some(
                crate::metrics_http::serve(addr, move || {
                    let handle = handle.clone();
                    async move { handle.text().await }
                })
                .await?,
            )
        }
        None => None,
    };
    write_addr_file(addr_file, server.addr)?;
    eprintln!("server listening on {}", server.addr);
    // SIGTERM is heard from here on, also while the server waits to be registered (a
    // manager down at start must not make the daemon deaf to `down`); the resolver starts
    // once the server has an id.
    let resolver = async {
        let id = server.registered().await;
        resolve_torn_stripes(id, managers, credential).await
    };
    tokio::select! {
        () = resolver => {}
        () = until_terminated() => {}
    }
    if let Some(scrape) = scrape {
        scrape.abort();
    }
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
async fn resolve_torn_stripes(server: ServerId, managers: Vec<SocketAddr>, credential: Credential) {
    let mut client = None;
    loop {
        tokio::time::sleep(TORN_RESOLVE_EVERY).await;
        if client.is_none() {
            client = connect_replicas(managers.clone(), None, credential)
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
pub async fn key_create(cluster: Option<String>, name: &str) -> Result<()> {
    let client = connect_admin(cluster).await?;
    let (id, key) = client.key_create(name).await?;
    println!("{}", tessera_client::format_access_key(id, &key));
    Ok(())
}

/// `tessera key ls`: the live access keys.
pub async fn key_ls(cluster: Option<String>) -> Result<()> {
    let client = connect_admin(cluster).await?;
    for key in client.key_list().await? {
        println!("{}  {}", key.id, key.name);
    }
    Ok(())
}

/// `tessera key rm KEYID`: revoke an access key.
pub async fn key_rm(cluster: Option<String>, id: &str) -> Result<()> {
    let id: tessera_client::KeyId = id
        .parse()
        .map_err(|_| anyhow!("bad key id '{id}' (expected k followed by 16 hex digits)"))?;
    let client = connect_admin(cluster).await?;
    client.key_remove(id).await?;
    println!("revoked {id}");
    Ok(())
}
