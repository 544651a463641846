//! The explorer in CI: fixed seed ranges per fault combination (see the crate docs). Each
//! failing seed is printed with its trace; `TESSERA_SIM_SEED=N` replays one seed,
//! `TESSERA_SIM_SEEDS=N` runs N seeds per test (a soak), from `TESSERA_SIM_SEED_BASE`.
//! `RUST_LOG` (e.g. `tessera_client=debug`) prints the cluster's log with a replay.

use std::time::{Duration, Instant};
use tessera_client::Scheme;
use tessera_sim::explore::seed_range;
use tessera_sim::{log_if_asked, replay, ExploreConfig};
use tessera_transport::MemFaults;

/// Run `seeds` seeds (or what the environment asks) and fail with the first failure's seed.
fn explore(name: &str, config: ExploreConfig, seeds: u64) {
    log_if_asked();
    let (base, count) = seed_range(seeds);
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
                total.power_losses += report.power_losses;
                total.writes_lost += report.writes_lost;
                total.bit_flips += report.bit_flips;
                total.stores_refused += report.stores_refused;
                total.scrub_repairs += report.scrub_repairs;
                total.scrub_repairs_past_size += report.scrub_repairs_past_size;
                total.scrubs_beside += report.scrubs_beside;
                total.scrub_beside_repairs += report.scrub_beside_repairs;
                total.scrubs_killed += report.scrubs_killed;
                total.rebuilds += report.rebuilds;
                total.torn_stripes_unreadable += report.torn_stripes_unreadable;
                total.network.requests_dropped += report.network.requests_dropped;
                total.network.answers_dropped += report.network.answers_dropped;
            }
            Err(failure) => panic!("{name}: {failure}"),
        }
    }
    eprintln!(
        "{name}: seeds {base}..{} passed in {:.1} s: {} writes acknowledged, {} not, {} reads \
         checked, {} bytes checked, {} client kills, {} server kills ({} wiped, {} power losses \
         dropping or tearing {} writes), {} bits flipped ({} stores refused), {} rebuilds, {} \
         scrub repairs ({} past the size), {} scrubs beside operations ({} repairs, {} killed), {} requests \
         and {} answers dropped, {} torn stripes unreadable with a server lost",
        base + count,
        started.elapsed().as_secs_f64(),
        total.writes_acked,
        total.writes_unacked,
        total.reads_checked,
        total.bytes_checked,
        total.client_crashes,
        total.server_crashes,
        total.wipes,
        total.power_losses,
        total.writes_lost,
        total.bit_flips,
        total.stores_refused,
        total.rebuilds,
        total.scrub_repairs,
        total.scrub_repairs_past_size,
        total.scrubs_beside,
        total.scrub_beside_repairs,
        total.scrubs_killed,
        total.network.requests_dropped,
        total.network.answers_dropped,
        total.torn_stripes_unreadable,
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
    explore("server faults, every scheme", config, 400);
}

/// As above with lost requests and answers too (only while every server is up). Before parity
/// locks had leases, 3 of seeds 0..300 (215, 218, 269) failed: a lost answer to a `LockParity`
/// left the lock held by the live client's open connection, its next partial write of that
/// stripe queued behind its own lock and marked the healthy parity server down.
#[test]
fn lost_messages_with_server_faults_every_scheme() {
    explore(
        "lost messages and server faults, every scheme",
        lost_messages_config(),
        150,
    );
}

fn lost_messages_config() -> ExploreConfig {
    ExploreConfig {
        server_crash: 0.2,
        server_loss: 0.5,
        wipe: 0.2,
        network: lossy(),
        ..ExploreConfig::default()
    }
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
    explore("client kills, raid0 and raid1", config, 400);
}

/// Servers lose power at random requests (their in-memory disks keep, drop or tear each write
/// not synced), besides process kills, losses and wipes, on every scheme: every acknowledged
/// byte reads exact, synced or not (a store that lost answered writes comes back empty as a
/// new incarnation and is rebuilt from the others; RAID-0 files on it may no longer be read),
/// during the run, after recovery, and with each server lost in turn. With the store keeping
/// what the power loss left instead (its bytes, no new incarnation), seed 1 fails: three
/// servers with torn blocks in the same stripes, unrebuildable.
#[test]
fn power_losses_with_server_faults_every_scheme() {
    explore(
        "power losses and server faults, every scheme",
        power_loss_config(),
        150,
    );
}

fn power_loss_config() -> ExploreConfig {
    ExploreConfig {
        server_crash: 0.25,
        server_loss: 0.3,
        wipe: 0.1,
        power_loss: 0.7,
        network: slow(),
        ..ExploreConfig::default()
    }
}

/// Seeds of the soak runs (past the CI's ranges) that failed once.
/// - Lost messages, 1084: the data requests of one read-modify-write to two columns of a
///   stripe were both lost; each column was recorded owing the stripe, though both servers
///   were up and answering: two columns owing one stripe is beyond what parity rebuilds, so
///   the stripe stayed unreadable for good. A request that timed out at a server that
///   answers a fresh ping is now sent once more when sending it again is harmless.
/// - Power losses, 1133: a rebuild cleared an orphaned stale-parity record after its sync, so
///   a power loss right after brought the record back; with one more server lost, the stripe
///   read as torn though its parity was whole. The clearing now goes before the sync.
/// - Write hole, 3776: acknowledged bytes of a Hybrid file read as those of an earlier,
///   unacknowledged write. A torn-stripe resolver waited long for a stripe's lock; meanwhile
///   a column went down, missed a full-stripe write of the stripe and came back, and the
///   resolver, its view of the file from before, recomputed parity from the column's old unit
///   and rebuilt the column from it. A lock holder now asks the manager again which columns
///   owe the stripe once its lock is granted. Then a resolver's parity, computed from units
///   read across a full-stripe write (which took no lock), rebuilt a unit wrong: a full-stripe
///   write's stale-parity record now waits for the stripes' settled lock holders.
#[test]
fn fault_regressions() {
    let cases = [
        (1084, lost_messages_config()),
        (1133, power_loss_config()),
        (3776, write_hole_config()),
    ];
    for (seed, config) in cases {
        if let Err(failure) = replay(seed, &config) {
            panic!("regression seed: {failure}");
        }
    }
}

/// Bits flip in any file of any server at random operations (data, checksums, overflow bytes
/// and log, intent and file records, `store.toml`), with server kills and losses, on the
/// redundant schemes: every read is exact or fails, never wrong; a refused `store.toml`
/// starts the server blank and it is rebuilt; after a scrub every file reads exact with each
/// server lost in turn. A flipped server is restarted before the scrub that follows, so that
/// damage read only at start (`store.toml`, the overflow log, intent records) is found then,
/// not with another server down.
///
/// Seeds 0..2000 pass (12,905 flips, 1,861 `store.toml` refusals, 411,570 repairs past
/// files' sizes). See [`bit_flip_regressions`] for what failed before.
#[test]
fn bit_flips_with_server_faults_redundant_schemes() {
    explore(
        "bit flips and server faults, redundant schemes",
        bit_flip_config(),
        100,
    );
}

fn bit_flip_config() -> ExploreConfig {
    ExploreConfig {
        schemes: vec![Scheme::Raid1, Scheme::Raid4, Scheme::Raid5, Scheme::Hybrid],
        bit_flip: 0.3,
        server_crash: 0.15,
        server_loss: 0.3,
        network: slow(),
        ..ExploreConfig::default()
    }
}

/// Scrubs of every file run beside the workload (at a third of the operations, by another
/// client), so that their repairs race the writes, with clients killed between their primary
/// and mirror copies or inside a read-modify-write (leaving copies that differ, or parity, for
/// the scrubs to repair) and servers killed: no acknowledged byte is ever read wrong, during
/// the run, after recovery, and with each server lost in turn. With RAID-1 copies written in
/// parallel again (before session 27), seed 129 of the RAID-1 and Hybrid runs lost 4,087
/// acknowledged bytes: a scrub copied a primary over a mirror that a racing write had
/// already reached, before that write's primary copy landed.
#[test]
fn scrubs_beside_writes_with_client_and_server_kills_every_scheme() {
    explore(
        "scrubs beside writes, client and server kills, every scheme",
        scrub_beside_config(),
        60,
    );
}

/// As above with the scrubs themselves killed at a random request (at 40% of them): a repair
/// cut midway (a mirror half rewritten, a fence left standing until its lease lapses, a
/// column's stripe half rebuilt) never makes an acknowledged byte read wrong, and the writes
/// held by a dead scrubber's fence go on once it lapses.
#[test]
fn killed_scrubs_beside_writes_every_scheme() {
    explore(
        "killed scrubs beside writes, client and server kills, every scheme",
        ExploreConfig {
            scrub_kill: 0.4,
            ..scrub_beside_config()
        },
        40,
    );
}

fn scrub_beside_config() -> ExploreConfig {
    ExploreConfig {
        client_crash: 0.25,
        server_crash: 0.15,
        server_loss: 0.3,
        scrub_beside: 0.35,
        network: slow(),
        ..ExploreConfig::default()
    }
}

/// Seeds of the bit-flip runs that failed once. 196 (122 before the workload changed): a
/// flipped `overflow.log` record makes its server answer *corrupt* for every overflow range
/// of the file, up to the maximum size; scrub repaired only the stripes inside the file's
/// size, so the damage stayed past it, and so did a flipped checksum entry of a block never
/// written on another server. The file then grew over them and a Hybrid stripe had three
/// corrupt columns: unreadable (never wrong). Scrub now also checks the stripes past the size
/// that some server holds bytes or damage in (at most 1,024), so each flip's damage is
/// repaired before the next one.
#[test]
fn bit_flip_regressions() {
    for seed in [122, 196] {
        if let Err(failure) = replay(seed, &bit_flip_config()) {
            panic!("bit flips, regression seed: {failure}");
        }
    }
}

/// A seed replays: the same run, to the network's last counter, every time.
#[test]
fn a_seed_replays_exactly() {
    let config = ExploreConfig {
        client_crash: 0.25,
        server_crash: 0.2,
        server_loss: 0.5,
        wipe: 0.2,
        network: lossy(),
        schemes: vec![Scheme::Raid1, Scheme::Hybrid],
        ..ExploreConfig::default()
    };
    let mut passed = 0;
    for seed in 0..5 {
        let first = format!("{:?}", replay(seed, &config));
        let again = format!("{:?}", replay(seed, &config));
        assert_eq!(first, again, "seed {seed} ran differently twice");
        // A run that fails replays its failure just as exactly (on the in-memory disks, seed
        // 2 ends at a Hybrid write hole of issue 15 item 1: unacknowledged bytes only).
        passed += u32::from(first.contains("network: MemStats"));
    }
    assert!(passed >= 3, "most seeds run to the end: {passed} of 5");
}

/// The RAID-4/5 write hole (issue 15 item 1): clients killed at random requests, with server
/// faults and losses, on the parity schemes: no *acknowledged* byte is ever read wrong. Before
/// the intent records, 7 of seeds 0..100 lost acknowledged bytes (seed 6: 8,161 bytes of a
/// raid4 file with server 1 lost after recovery; 13, 72, 77, 84, 89, 95). Before the
/// stale-parity records of full-stripe writes, seed 72 of 0..150 still did (279 acknowledged
/// bytes of a raid4 file, server 2 lost after recovery): a client killed inside a full-stripe
/// write left that stripe's parity stale with no record, and a later acknowledged
/// read-modify-write computed `P ^ D ^ D'` from it. A run that ends at a byte of an
/// unacknowledged write read as neither old nor new is counted here (the strict test below
/// fails on it); the count is printed and must stay below the runs.
#[test]
fn write_hole_no_acknowledged_byte_lost_parity_schemes() {
    log_if_asked();
    let config = write_hole_config();
    let (base, count) = seed_range(150);
    let mut torn_unacknowledged = Vec::new();
    for seed in base..base + count {
        let Err(failure) = replay(seed, &config) else {
            continue;
        };
        match &failure.mismatch {
            Some(m) if m.wrong_acknowledged == 0 => torn_unacknowledged.push(seed),
            _ => panic!("write hole, acknowledged bytes: {failure}"),
        }
    }
    eprintln!(
        "write hole: seeds {base}..{}: 0 acknowledged bytes wrong; {} runs ended at an \
         unacknowledged write read as neither old nor new: {torn_unacknowledged:?}",
        base + count,
        torn_unacknowledged.len()
    );
    assert!(
        (torn_unacknowledged.len() as u64) < count.max(2),
        "every run ended early at a torn unacknowledged write, so nothing was checked"
    );
}

/// The strict form: bytes of an interrupted write read as old or new, never a mix computed
/// from stale parity; the one exception the model allows is a stripe an interrupted
/// full-stripe write covered whole, not resolved since, which may read as an *error* while a
/// column is lost (`tessera-store`'s `stale` module argues why). Before the stale-parity
/// records it failed at seed 8 (3,004 bytes of an interrupted raid4 write rebuilt as neither).
/// The run also found a rebuild that stopped at the file's size: a wiped parity column's unit
/// past it (bytes of an unacknowledged write) stayed a hole, and a later write growing the
/// file over it computed parity from that hole (seed 84, 2,067 acknowledged bytes).
#[test]
fn write_hole_client_kills_then_server_loss_parity_schemes() {
    explore(
        "write hole: client kills, parity schemes",
        write_hole_config(),
        150,
    );
}

/// Client kills inside read-modify-writes and full-stripe writes, with power losses, on
/// RAID-4 and RAID-5 (seeds 1000..4000 pass: 10,469 client kills, 3,768 power losses; Hybrid
/// in the next test): since session 24 an intent or stale-parity record is answered before it is synced, under the
/// store's durable `unsynced` mark, so a power loss of its server before the next sync must
/// renew that store (rebuilt from the others, its parity with it) rather than leave a
/// stripe whose record is gone and whose parity a dead writer left stale.
#[test]
fn write_hole_client_kills_with_power_losses_parity_schemes() {
    explore(
        "write hole: client kills and power losses, parity schemes",
        ExploreConfig {
            power_loss: 0.5,
            schemes: vec![Scheme::Raid4, Scheme::Raid5],
            ..write_hole_config()
        },
        150,
    );
}

/// The same with Hybrid. Until session 25 it failed (seeds 1012 and 2069, replayed by the
/// next test): a scrub, here the torn-stripe resolver's, repaired a differing overflow mirror
/// by rebuilding the mirror column's whole stripe, which also replaced another block's
/// primary entries by that block's mirror an interrupted write had left short (1,304 bytes
/// read as zeros); and it repaired from listings made long before, over a slow network, after
/// the primary's server had gone down and an acknowledged write had reached only the mirror,
/// whose entries the repair then invalidated (8,155 and 106 acknowledged bytes lost).
#[test]
fn write_hole_client_kills_with_power_losses_hybrid() {
    explore(
        "write hole: client kills and power losses, hybrid",
        ExploreConfig {
            power_loss: 0.5,
            schemes: vec![Scheme::Hybrid],
            ..write_hole_config()
        },
        150,
    );
}

/// The two seeds that found the Hybrid scrub's bugs above, replayed whatever the seed range.
#[test]
fn write_hole_hybrid_seeds_that_lost_bytes() {
    log_if_asked();
    let hybrid = ExploreConfig {
        power_loss: 0.5,
        schemes: vec![Scheme::Hybrid],
        ..write_hole_config()
    };
    let mixed = ExploreConfig {
        power_loss: 0.5,
        ..write_hole_config()
    };
    for (seed, config) in [(1012, hybrid), (2069, mixed)] {
        if let Err(failure) = replay(seed, &config) {
            panic!("Hybrid with power losses: {failure}");
        }
    }
}

fn write_hole_config() -> ExploreConfig {
    ExploreConfig {
        schemes: vec![Scheme::Raid4, Scheme::Raid5, Scheme::Hybrid],
        client_crash: 0.25,
        server_crash: 0.2,
        server_loss: 0.5,
        wipe: 0.2,
        network: slow(),
        ..ExploreConfig::default()
    }
}
