//! The replicated manager's checker in CI (issue 17, item 6; see
//! `tessera_sim::metadata`): clients change and read metadata while manager replicas are
//! killed, restarted and cut off; every answer is checked against a sequential model, and
//! after recovery every replica must hold the same store. `TESSERA_SIM_SEED=N` replays one
//! seed, `TESSERA_SIM_SEEDS=N` runs N (a soak), from `TESSERA_SIM_SEED_BASE`.

use tessera_sim::metadata::{check_metadata, check_seeds, MetadataConfig};
use tessera_sim::replicas::OrderFaults;

#[test]
fn three_replicas_killed_restarted_and_cut_off() {
    let total = check_seeds("three replicas", &MetadataConfig::default(), 24);
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
    check_seeds("five replicas, 2% loss", &config, 8);
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
