//! `tessera bench --attacks`: what each resource attack costs a well-behaved client.
//!
//! Issue 15 asks that idle connections beyond the caps, stalled frames announcing almost 24 MiB
//! and floods of junk datagram session openings leave other clients working at 0.8x or more of
//! their throughput, with the daemons' memory bounded. This measures it on an embedded cluster
//! of its own (never the one `TESSERA_CLUSTER` names: attacking a user's cluster is not a
//! benchmark): each round times the client's work (a RAID-5 file written, synced and read back,
//! repeated for at least [`WORK_TIME_MIN`]) without an attack and under each attack in turn,
//! and reports the median ratio over the rounds, with the attacked daemon's resident memory
//! before and at most during the attack.
//!
//! The two runs of a pair are made comparable: the same data, the daemons quiet (their CPU
//! time not moving) before each run, so that what one run or attack set off does not fall on
//! the next, and the order of the pair alternating from round to round (attacked first in half
//! of them), so that a machine slowing down or warming up over the pair favours neither. The
//! machine's load average is reported with the ratios: on a shared machine it moves them more
//! than any attack.
//!
//! The attacker runs in this process, so it shares the machine's cores with the client and the
//! daemons, as an attacker on the same host would; the ratio includes that.

use crate::bench::{read_open, EmbeddedCluster};
use crate::config::Config;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use rand::RngCore;
use serde::Serialize;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_client::{Client, Credential, LayoutRequest, Scheme};
use tessera_datagram::packet::{Packet, PacketKind};
use tessera_wire::{FrameHeader, FrameKind, MESSAGE_BYTES_MAX, PAYLOAD_BYTES_MAX};
use tokio::io::AsyncWriteExt;

/// Servers of the embedded cluster.
const SERVERS: u32 = 5;
/// Idle connections opened to the manager and to one server (the lock-out was 2,000).
const IDLE_CONNECTIONS: usize = 2_000;
/// Authenticated connections that send all but the last byte of a largest frame, and those
/// that send only its header (the issue: 40 connections took a server to 1 GB).
const STALLED_BODIES: usize = 20;
const STALLED_HEADERS: usize = 200;
/// Junk session openings sent at once, then per second while the client works.
const JUNK_BURST: usize = 4_200;
const JUNK_PER_SECOND: usize = 20_000;
/// Source addresses of the junk (127.0.0.2 and up), so per-source limits do not stop it all.
const JUNK_SOURCES: u8 = 64;
/// Shortest time the client's work is repeated for in one measurement: single runs of a few
/// tens of milliseconds vary by more than the attacks cost.
const WORK_TIME_MIN: Duration = Duration::from_millis(600);
/// The daemons are quiet when, over [`QUIET_WINDOW`], they used at most this share of one core
/// together (their heartbeats and timers cost about nothing).
const QUIET_CPU_SHARE: f64 = 0.10;
const QUIET_WINDOW: Duration = Duration::from_millis(200);
/// Longest wait for the daemons to be quiet; past it the run starts all the same.
const QUIET_WAIT_MAX: Duration = Duration::from_secs(5);
/// Where the TCP attacks come from: another host than the client's 127.0.0.1, as an attacker
/// on the network would (per-peer caps are per address; on one address the attacker and the
/// client would be one peer).
const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// One attack, held while the client works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attack {
    IdleConnections,
    StalledFrames,
    JunkOpenings,
}

impl Attack {
    const ALL: [Attack; 3] = [
        Attack::IdleConnections,
        Attack::StalledFrames,
        Attack::JunkOpenings,
    ];

    fn describe(self) -> String {
        match self {
            Attack::IdleConnections => {
                format!("{IDLE_CONNECTIONS} idle TCP connections each to the manager and server 1")
            }
            Attack::StalledFrames => format!(
                "{STALLED_BODIES} stalled frames of almost 24 MiB and {STALLED_HEADERS} bare \
                 headers to server 1 (authenticated)"
            ),
            Attack::JunkOpenings => format!(
                "{JUNK_BURST} junk datagram session openings, then {JUNK_PER_SECOND}/s, to every \
                 server from {JUNK_SOURCES} addresses"
            ),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Attack::IdleConnections => "idle_connections",
            Attack::StalledFrames => "stalled_frames",
            Attack::JunkOpenings => "junk_openings",
        }
    }
}

/// What an attack holds open; dropping it ends the attack.
struct Held {
    streams: Vec<std::net::TcpStream>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    flooding: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some((flag, thread)) = self.flooding.take() {
            flag.store(false, Ordering::Relaxed);
            let _ = thread.join();
        }
        self.streams.clear();
    }
}

/// The cluster under attack: its addresses, the attacked daemons' pids and a client key.
struct Target {
    manager: SocketAddr,
    manager_pid: u32,
    servers: Vec<(SocketAddr, u32)>,
    key: Credential,
}

impl Target {
    /// Every daemon of the cluster.
    fn pids(&self) -> Vec<u32> {
        std::iter::once(self.manager_pid)
            .chain(self.servers.iter().map(|s| s.1))
            .collect()
    }
}

#[derive(Serialize)]
struct Row {
    attack: String,
    what: String,
    baseline_mb_s: f64,
    attacked_mb_s: f64,
    ratio: f64,
    /// Each round's attacked/alone ratio, in round order.
    ratios: Vec<f64>,
    rss_before_mib: u64,
    rss_max_mib: u64,
    /// Median time the daemons took to be quiet again after the attack began, ms.
    landing_ms: u64,
}

#[derive(Serialize)]
struct Report {
    rounds: usize,
    work_bytes: usize,
    /// The machine's one-minute load average at the start and at the end.
    load_average_start: f64,
    load_average_end: f64,
    attacks: Vec<Row>,
}

/// One attack's measurements over the rounds.
#[derive(Clone, Default)]
struct Samples {
    baseline: Vec<f64>,
    attacked: Vec<f64>,
    rss_before: u64,
    rss_max: u64,
    landing_ms: Vec<f64>,
}

/// Runs every attack against an embedded cluster and prints the table (and JSON).
pub async fn run(config: &Config, quick: bool, json: Option<PathBuf>) -> Result<()> {
    let embedded = EmbeddedCluster::start(config, SERVERS).await?;
    let cluster = &embedded.cluster;
    let key = crate::credentials::client(config, cluster.file.key.as_deref(), None)?;
    let target = Target {
        manager: cluster.manager_addr()?,
        manager_pid: cluster.file.manager_process.pid,
        servers: cluster
            .file
            .servers
            .iter()
            .map(|s| Ok((s.process.addr.parse()?, s.process.pid)))
            .collect::<Result<_>>()?,
        key: key.for_storage(),
    };
    let client = cluster.client(config).await?;
    let bytes = if quick { 16 << 20 } else { 64 << 20 };
    // Even, so that each order of a pair is run equally often.
    let rounds = if quick { 4 } else { 6 };
    let load_average_start = load_average();
    eprintln!(
        "bench --attacks: {SERVERS} servers over {} (embedded cluster), {rounds} rounds of a \
         {} MiB RAID-5 write+sync+read (repeated for {} ms at least) alone and under each \
         attack, load average {load_average_start:.2}",
        cluster.transport().name(),
        bytes >> 20,
        WORK_TIME_MIN.as_millis()
    );
    let mut data = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut data);
    let mut back = vec![0u8; bytes];
    work(&client, &data, &mut back).await?; // warms connections and caches
    let mut samples = vec![Samples::default(); Attack::ALL.len()];
    for round in 0..rounds {
        // Rotated each round, so what one attack leaves behind falls on each in turn.
        for k in 0..Attack::ALL.len() {
            let i = (k + round) % Attack::ALL.len();
            let attacked_first = round % 2 == 1;
            let pair = measure_pair(&target, Attack::ALL[i], attacked_first, &client, &data);
            let (baseline, attacked) = pair.await?;
            let slot = &mut samples[i];
            slot.baseline.push(baseline);
            slot.attacked.push(attacked.mb_s);
            slot.rss_before = match round {
                0 => attacked.rss_before,
                _ => slot.rss_before.min(attacked.rss_before),
            };
            slot.rss_max = slot.rss_max.max(attacked.rss_max);
            slot.landing_ms.push(attacked.landing.as_secs_f64() * 1e3);
        }
        eprintln!(
            "bench --attacks: round {} of {rounds} done (load average {:.2})",
            round + 1,
            load_average()
        );
    }
    let report = Report {
        rounds,
        work_bytes: bytes,
        load_average_start,
        load_average_end: load_average(),
        attacks: rows(samples),
    };
    print_report(&report);
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// The client's work under an attack, and what the attack did to the daemon it aims at.
struct AttackedRun {
    mb_s: f64,
    rss_before: u64,
    rss_max: u64,
    /// From the attack's start to the daemons' being quiet under it.
    landing: Duration,
}

/// One round of one attack: the client's work alone and under the attack, in the order given,
/// each after the daemons are quiet. Returns MB/s alone, and the attacked run.
async fn measure_pair(
    target: &Target,
    attack: Attack,
    attacked_first: bool,
    client: &Client,
    data: &[u8],
) -> Result<(f64, AttackedRun)> {
    let mut back = vec![0u8; data.len()];
    let mut baseline = None;
    if !attacked_first {
        baseline = Some(work_for(target, client, data, &mut back).await?);
    }
    quiet(&target.pids()).await;
    let pid = attacked_pid(target, attack);
    let rss_before = rss_bytes(pid);
    let started = Instant::now();
    let held = start(target, attack).await?;
    let watch = RssWatch::start(pid);
    // Under the attack held, not while the daemons are still taking its first burst in.
    quiet(&target.pids()).await;
    let landing = started.elapsed();
    let mb_s = work_for(target, client, data, &mut back)
        .await
        .with_context(|| format!("the client failed under {}", attack.describe()))?;
    let rss_max = watch.stop();
    drop(held);
    let baseline = match baseline {
        Some(baseline) => baseline,
        None => work_for(target, client, data, &mut back).await?,
    };
    let run = AttackedRun {
        mb_s,
        rss_before,
        rss_max,
        landing,
    };
    Ok((baseline, run))
}

/// The client's work repeated until [`WORK_TIME_MIN`] has passed; MB/s over all of it. One
/// run goes first unmeasured, then the daemons are let be quiet: the first run after a pause
/// is slow with or without an attack (after 15 s of nothing, 233-743 ms against 135-200 ms,
/// the datagram sessions' timers and the caches gone cold), and the attacked run always
/// follows one, the attacker's connecting (5-20 s).
async fn work_for(target: &Target, client: &Client, data: &[u8], back: &mut [u8]) -> Result<f64> {
    work(client, data, back).await?;
    quiet(&target.pids()).await;
    let started = Instant::now();
    let mut runs = 0u32;
    while runs == 0 || started.elapsed() < WORK_TIME_MIN {
        work(client, data, back).await?;
        runs += 1;
    }
    let bytes = 2.0 * data.len() as f64 * f64::from(runs);
    Ok(bytes / started.elapsed().as_secs_f64() / 1e6)
}

/// Waits until the daemons' CPU time stops moving (see [`QUIET_CPU_SHARE`]), at most
/// [`QUIET_WAIT_MAX`].
async fn quiet(pids: &[u32]) {
    let started = Instant::now();
    let ticks_per_second = clock_ticks_per_second();
    let mut before = cpu_ticks(pids);
    while started.elapsed() < QUIET_WAIT_MAX {
        tokio::time::sleep(QUIET_WINDOW).await;
        let now = cpu_ticks(pids);
        let used = now.saturating_sub(before) as f64 / ticks_per_second;
        if used <= QUIET_CPU_SHARE * QUIET_WINDOW.as_secs_f64() {
            return;
        }
        before = now;
    }
}

/// User and system CPU time of `pids` together, in clock ticks (`/proc/PID/stat`).
fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let user: u64 = fields.get(11)?.parse().ok()?;
            let system: u64 = fields.get(12)?.parse().ok()?;
            Some(user + system)
        })
        .sum()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// The machine's one-minute load average (0 if it cannot be read).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The client's work: write `data` to a new RAID-5 file, sync, read it back and compare.
/// Returns MB/s over both directions.
async fn work(client: &Client, data: &[u8], back: &mut [u8]) -> Result<f64> {
    let path = "bench-attacks/work";
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 64 << 10,
        width: None,
    };
    let started = Instant::now();
    let file = client.create_replacing(path, layout).await?;
    let mut open = client.open_id(&file).await?;
    client.upload_bytes(&mut open, 0, data).await?;
    client.sync_open(&mut open).await?;
    read_open(client, &open, back).await?;
    let seconds = started.elapsed().as_secs_f64();
    if back != data {
        bail!("the bytes read back differ from those written");
    }
    client.remove(path).await?;
    Ok(2.0 * data.len() as f64 / seconds / 1e6)
}

/// The daemon whose memory an attack aims at.
fn attacked_pid(target: &Target, attack: Attack) -> u32 {
    match attack {
        Attack::IdleConnections => target.manager_pid,
        Attack::StalledFrames | Attack::JunkOpenings => target.servers[0].1,
    }
}

async fn start(target: &Target, attack: Attack) -> Result<Held> {
    let mut held = Held {
        streams: Vec::new(),
        tasks: Vec::new(),
        flooding: None,
    };
    match attack {
        Attack::IdleConnections => {
            let (manager, server) = (target.manager, target.servers[0].0);
            held.streams = tokio::task::spawn_blocking(move || {
                let mut streams = idle_connections(manager, IDLE_CONNECTIONS);
                streams.extend(idle_connections(server, IDLE_CONNECTIONS));
                streams
            })
            .await?;
        }
        Attack::StalledFrames => held.tasks = stalled_frames(target.servers[0].0, target.key),
        Attack::JunkOpenings => {
            let servers: Vec<SocketAddr> = target.servers.iter().map(|s| s.0).collect();
            held.flooding = Some(junk_flood(servers)?);
        }
    }
    // Let the attack land before the client starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(held)
}

/// `count` TCP connections to `addr` from [`ATTACKER`] that never send anything (as many as
/// connect).
fn idle_connections(addr: SocketAddr, count: usize) -> Vec<std::net::TcpStream> {
    let connect = || -> std::io::Result<std::net::TcpStream> {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.bind(&SocketAddr::from((ATTACKER, 0)).into())?;
        socket.connect_timeout(&addr.into(), Duration::from_secs(1))?;
        Ok(socket.into())
    };
    (0..count).filter_map(|_| connect().ok()).collect()
}

/// Authenticated connections that announce the largest frame and stall: some after all but
/// one byte of its body, some after the header alone.
fn stalled_frames(server: SocketAddr, key: Credential) -> Vec<tokio::task::JoinHandle<()>> {
    let header = FrameHeader {
        kind: FrameKind::Request,
        message_len: MESSAGE_BYTES_MAX,
        payload_len: PAYLOAD_BYTES_MAX,
        request_id: 1,
    }
    .encode();
    let body_len = MESSAGE_BYTES_MAX as usize + PAYLOAD_BYTES_MAX as usize - 1;
    (0..STALLED_BODIES + STALLED_HEADERS)
        .map(|i| {
            tokio::spawn(async move {
                let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
                    return;
                };
                let bound = socket.bind(SocketAddr::from((ATTACKER, 0)));
                let Ok(mut stream) = (match bound {
                    Ok(()) => socket.connect(server).await,
                    Err(e) => Err(e),
                }) else {
                    return;
                };
                if tessera_transport::authenticate(&mut stream, server, &key)
                    .await
                    .is_err()
                    || stream.write_all(&header).await.is_err()
                {
                    return;
                }
                if i < STALLED_BODIES {
                    // Blocks while the server holds back (its budget spent), or fails once
                    // the server evicts the connection.
                    let _ = stream.write_all(&vec![0x5a; body_len]).await;
                }
                // Hold the connection until the attack ends (the task is aborted).
                std::future::pending::<()>().await;
            })
        })
        .collect()
}

/// A thread sending junk session openings to `servers`: a burst, then a steady flood.
fn junk_flood(servers: Vec<SocketAddr>) -> Result<(Arc<AtomicBool>, std::thread::JoinHandle<()>)> {
    let sockets: Vec<UdpSocket> = (2..2 + JUNK_SOURCES)
        .map(|host| UdpSocket::bind((Ipv4Addr::new(127, 0, 0, host), 0)))
        .collect::<std::io::Result<_>>()
        .context("cannot bind the junk sources 127.0.0.2 and up")?;
    let flag = Arc::new(AtomicBool::new(true));
    let flooding = flag.clone();
    let thread = std::thread::spawn(move || {
        let mut session = 0xbad0_0000_0000u64;
        let mut send = |count: usize| {
            for _ in 0..count {
                let socket = &sockets[session as usize % sockets.len()];
                let server = servers[(session / sockets.len() as u64) as usize % servers.len()];
                let _ = socket.send_to(&junk_opening(session), server);
                session += 1;
            }
        };
        send(JUNK_BURST);
        while flooding.load(Ordering::Relaxed) {
            send(JUNK_PER_SECOND / 100);
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    Ok((flag, thread))
}

/// A session-opening DATA packet of a message that never continues, with no valid MAC.
fn junk_opening(session: u64) -> Vec<u8> {
    Packet {
        kind: PacketKind::Data,
        first: true,
        last: false,
        probe: false,
        session,
        seq: 0,
        ack: 0,
        window: 256,
        timestamp: 0,
        echo: 0,
        message_len: 100_000,
        ack_delay: 0,
        queue: 0,
        payload: Bytes::from(vec![0x5a; 50]),
    }
    .encode()
}

/// Resident memory of process `pid` in bytes (0 if it cannot be read).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib << 10)
}

/// Samples a process's resident memory every 20 ms on a thread of its own.
struct RssWatch {
    running: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssWatch {
    fn start(pid: u32) -> RssWatch {
        let running = Arc::new(AtomicBool::new(true));
        let flag = running.clone();
        let thread = std::thread::spawn(move || {
            let mut max = rss_bytes(pid);
            while flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                max = max.max(rss_bytes(pid));
            }
            max
        });
        RssWatch { running, thread }
    }

    fn stop(self) -> u64 {
        self.running.store(false, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// The median (of an even count, the mean of the middle two).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

fn rows(samples: Vec<Samples>) -> Vec<Row> {
    Attack::ALL
        .into_iter()
        .zip(samples)
        .map(|(attack, mut samples)| {
            // The ratio of each round's pair, so a slow moment of the machine falls on both.
            let ratios: Vec<f64> = samples
                .attacked
                .iter()
                .zip(&samples.baseline)
                .map(|(a, b)| a / b)
                .collect();
            Row {
                attack: attack.name().into(),
                what: attack.describe(),
                baseline_mb_s: median(&mut samples.baseline),
                attacked_mb_s: median(&mut samples.attacked),
                ratio: median(&mut ratios.clone()),
                ratios,
                rss_before_mib: samples.rss_before >> 20,
                rss_max_mib: samples.rss_max >> 20,
                landing_ms: median(&mut samples.landing_ms) as u64,
            }
        })
        .collect()
}

fn print_report(report: &Report) {
    println!(
        "{:<17} {:>10} {:>10} {:>7} {:>24} {:>14} {:>8}",
        "attack", "alone MB/s", "attacked", "ratio", "ratios by round", "RSS MiB (max)", "landing"
    );
    for row in &report.attacks {
        let ratios: Vec<String> = row.ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "{:<17} {:>10.0} {:>10.0} {:>6.2}x {:>24} {:>6} ({:>5}) {:>6} ms",
            row.attack,
            row.baseline_mb_s,
            row.attacked_mb_s,
            row.ratio,
            ratios.join(" "),
            row.rss_before_mib,
            row.rss_max_mib,
            row.landing_ms
        );
    }
    println!(
        "load average {:.2} at the start, {:.2} at the end ({} rounds, alternating which run \
         of a pair comes first)",
        report.load_average_start, report.load_average_end, report.rounds
    );
    for row in &report.attacks {
        println!("  {}: {}", row.attack, row.what);
    }
}
