//! Tessera's network lab.
//!
//! This crate owns everything `tessera lab` does beyond parsing its command line. It builds a
//! small switched network out of Linux network namespaces — one per host, a bridge in a
//! namespace of its own as the switch, a `tbf` qdisc on each switch port toward a host (the
//! port's rate and buffer) and on each host's interface (its NIC's rate and transmit queue) —
//! starts Tessera's real daemons on its hosts, runs a measurement client on another, and
//! turns what it measured into results: JSON, CSV, a Markdown table and a PNG plot.
//!
//! It must never touch a network it did not make: every namespace it creates is named
//! `tl-PID-SEQ-HOST`, nothing is created in the namespace it runs in, its addresses
//! (10.77.0.0/24) exist only inside its namespaces, and everything it creates belongs to a
//! guard that tears it down when dropped — on success, on error, on panic, and (through
//! [`Cancel`], set by the binary's signal handler) on Ctrl-C. A run killed outright leaves
//! namespaces that [`net::cleanup`] (`tessera lab cleanup`) removes.
//!
//! The layers, bottom up:
//! - [`cmd`]: commands as values (tests read them before anything runs), the cancel flag.
//! - [`net`]: the [`net::Topology`], the `ip`/`tc`/`ethtool` commands that build it, and the
//!   [`net::Network`] guard.
//! - [`probe`]: a UDP echo and a TCP stream across the network from threads inside its
//!   namespaces, and the machine's CPU time.
//! - [`cluster`]: the daemons (`tessera manager`, `tessera server`) in their namespaces, and
//!   jobs for the measurement client (`tessera lab-client`) in the client's.
//! - [`job`]: what the measurement client does with [`tessera_client::Client`]; [`stream`]:
//!   one rated stream of `lab radon`.
//! - [`results`]: tables (CSV, Markdown) and figures (PNG).
//! - [`experiments`]: `check`, `calibrate`, `swift-window`, `incast`, `total-order` and
//!   `radon`.
//!
//! A network, an echo across it and a TCP stream through its `tbf` ports (as root):
//!
//! ```no_run
//! use std::time::Duration;
//! use tessera_lab::net::{LinkSpec, Network, Rate, RunPrefix, Topology};
//! use tessera_lab::probe;
//!
//! let link = LinkSpec::new(Rate::mbit(100));
//! let topology = Topology::new(RunPrefix::new(), &["a", "b"], link)?;
//! let network = Network::build(topology)?; // torn down when dropped, whatever happens
//! let echo = probe::udp_echo(&network, "a", "b", 10)?;
//! let stream = probe::tcp_stream(&network, "a", "b", 5_000_000, Duration::from_secs(10))?;
//! println!("rtt {} us, {:.1} Mbit/s", echo.rtt_us_median, stream.bits_per_s / 1e6);
//! network.teardown()?; // or just drop it; this also checks nothing is left
//! # Ok::<(), tessera_lab::LabError>(())
//! ```
//!
//! A cluster on it, and a job for the measurement client (the binary must have the hidden
//! `lab-client` command, as `tessera` does):
//!
//! ```no_run
//! use std::time::Duration;
//! use tessera_lab::cluster::{Cluster, ClusterSpec, Transport};
//! use tessera_lab::job::{ClientJob, FileSpec};
//! use tessera_lab::net::{LinkSpec, Network, Rate, RunPrefix, Topology};
//! use tessera_lab::Cancel;
//!
//! let topology = Topology::cluster(RunPrefix::new(), 3, LinkSpec::new(Rate::mbit(200)))?;
//! let network = Network::build(topology)?;
//! let exe = std::env::current_exe().unwrap();
//! let mut cluster = Cluster::start(&network, ClusterSpec::new(exe, 3, Transport::Tcp), &Cancel::new())?;
//! let file = FileSpec {
//!     path: "lab/f".into(),
//!     scheme: tessera_client::Scheme::Raid5,
//!     stripe_unit_bytes: 65536,
//!     bytes: 1 << 20,
//!     seed: 1,
//!     width: None,
//! };
//! let report = cluster.run_job(&ClientJob::Check { file }, Duration::from_secs(60))?;
//! # Ok::<(), tessera_lab::LabError>(())
//! ```

pub mod cluster;
pub mod cmd;
mod error;
pub mod experiments;
pub mod host;
pub mod job;
pub mod net;
pub mod probe;
pub mod results;
pub mod stream;

pub use cmd::Cancel;
pub use error::LabError;
