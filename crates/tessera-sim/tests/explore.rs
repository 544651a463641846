//! The explorer in CI: fixed seed ranges per fault combination (see the crate docs). Each
//! failing seed is printed with its trace; `TESSERA_SIM_SEED=N` replays one seed,
//! `TESSERA_SIM_SEEDS=N` runs N seeds per test (a soak), from `TESSERA_SIM_SEED_BASE`.

use std::time::{Duration, Instant};
use tessera_client::Scheme;
use tessera_sim::{replay, ExploreConfig};
use tessera_transport::MemFaults;

fn env(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// Run `seeds` seeds (or what the environment asks) and fail with the first failure's seed.
fn explore(name: &str, config: ExploreConfig, seeds: u64) {
    let (base, count) = match env("TESSERA_SIM_SEED") {
        Some(seed) => (seed, 1),
        None => (
            env("TESSERA_SIM_SEED_BASE").unwrap_or(0),
            env("TESSERA_SIM_SEEDS").unwrap_or(seeds),
        ),
    };
    let started = Instant::now();
    let mut total = tessera_sim::RunReport::default();
    for seed in base..base + count {
        match replay(seed, &config) {
            Ok(report) => {
                total.writes_acked += report.writes_acked;
                total.writes_unacked += report.writes_unacked;
                total.reads_checked += report.reads_checked;
                total.bytes_checked += report.bytes_checked;
                total.client_crashes += report.client_crashes;
                total.server_crashes += report.server_crashes;
                total.wipes += report.wipes;
                total.rebuilds += report.rebuilds;
                total.network.requests_dropped += report.network.requests_dropped;
                total.network.answers_dropped += report.network.answers_dropped;
            }
            Err(failure) => panic!("{name}: {failure}"),
        }
    }
    eprintln!(
        "{name}: seeds {base}..{} passed in {:.1} s: {} writes acknowledged, {} not, {} reads \
         checked, {} bytes checked, {} client kills, {} server kills ({} wiped), {} rebuilds, \
         {} requests and {} answers dropped",
        base + count,
        started.elapsed().as_secs_f64(),
        total.writes_acked,
        total.writes_unacked,
        total.reads_checked,
        total.bytes_checked,
        total.client_crashes,
        total.server_crashes,
        total.wipes,
        total.rebuilds,
        total.network.requests_dropped,
        total.network.answers_dropped,
    );
}

/// Delayed messages only.
fn slow() -> MemFaults {
    MemFaults {
        delay: 0.1,
        delay_max: Duration::from_millis(5),
        ..MemFaults::default()
    }
}

/// Lost and delayed messages.
fn lossy() -> MemFaults {
    MemFaults {
        drop_request: 0.002,
        drop_answer: 0.002,
        delay: 0.1,
        delay_max: Duration::from_millis(5),
    }
}

/// Servers killed at random requests (restarted at once, kept down for some operations, or
/// wiped), delayed messages, every scheme: no client is killed, so every write either is
/// acknowledged and must read back exact, or failed cleanly.
#[test]
fn server_kills_losses_and_wipes_every_scheme() {
    let config = ExploreConfig {
        server_crash: 0.2,
        server_loss: 0.5,
        wipe: 0.2,
        network: slow(),
        ..ExploreConfig::default()
    };
    explore("server faults, every scheme", config, 150);
}

/// As above with lost requests and answers too. Fails today: lost messages make two servers
/// stale at once, and neither rebuild then finishes ("raid5 file is unavailable: server 1 and
/// server 4"; seeds 4 and 23 of the first runs: 2 servers still stale after recovery).
/// Whether that is a true double fault (both missed the same stripes) or rebuild refusing a
/// file it could rebuild stripe by stripe is the next thing to find out.
#[test]
#[ignore = "two servers stale at once after lost messages are never rebuilt: to be diagnosed"]
fn lost_messages_with_server_faults_every_scheme() {
    let config = ExploreConfig {
        server_crash: 0.2,
        server_loss: 0.5,
        wipe: 0.2,
        network: lossy(),
        ..ExploreConfig::default()
    };
    explore("lost messages and server faults, every scheme", config, 150);
}

/// Clients killed at random requests, with the server faults above, for the schemes without
/// parity (a killed RAID-1 write leaves the copies differing only in unacknowledged bytes).
#[test]
fn client_kills_with_server_faults_raid0_raid1() {
    let config = ExploreConfig {
        schemes: vec![Scheme::Raid0, Scheme::Raid1],
        client_crash: 0.25,
        server_crash: 0.2,
        server_loss: 0.5,
        wipe: 0.2,
        network: slow(),
        ..ExploreConfig::default()
    };
    explore("client kills, raid0 and raid1", config, 150);
}

/// The RAID-4/5 write hole (issue 15 item 1): a client killed between its data and parity
/// writes, then a server lost, makes reconstruction from the stale parity wrong. Fails today
/// (seed 2: raid4, 3,622 bytes of an unacknowledged write rebuilt as neither old nor new);
/// to be enabled when the parity fix lands.
#[test]
#[ignore = "RAID-4/5 write hole, issue 15 item 1: enable when the parity helper's fix lands"]
fn write_hole_client_kills_then_server_loss_parity_schemes() {
    let config = ExploreConfig {
        schemes: vec![Scheme::Raid4, Scheme::Raid5, Scheme::Hybrid],
        client_crash: 0.25,
        server_crash: 0.2,
        server_loss: 0.5,
        wipe: 0.2,
        network: slow(),
        ..ExploreConfig::default()
    };
    explore("write hole: client kills, parity schemes", config, 150);
}
