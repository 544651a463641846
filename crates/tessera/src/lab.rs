//! `tessera lab` and the hidden `tessera lab-client`: command-line arguments, the signal
//! handler, and calls into `tessera-lab`, which does the work.
//!
//! The global `--transport` and `--window` pick what `swift-window` measures (TCP only, the
//! datagram transport only, one window); the lab passes them on to the daemons and to
//! `lab-client`, which connects with them like every client command. `incast` ignores them:
//! each of its lines picks the transport. The global `--receive-budget` goes to `lab-client`
//! (the datagram transport's client side). Link settings left out take each experiment's
//! defaults (`incast` measures at 1 Gbit/s with 32 KiB switch buffers, the others at
//! 200 Mbit/s with 128 frames). `radon`'s streams pick their own pacing per line
//! (`lab-client` reads it from the job).

use crate::config::Config as Flags;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use tessera_client::Scheme;
use tessera_lab::cluster::Transport;
use tessera_lab::experiments::calibrate::{self, CalibrateConfig};
use tessera_lab::experiments::check::{self, CheckConfig};
use tessera_lab::experiments::incast::{self, IncastConfig, Line};
use tessera_lab::experiments::radon::{self, RadonLabConfig};
use tessera_lab::experiments::swift_window::{self, SwiftWindowConfig};
use tessera_lab::experiments::total_order::{self, TotalOrderConfig};
use tessera_lab::experiments::LabConfig;
use tessera_lab::job::{ClientJob, ClientReport};
use tessera_lab::net::{self, Buffer, LinkSpec, Rate};
use tessera_lab::Cancel;

/// Build a test network of namespaces and run experiments on it (needs root).
#[derive(Args)]
pub struct LabArgs {
    #[command(subcommand)]
    experiment: Experiment,
}

#[derive(Subcommand)]
enum Experiment {
    /// Smoke test: build the network, echo across it, store and read a file, tear down
    /// (over TCP unless --transport udp).
    Check {
        /// Servers in the cluster.
        #[arg(long, default_value_t = 3)]
        servers: u32,
        /// Scheme of the file.
        #[arg(long, default_value = "raid5")]
        scheme: Scheme,
        /// Bytes of the file, e.g. 4M.
        #[arg(long, default_value = "4M")]
        size: String,
        #[command(flatten)]
        common: Common,
    },
    /// Swift/RAID figures 2-5: throughput against the window, TCP, degraded mode.
    SwiftWindow(SwiftWindowArgs),
    /// TCP incast: goodput of synchronized reads from 1 to 64 servers through one switch
    /// port, over TCP, TCP with rto_min 1 ms and Tessera's transport.
    Incast(IncastArgs),
    /// Radon's experiments (issue 18): six writers into one server's switch port, punctuated,
    /// fairshare and unfair, as constant-rate senders, Radon, and Tessera (admission control).
    Radon {
        /// 2 s runs of 250 ms periods: about a minute and a half.
        #[arg(long)]
        quick: bool,
        /// Only these experiments (punctuated, fairshare, unfair, bulk; repeat for more).
        #[arg(long = "experiment")]
        experiments: Vec<String>,
        /// Only these lines (constant, radon, tessera; repeat for more).
        #[arg(long = "line")]
        lines: Vec<String>,
        /// The mirror case: six reader processes on one host read from six servers, the
        /// streams meeting in the port toward the readers (`DIR/radon-mirror.*`).
        #[arg(long)]
        mirror: bool,
        /// An extra flag for the measurement clients (repeat for more).
        #[arg(long, allow_hyphen_values = true)]
        client_arg: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Total order through two switches joined by one link (issue 16): tessera-order over
    /// multicast beside a raw multicast UDP stream, throughput and PO/UTO latency.
    TotalOrder {
        /// Under a minute: 3 nodes, 64 B and 1 KiB messages, 9000-byte packing.
        #[arg(long)]
        quick: bool,
        /// Nodes, each a sender and a receiver unless --senders says.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// The first S nodes only send, the others only receive (the thesis's tables 2-3).
        #[arg(long)]
        senders: Option<usize>,
        /// Table 4's points instead of the default ones, each SIDE:PERCENT of datagrams
        /// dropped by the drivers, SIDE `senders`, `receivers` or `nodeN` (node N's receiver
        /// only; node 0 leads) (`receivers:0` measures the no-loss row afresh). Repeatable.
        #[arg(long)]
        loss: Vec<total_order::tables::LossPoint>,
        /// Tables 2-3: every disjoint configuration of 1..=N senders and receivers (0: none).
        #[arg(long)]
        grid: Option<usize>,
        /// Share of the measured throughput offered in the latency runs [default: 0.1].
        #[arg(long)]
        latency_load: Option<f64>,
        #[command(flatten)]
        common: Common,
    },
    /// A raw TCP stream and Tessera at several link rates, with CPU use.
    Calibrate {
        /// A shorter sweep.
        #[arg(long)]
        quick: bool,
        /// Link rates to try, e.g. 100mbit,1gbit [default: 100mbit to 2gbit].
        #[arg(long, value_delimiter = ',')]
        rates: Vec<Rate>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove lab namespaces (and their links and processes) left by runs that died.
    Cleanup {
        /// Also those of runs still alive.
        #[arg(long)]
        all: bool,
    },
}

/// Settings every experiment takes. Link settings left out take the experiment's defaults.
#[derive(Args)]
struct Common {
    /// Rate of every link, each way (tc units: 200mbit, 1gbit) [default: 200mbit; incast and
    /// total-order: 1gbit].
    #[arg(long)]
    rate: Option<Rate>,
    /// Queue of each switch port toward a host: frames (128p) or bytes (192K) [default:
    /// 128p; incast: 32K].
    #[arg(long)]
    buffer: Option<Buffer>,
    /// Transmit queue of each host: frames or bytes [default: 1000p].
    #[arg(long)]
    nic_buffer: Option<Buffer>,
    /// Token bucket of each link in bytes [default: 1 ms of the rate].
    #[arg(long)]
    burst: Option<u64>,
    /// Directory for NAME.json, NAME.csv, NAME.md and NAME.png.
    #[arg(long, default_value = "results")]
    dir: PathBuf,
    /// An extra flag for every `tessera server` (repeat for more), e.g. --server-arg=--foo.
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// Microseconds an idle CPU polls before it halts, for the run (the kernel's haltpoll
    /// guest_halt_poll_ns; restored afterwards). On a virtual machine that boots with 0, waking
    /// a halted CPU adds tens of microseconds to every hop between the lab's processes.
    #[arg(long, default_value_t = tessera_lab::host::HALT_POLL_US_DEFAULT)]
    halt_poll_us: u64,
}

#[derive(Args)]
struct SwiftWindowArgs {
    /// The subset that runs in under two minutes. (--transport tcp|udp measures one
    /// transport only, --window N one window only.)
    #[arg(long)]
    quick: bool,
    /// Windows of the datagram transport, e.g. 1,2,4 [default: 1 to 8; quick: 1,2,3,8].
    #[arg(long, value_delimiter = ',')]
    windows: Vec<u32>,
    /// Numbers of servers, e.g. 3,5 [default: 3,4,5; quick: 3].
    #[arg(long, value_delimiter = ',')]
    servers: Vec<u32>,
    /// Schemes, e.g. raid0,raid5 [default: raid0,raid4,raid5; quick: raid5].
    #[arg(long, value_delimiter = ',')]
    schemes: Vec<Scheme>,
    /// Bytes of the large file, e.g. 32M.
    #[arg(long)]
    large_size: Option<String>,
    /// Stripe unit (one block), e.g. 64K.
    #[arg(long)]
    stripe_unit: Option<String>,
    /// Skip degraded mode.
    #[arg(long)]
    no_degraded: bool,
    /// An extra flag for the measurement client (repeat for more).
    #[arg(long, allow_hyphen_values = true)]
    client_arg: Vec<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct IncastArgs {
    /// N = 1 to 16 with fewer reads per point: under two minutes.
    #[arg(long)]
    quick: bool,
    /// Numbers of servers, e.g. 1,4,16 [default: 1,2,4,8,16,32,64; quick: 1 to 16].
    #[arg(long, value_delimiter = ',')]
    servers: Vec<u32>,
    /// Stripe units (the paper's server request units), e.g. 32K,256K [default: 32K,256K].
    #[arg(long, value_delimiter = ',')]
    units: Vec<String>,
    /// Lines to measure: tcp, tcp-rto1ms, tessera [default: all three]. The global
    /// --transport and --window are not used: each line picks its transport.
    #[arg(long, value_delimiter = ',')]
    lines: Vec<Line>,
    /// Timed reads per point [default: about 128 MiB of blocks, 20 to 4000 reads; quick:
    /// 48 MiB, 24 to 1500 reads].
    #[arg(long)]
    reads: Option<u32>,
    /// Blocks the client keeps in flight: 1 waits for each block whole before asking for the
    /// next, as in the paper; more is the client's read-ahead.
    #[arg(long, default_value_t = 1)]
    read_ahead: u32,
    /// An extra flag for the measurement client (repeat for more).
    #[arg(long, allow_hyphen_values = true)]
    client_arg: Vec<String>,
    #[command(flatten)]
    common: Common,
}

/// The measurement client: runs one lab job against a cluster and prints its report as JSON.
/// It connects with the global `--transport` and `--window`.
#[derive(Args)]
pub struct LabClientArgs {
    /// The manager's address.
    #[arg(long)]
    manager: SocketAddr,
    /// The job, as JSON.
    #[arg(long)]
    job: String,
}

pub async fn run(config: &Flags, args: LabArgs) -> Result<()> {
    let (common, experiment) = match args.experiment {
        Experiment::Cleanup { all } => return cleanup(all),
        Experiment::Check {
            servers,
            scheme,
            size,
            common,
        } => {
            // TCP unless --transport udp asks for the datagram transport.
            let transport = match (config.transport.map(|t| t.name()), config.window) {
                (Some("tcp"), _) | (None, None) => Transport::Tcp,
                (_, Some(window)) => Transport::Datagram { window },
                (Some(_), None) => Transport::Adaptive,
            };
            let config = CheckConfig {
                servers,
                scheme,
                bytes: u64::from(crate::commands::parse_size(&size)?),
                transport,
                server_args: common.server_arg.clone(),
                ..CheckConfig::default()
            };
            (common, Config::Check(config))
        }
        Experiment::Calibrate {
            quick,
            rates,
            common,
        } => {
            let mut config = if quick {
                CalibrateConfig::quick()
            } else {
                CalibrateConfig::full()
            };
            if !rates.is_empty() {
                config.rates = rates;
            }
            (common, Config::Calibrate(config))
        }
        Experiment::TotalOrder {
            quick,
            nodes,
            senders,
            loss,
            grid,
            latency_load,
            common,
        } => {
            if !(1..=total_order::net::NODES_MAX).contains(&nodes) {
                bail!(
                    "{nodes} nodes: the lab holds 1 to {}",
                    total_order::net::NODES_MAX
                );
            }
            let mut config = if quick {
                TotalOrderConfig::quick()
            } else {
                TotalOrderConfig::full(nodes)
            };
            config.nodes = nodes;
            config.senders = senders;
            if !loss.is_empty() {
                config.losses = loss;
            }
            if let Some(grid) = grid {
                if grid > total_order::net::NODES_MAX / 2 {
                    bail!("--grid {grid}: at most {}", total_order::net::NODES_MAX / 2);
                }
                config.grid = grid;
            }
            if let Some(share) = latency_load {
                if !(share > 0.0 && share <= 1.0) {
                    bail!(
                        "--latency-load {share}: a share of the throughput, above 0 and at most 1"
                    );
                }
                config.latency_load = share;
            }
            config.group()?;
            (common, Config::TotalOrder(config))
        }
        Experiment::Radon {
            quick,
            experiments,
            lines,
            mirror,
            client_arg,
            common,
        } => {
            let mut radon = if quick {
                RadonLabConfig::quick()
            } else {
                RadonLabConfig::full()
            };
            radon.mirror = mirror;
            if !experiments.is_empty() {
                radon.experiments = experiments
                    .iter()
                    .map(|name| radon::Experiment::from_name(name))
                    .collect::<Result<_, String>>()
                    .map_err(anyhow::Error::msg)?;
            }
            if !lines.is_empty() {
                radon.lines = lines
                    .iter()
                    .map(|name| radon::Line::from_name(name))
                    .collect::<Result<_, String>>()
                    .map_err(anyhow::Error::msg)?;
            }
            radon.server_args = common.server_arg.clone();
            radon.client_args = client_args(config, &client_arg);
            (common, Config::Radon(radon))
        }
        Experiment::SwiftWindow(args) => {
            let swift = swift_window_config(config, &args)?;
            (args.common, Config::SwiftWindow(swift))
        }
        Experiment::Incast(args) => {
            let incast = incast_config(config, &args)?;
            (args.common, Config::Incast(incast))
        }
    };
    let cancel = Cancel::new();
    watch_signals(cancel.clone())?;
    let exe = std::env::current_exe().context("cannot find the tessera binary")?;
    let link = common.link(experiment.link_defaults());
    tessera_lab::cmd::require_lab_host()?;
    let halt_poll = tessera_lab::host::HaltPoll::set(common.halt_poll_us)?;
    if let Some(guard) = &halt_poll {
        if guard.before_us() != common.halt_poll_us {
            eprintln!(
                "lab: idle CPUs poll {} us before halting for this run (was {} us)",
                common.halt_poll_us,
                guard.before_us()
            );
        }
    }
    let lab = LabConfig::new(exe, link, common.dir, cancel);
    // The lab waits on processes and sockets with plain blocking calls.
    let paths = tokio::task::spawn_blocking(move || run_experiment(&lab, experiment)).await??;
    drop(halt_poll);
    for path in paths {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn cleanup(all: bool) -> Result<()> {
    let report = net::cleanup(all)?;
    for ns in &report.removed {
        println!("removed {ns}");
    }
    for ns in &report.kept {
        println!("kept {ns} (its run is alive; --all removes it too)");
    }
    for dir in &report.removed_dirs {
        println!("removed {}", dir.display());
    }
    if report.removed.is_empty() && report.kept.is_empty() && report.removed_dirs.is_empty() {
        println!("no lab namespaces");
    }
    Ok(())
}

/// An experiment, configured.
enum Config {
    Check(CheckConfig),
    Calibrate(CalibrateConfig),
    SwiftWindow(SwiftWindowConfig),
    Incast(IncastConfig),
    TotalOrder(TotalOrderConfig),
    Radon(RadonLabConfig),
}

impl Config {
    /// The links of the experiment where the command line does not say.
    fn link_defaults(&self) -> LinkSpec {
        match self {
            Config::Incast(_) => IncastConfig::link_defaults(),
            Config::TotalOrder(_) => LinkSpec::new(Rate::mbit(1000)),
            Config::Check(_) | Config::Calibrate(_) | Config::SwiftWindow(_) | Config::Radon(_) => {
                LinkSpec::new(Rate::mbit(200))
            }
        }
    }
}

/// The measurement client's extra flags: `--client-arg`s, and the global `--receive-budget`
/// if given, which belongs to the client (a flag, so that it shows in the client's command
/// line; the lab's own process has no use for it).
fn client_args(flags: &Flags, given: &[String]) -> Vec<String> {
    let mut args = given.to_vec();
    let set_already = given.iter().any(|a| a.starts_with("--receive-budget"));
    if let (Some(budget), false) = (flags.receive_budget, set_already) {
        args.push(format!("--receive-budget={budget}"));
    }
    args
}

fn incast_config(flags: &Flags, args: &IncastArgs) -> Result<IncastConfig> {
    let mut config = if args.quick {
        IncastConfig::quick()
    } else {
        IncastConfig::full()
    };
    if !args.servers.is_empty() {
        config.servers = args.servers.clone();
    }
    if let Some(n) = config
        .servers
        .iter()
        .find(|n| !(1..=net::SERVERS_MAX).contains(*n))
    {
        bail!("{n} servers: the lab holds 1 to {}", net::SERVERS_MAX);
    }
    if !args.units.is_empty() {
        config.stripe_units_bytes = args
            .units
            .iter()
            .map(|unit| crate::commands::parse_size(unit))
            .collect::<Result<_>>()?;
    }
    if config.stripe_units_bytes.contains(&0) {
        bail!("a stripe unit must be at least one byte");
    }
    if !args.lines.is_empty() {
        config.lines = args.lines.clone();
    }
    if args.reads == Some(0) {
        bail!("--reads must be at least 1");
    }
    config.reads = args.reads;
    if !(1..=64).contains(&args.read_ahead) {
        bail!("--read-ahead must be 1 to 64 blocks");
    }
    config.read_ahead = args.read_ahead;
    for &servers in &config.servers {
        for &unit in &config.stripe_units_bytes {
            let file = config.file(servers, unit);
            if file.bytes > tessera_lab::job::FILE_BYTES_MAX {
                bail!(
                    "{servers} servers with {unit}-byte stripe units need a file of {} bytes, \
                     more than the lab's {}",
                    file.bytes,
                    tessera_lab::job::FILE_BYTES_MAX
                );
            }
        }
    }
    config.server_args = args.common.server_arg.clone();
    config.client_args = client_args(flags, &args.client_arg);
    Ok(config)
}

fn swift_window_config(flags: &Flags, args: &SwiftWindowArgs) -> Result<SwiftWindowConfig> {
    let mut config = if args.quick {
        SwiftWindowConfig::quick()
    } else {
        SwiftWindowConfig::full()
    };
    if !args.windows.is_empty() {
        config.windows = args.windows.clone();
    }
    if let Some(window) = flags.window {
        config.windows = vec![window];
        config.degraded_window = window;
    }
    if config.windows.contains(&0) {
        bail!("a window must be at least 1");
    }
    if !args.servers.is_empty() {
        config.servers = args.servers.clone();
        config.degraded_servers = args.servers.clone();
    }
    if config.servers.iter().any(|n| *n < 3) {
        bail!("RAID-4 and RAID-5 need at least 3 servers");
    }
    if !args.schemes.is_empty() {
        config.schemes = args.schemes.clone();
        config
            .degraded
            .retain(|case| args.schemes.contains(&case.scheme));
    }
    match flags.transport.map(|t| t.name()) {
        None => {}
        Some("tcp") => config.windows.clear(),
        Some(_) => config.tcp = false,
    }
    if let Some(size) = &args.large_size {
        config.large_bytes = u64::from(crate::commands::parse_size(size)?);
    }
    if let Some(unit) = &args.stripe_unit {
        config.stripe_unit_bytes = crate::commands::parse_size(unit)?;
    }
    if args.no_degraded {
        config.degraded.clear();
    }
    config.server_args = args.common.server_arg.clone();
    config.client_args = client_args(flags, &args.client_arg);
    Ok(config)
}

impl Common {
    /// The links: what was given, else the experiment's `defaults`.
    fn link(&self, defaults: LinkSpec) -> LinkSpec {
        LinkSpec {
            rate: self.rate.unwrap_or(defaults.rate),
            switch_buffer: self.buffer.unwrap_or(defaults.switch_buffer),
            nic_buffer: self.nic_buffer.unwrap_or(defaults.nic_buffer),
            burst_bytes: self.burst.or(defaults.burst_bytes),
        }
    }
}

fn run_experiment(lab: &LabConfig, experiment: Config) -> Result<Vec<PathBuf>> {
    Ok(match experiment {
        Config::Check(config) => {
            let report = check::run(lab, &config)?;
            println!(
                "check passed: wrote and read {} bytes over the bridge at {:.1} and {:.1} MB/s",
                report.bytes,
                report.write_bytes_per_s / 1e6,
                report.read_bytes_per_s / 1e6
            );
            report.outputs
        }
        Config::Calibrate(config) => calibrate::run(lab, &config)?.1,
        Config::Incast(config) => {
            let (report, paths) = incast::run(lab, &config)?;
            eprintln!("lab: incast took {:.0} s", report.duration_s);
            print_markdown(&paths);
            paths
        }
        Config::TotalOrder(config) => {
            let (report, paths) = total_order::run(lab, &config)?;
            eprintln!("lab: total-order took {:.0} s", report.duration_s);
            print_markdown(&paths);
            paths
        }
        Config::Radon(config) => {
            let (report, paths) = radon::run(lab, &config)?;
            eprintln!("lab: radon took {:.0} s", report.duration_s);
            print_markdown(&paths);
            paths
        }
        Config::SwiftWindow(config) => {
            let (report, paths) = swift_window::run(lab, &config)?;
            eprintln!("lab: swift-window took {:.0} s", report.duration_s);
            print_markdown(&paths);
            paths
        }
    })
}

/// Print the Markdown file among an experiment's outputs.
fn print_markdown(paths: &[PathBuf]) {
    if let Some(md) = paths
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "md"))
    {
        print!("{}", std::fs::read_to_string(md).unwrap_or_default());
    }
}

/// On Ctrl-C, SIGTERM or SIGHUP, ask the experiment to stop; its guards then tear down.
/// Registering replaces the default action (exit at once, leaving the network behind).
fn watch_signals(cancel: Cancel) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut signals = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ] {
        signals.push(signal(kind).context("cannot install a signal handler")?);
    }
    tokio::spawn(async move {
        let waits = signals.iter_mut().map(|s| Box::pin(s.recv()));
        futures::future::select_all(waits).await;
        eprintln!("lab: interrupted; tearing down");
        cancel.cancel();
    });
    Ok(())
}

/// `tessera lab-client`: one job, its report on stdout.
pub async fn client(config: &Flags, args: LabClientArgs) -> Result<()> {
    let job: ClientJob = serde_json::from_str(&args.job).context("bad --job")?;
    let config = config.for_cluster(args.manager.to_string());
    let report = match &job {
        ClientJob::Stream(stream) => {
            // A stream's clients pace as its line says: reserved or not, Radon or not.
            let config = crate::config::Config {
                radon_link_bytes_per_s: stream.radon_link_bytes_per_s(),
                ..config
            };
            let connect = |reservation| {
                crate::commands::connect_reserved(&config, reservation)
                    .map_err(|e| tessera_lab::LabError::Connect(format!("{e:#}")))
            };
            ClientReport::Stream(tessera_lab::stream::run(stream, &connect).await?)
        }
        _ => {
            let client = crate::commands::connect(&config)?;
            tessera_lab::job::run(&client, &job).await?
        }
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
