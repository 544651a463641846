//! `tessera bench`: throughput of every scheme on a cluster, side by side with a raw TCP
//! stream over loopback with the same socket buffers, so results are ratios from one run.

use crate::cluster::LocalCluster;
use crate::commands;
use crate::config::Config;
use crate::cpu_meter::{CpuMeter, CpuSnapshot};
use anyhow::{bail, Context, Result};
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;
use tessera_client::{Client, Credential, File, LayoutRequest, OpenFile, Scheme, TransportKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Socket buffers for the yardstick: the same as Tessera's TCP transport uses.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;
const STRIPE_UNIT: u32 = 64 << 10;

/// A local cluster in a temporary directory, stopped when dropped.
pub struct EmbeddedCluster {
    pub cluster: LocalCluster,
    _dir: tempfile::TempDir,
}

impl EmbeddedCluster {
    pub async fn start(config: &Config, servers: u32) -> Result<EmbeddedCluster> {
        let dir = tempfile::Builder::new()
            .prefix("tessera-")
            .tempdir()
            .context("cannot make a temporary directory")?;
        let cluster = LocalCluster::up(dir.path(), servers, 1, false, config).await?;
        Ok(EmbeddedCluster { cluster, _dir: dir })
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        self.cluster.down();
    }
}

#[derive(Serialize)]
struct Row {
    transport: String,
    scheme: String,
    workload: String,
    mb_s: f64,
    /// CPU seconds per GiB moved, median over the rounds: this process (the client) and,
    /// on an embedded cluster, its daemons.
    cpu_s_per_gib: f64,
    overhead: f64,
}

#[derive(Serialize)]
struct Yardstick {
    tcp_stream_mb_s: f64,
}

#[derive(Serialize)]
struct Report {
    yardstick: Yardstick,
    /// Whose CPU `cpu_s_per_gib` counts.
    cpu_counted: &'static str,
    results: Vec<Row>,
}

fn mb_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds.max(1e-9)
}

/// Write `data` at 0 of `file` with the client's transfer API and make it durable (its
/// size told to the manager once, then synced).
pub async fn write_all(client: &Client, file: &File, data: &[u8]) -> Result<()> {
    let mut open = client.open_id(file).await?;
    client.upload_bytes(&mut open, 0, data).await?;
    client.sync_open(&mut open).await?;
    Ok(())
}

/// Read `len` bytes from 0 with the client's transfer API.
pub async fn read_all(client: &Client, file: &File, len: u64) -> Result<Vec<u8>> {
    let mut out = vec![0u8; len as usize];
    let open = client.open_id(file).await?;
    read_open(client, &open, &mut out).await?;
    Ok(out)
}

/// Fill `out` from offset 0 of an open file straight from the servers.
pub async fn read_open(client: &Client, open: &OpenFile, out: &mut [u8]) -> Result<()> {
    let got = client.download_into(open, 0, out).await?;
    if got != out.len() {
        bail!(
            "short read of {}: {got} of {} bytes",
            open.file().path,
            out.len()
        );
    }
    Ok(())
}

/// One raw TCP stream over loopback: bytes per second from first write to last byte read.
async fn tcp_stream_mb_s(bytes: u64) -> Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let sink = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let sock = socket2::SockRef::from(&stream);
        sock.set_recv_buffer_size(SOCKET_BUFFER_BYTES)?;
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0u64;
        while got < bytes {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        stream.write_all(b"k").await?;
        Ok::<u64, std::io::Error>(got)
    });
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    socket2::SockRef::from(&stream).set_send_buffer_size(SOCKET_BUFFER_BYTES)?;
    let block = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        let n = block.len().min((bytes - sent) as usize);
        stream.write_all(&block[..n]).await?;
        sent += n as u64;
    }
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).await?;
    let seconds = start.elapsed().as_secs_f64();
    let got = sink.await??;
    if got != bytes {
        bail!("yardstick stream lost bytes: {got} of {bytes}");
    }
    Ok(mb_s(bytes, seconds))
}

/// The client credential of a cluster found, once a client with it reaches the manager.
/// The client credential of a cluster found, once a client with it reaches the manager.
async fn connect_target(config: &Config, target: &commands::Target) -> Result<Credential> {
    let credential = target.client_credential(config)?;
    commands::connect_replicas(config, target.replicas(), target.transport, credential).await?;
    Ok(credential)
}

pub async fn run(config: &Config, quick: bool, json: Option<PathBuf>) -> Result<()> {
    // Use the cluster named (or the default one) if it answers, else an embedded one.
    let mut embedded = None;
    let named = config.cluster.is_some();
    let found = match commands::resolve(config.cluster.clone()) {
        Ok(target) => match connect_target(config, &target).await {
            Ok(credential) => Some((
                target.replicas(),
                target.transport.unwrap_or_default(),
                credential,
            )),
            Err(e) if named => return Err(e),
            Err(_) => None,
        },
        Err(e) if named => return Err(e),
        Err(_) => None,
    };
    let (managers, cluster_transport, credential) = match found {
        Some(found) => found,
        None => {
            let e = EmbeddedCluster::start(config, 5).await?;
            let c = &e.cluster;
            let (key, secret) = (c.file.key.as_deref(), c.secret_path());
            let credential = crate::credentials::client(config, key, secret.as_deref())?;
            let found = (c.manager_addrs()?, c.transport(), credential);
            embedded = Some(e);
            found
        }
    };
    // The client's CPU, and the daemons' where they are ours to see.
    let daemons = embedded.as_ref().map(|e| e.cluster.daemon_pids());
    let cpu_counted = match daemons {
        Some(_) => "this process (the client) and the embedded cluster's daemons",
        None => "this process (the client) only: the named cluster's daemons are not counted",
    };
    let meter = CpuMeter::new(vec![vec![std::process::id()], daemons.unwrap_or_default()]);
    // Servers of a datagram cluster also serve TCP: measure both, side by side, unless one
    // was asked for.
    let transports: Vec<TransportKind> = match (config.transport, cluster_transport) {
        (Some(t), _) => vec![t],
        (None, TransportKind::Udp) => vec![TransportKind::Udp, TransportKind::Tcp],
        (None, TransportKind::Tcp) => vec![TransportKind::Tcp],
    };
    let mut clients = Vec::new();
    for &t in &transports {
        let config = config.over(t);
        let client = commands::connect_replicas(&config, managers.clone(), Some(t), credential);
        clients.push((t, client.await?));
    }
    let servers = clients[0].1.status().await?.len();
    let size: u64 = if quick { 64 << 20 } else { 256 << 20 };
    let small_writes: u64 = if quick { 200 } else { 1000 };
    let rounds = if quick { 3 } else { 5 };
    let names: Vec<&str> = transports.iter().map(|t| t.name()).collect();
    eprintln!(
        "bench: {servers} servers, {rounds} rounds of {} MiB sequential and {small_writes} small writes of {} KiB per scheme, over {}{}",
        size >> 20,
        STRIPE_UNIT >> 10,
        names.join(" and "),
        if embedded.is_some() { " (embedded cluster)" } else { "" }
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7e55e2a);
    let mut data = vec![0u8; size as usize];
    rng.fill_bytes(&mut data);

    // Rounds interleave every scheme, transport and the yardstick, so that noise from the
    // machine falls on all of them alike; each figure is the median over the rounds.
    let mut yardsticks = Vec::new();
    let mut samples: Vec<Samples> = Vec::new();
    for &transport in &transports {
        for scheme in Scheme::ALL {
            for workload in ["seq_write", "seq_read", "small_write"] {
                samples.push(Samples {
                    transport,
                    scheme,
                    workload,
                    mb_s: Vec::new(),
                    cpu_s_per_gib: Vec::new(),
                    overhead: 0.0,
                });
            }
        }
    }
    // Like the yardstick's receive buffer, the read buffer is reused (and already faulted in),
    // so the figures compare moving bytes, not allocating memory.
    let mut back = vec![0u8; size as usize];
    for round in 0..rounds {
        yardsticks.push(tcp_stream_mb_s(size).await?);
        // Rotate the order each round: whatever the previous measurement leaves behind (dirty
        // pages being written back, a deleted file being freed) falls on every scheme in turn.
        for i in 0..Scheme::ALL.len() {
            let scheme = Scheme::ALL[(i + round) % Scheme::ALL.len()];
            for (t, client) in &clients {
                back.fill(0);
                let buffers = (&data[..], &mut back[..]);
                let m =
                    measure_scheme(client, scheme, buffers, small_writes, &mut rng, &meter).await?;
                for m in m {
                    let slot = samples
                        .iter_mut()
                        .find(|s| {
                            s.transport == *t && s.scheme == scheme && s.workload == m.workload
                        })
                        .expect("slot");
                    slot.mb_s.push(m.mb_s);
                    slot.cpu_s_per_gib.push(m.cpu_s_per_gib);
                    slot.overhead = m.overhead;
                }
            }
        }
        eprintln!("bench: round {} of {rounds} done", round + 1);
    }
    let yardstick = median(&mut yardsticks);
    let rows: Vec<Row> = samples
        .into_iter()
        .map(|mut s| Row {
            transport: s.transport.name().into(),
            scheme: s.scheme.name().into(),
            workload: s.workload.into(),
            mb_s: median(&mut s.mb_s),
            cpu_s_per_gib: median(&mut s.cpu_s_per_gib),
            overhead: s.overhead,
        })
        .collect();
    print_table(yardstick, &rows, &transports);
    println!("CPU-s per GiB counts {cpu_counted}");
    if let Some(path) = json {
        let report = Report {
            yardstick: Yardstick {
                tcp_stream_mb_s: yardstick,
            },
            cpu_counted,
            results: rows,
        };
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    drop(clients);
    drop(embedded);
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// What one round measured of one workload of one scheme.
struct Measured {
    workload: &'static str,
    mb_s: f64,
    cpu_s_per_gib: f64,
    /// Bytes stored per byte of the file after it.
    overhead: f64,
}

/// The rounds' samples of one transport, scheme and workload.
struct Samples {
    transport: TransportKind,
    scheme: Scheme,
    workload: &'static str,
    mb_s: Vec<f64>,
    cpu_s_per_gib: Vec<f64>,
    overhead: f64,
}

/// CPU seconds per GiB of `bytes` that every process `meter` counts spent since `before`.
fn cpu_per_gib(meter: &CpuMeter, before: &CpuSnapshot, bytes: u64) -> Result<f64> {
    Ok(meter.per_gib_since(before, bytes)?.iter().sum())
}

/// One round of one scheme: its sequential write, sequential read and small writes.
async fn measure_scheme(
    client: &Client,
    scheme: Scheme,
    (data, back): (&[u8], &mut [u8]),
    small_writes: u64,
    rng: &mut rand::rngs::StdRng,
    meter: &CpuMeter,
) -> Result<Vec<Measured>> {
    let size = data.len() as u64;
    let path = format!("bench/{}", scheme.name());
    // Written as `put` writes a new file: pending, then committed (so its full-stripe writes
    // take no stale-parity record: a pending file is discarded whole if its writer dies).
    let layout = LayoutRequest {
        scheme,
        stripe_unit: STRIPE_UNIT,
        width: None,
    };
    let (_, mut open) = client.create_pending_open(&path, layout).await?;
    let (cpu, start) = (meter.snapshot()?, Instant::now());
    client.upload_bytes(&mut open, 0, data).await?;
    let write_s = start.elapsed().as_secs_f64();
    let write_cpu = cpu_per_gib(meter, &cpu, size)?;
    client.commit_upload(&open).await?;
    let file = open.file().clone();
    let overhead = client.stat(&path).await?.stored_bytes as f64 / size as f64;
    let (cpu, start) = (meter.snapshot()?, Instant::now());
    read_open(client, &open, back).await?;
    let read_s = start.elapsed().as_secs_f64();
    let read_cpu = cpu_per_gib(meter, &cpu, size)?;
    if back != data {
        bail!("{scheme}: bytes read back differ from bytes written");
    }
    let unit = STRIPE_UNIT as u64;
    let units = size / unit;
    let payload = vec![0xa5u8; unit as usize];
    let (cpu, start) = (meter.snapshot()?, Instant::now());
    for _ in 0..small_writes {
        let at = rng.gen_range(0..units) * unit;
        client.write_at(&file, at, &payload).await?;
    }
    let small_s = start.elapsed().as_secs_f64();
    let small_cpu = cpu_per_gib(meter, &cpu, small_writes * unit)?;
    let small_overhead = client.stat(&path).await?.stored_bytes as f64 / size as f64;
    client.remove(&path).await?;
    let measured = |workload, mb_s, cpu_s_per_gib, overhead| Measured {
        workload,
        mb_s,
        cpu_s_per_gib,
        overhead,
    };
    Ok(vec![
        measured("seq_write", mb_s(size, write_s), write_cpu, overhead),
        measured("seq_read", mb_s(size, read_s), read_cpu, overhead),
        measured(
            "small_write",
            mb_s(small_writes * unit, small_s),
            small_cpu,
            small_overhead,
        ),
    ])
}

fn print_table(yardstick: f64, rows: &[Row], transports: &[TransportKind]) {
    println!("raw TCP stream over loopback: {yardstick:.0} MB/s");
    println!(
        "{:<9} {:<7} {:<12} {:>10} {:>9} {:>9} {:>10}",
        "transport", "scheme", "workload", "MB/s", "x TCP", "overhead", "CPU-s/GiB"
    );
    for r in rows {
        println!(
            "{:<9} {:<7} {:<12} {:>10.1} {:>9.3} {:>9.2} {:>10.2}",
            r.transport,
            r.scheme,
            r.workload,
            r.mb_s,
            r.mb_s / yardstick,
            r.overhead,
            r.cpu_s_per_gib
        );
    }
    for &t in transports {
        let get = |s: &str, w: &str| {
            rows.iter()
                .find(|r| r.transport == t.name() && r.scheme == s && r.workload == w)
                .map(|r| r.mb_s)
                .unwrap_or(0.0)
        };
        println!("ratios over {}:", t.name());
        let lines = [
            (
                "raid0 seq read / TCP stream",
                get("raid0", "seq_read") / yardstick,
                ">= 0.6",
            ),
            (
                "raid0 seq write / TCP stream",
                get("raid0", "seq_write") / yardstick,
                ">= 0.5",
            ),
            (
                "raid5 seq write / raid1",
                get("raid5", "seq_write") / get("raid1", "seq_write"),
                ">= 1.2",
            ),
            (
                "hybrid seq write / raid1",
                get("hybrid", "seq_write") / get("raid1", "seq_write"),
                ">= 1.2",
            ),
            (
                "hybrid small / raid5 small",
                get("hybrid", "small_write") / get("raid5", "small_write"),
                ">= 1.3",
            ),
            (
                "hybrid small / raid1 small",
                get("hybrid", "small_write") / get("raid1", "small_write"),
                ">= 0.9",
            ),
            (
                "hybrid full-stripe / raid5",
                get("hybrid", "seq_write") / get("raid5", "seq_write"),
                ">= 0.9",
            ),
        ];
        for (what, ratio, target) in lines {
            println!("  {what:<30} {ratio:>5.2} (target {target})");
        }
    }
    if transports.len() == 2 {
        println!("udp / tcp, same scheme and workload: throughput (target >= 0.95), CPU per byte (target <= 1.1):");
        for r in rows.iter().filter(|r| r.transport == "udp") {
            if let Some(tcp) = rows
                .iter()
                .find(|o| o.transport == "tcp" && o.scheme == r.scheme && o.workload == r.workload)
            {
                println!(
                    "  {:<7} {:<12} {:>5.2} {:>5.2}",
                    r.scheme,
                    r.workload,
                    r.mb_s / tcp.mb_s,
                    r.cpu_s_per_gib / tcp.cpu_s_per_gib
                );
            }
        }
    }
}
