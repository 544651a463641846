use super::*;
use proptest::prelude::*;

fn one_slot(rebuild_bytes_per_s: Option<u64>) -> Scheduler {
    Scheduler::new(ScheduleConfig {
        disk_slots: 1,
        rebuild_bytes_per_s,
    })
}

/// Dispatches and finishes one request at `now_us`.
fn serve_one(scheduler: &mut Scheduler, now_us: u64) -> Option<Ticket> {
    let ticket = scheduler.dispatch(now_us)?;
    scheduler.finish();
    Some(ticket)
}

#[derive(Debug, Clone)]
enum Step {
    Arrive { service: Service, bytes: u64 },
    Serve,
}

fn service() -> impl Strategy<Value = Service> {
    prop_oneof![
        (0u64..5_000).prop_map(|deadline_us| Service::Reserved { deadline_us }),
        Just(Service::BestEffort),
        Just(Service::Background),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        (service(), 1u64..1 << 20).prop_map(|(service, bytes)| Step::Arrive { service, bytes }),
        Just(Step::Serve),
    ];
    prop::collection::vec(step, 1..300)
}

#[test]
fn reserved_go_ahead_of_best_effort_and_background() {
    let mut scheduler = one_slot(None);
    let bulk: Vec<_> = (0..4)
        .map(|_| scheduler.enqueue(Service::BestEffort, 1 << 20, 0))
        .collect();
    let rebuild = scheduler.enqueue(Service::Background, 1 << 20, 0);
    let late = scheduler.enqueue(Service::Reserved { deadline_us: 900 }, 4096, 10);
    let soon = scheduler.enqueue(Service::Reserved { deadline_us: 100 }, 4096, 20);
    let order: Vec<_> = std::iter::from_fn(|| serve_one(&mut scheduler, 30)).collect();
    let mut expected = vec![soon, late];
    expected.extend(&bulk);
    expected.push(rebuild);
    assert_eq!(order, expected);
    assert_eq!(scheduler.stats().unreserved_ahead_of_reserved, 0);
}

#[test]
fn background_keeps_to_the_rebuild_rate() {
    // 1 MB/s: a 100 KB request costs 100 ms of the rate.
    let mut scheduler = one_slot(Some(1_000_000));
    for _ in 0..5 {
        scheduler.enqueue(Service::Background, 100_000, 0);
    }
    assert!(serve_one(&mut scheduler, 0).is_some());
    // The burst allowance is 100 ms: one more goes at once, then one per 100 ms.
    assert!(serve_one(&mut scheduler, 0).is_none());
    assert_eq!(scheduler.background_ready_at_us(), Some(100_000));
    assert!(serve_one(&mut scheduler, 99_999).is_none());
    assert!(serve_one(&mut scheduler, 100_000).is_some());
    assert!(serve_one(&mut scheduler, 150_000).is_none());
    assert!(serve_one(&mut scheduler, 200_000).is_some());
    // Best effort is not held back by the rebuild's rate.
    let bulk = scheduler.enqueue(Service::BestEffort, 1 << 20, 200_000);
    assert_eq!(serve_one(&mut scheduler, 200_001), Some(bulk));
}

#[test]
fn slots_bound_the_requests_served_at_once() {
    let mut scheduler = Scheduler::new(ScheduleConfig {
        disk_slots: 3,
        rebuild_bytes_per_s: None,
    });
    for _ in 0..5 {
        scheduler.enqueue(Service::BestEffort, 1, 0);
    }
    let dispatched: Vec<_> = std::iter::from_fn(|| scheduler.dispatch(0)).collect();
    assert_eq!(dispatched, vec![0, 1, 2]);
    scheduler.finish();
    assert_eq!(scheduler.dispatch(0), Some(3));
    assert_eq!(scheduler.dispatch(0), None);
    assert_eq!(scheduler.stats().waiting, 1);
}

proptest! {
    /// Reserved requests alone are dispatched earliest deadline first, ties by arrival.
    #[test]
    fn reserved_requests_go_earliest_deadline_first(
        arrivals in prop::collection::vec((0u64..10_000, 0u64..u64::MAX / 2), 1..100),
    ) {
        let mut scheduler = one_slot(None);
        let mut deadlines = Vec::new();
        for &(deadline_us, now_us) in &arrivals {
            let ticket = scheduler.enqueue(Service::Reserved { deadline_us }, 1, now_us);
            deadlines.push((now_us + deadline_us, ticket));
        }
        deadlines.sort_unstable();
        let order: Vec<_> = std::iter::from_fn(|| serve_one(&mut scheduler, 0)).collect();
        let expected: Vec<_> = deadlines.iter().map(|&(_, ticket)| ticket).collect();
        prop_assert_eq!(order, expected);
    }

    /// Under any arrivals: an unreserved request goes while a reserved one waits only on the
    /// starvation rule's turn (after `RESERVED_RUN_MAX` reserved in a row), and every
    /// best-effort request is dispatched within `(k + 1) * (RESERVED_RUN_MAX + 1)` dispatches
    /// of its arrival, `k` the unreserved requests ahead of it (none rate-held: no cap here).
    #[test]
    fn best_effort_waits_a_bounded_number_of_turns(steps in steps()) {
        let mut scheduler = one_slot(None);
        let mut reserved_waiting = std::collections::BTreeSet::new();
        let mut unreserved_waiting = VecDeque::new();
        let mut bound: HashMap<Ticket, u64> = HashMap::new();
        let (mut dispatches, mut run) = (0u64, 0u32);
        let steps = steps.into_iter().chain(std::iter::repeat_n(Step::Serve, 300));
        for step in steps {
            match step {
                Step::Arrive { service, bytes } => {
                    let reserved = matches!(service, Service::Reserved { .. });
                    let ticket = scheduler.enqueue(service, bytes, 0);
                    if reserved {
                        reserved_waiting.insert(ticket);
                    } else {
                        let turns = (unreserved_waiting.len() as u64 + 1)
                            * u64::from(RESERVED_RUN_MAX + 1);
                        bound.insert(ticket, dispatches + turns);
                        unreserved_waiting.push_back(ticket);
                    }
                }
                Step::Serve => {
                    let Some(ticket) = serve_one(&mut scheduler, 0) else {
                        prop_assert!(reserved_waiting.is_empty() && unreserved_waiting.is_empty());
                        continue;
                    };
                    dispatches += 1;
                    if reserved_waiting.remove(&ticket) {
                        run = if unreserved_waiting.is_empty() { 0 } else { run + 1 };
                        prop_assert!(run <= RESERVED_RUN_MAX);
                    } else {
                        prop_assert_eq!(unreserved_waiting.pop_front(), Some(ticket));
                        prop_assert!(reserved_waiting.is_empty() || run == RESERVED_RUN_MAX);
                        prop_assert!(dispatches <= bound[&ticket]);
                        run = 0;
                    }
                }
            }
        }
        prop_assert!(unreserved_waiting.is_empty());
    }

    /// Background bytes dispatched by any time stay within the rate plus its burst and one
    /// request.
    #[test]
    fn background_never_runs_ahead_of_its_rate(
        sizes in prop::collection::vec(1u64..200_000, 1..60),
        rate in 100_000u64..10_000_000,
        step_us in 1u64..50_000,
    ) {
        let mut scheduler = one_slot(Some(rate));
        for &bytes in &sizes {
            scheduler.enqueue(Service::Background, bytes, 0);
        }
        let (mut sent, mut now_us, mut next) = (0u64, 0u64, 0usize);
        while next < sizes.len() {
            if serve_one(&mut scheduler, now_us).is_some() {
                sent += sizes[next];
                next += 1;
                let allowed = u128::from(rate) * u128::from(now_us + BACKGROUND_BURST_US)
                    / 1_000_000 + u128::from(sizes[next - 1]);
                prop_assert!(u128::from(sent) <= allowed, "{} bytes by {} us", sent, now_us);
            } else {
                now_us += step_us;
            }
        }
    }
}
