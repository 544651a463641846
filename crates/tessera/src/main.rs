//! The `tessera` command: the daemons, the embedded local cluster, the client commands, the
//! demo and the benchmark. This is the edge where errors become one clear line for the user.

mod attacks;
mod bench;
mod bench_minio;
mod bench_mount;
mod cluster;
mod commands;
mod config;
mod cpu_meter;
mod credentials;
mod demo;
mod lab;
mod metrics_http;
mod mount;
mod recover;
mod reserve;
mod s3;
mod s3_client;
mod snapshot;
mod top;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Large transfer buffers are allocated and freed constantly; glibc's allocator returns them
/// to the kernel each time, and the page faults to get them back cost more than the copying.
/// mimalloc keeps them. Built without transparent huge pages (the `no_thp` feature): with
/// them, a page it purged and then reused faulted in as a 2 MiB huge page to zero, which was
/// a third of all CPU time with 64 mostly idle servers on one host.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Striped, redundant storage for large files"
)]
struct Cli {
    /// The cluster: a manager address, or a cluster.toml file [default: ./tessera-data/cluster.toml]
    #[arg(long, global = true, env = "TESSERA_CLUSTER")]
    cluster: Option<String>,
    /// Transport between clients and servers: udp (Tessera's datagram transport) or tcp
    /// [default: the local cluster's, else udp]
    #[arg(long, global = true, env = "TESSERA_TRANSPORT")]
    transport: Option<String>,
    /// Datagram transport: fix the window at N datagrams in flight per session (1 is
    /// stop-and-wait) instead of adapting it
    #[arg(long, global = true, env = "TESSERA_WINDOW")]
    window: Option<u32>,
    /// Datagram transport, client side: packets of answers granted and not yet arrived,
    /// across all servers (about the switch buffer in front of the client plus one
    /// bandwidth-delay product); 0 turns receiver-driven grants off [default: 20]
    #[arg(long, global = true, env = "TESSERA_RECEIVE_BUDGET")]
    receive_budget: Option<u32>,
    /// Datagram transport: the largest datagram sent to any peer, in bytes (1200 to 65507),
    /// below what the path carries; `up` and `bench` give it to their servers too. 1472 on
    /// loopback measures an Ethernet LAN's per-packet costs on one host [default: the
    /// path's MTU]
    #[arg(long, global = true, env = "TESSERA_DATAGRAM_BYTES")]
    datagram_bytes: Option<usize>,
    /// Client access key, KEYID:SECRET (from `tessera key create`) [default: the local
    /// cluster's]
    #[arg(long, global = true, env = "TESSERA_KEY", hide_env_values = true)]
    key: Option<String>,
    /// The cluster secret file: daemons authenticate with it, and client commands given it
    /// act as the admin [default: the local cluster's, for admin commands]
    #[arg(long, global = true, env = "TESSERA_SECRET")]
    secret: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start an embedded local cluster: a manager and N servers on 127.0.0.1.
    Up {
        /// Number of storage servers.
        #[arg(long, default_value_t = 5)]
        servers: u32,
        /// Number of manager replicas (3 or 5 survive the loss of 1 or 2; 1: one manager).
        #[arg(long, default_value_t = 1)]
        managers: u16,
        /// Data directory [default: the directory of the cluster file --cluster names, else
        /// tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Return once all servers are up, leaving the cluster running in the background.
        #[arg(long)]
        detach: bool,
        /// Also start the S3 gateway on this address (e.g. 127.0.0.1:9000; port 0: any free
        /// one); its endpoint and keys are printed and written into DIR/cluster.toml.
        #[arg(long, value_name = "ADDR")]
        s3: Option<String>,
        /// Every daemon serves Prometheus metrics, each on a free port of 127.0.0.1 (kept
        /// across restarts); the addresses are printed and written into DIR/cluster.toml.
        #[arg(long)]
        metrics: bool,
    },
    /// Stop the local cluster in DIR.
    Down {
        /// Data directory [default: the directory of the cluster file --cluster names, else
        /// tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run the metadata manager daemon, or rebuild its lost store from the servers.
    Manager(ManagerArgs),
    /// Take, list and remove copy-on-write snapshots of files.
    Snapshot {
        #[command(subcommand)]
        action: snapshot::SnapshotAction,
    },
    /// Issue, list and revoke client access keys (needs the cluster secret).
    Key {
        #[command(subcommand)]
        action: KeyAction,
    },
    /// Run a storage server daemon, or stop/start one server of the local cluster.
    Server(ServerArgs),
    /// Store a local file (`-` for stdin).
    Put {
        local: String,
        remote: String,
        /// raid0, raid1, raid4, raid5 or hybrid.
        #[arg(long, default_value = "hybrid")]
        scheme: String,
        /// Stripe unit size, e.g. 64K.
        #[arg(long, default_value = "64K")]
        stripe_unit: String,
        /// Number of servers to stripe over [default: all up].
        #[arg(long)]
        width: Option<u32>,
        #[command(flatten)]
        reserve: reserve::ReserveArgs,
    },
    /// Fetch a stored file (`-` for stdout).
    Get {
        remote: String,
        local: String,
        /// The file as snapshot NAME holds it.
        #[arg(long, value_name = "NAME")]
        snapshot: Option<String>,
        #[command(flatten)]
        reserve: reserve::ReserveArgs,
    },
    /// Write a local file's bytes into a stored file at OFFSET (overwrite or extend).
    Write {
        remote: String,
        offset: u64,
        local: String,
        #[command(flatten)]
        reserve: reserve::ReserveArgs,
    },
    /// Read LENGTH bytes at OFFSET of a stored file into LOCAL (`-` for stdout).
    Read {
        remote: String,
        offset: u64,
        length: u64,
        local: String,
        /// The file as snapshot NAME holds it.
        #[arg(long, value_name = "NAME")]
        snapshot: Option<String>,
        #[command(flatten)]
        reserve: reserve::ReserveArgs,
    },
    /// List stored files.
    Ls {
        prefix: Option<String>,
        /// One JSON array of {path, id, size, scheme, stripe_unit, width}.
        #[arg(long)]
        json: bool,
    },
    /// Remove a stored file.
    Rm { remote: String },
    /// Cut or extend a stored file to SIZE bytes (e.g. 0, 1M); bytes past a smaller size read
    /// as zeros if it grows again. What is cut is discarded at the servers, not overwritten.
    Truncate { remote: String, size: String },
    /// Show a file's layout, size and stored bytes.
    Stat {
        remote: String,
        #[arg(long)]
        json: bool,
    },
    /// Show the cluster's servers.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// A live view of the cluster: each server's state, request and byte rates,
    /// retransmissions, and what it owes.
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many refreshes (printed one after another, not redrawn).
        #[arg(long)]
        count: Option<u64>,
    },
    /// Rebuild everything server ID owes (missed regions, or all of it after a wipe).
    Rebuild { id: u32 },
    /// Check checksums and parity or mirrors of one file or all; repair what can be.
    Scrub { remote: Option<String> },
    /// Measure throughput of every scheme against a raw TCP stream.
    Bench {
        /// A shorter run.
        #[arg(long)]
        quick: bool,
        /// Write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Instead: a client's throughput alone and under each resource attack (idle
        /// connections, stalled huge frames, junk datagram openings), always on an embedded
        /// cluster of its own (it attacks what it measures).
        #[arg(long, conflicts_with = "mount")]
        attacks: bool,
        /// Instead: sequential throughput through a FUSE mount against the client library's,
        /// side by side, on an embedded cluster of its own (needs /dev/fuse and fusermount3).
        #[arg(long)]
        mount: bool,
        /// Instead: Tessera (RAID-5 over 5 servers, by the client library and by its S3
        /// gateway) against MinIO (EC:1 over 5 drives) side by side, each on temporary
        /// directories of its own; give the path of a MinIO server binary.
        #[arg(long, value_name = "MINIO", conflicts_with_all = ["mount", "attacks"])]
        against_minio: Option<PathBuf>,
        /// With --against-minio: the size of each object, e.g. 1G [default: 256M, 64M with
        /// --quick].
        #[arg(long, requires = "against_minio", value_parser = commands::parse_bytes)]
        object_size: Option<u64>,
    },
    /// Serve the cluster over S3 (buckets are top-level directories, objects files).
    S3 {
        /// Address to listen on, e.g. 127.0.0.1:9000.
        #[arg(long)]
        listen: String,
        /// Access key requests must be signed with [default: generated and printed].
        #[arg(long, env = "TESSERA_S3_ACCESS_KEY")]
        access_key: Option<String>,
        /// Its secret key.
        #[arg(long, env = "TESSERA_S3_SECRET_KEY", hide_env_values = true)]
        secret_key: Option<String>,
        /// Default scheme of new buckets: raid0, raid1, raid4, raid5 or hybrid.
        #[arg(long, default_value = "hybrid")]
        scheme: String,
        /// Default stripe unit of new buckets, e.g. 64K.
        #[arg(long, default_value = "64K")]
        stripe_unit: String,
        /// Default width of new buckets [default: all servers up at each put].
        #[arg(long)]
        width: Option<u32>,
        /// Write the bound address to this file once listening.
        #[arg(long)]
        addr_file: Option<PathBuf>,
        /// Serve Prometheus metrics on this address (GET /metrics).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Close a connection that sends no whole request head for this long (also while
        /// idle between requests), and fail a body that sends nothing for this long.
        #[arg(long, default_value = "20s")]
        idle_timeout: String,
    },
    /// Mount the cluster as a file system (FUSE) at MOUNTPOINT, an empty directory.
    Mount {
        mountpoint: PathBuf,
        /// Serve the mount from this process until it is unmounted (default: a detached one).
        #[arg(long)]
        foreground: bool,
        /// Scheme of files created through the mount: raid0, raid1, raid4, raid5 or hybrid.
        #[arg(long, default_value = "hybrid")]
        scheme: String,
        /// Their stripe unit, e.g. 64K.
        #[arg(long, default_value = "64K")]
        stripe_unit: String,
        /// Their width [default: all servers up].
        #[arg(long)]
        width: Option<u32>,
    },
    /// Unmount a `tessera mount`.
    Umount { mountpoint: PathBuf },
    /// Tessera's main job on an embedded cluster: store, lose a server, read degraded, rebuild.
    Demo,
    /// Build a test network of namespaces and run experiments on it (needs root).
    Lab(lab::LabArgs),
    /// The lab's measurement client (run by `tessera lab` inside a namespace).
    #[command(hide = true)]
    LabClient(lab::LabClientArgs),
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ServerArgs {
    #[command(subcommand)]
    action: Option<ServerAction>,
    /// The manager's address.
    #[arg(long)]
    manager: Option<String>,
    /// Address to listen on.
    #[arg(long)]
    listen: Option<String>,
    /// Data directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Server id to claim if the store has none.
    #[arg(long)]
    id: Option<u32>,
    /// Write the bound address to this file once listening.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (GET /metrics).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Most rebuild and scrub traffic this server serves, e.g. 50MB/s [default: no cap]
    #[arg(long, env = "TESSERA_REBUILD_RATE", value_name = "RATE")]
    rebuild_rate: Option<String>,
    /// Disk requests served at once; the rest wait, reserved streams' earliest deadline first
    /// [default: 8]
    #[arg(long, env = "TESSERA_DISK_SLOTS")]
    disk_slots: Option<u32>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    datagram_limits: DatagramLimitArgs,
}

/// How a server orders its disk work, from its flags.
fn server_schedule(
    rebuild_rate: Option<&str>,
    disk_slots: Option<u32>,
) -> anyhow::Result<tessera_server::ScheduleConfig> {
    let mut schedule = tessera_server::ScheduleConfig::default();
    if let Some(rate) = rebuild_rate {
        let rate = tessera_client::stream::parse_rate(rate)
            .map_err(|e| anyhow::anyhow!("bad --rebuild-rate: {e}"))?;
        schedule.rebuild_bytes_per_s = Some(rate);
    }
    match disk_slots {
        Some(0) => anyhow::bail!("--disk-slots must be at least 1"),
        Some(slots) => schedule.disk_slots = slots,
        None => {}
    }
    Ok(schedule)
}

/// What a daemon lets its TCP peers hold (see the README's "Wire and transport").
#[derive(Args, Clone, Default)]
struct LimitArgs {
    /// TCP connections open at once; a newcomer evicts the idle one silent longest
    /// [default: 1024]
    #[arg(long, env = "TESSERA_CONNECTIONS_MAX")]
    connections_max: Option<usize>,
    /// TCP connections open at once from one IP address [default: 256]
    #[arg(long, env = "TESSERA_CONNECTIONS_PER_PEER_MAX")]
    connections_per_peer_max: Option<usize>,
    /// Seconds a TCP connection with nothing in progress may stay silent [default: 300]
    #[arg(long, env = "TESSERA_IDLE_TIMEOUT")]
    idle_timeout: Option<f64>,
    /// Bytes buffered for requests received and not yet answered, e.g. 256M [default: 256M]
    #[arg(long, env = "TESSERA_FRAME_BUDGET")]
    frame_budget: Option<String>,
}

impl LimitArgs {
    fn tcp_limits(&self) -> anyhow::Result<tessera_transport::TcpLimits> {
        let mut limits = tessera_transport::TcpLimits::default();
        if let Some(n) = self.connections_max {
            limits.connections_max = n;
        }
        if let Some(n) = self.connections_per_peer_max {
            limits.connections_per_peer_max = n;
        }
        if let Some(seconds) = self.idle_timeout {
            limits.idle_timeout = std::time::Duration::try_from_secs_f64(seconds)
                .map_err(|_| anyhow::anyhow!("bad --idle-timeout {seconds}"))?;
        }
        if let Some(size) = &self.frame_budget {
            limits.frame_bytes_budget = usize::try_from(commands::parse_bytes(size)?)?;
        }
        limits
            .validate()
            .map_err(|e| anyhow::anyhow!("bad connection limits: {e}"))?;
        Ok(limits)
    }
}

/// What a server's datagram endpoint lets its peers hold (see the README's "Wire and
/// transport"; `tessera_datagram::MemoryConfig`).
#[derive(Args, Clone, Default)]
struct DatagramLimitArgs {
    /// Bytes of datagram messages being reassembled or not yet handled, in all, e.g. 544M
    /// [default: 544M]
    #[arg(long, env = "TESSERA_DATAGRAM_MEMORY", value_name = "SIZE")]
    datagram_memory: Option<String>,
    /// The same, from one IP address; at least the largest message, 17M [default: 272M]
    #[arg(long, env = "TESSERA_DATAGRAM_MEMORY_PER_SOURCE", value_name = "SIZE")]
    datagram_memory_per_source: Option<String>,
    /// Bytes of datagrams held past a gap (a loss or a reordering), in all [default: 64M]
    #[arg(long, env = "TESSERA_DATAGRAM_OUT_OF_ORDER", value_name = "SIZE")]
    datagram_out_of_order: Option<String>,
    /// The same, from one IP address; at least one datagram, 65K [default: 16M]
    #[arg(
        long,
        env = "TESSERA_DATAGRAM_OUT_OF_ORDER_PER_SOURCE",
        value_name = "SIZE"
    )]
    datagram_out_of_order_per_source: Option<String>,
    /// Bytes of datagram answers queued and not yet acknowledged, in all; at least the
    /// largest message, 17M [default: 1G]
    #[arg(long, env = "TESSERA_DATAGRAM_SEND_QUEUE", value_name = "SIZE")]
    datagram_send_queue: Option<String>,
    /// Datagram sessions peers may hold open at once [default: 4096]
    #[arg(long, env = "TESSERA_DATAGRAM_SESSIONS_MAX", value_name = "N")]
    datagram_sessions_max: Option<usize>,
    /// The same, from one IP address [default: 1024]
    #[arg(
        long,
        env = "TESSERA_DATAGRAM_SESSIONS_PER_SOURCE_MAX",
        value_name = "N"
    )]
    datagram_sessions_per_source_max: Option<usize>,
}

impl DatagramLimitArgs {
    /// `config` with these limits, or one line saying which flag is wrong.
    fn apply(
        &self,
        mut config: tessera_transport::DatagramConfig,
    ) -> anyhow::Result<tessera_transport::DatagramConfig> {
        let size = |flag: &str, value: &Option<String>, into: &mut usize| -> anyhow::Result<()> {
            if let Some(text) = value {
                let bytes =
                    commands::parse_bytes(text).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))?;
                *into = usize::try_from(bytes)?;
            }
            Ok(())
        };
        let memory = &mut config.memory;
        size(
            "datagram-memory",
            &self.datagram_memory,
            &mut memory.reassembly_bytes_max,
        )?;
        size(
            "datagram-memory-per-source",
            &self.datagram_memory_per_source,
            &mut memory.reassembly_bytes_per_source_max,
        )?;
        size(
            "datagram-out-of-order",
            &self.datagram_out_of_order,
            &mut memory.out_of_order_bytes_max,
        )?;
        size(
            "datagram-out-of-order-per-source",
            &self.datagram_out_of_order_per_source,
            &mut memory.out_of_order_bytes_per_source_max,
        )?;
        size(
            "datagram-send-queue",
            &self.datagram_send_queue,
            &mut memory.send_queue_bytes_max,
        )?;
        if let Some(n) = self.datagram_sessions_max {
            config.sessions_max = n;
        }
        if let Some(n) = self.datagram_sessions_per_source_max {
            config.sessions_per_source_max = n;
        }
        datagram_limits_check(&config)?;
        Ok(config)
    }
}

/// Says which datagram limit flag admits nothing, in one line.
fn datagram_limits_check(config: &tessera_transport::DatagramConfig) -> anyhow::Result<()> {
    let memory = &config.memory;
    let message = config.message_bytes_max;
    let datagram =
        tessera_datagram::packet::DATAGRAM_LEN_MAX + tessera_datagram::HELD_PACKET_OVERHEAD_BYTES;
    let checks = [
        (
            memory.reassembly_bytes_per_source_max >= message,
            format!("--datagram-memory-per-source must hold the largest message, {message} bytes"),
        ),
        (
            memory.reassembly_bytes_max >= memory.reassembly_bytes_per_source_max,
            "--datagram-memory must be at least --datagram-memory-per-source".to_string(),
        ),
        (
            memory.out_of_order_bytes_per_source_max >= datagram,
            format!("--datagram-out-of-order-per-source must hold a datagram, {datagram} bytes"),
        ),
        (
            memory.out_of_order_bytes_max >= memory.out_of_order_bytes_per_source_max,
            "--datagram-out-of-order must be at least --datagram-out-of-order-per-source"
                .to_string(),
        ),
        (
            memory.send_queue_bytes_max >= message,
            format!("--datagram-send-queue must hold the largest message, {message} bytes"),
        ),
        (
            config.sessions_max >= 1,
            "--datagram-sessions-max must be at least 1".to_string(),
        ),
        (
            config.sessions_per_source_max >= 1,
            "--datagram-sessions-per-source-max must be at least 1".to_string(),
        ),
    ];
    if let Some((_, error)) = checks.into_iter().find(|(ok, _)| !ok) {
        anyhow::bail!("{error}");
    }
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("bad datagram limits: {e}"))
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ManagerArgs {
    #[command(subcommand)]
    action: Option<ManagerAction>,
    /// Address to listen on.
    #[arg(long)]
    listen: Option<String>,
    /// Data directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the bound address to this file once listening.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (GET /metrics).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// How long a file being written by `put` lives without its writer renewing or
    /// committing it, in milliseconds [default: 60000]
    #[arg(long, env = "TESSERA_PENDING_LEASE_MS")]
    pending_lease_ms: Option<u64>,
    #[command(flatten)]
    links: reserve::LinkArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// This replica's id, 1-based: its position in --peers (a replicated manager)
    #[arg(long, requires = "peers")]
    id: Option<u16>,
    /// Every replica's address, comma-separated, the same list in the same order for every
    /// replica: this one listens at the --id'th (TCP for requests, UDP at the same port for
    /// the total order between replicas). Without it, a single manager at --listen
    #[arg(long, value_delimiter = ',', requires = "id")]
    peers: Vec<String>,
    /// Create the metadata store (a new, empty cluster) if DIR has none, and the cluster
    /// secret (DIR/cluster.secret, or --secret FILE) if it does not exist yet. Without it, a
    /// manager whose store is missing refuses every server and waits for
    /// `tessera manager recover`.
    #[arg(long)]
    init: bool,
    /// Join a running group as a new member (with --id/--peers and an empty store): the
    /// replica waits until `tessera manager add ID ADDR` makes it one, then takes a peer's store
    #[arg(long, requires = "id")]
    join: bool,
}

#[derive(Subcommand)]
enum ManagerAction {
    /// Add manager replica ID to the replicated manager's group, as one ordered change. On
    /// a local cluster (DIR/cluster.toml) the replica is started first, with an empty store
    /// (a removed id's directory is wiped), at ADDR or a free port; elsewhere start it
    /// yourself with `tessera manager --id ID --peers ... --join --init` and give its ADDR.
    Add {
        id: u16,
        addr: Option<String>,
        /// Data directory of the local cluster [default: the directory of the cluster file
        /// --cluster names, else tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Remove manager replica ID from the replicated manager's group, as one ordered
    /// change; on a local cluster, the replica is stopped once the new group runs.
    Remove {
        id: u16,
        /// Data directory of the local cluster [default: the directory of the cluster file
        /// --cluster names, else tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Stop (kill) manager replica ID of the local cluster (`up --managers N`).
    Stop {
        id: u16,
        /// Data directory of the local cluster [default: the directory of the cluster file
        /// --cluster names, else tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Start manager replica ID of the local cluster again; it catches up from the others.
    Start {
        id: u16,
        /// Data directory of the local cluster [default: the directory of the cluster file
        /// --cluster names, else tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Rebuild a lost metadata store from the file records the servers keep. Run it where the
    /// manager's store is missing (the manager may be running: it opens the store once written).
    Recover {
        /// The manager's data directory, where the store is written.
        #[arg(long)]
        dir: PathBuf,
        /// Addresses of every server, comma-separated [default: the servers of the cluster
        /// file named by --cluster, else ./tessera-data/cluster.toml]
        #[arg(long, value_delimiter = ',')]
        servers: Vec<String>,
    },
}

#[derive(Subcommand)]
enum KeyAction {
    /// Issue an access key and print it as KEYID:SECRET (it is not shown again).
    Create {
        /// Who or what holds it, for `key ls`.
        #[arg(default_value = "unnamed")]
        name: String,
    },
    /// List the live access keys.
    Ls,
    /// Revoke an access key.
    Rm {
        /// Its id, k followed by 16 hex digits.
        id: String,
    },
}

#[derive(Subcommand)]
enum ServerAction {
    /// Stop (kill) server ID of the local cluster.
    Stop {
        id: u32,
        /// Data directory of the local cluster [default: the directory of the cluster file
        /// --cluster names, else tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Start server ID of the local cluster again.
    Start {
        id: u32,
        /// Data directory of the local cluster [default: the directory of the cluster file
        /// --cluster names, else tessera-data].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn main() {
    let cli = Cli::parse();
    // Daemons log what they do; client commands print one line on failure and nothing else
    // unless TESSERA_LOG asks for more.
    let daemon = matches!(
        cli.command,
        Command::Manager(ManagerArgs { action: None, .. })
            | Command::Server(ServerArgs { action: None, .. })
            | Command::S3 { .. }
            | Command::Mount {
                foreground: true,
                ..
            }
    );
    let default_level = match cli.command {
        // s3s logs every refused request as an error; the client is told, the log need not be.
        Command::S3 { .. } => "info,s3s::ops=off",
        _ if daemon => "info",
        _ => "error",
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(run(cli)) {
        eprintln!("tessera: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// The error and its causes on one line, without repeating a cause the message already holds.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}

/// `--datagram-bytes` bounds: QUIC's smallest datagram, and the largest UDP payload over IPv4.
const DATAGRAM_BYTES_MIN: usize = 1200;
const DATAGRAM_BYTES_MAX: usize = 65_507;

async fn run(cli: Cli) -> Result<()> {
    let transport = cli
        .transport
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    if cli.window == Some(0) {
        anyhow::bail!("--window must be at least 1");
    }
    if let Some(bytes) = cli.datagram_bytes {
        if !(DATAGRAM_BYTES_MIN..=DATAGRAM_BYTES_MAX).contains(&bytes) {
            anyhow::bail!(
                "--datagram-bytes must be {DATAGRAM_BYTES_MIN} to {DATAGRAM_BYTES_MAX}, not {bytes}"
            );
        }
    }
    // Every global flag goes into this one value, handed to whatever needs it.
    let config = config::Config {
        cluster: cli.cluster,
        transport,
        window: cli.window,
        receive_budget: cli.receive_budget,
        datagram_bytes: cli.datagram_bytes,
        key: cli.key,
        secret: cli.secret,
        radon_link_bytes_per_s: None,
    };
    let config = &config;
    match cli.command {
        Command::Up {
            servers,
            managers,
            dir,
            detach,
            s3,
            metrics,
        } => {
            let daemons = commands::UpDaemons {
                servers,
                managers,
                s3: s3.as_deref(),
                metrics,
            };
            let dir = commands::local_dir(config, dir)?;
            commands::up(config, &dir, daemons, detach).await
        }
        Command::Down { dir } => commands::down(&commands::local_dir(config, dir)?),
        Command::Manager(args) => match args.action {
            Some(ManagerAction::Recover { dir, servers }) => {
                recover::run(config, &dir, servers).await
            }
            Some(ManagerAction::Stop { id, dir }) => {
                commands::manager_stop(&commands::local_dir(config, dir)?, id)
            }
            Some(ManagerAction::Add { id, addr, dir }) => {
                let dir = commands::local_dir(config, dir)?;
                commands::manager_add(config, &dir, id, addr).await
            }
            Some(ManagerAction::Remove { id, dir }) => {
                let dir = commands::local_dir(config, dir)?;
                commands::manager_remove(config, &dir, id).await
            }
            Some(ManagerAction::Start { id, dir }) => {
                commands::manager_start(&commands::local_dir(config, dir)?, id)
            }
            None => {
                let dir = args
                    .dir
                    .ok_or_else(|| anyhow::anyhow!("tessera manager needs --dir"))?;
                let limits = args.limits.tcp_limits()?;
                let replica = match args.id {
                    Some(id) => Some(commands::replica_config(id, &args.peers, args.join)?),
                    None => None,
                };
                let listen = match (&replica, args.listen) {
                    (Some(replica), _) => replica.addr().to_string(),
                    (None, Some(listen)) => listen,
                    (None, None) => {
                        anyhow::bail!("tessera manager needs --listen (or --id and --peers)")
                    }
                };
                let at = commands::ServerAt {
                    listen: &listen,
                    dir: &dir,
                    addr_file: args.addr_file,
                    metrics: args.metrics.as_deref(),
                };
                commands::run_manager(
                    config,
                    at,
                    commands::manager_config(args.pending_lease_ms, args.links.capacity()?)?,
                    limits,
                    args.init,
                    replica,
                )
                .await
            }
        },
        Command::Key { action } => match action {
            KeyAction::Create { name } => commands::key_create(config, &name).await,
            KeyAction::Ls => commands::key_ls(config).await,
            KeyAction::Rm { id } => commands::key_rm(config, &id).await,
        },
        Command::Server(args) => match args.action {
            Some(ServerAction::Stop { id, dir }) => {
                commands::server_stop(&commands::local_dir(config, dir)?, id)
            }
            Some(ServerAction::Start { id, dir }) => {
                let dir = commands::local_dir(config, dir)?;
                commands::server_start(config, &dir, id).await
            }
            None => {
                let need = |v: Option<String>, flag: &str| {
                    v.ok_or_else(|| anyhow::anyhow!("tessera server needs --{flag}"))
                };
                let manager = need(args.manager, "manager")?;
                let listen = need(args.listen, "listen")?;
                let dir = args
                    .dir
                    .ok_or_else(|| anyhow::anyhow!("tessera server needs --dir"))?;
                let limits = args.limits.tcp_limits()?;
                let datagram = args.datagram_limits.apply(config.server_datagram())?;
                let schedule = server_schedule(args.rebuild_rate.as_deref(), args.disk_slots)?;
                let at = commands::ServerAt {
                    listen: &listen,
                    dir: &dir,
                    addr_file: args.addr_file,
                    metrics: args.metrics.as_deref(),
                };
                let limits = commands::ServerLimits {
                    tcp: limits,
                    datagram,
                };
                commands::run_server(config, &manager, at, args.id, limits, schedule).await
            }
        },
        Command::Put {
            local,
            remote,
            scheme,
            stripe_unit,
            width,
            reserve,
        } => {
            let layout = tessera_client::LayoutRequest {
                scheme: scheme.parse()?,
                stripe_unit: commands::parse_size(&stripe_unit)?,
                width,
            };
            commands::put(config, &local, &remote, layout, &reserve).await
        }
        Command::Get {
            remote,
            local,
            snapshot: Some(name),
            ..
        } => snapshot::read(config, &name, &remote, 0, None, &local).await,
        Command::Get {
            remote,
            local,
            reserve,
            snapshot: None,
        } => commands::get(config, &remote, &local, &reserve).await,
        Command::Write {
            remote,
            offset,
            local,
            reserve,
        } => commands::write(config, &remote, offset, &local, &reserve).await,
        Command::Read {
            remote,
            offset,
            length,
            local,
            snapshot: Some(name),
            ..
        } => snapshot::read(config, &name, &remote, offset, Some(length), &local).await,
        Command::Read {
            remote,
            offset,
            length,
            local,
            reserve,
            snapshot: None,
        } => commands::read(config, &remote, offset, length, &local, &reserve).await,
        Command::Snapshot { action } => snapshot::run(config, action).await,
        Command::Ls { prefix, json } => {
            commands::ls(config, prefix.as_deref().unwrap_or(""), json).await
        }
        Command::Rm { remote } => commands::rm(config, &remote).await,
        Command::Truncate { remote, size } => commands::truncate(config, &remote, &size).await,
        Command::Stat { remote, json } => commands::stat(config, &remote, json).await,
        Command::Status { json } => commands::status(config, json).await,
        Command::Top { interval, count } => {
            let interval = std::time::Duration::try_from_secs_f64(interval)
                .ok()
                .filter(|i| !i.is_zero())
                .ok_or_else(|| anyhow::anyhow!("bad --interval {interval}: give seconds > 0"))?;
            top::run(commands::connect(config)?, interval, count).await
        }
        Command::Rebuild { id } => commands::rebuild(config, id).await,
        Command::Scrub { remote } => commands::scrub(config, remote.as_deref()).await,
        Command::Bench {
            quick,
            json,
            attacks: true,
            ..
        } => attacks::run(config, quick, json).await,
        Command::Bench {
            quick,
            json,
            mount: true,
            ..
        } => bench_mount::run(config, quick, json).await,
        Command::Bench {
            quick,
            json,
            against_minio: Some(minio),
            object_size,
            ..
        } => bench_minio::run(config, &minio, (quick, object_size), json).await,
        Command::Bench { quick, json, .. } => bench::run(config, quick, json).await,
        Command::S3 {
            listen,
            access_key,
            secret_key,
            scheme,
            stripe_unit,
            width,
            addr_file,
            metrics,
            idle_timeout,
        } => {
            let args = s3::S3Args {
                listen,
                access_key,
                secret_key,
                scheme,
                stripe_unit,
                width,
                addr_file,
                metrics,
                idle_timeout,
            };
            s3::run(config, args).await
        }
        Command::Mount {
            mountpoint,
            foreground,
            scheme,
            stripe_unit,
            width,
        } => {
            let args = mount::MountArgs {
                mountpoint,
                foreground,
                scheme,
                stripe_unit,
                width,
            };
            mount::run(config, args).await
        }
        Command::Umount { mountpoint } => mount::unmount(&mountpoint),
        Command::Demo => demo::run(config).await,
        Command::Lab(args) => lab::run(config, args).await,
        Command::LabClient(args) => lab::client(config, args).await,
    }
}
