//! Membership of the replicated manager's group under faults (issue 17 item 3; see
//! `tessera_sim::metadata`): with spare replicas, the fault injector also adds spares to the
//! group (an empty store, state transfer once a member) and removes members (stopped once
//! the new group runs), between kills, restarts and partitions of members, and once the
//! group changed, kills the whole group now and then: it must start again as the changed
//! group (the most advanced store's), the replicas out of it left down. Every client
//! answer is checked against the sequential model (the history stays linearizable), and
//! after recovery every member must hold the same store, the stored group included.
//! `TESSERA_SIM_SEED=N` replays one seed, `TESSERA_SIM_SEEDS=N` runs N from
//! `TESSERA_SIM_SEED_BASE`.

use tessera_sim::metadata::{check_seeds, MetadataConfig};
use tessera_sim::replicas::OrderFaults;

#[test]
fn replicas_added_and_removed_between_kills() {
    let config = MetadataConfig {
        spares: 2,
        ..MetadataConfig::default()
    };
    let total = check_seeds("three replicas and two spares", &config, 16);
    if std::env::var_os("TESSERA_SIM_SEED").is_none() {
        assert!(total.added > 0 && total.removed > 0, "{total:?}");
        assert!(total.group_changes > 0, "{total:?}");
        assert!(total.group_restarts > 0, "no whole-group kill: {total:?}");
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
    let total = check_seeds("five replicas and two spares, 2% loss", &config, 6);
    if std::env::var_os("TESSERA_SIM_SEED").is_none() {
        assert!(total.group_changes > 0, "{total:?}");
    }
}
