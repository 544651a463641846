//! The checker's sweep: thousands of seeded simulator runs with loss, reordering, crashes,
//! restarts, partitions and (in a third of the all-to-all runs) nodes added and removed by
//! ordered group changes, each history checked for UTO1-UTO4 and FIFO.
//!
//! `TESSERA_ORDER_SEEDS=N` runs N seeds (the soak: millions), from
//! `TESSERA_ORDER_SEED_START` (default 0); `TESSERA_ORDER_SEED=S` replays seed S alone and
//! prints its scenario and outcome. A failing seed is printed with its violations.

use std::time::Instant;
use tessera_order::{check, sim};

const SEEDS_DEFAULT: u64 = 3_000;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
    })
}

/// Runs one seed; the violations, if any, as one line each.
fn run_seed(seed: u64) -> Result<sim::Outcome, Vec<String>> {
    let scenario = sim::Scenario::random(seed);
    let outcome = std::panic::catch_unwind(|| sim::run(seed, &scenario)).map_err(|_| {
        vec![format!(
            "seed {seed}: the run panicked (an invariant assertion)"
        )]
    })?;
    match check::check(&outcome.history) {
        Ok(_) => Ok(outcome),
        Err(violations) => Err(violations
            .iter()
            .map(|violation| format!("seed {seed}: {violation}"))
            .collect()),
    }
}

/// Runs one seed, printing its scenario, the network's and every node's counts and state.
fn replay(seed: u64) {
    let scenario = sim::Scenario::random(seed);
    println!("{scenario:#?}");
    let outcome = sim::run(seed, &scenario);
    println!(
        "{:#?}\nsettled early: {} at {} µs",
        outcome.stats, outcome.settled_early, outcome.end_us
    );
    for line in &outcome.node_summaries {
        println!("{line}");
    }
    for stats in &outcome.node_stats {
        println!("{stats:?}");
    }
    if let Err(violations) = check::check(&outcome.history) {
        panic!("seed {seed}: {violations:#?}");
    }
}

#[test]
fn seeded_runs_keep_uto_and_fifo() {
    if let Some(seed) = env("TESSERA_ORDER_SEED") {
        replay(seed);
        return;
    }
    let start = env("TESSERA_ORDER_SEED_START").unwrap_or(0);
    let seeds = env("TESSERA_ORDER_SEEDS").unwrap_or(SEEDS_DEFAULT);
    let began = Instant::now();
    let mut failures = Vec::new();
    let (mut crashes, mut partitions, mut lost, mut view_changes, mut delivered) = (0, 0, 0, 0, 0);
    let mut unsettled = Vec::new();
    let mut gaps = 0;
    let (mut oversized, mut parts, mut fetched) = (0, 0, 0);
    let (mut changing_runs, mut added, mut removed) = (0, 0, 0);
    for seed in start..start + seeds {
        match run_seed(seed) {
            Ok(outcome) => {
                if !outcome.settled_early {
                    unsettled.push(seed);
                }
                gaps += outcome
                    .history
                    .processes
                    .iter()
                    .map(|p| p.gaps.len() as u64)
                    .sum::<u64>();
                crashes += outcome.stats.crashes;
                changing_runs += u64::from(outcome.stats.changes_proposed > 0);
                added += outcome.stats.nodes_added;
                removed += outcome.stats.nodes_removed;
                oversized += outcome.stats.oversized;
                parts += outcome
                    .node_stats
                    .iter()
                    .map(|s| s.view_change_parts_sent)
                    .sum::<u64>();
                fetched += outcome
                    .node_stats
                    .iter()
                    .map(|s| s.positions_fetched)
                    .sum::<u64>();
                partitions += outcome.stats.partitions;
                lost += outcome.stats.lost;
                view_changes += outcome.stats.view_changes;
                delivered += outcome
                    .history
                    .processes
                    .iter()
                    .map(|p| p.deliveries.len() as u64)
                    .sum::<u64>();
            }
            Err(mut lines) => {
                eprintln!("{}", lines.join("\n"));
                failures.append(&mut lines);
            }
        }
        // The soak's progress, so that a long run stopped early still says how far it got.
        let done = seed - start + 1;
        if done.is_multiple_of(10_000) && done < seeds {
            eprintln!(
                "{done} seeds from {start} in {:.0} s: {} violations so far",
                began.elapsed().as_secs_f64(),
                failures.len()
            );
        }
    }
    println!(
        "{seeds} seeds from {start} in {:.1} s: {} violations; {crashes} crashes, {partitions} \
         partitions, {lost} packets lost, {view_changes} view changes, {delivered} deliveries, {gaps} gaps (state transfers), {fetched} positions fetched instead, {parts} view-change parts, \
         {oversized} packets over a datagram; group changes in {changing_runs} runs: {added} \
         nodes added, {removed} removed; \
         {} runs reached the deadline unsettled {:?}",
        began.elapsed().as_secs_f64(),
        failures.len(),
        unsettled.len(),
        &unsettled[..unsettled.len().min(10)]
    );
    assert_eq!(oversized, 0, "every packet must fit one datagram");
    assert!(
        failures.is_empty(),
        "{} violations; replay with TESSERA_ORDER_SEED=<seed>",
        failures.len()
    );
    // The sweep must exercise the faults it claims to.
    if seeds >= 500 {
        assert!(crashes > 0 && partitions > 0 && lost > 0 && view_changes > 0);
        assert!(added > 0 && removed > 0);
    }
}
