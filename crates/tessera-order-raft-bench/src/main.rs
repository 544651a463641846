//! `tessera-order-raft-bench`: tessera-order against openraft, side by side in one run, on
//! 127.0.0.1: three nodes each, the same message size, the same closed-loop load (a number of
//! messages outstanding at once), measured the same way (messages ordered per second, and the
//! latency from hand-off to delivery or commit).
//!
//! openraft 0.9 commits through its leader: every write goes to node 0's Raft, which
//! replicates it over TCP to the others and answers once a majority holds it. tessera-order
//! has no leader on its fast path: every node proposes a third of the messages over UDP
//! (unicast fan-out, since loopback has no two-switch sequencer), and a message counts once
//! UTO-delivered at the slowest node. Both keep their logs in memory. The lab's
//! `tessera lab total-order` measures tessera-order in the two-switch topology; this binary
//! is a crate of its own so that openraft's dependencies stay out of the `tessera` binary.
//!
//! With `--lab` (root), both run instead in the lab's two-switch network in namespaces, at 3
//! and 5 nodes (`--nodes`), see [`lab`]: openraft over TCP unicast through the same switches
//! and shaped links as tessera-order's multicast.
//!
//! With `--manager`, the manager's metadata state machine instead of bare messages: Tessera's
//! 3 replicas against the same state machine replicated by openraft on 3 nodes (and one
//! manager alone), the same metadata workload in interleaved rounds, see [`metadata`].
//!
//! Usage: `tessera-order-raft-bench [--quick] [--sizes 64,1024] [--seconds S] [--json PATH]
//! [--lab [--nodes 3,5] [--loads 4096]]`, or `tessera-order-raft-bench --manager
//! [--rounds 3] [--seconds 3] [--clients 8]`.

mod lab;
mod manager;
mod metadata;
mod order;
mod raft;

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// Latency percentiles of a run, microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latencies {
    /// Samples.
    pub samples: usize,
    /// Median.
    pub median_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

impl Latencies {
    /// Of the samples given.
    pub fn of(mut us: Vec<f64>) -> Latencies {
        us.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if us.is_empty() {
                f64::NAN
            } else {
                us[((us.len() - 1) as f64 * q).round() as usize]
            }
        };
        Latencies {
            samples: us.len(),
            median_us: at(0.5),
            p99_us: at(0.99),
        }
    }
}

/// One engine at one message size and load.
#[derive(Debug, Clone, Serialize)]
struct Point {
    engine: &'static str,
    message_bytes: usize,
    outstanding: usize,
    messages_per_s: f64,
    latency: Latencies,
}

struct Args {
    sizes: Vec<usize>,
    seconds: f64,
    loads: Vec<usize>,
    json: Option<String>,
    /// Run in the lab's namespaces, with these node counts.
    lab: Option<Vec<usize>>,
    /// Run the manager's metadata workload (`--manager`).
    manager: bool,
    /// Rounds of the metadata workload.
    rounds: usize,
    /// Client tasks of the metadata workload.
    clients: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        sizes: vec![64, 1024],
        seconds: 5.0,
        loads: vec![1, 1024],
        json: None,
        lab: None,
        manager: false,
        rounds: 3,
        clients: 8,
    };
    let mut loads_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--quick" => args.seconds = 2.0,
            "--seconds" => args.seconds = value()?.parse().context("--seconds")?,
            "--sizes" => {
                args.sizes = value()?
                    .split(',')
                    .map(|s| s.parse().context("--sizes"))
                    .collect::<Result<_>>()?
            }
            "--loads" => {
                loads_given = true;
                args.loads = value()?
                    .split(',')
                    .map(|s| s.parse().context("--loads"))
                    .collect::<Result<_>>()?
            }
            "--json" => args.json = Some(value()?),
            "--manager" => args.manager = true,
            "--rounds" => args.rounds = value()?.parse().context("--rounds")?,
            "--clients" => args.clients = value()?.parse().context("--clients")?,
            "--lab" => {
                args.lab.get_or_insert_with(|| vec![3, 5]);
            }
            "--nodes" => {
                args.lab = Some(
                    value()?
                        .split(',')
                        .map(|s| s.parse().context("--nodes"))
                        .collect::<Result<_>>()?,
                )
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if args
        .sizes
        .iter()
        .any(|&s| !(order::STAMP_BYTES..=1400).contains(&s))
    {
        bail!("message sizes must be {} to 1400 bytes", order::STAMP_BYTES);
    }
    if args.loads.contains(&0)
        || args.rounds == 0
        || args.clients == 0
        || !args.seconds.is_finite()
        || args.seconds <= 0.0
    {
        bail!("loads and seconds must be positive");
    }
    if let (Some(_), false) = (&args.lab, loads_given) {
        // One load in the lab: the throughput one (runs there cost more).
        args.loads = vec![1024];
    }
    if let Some(nodes) = &args.lab {
        if nodes.iter().any(|&n| !(2..=16).contains(&n)) {
            bail!("--nodes: 2 to 16 nodes");
        }
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("load average before: {}", load.trim());
    if let Some(nodes) = &args.lab {
        return run_lab(&args, nodes);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.manager {
        return run_manager(&args, &runtime);
    }
    let mut points = Vec::new();
    for &size in &args.sizes {
        for &outstanding in &args.loads {
            let cluster = runtime.block_on(raft::Cluster::start(3, 4096))?;
            let (rate, latency) =
                runtime.block_on(cluster.closed_loop(size, outstanding, args.seconds))?;
            let applied = cluster.applied();
            runtime.block_on(cluster.shutdown());
            eprintln!(
                "openraft {size} B, {outstanding} outstanding: {rate:.0}/s, applied {applied:?}"
            );
            points.push(Point {
                engine: "openraft 0.9.25",
                message_bytes: size,
                outstanding,
                messages_per_s: rate,
                latency,
            });
            let (rate, latency) = order::closed_loop(3, size, outstanding, args.seconds)?;
            eprintln!("tessera-order {size} B, {outstanding} outstanding: {rate:.0}/s");
            points.push(Point {
                engine: "tessera-order",
                message_bytes: size,
                outstanding,
                messages_per_s: rate,
                latency,
            });
        }
    }
    print_table(&points);
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&points)? + "\n")
            .with_context(|| format!("write {path}"))?;
    }
    Ok(())
}

/// `--manager`: the metadata workload's table on stdout.
fn run_manager(args: &Args, runtime: &tokio::runtime::Runtime) -> Result<()> {
    let seconds = if args.seconds == 5.0 {
        3.0
    } else {
        args.seconds
    };
    let dir = tempfile::tempdir()?;
    let measured = runtime.block_on(metadata::run(
        dir.path(),
        args.rounds,
        seconds,
        args.clients,
    ))?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("load average after: {}", load.trim());
    println!(
        "metadata ops/s by kind, {} clients, {} rounds of {seconds} s per kind and system:",
        args.clients, args.rounds
    );
    let ratio =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| a / b).collect() };
    for (kind, systems) in &measured.rates {
        println!("{kind:?}:");
        for (name, rates) in systems {
            println!("  {name:<31} {rates:.0?}");
        }
        let Some((_, tessera)) = systems.iter().find(|(name, _)| *name == metadata::TESSERA) else {
            bail!("tessera measured");
        };
        for (name, rates) in systems
            .iter()
            .filter(|(name, _)| *name != metadata::TESSERA)
        {
            println!("  tessera / {name:<21} {:.2?}", ratio(tessera, rates));
        }
    }
    println!("  load before rounds              {:?}", measured.loads);
    Ok(())
}

/// `--lab`: every node count, size and load; the table on stdout, the points as JSON.
fn run_lab(args: &Args, nodes: &[usize]) -> Result<()> {
    let mut points = Vec::new();
    for &outstanding in &args.loads {
        points.extend(lab::run(nodes, &args.sizes, outstanding, args.seconds)?);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("load average after: {}", load.trim());
    print!("{}", lab::markdown(&points));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&points)? + "\n")
            .with_context(|| format!("write {path}"))?;
    }
    Ok(())
}

fn print_table(points: &[Point]) {
    println!("| message B | outstanding | openraft msg/s | tessera-order msg/s | ratio | openraft median/p99 us | tessera-order median/p99 us |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for pair in points.chunks(2) {
        let (raft, order) = (&pair[0], &pair[1]);
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
            raft.message_bytes,
            raft.outstanding,
            raft.messages_per_s,
            order.messages_per_s,
            order.messages_per_s / raft.messages_per_s.max(1.0),
            raft.latency.median_us,
            raft.latency.p99_us,
            order.latency.median_us,
            order.latency.p99_us
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_samples() {
        let l = Latencies::of((1..=100).map(f64::from).rev().collect());
        assert_eq!((l.samples, l.median_us, l.p99_us), (100, 51.0, 99.0));
        assert!(Latencies::of(Vec::new()).median_us.is_nan());
    }
}
