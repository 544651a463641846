//! The replicated manager's checker in CI (issue 17, item 6; see
//! `tessera_sim::metadata`): clients change and read metadata while manager replicas are
//! killed, restarted and cut off; every answer is checked against a sequential model, and
//! after recovery every replica must hold the same store. `TESSERA_SIM_SEED=N` replays one
//! seed, `TESSERA_SIM_SEEDS=N` runs N (a soak), from `TESSERA_SIM_SEED_BASE`.

use std::time::Instant;
use tessera_sim::explore::seed_range;
use tessera_sim::metadata::{check_metadata, MetadataConfig, MetadataReport};
use tessera_sim::replicas::OrderFaults;

/// Runs `seeds` seeds (or what the environment asks) and fails with the first failure; what
/// they did, summed.
fn check(name: &str, config: MetadataConfig, seeds: u64) -> MetadataReport {
    let (base, count) = seed_range(seeds);
    let started = Instant::now();
    let mut total = MetadataReport::default();
    for seed in base..base + count {
        match check_metadata(seed, &config) {
            Ok(report) => {
                total.checked += report.checked;
                total.acknowledged_changes += report.acknowledged_changes;
                total.unknown += report.unknown;
                total.kills += report.kills;
                total.restarts += report.restarts;
                total.partitions += report.partitions;
                total.catch_ups += report.catch_ups;
                total.group_restarts += report.group_restarts;
                total.unsynced_lost += report.unsynced_lost;
                total.once_expiries += report.once_expiries;
                total.datagrams += report.datagrams;
                total.datagrams_lost += report.datagrams_lost;
                total.states_max = total.states_max.max(report.states_max);
            }
            Err(failure) => panic!("{name}: {failure}"),
        }
    }
    eprintln!(
        "{name}: seeds {base}..{} passed in {:.1} s: {} answers checked ({} changes \
         acknowledged), {} unknown, {} replica kills, {} restarts ({} catch-ups from a peer's \
         store), {} whole-group kills, {} kills that lost unsynced commits, {} ExpireOnce applied, \
         {} partitions, {} of {} order datagrams lost, at most {} namespaces followed",
        base + count,
        started.elapsed().as_secs_f64(),
        total.checked,
        total.acknowledged_changes,
        total.unknown,
        total.kills,
        total.restarts,
        total.catch_ups,
        total.group_restarts,
        total.unsynced_lost,
        total.once_expiries,
        total.partitions,
        total.datagrams_lost,
        total.datagrams,
        total.states_max,
    );
    total
}

#[test]
fn three_replicas_killed_restarted_and_cut_off() {
    let total = check("three replicas", MetadataConfig::default(), 24);
    if std::env::var_os("TESSERA_SIM_SEED").is_none() {
        // The faults this checks against happened: whole-group kills, kills that lost
        // commits made without sync, and expiries of the once answers.
        assert!(total.group_restarts > 0, "{total:?}");
        assert!(total.unsynced_lost > 0, "{total:?}");
        assert!(total.once_expiries > 0, "{total:?}");
    }
}

#[test]
fn five_replicas_with_lost_datagrams() {
    let config = MetadataConfig {
        replicas: 5,
        order: OrderFaults {
            loss: 0.02,
            ..OrderFaults::default()
        },
        ..MetadataConfig::default()
    };
    check("five replicas, 2% loss", config, 8);
}

#[test]
fn a_seed_replays_exactly() {
    let config = MetadataConfig {
        operations: 12,
        ..MetadataConfig::default()
    };
    for seed in 0..2 {
        let first = check_metadata(seed, &config).expect("a run");
        let second = check_metadata(seed, &config).expect("a run");
        assert_eq!(format!("{first:?}"), format!("{second:?}"), "seed {seed}");
    }
}
