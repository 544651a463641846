//! Membership of the replicated manager's group under faults (issue 17 item 3; see
//! `tessera_sim::metadata`): with spare replicas, the fault injector also adds spares to the
//! group (an empty store, state transfer once a member) and removes members (stopped once
//! the new group runs), between kills, restarts and partitions of members. Every client
//! answer is checked against the sequential model (the history stays linearizable), and
//! after recovery every member must hold the same store, the stored group included.
//! `TESSERA_SIM_SEED=N` replays one seed, `TESSERA_SIM_SEEDS=N` runs N from
//! `TESSERA_SIM_SEED_BASE`.

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
                total.group_changes += report.group_changes;
                total.added += report.added;
                total.removed += report.removed;
            }
            Err(failure) => panic!("{name}: {failure}"),
        }
    }
    eprintln!(
        "{name}: seeds {base}..{} passed in {:.1} s: {} answers checked ({} changes \
         acknowledged), {} unknown, {} spares started to be added, {} removals proposed, {} \
         group changes applied (summed over replicas), {} kills, {} restarts, {} catch-ups \
         from a peer's store, {} partitions",
        base + count,
        started.elapsed().as_secs_f64(),
        total.checked,
        total.acknowledged_changes,
        total.unknown,
        total.added,
        total.removed,
        total.group_changes,
        total.kills,
        total.restarts,
        total.catch_ups,
        total.partitions,
    );
    total
}

#[test]
fn replicas_added_and_removed_between_kills() {
    let config = MetadataConfig {
        spares: 2,
        ..MetadataConfig::default()
    };
    let total = check("three replicas and two spares", config, 16);
    if std::env::var_os("TESSERA_SIM_SEED").is_none() {
        assert!(total.added > 0 && total.removed > 0, "{total:?}");
        assert!(total.group_changes > 0, "{total:?}");
    }
}

#[test]
fn five_replicas_changing_with_lost_datagrams() {
    let config = MetadataConfig {
        replicas: 5,
        spares: 2,
        order: OrderFaults {
            loss: 0.02,
            ..OrderFaults::default()
        },
        ..MetadataConfig::default()
    };
    let total = check("five replicas and two spares, 2% loss", config, 6);
    if std::env::var_os("TESSERA_SIM_SEED").is_none() {
        assert!(total.group_changes > 0, "{total:?}");
    }
}
