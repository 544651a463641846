//! The manager as a replicated state machine: the same commands applied on several replicas,
//! each with its own clock, leave the same store; retries of a `Once` request apply once.

use crate::command::{Command, Decision, OrderPosition, Proposal};
use crate::{Manager, ManagerConfig};
use std::time::{Duration, Instant};
use tessera_layout::Scheme;
use tessera_wire::{LayoutRequest, ManagerError, ManagerRequest, ManagerResponse};

const REPLICAS: usize = 3;

fn replicas() -> Vec<(tempfile::TempDir, Manager)> {
    let key = tessera_auth::Secret::from_bytes([9; 32]).replica_key();
    (0..REPLICAS)
        .map(|_| {
            let dir = tempfile::tempdir().unwrap();
            let config = ManagerConfig {
                cluster_id: Some(0x5eed),
                ..ManagerConfig::default()
            };
            let mut manager = Manager::open(dir.path(), config).unwrap();
            manager.set_replicated(key);
            (dir, manager)
        })
        .collect()
}

/// Seeded draws: each call a number below its argument.
fn draws(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed;
    move |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    }
}

/// A seeded sequence of commands as replica 0 would propose them (deciding with its own
/// liveness): server registrations and heartbeats, creates, atomic replaces, size changes,
/// removals, keys, lease expiries, and `Once` requests with retries.
fn commands(seed: u64, count: usize, decider: &mut Manager, now: Instant) -> Vec<Command> {
    let mut next = draws(seed);
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 65536,
        width: Some(3),
    };
    let mut out = Vec::new();
    for port in 0..4 {
        let addr = format!("127.0.0.1:{}", 7000 + port);
        let request = ManagerRequest::Register {
            server: None,
            addr,
            incarnation: 1,
            cluster: None,
        };
        out.push(request);
    }
    for sequence in 1..=count as u64 {
        let path = format!("/f{}", next(8));
        let file = 1 + next(12);
        let request = match next(11) {
            0 => ManagerRequest::Create {
                path,
                layout: layout.clone(),
                replace: next(2) == 0,
            },
            1 => ManagerRequest::CreatePending {
                path,
                layout: layout.clone(),
            },
            2 => ManagerRequest::CommitPending { file },
            3 => ManagerRequest::SetSize {
                file,
                size: next(1 << 30),
                grow_only: next(2) == 0,
            },
            4 => ManagerRequest::Remove { path },
            5 => ManagerRequest::KeyCreate {
                name: format!("k{sequence}"),
            },
            6 => ManagerRequest::Heartbeat {
                server: 1 + next(4) as u32,
                incarnation: 1 + next(2),
                cluster: 0x5eed,
            },
            9 => ManagerRequest::SnapshotCreate {
                name: format!("s{}", next(3)),
                prefix: "/f".into(),
            },
            10 => ManagerRequest::SnapshotRemove {
                name: format!("s{}", next(3)),
            },
            7 => ManagerRequest::Resynced {
                server: 1,
                file,
                stripes: tessera_wire::IndexRange::new(0, 9),
                tag: next(3),
            },
            _ => ManagerRequest::AbandonPending { file },
        };
        let request = ManagerRequest::Once {
            client: next(3),
            sequence,
            request: Box::new(request),
        };
        out.push(request);
    }
    let mut decider_applied = 0;
    let mut commands: Vec<Command> = Vec::new();
    for request in out {
        // The proposer decides against its own state, just before it is ordered.
        let decision = decider.decide(&request);
        let command = Command::Request { request, decision };
        commands.push(command.clone());
        // Retries and expiries now and then, as a failover or a lease would bring them.
        if next(5) == 0 {
            commands.push(command);
        }
        if next(7) == 0 {
            commands.push(Command::ExpirePending { file: 1 + next(12) });
        }
        // The proposer applies what was ordered before it decides again.
        while decider_applied < commands.len() {
            decider.apply(commands[decider_applied].clone(), now);
            decider_applied += 1;
        }
    }
    commands
}

#[test]
fn replicas_applying_the_same_commands_hold_the_same_store() {
    for seed in 0..8 {
        let mut group = replicas();
        let start = Instant::now();
        let (_, decider) = &mut group[0];
        let commands = commands(seed, 150, decider, start);
        // Replica 0 decided and applied as it went; the others apply the ordered commands
        // (through their wire encoding), each at its own local time.
        let mut answers = vec![Vec::new(); REPLICAS];
        for (index, (_, manager)) in group.iter_mut().enumerate().skip(1) {
            let local = start + Duration::from_millis(index as u64 * 7);
            for command in &commands {
                let proposal = Proposal {
                    version: crate::command::PROPOSAL_VERSION,
                    origin: 1,
                    incarnation: 1,
                    ticket: 0,
                    command: command.clone(),
                };
                let decoded = Proposal::decode(&proposal.encode()).unwrap();
                answers[index].push(manager.apply(decoded.command, local));
            }
        }
        let reference = group[1].1.state_dump();
        assert!(
            reference.iter().any(|line| line.starts_with("files")),
            "seed {seed}: no files"
        );
        assert!(
            reference.iter().any(|line| line.starts_with("once")),
            "seed {seed}"
        );
        assert!(
            reference
                .iter()
                .any(|line| line.contains("snapshot_epoch_next")),
            "seed {seed}: no snapshots"
        );
        for (index, (_, manager)) in group.iter().enumerate() {
            assert_eq!(
                manager.state_dump(),
                reference,
                "seed {seed}: replica {index} differs"
            );
        }
        assert_eq!(answers[1], answers[2], "seed {seed}: answers differ");
    }
}

#[test]
fn a_retried_once_request_is_applied_once() {
    let mut group = replicas();
    let now = Instant::now();
    let manager = &mut group[0].1;
    register_three_servers(manager, now);
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 65536,
        width: None,
    };
    let create = |sequence| ManagerRequest::Once {
        client: 42,
        sequence,
        request: Box::new(ManagerRequest::Create {
            path: "/a".into(),
            layout: layout.clone(),
            replace: false,
        }),
    };
    let first = manager.handle(create(1), now);
    assert!(matches!(first, ManagerResponse::File(_)), "{first:?}");
    // The same request again (a retry after a failover): the same answer, no second file.
    assert_eq!(manager.handle(create(1), now), first);
    // A new request of the same client is applied: the path exists now.
    assert_eq!(
        manager.handle(create(2), now),
        ManagerResponse::Error(ManagerError::Exists("/a".into()))
    );
    // Requests in flight together are ordered in any order: an earlier number that comes
    // late is applied, not refused.
    let lookup = |sequence| ManagerRequest::Once {
        client: 42,
        sequence,
        request: Box::new(ManagerRequest::Lookup { path: "/a".into() }),
    };
    let last = crate::command::ONCE_WINDOW + 10;
    assert!(matches!(
        manager.handle(lookup(last), now),
        ManagerResponse::File(_)
    ));
    assert!(matches!(
        manager.handle(lookup(20), now),
        ManagerResponse::File(_)
    ));
    // The first is no longer kept once a window of later ones went past it.
    assert_eq!(
        manager.handle(create(1), now),
        ManagerResponse::Error(ManagerError::Superseded {
            client: 42,
            sequence: 1,
            latest: last
        })
    );
    // The retry of one within the window is still answered from the table.
    assert_eq!(
        manager.handle(lookup(20), now),
        manager.handle(lookup(last), now)
    );
}

#[test]
fn replicated_pending_files_expire_only_by_command() {
    let mut group = replicas();
    let now = Instant::now();
    let manager = &mut group[0].1;
    register_three_servers(manager, now);
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 65536,
        width: None,
    };
    let request = ManagerRequest::CreatePending {
        path: "/p".into(),
        layout,
    };
    let decision = manager.decide(&request);
    let ManagerResponse::Pending { view, .. } =
        manager.apply(Command::Request { request, decision }, now)
    else {
        panic!()
    };
    let late = now + crate::PENDING_LEASE_DEFAULT * 2;
    manager.tick(late);
    assert_eq!(
        manager.pending_files(),
        vec![view.meta.id],
        "a replica's clock removed it"
    );
    assert_eq!(manager.expired_pending(late), vec![view.meta.id]);
    manager.apply(Command::ExpirePending { file: view.meta.id }, late);
    assert!(manager.pending_files().is_empty());
    let _ = Decision::default();
}

#[test]
fn a_store_registering_again_keeps_its_id() {
    let mut group = replicas();
    let now = Instant::now();
    let manager = &mut group[0].1;
    let register = |incarnation| ManagerRequest::Register {
        server: None,
        addr: "127.0.0.1:7001".into(),
        incarnation,
        cluster: None,
    };
    let first = manager.handle(register(5), now);
    let ManagerResponse::Registered { server, .. } = first else {
        panic!("{first:?}")
    };
    // Its first answer lost, it asks again (another replica, after a failover): same id.
    assert_eq!(manager.handle(register(5), now), first);
    // Another store at that address is another server.
    let ManagerResponse::Registered { server: other, .. } = manager.handle(register(6), now) else {
        panic!()
    };
    assert_ne!(other, server);
    assert_eq!(manager.known_servers(), 2);
}

/// Registers three servers (ports 0 to 2 of 127.0.0.1) with `manager`.
fn register_three_servers(manager: &mut Manager, now: Instant) {
    for port in 0..3 {
        let addr = format!("127.0.0.1:{port}");
        manager.handle(
            ManagerRequest::Register {
                server: None,
                addr,
                incarnation: 1,
                cluster: None,
            },
            now,
        );
    }
}

/// A replica applying the order in batches (as the applier takes every delivery waiting)
/// ends with the same store and answers as one applying command by command, the order
/// position it records included (the batch's sync recorded the batch's last position once),
/// and syncs its store at most once per batch instead of once per change.
#[test]
fn a_batch_applies_like_single_commands_and_syncs_once() {
    for seed in 0..4 {
        let mut group = replicas();
        let start = Instant::now();
        let commands = commands(seed, 150, &mut group[0].1, start);
        let at = |index: usize| OrderPosition {
            epoch: 1,
            next: index as u64 + 1,
        };
        let singles: Vec<_> = (0..)
            .zip(&commands)
            .map(|(index, command)| {
                group[1].1.set_order_position(at(index));
                group[1].1.apply(command.clone(), start)
            })
            .collect();
        let batched = &mut group[2].1;
        let (synced_before, mut batches) = (batched.synced_commits(), 0);
        let mut answers = Vec::new();
        for (chunk, batch) in commands.chunks(16).enumerate() {
            batched.begin_batch().unwrap();
            for (offset, command) in batch.iter().enumerate() {
                batched.set_order_position(at(chunk * 16 + offset));
                answers.push(batched.apply(command.clone(), start));
            }
            batched.end_batch().unwrap();
            batches += 1;
        }
        assert_eq!(answers, singles, "seed {seed}: answers differ");
        assert_eq!(
            group[2].1.state_dump(),
            group[1].1.state_dump(),
            "seed {seed}"
        );
        let synced_batched = group[2].1.synced_commits() - synced_before;
        assert!(
            synced_batched <= batches,
            "seed {seed}: {synced_batched} syncs in {batches} batches"
        );
        assert!(
            group[1].1.synced_commits() > 3 * batches,
            "seed {seed}: {} syncs one by one",
            group[1].1.synced_commits()
        );
        // The store is synced at the end of a batch: reopened, it holds everything.
        let dump = group[2].1.state_dump();
        let (dir, manager) = group.remove(2);
        drop(manager);
        let config = ManagerConfig {
            cluster_id: Some(0x5eed),
            ..ManagerConfig::default()
        };
        let reopened = Manager::open_existing(dir.path(), config).unwrap();
        assert_eq!(reopened.state_dump(), dump, "seed {seed}");
    }
}

/// While a batch's sync is owed, a local read sees the store as it stood before the batch
/// (durable: the store reopened after a crash then holds what it read), ordered requests in
/// the batch see what the batch changed, and once the sync ran local reads see it too.
#[test]
fn local_reads_see_the_durable_store_while_a_batch_syncs() {
    let mut group = replicas();
    let (dir, manager) = &mut group[0];
    let now = Instant::now();
    register_three_servers(manager, now);
    let create = create_command;
    let lookup = |path: &str| ManagerRequest::Lookup { path: path.into() };
    let local = |manager: &mut Manager, request: &ManagerRequest| {
        crate::replica_core::local_answer(manager, request, now)
    };
    manager.begin_batch().unwrap();
    let before = manager.apply(create(manager, "/before"), now);
    assert!(matches!(before, ManagerResponse::File(_)), "{before:?}");
    manager.end_batch().unwrap();

    manager.begin_batch().unwrap();
    let ManagerResponse::File(during) = manager.apply(create(manager, "/during"), now) else {
        panic!("create /during")
    };
    let ordered = Command::Request {
        request: lookup("/during"),
        decision: Decision::default(),
    };
    let seen = manager.apply(ordered, now);
    assert!(
        matches!(&seen, ManagerResponse::File(view) if view.meta == during.meta),
        "an ordered read sees the batch: {seen:?}"
    );
    let sync = manager
        .finish_batch()
        .unwrap()
        .expect("a create owes a sync");
    let read = local(manager, &lookup("/before"));
    assert!(matches!(read, Some(ManagerResponse::File(_))), "{read:?}");
    assert_eq!(local(manager, &lookup("/during")), None, "absent: ordered");
    let listed = local(manager, &ManagerRequest::List { prefix: "/".into() });
    let Some(ManagerResponse::Files(files)) = listed else {
        panic!("{listed:?}")
    };
    let paths: Vec<_> = files.iter().map(|meta| meta.path.as_str()).collect();
    assert_eq!(paths, ["/before"]);

    // Killed now, the replica's store reopens with what the local reads saw.
    reopens_with(dir.path(), "/before", "/during");

    manager.batch_synced(sync.run()).unwrap();
    let read = local(manager, &lookup("/during"));
    assert!(
        matches!(&read, Some(ManagerResponse::File(view)) if view.meta == during.meta),
        "{read:?}"
    );
}

/// The ordered create of a raid5 file at `path`, as `manager` decides it.
fn create_command(manager: &Manager, path: &str) -> Command {
    let request = ManagerRequest::Create {
        path: path.into(),
        layout: LayoutRequest {
            scheme: Scheme::Raid5,
            stripe_unit: 65536,
            width: Some(3),
        },
        replace: false,
    };
    let decision = manager.decide(&request);
    Command::Request { request, decision }
}

/// The store in `dir`, copied as a kill would leave it and reopened, holds `kept` and not
/// `lost`.
fn reopens_with(dir: &std::path::Path, kept: &str, lost: &str) {
    let crashed = tempfile::tempdir().unwrap();
    let file = crate::store::DB_FILE_NAME;
    std::fs::copy(dir.join(file), crashed.path().join(file)).unwrap();
    let config = ManagerConfig {
        cluster_id: Some(0x5eed),
        ..ManagerConfig::default()
    };
    let mut reopened = Manager::open_existing(crashed.path(), config).unwrap();
    let lookup = |path: &str| ManagerRequest::Lookup { path: path.into() };
    let now = Instant::now();
    let found = reopened.handle(lookup(kept), now);
    assert!(matches!(found, ManagerResponse::File(_)), "{found:?}");
    let absent = reopened.handle(lookup(lost), now);
    assert!(
        matches!(absent, ManagerResponse::Error(ManagerError::NotFound(_))),
        "{absent:?}"
    );
}

/// A replica applies the next batch while the last one syncs (`replica.rs`, the pipeline):
/// local reads see neither batch until the first one's sync ended, then what that sync
/// covered (the first batch) and not the second, and the second once its own sync ended; a
/// crash between the two syncs reopens with what the reads saw.
#[test]
fn local_reads_see_what_each_sync_covered_while_the_next_batch_applies() {
    let mut group = replicas();
    let (dir, manager) = &mut group[0];
    let now = Instant::now();
    register_three_servers(manager, now);
    let create = |manager: &mut Manager, path: &str| {
        let answer = manager.apply(create_command(manager, path), now);
        assert!(matches!(answer, ManagerResponse::File(_)), "{answer:?}");
    };
    let lookup = |path: &str| ManagerRequest::Lookup { path: path.into() };
    let sees = |manager: &mut Manager, path: &str| {
        crate::replica_core::local_answer(manager, &lookup(path), now).is_some()
    };
    manager.begin_batch().unwrap();
    create(manager, "/first");
    let first = manager
        .finish_batch()
        .unwrap()
        .expect("a create owes a sync");
    // The syncer runs the first batch's sync; the applier begins the second meanwhile.
    let (synced, covered) = first.run_covering();
    manager.begin_batch().unwrap();
    create(manager, "/second");
    assert!(
        !sees(manager, "/first"),
        "its sync has not been reported yet"
    );
    let second = manager
        .finish_batch()
        .unwrap()
        .expect("a create owes a sync");
    manager.batches_synced(1, synced, covered).unwrap();
    assert!(sees(manager, "/first"));
    assert!(!sees(manager, "/second"), "not yet durable");

    reopens_with(dir.path(), "/first", "/second");

    let (synced, covered) = second.run_covering();
    manager.batches_synced(1, synced, covered).unwrap();
    assert!(sees(manager, "/second"));
}

/// Applies `command` at order position `next - 1` of epoch 1 on every replica; the answers.
fn apply_at(
    group: &mut [(tempfile::TempDir, Manager)],
    next: u64,
    command: &Command,
) -> Vec<ManagerResponse> {
    let now = Instant::now();
    group
        .iter_mut()
        .map(|(_, manager)| {
            manager.set_order_position(OrderPosition { epoch: 1, next });
            manager.apply(command.clone(), now)
        })
        .collect()
}

/// A `Once` request of `client` numbered `sequence`, as a command.
fn once(client: u64, sequence: u64, request: ManagerRequest) -> Command {
    Command::Request {
        request: ManagerRequest::Once {
            client,
            sequence,
            request: Box::new(request),
        },
        decision: Decision::default(),
    }
}

/// Every `once` record of `client` in `manager`'s store, as dumped.
fn once_records(manager: &Manager, client: u64) -> usize {
    let prefix = format!("once ({client}, ");
    manager
        .state_dump()
        .iter()
        .filter(|line| line.starts_with(&prefix))
        .count()
}

/// `ExpireOnce` removes the records of the clients idle since its cutoff, and only theirs
/// (a client stamped again later keeps its records), alike on every replica; a retry within
/// the window is answered from the table, a retry of an expired client applied again.
#[test]
fn once_records_of_idle_clients_expire_by_command() {
    let mut group = replicas();
    let now = Instant::now();
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 65536,
        width: None,
    };
    let create = |path: &str| ManagerRequest::Create {
        path: path.into(),
        layout: layout.clone(),
        replace: false,
    };
    for (_, manager) in group.iter_mut() {
        register_three_servers(manager, now);
    }
    apply_at(&mut group, 1, &once(1, 1, create("/a")));
    let first_b = apply_at(&mut group, 2, &once(1, 2, create("/b")));
    let first_c = apply_at(&mut group, 3, &once(2, 1, create("/c")));
    assert!(
        matches!(first_c[0], ManagerResponse::File(_)),
        "{first_c:?}"
    );
    let expire = |epoch, next| Command::ExpireOnce {
        before: OrderPosition { epoch, next },
    };
    apply_at(&mut group, 4, &expire(1, 2));
    for (_, manager) in &group {
        assert_eq!(once_records(manager, 1), 0);
        assert_eq!(once_records(manager, 2), 1);
        assert_eq!(manager.state_dump(), group[0].1.state_dump());
    }
    // Client 2's retry is answered from the table; client 1's, expired, is applied again.
    assert_eq!(apply_at(&mut group, 5, &once(2, 1, create("/c"))), first_c);
    let again = apply_at(&mut group, 6, &once(1, 2, create("/b")));
    assert_ne!(again, first_b);
    assert_eq!(
        again[0],
        ManagerResponse::Error(ManagerError::Exists("/b".into()))
    );
    // Client 2 changes again (stamped at 7): a cutoff past its first change keeps it.
    apply_at(&mut group, 7, &once(2, 2, create("/d")));
    apply_at(&mut group, 8, &expire(1, 5));
    for (_, manager) in &group {
        assert_eq!(once_records(manager, 2), 2);
        assert_eq!(
            once_records(manager, 1),
            1,
            "stamped at 6, after the cutoff"
        );
    }
    // A cutoff of a later epoch takes everything stamped in epoch 1.
    apply_at(&mut group, 9, &expire(2, 0));
    for (_, manager) in &group {
        assert_eq!(once_records(manager, 1) + once_records(manager, 2), 0);
        assert!(!manager
            .state_dump()
            .iter()
            .any(|line| line.starts_with("once")));
        assert!(!manager.once_expiry_backlog());
    }
}

/// One `ExpireOnce` removes at most about `ONCE_EXPIRED_RECORDS_MAX` records (whole clients)
/// and says some remain; the same command again removes the rest.
#[test]
fn once_expiry_is_bounded_per_command() {
    let mut group = replicas();
    group.truncate(1);
    let clients = 10u64;
    let per_client = 1000u64;
    let mut next = 0;
    for client in 1..=clients {
        for sequence in 1..=per_client {
            next += 1;
            let read = ManagerRequest::Lookup { path: "/x".into() };
            apply_at(&mut group, next, &once(client, sequence, read));
        }
    }
    let manager = &mut group[0].1;
    let total = |manager: &Manager| {
        (1..=clients)
            .map(|client| once_records(manager, client))
            .sum::<usize>()
    };
    assert_eq!(total(manager), (clients * per_client) as usize);
    let before = OrderPosition { epoch: 1, next };
    let removed = manager.expire_once(before).unwrap();
    let bound = crate::command::ONCE_EXPIRED_RECORDS_MAX;
    assert!(removed >= bound && removed < bound + crate::command::ONCE_WINDOW as usize);
    assert!(manager.once_expiry_backlog());
    assert_eq!(total(manager), (clients * per_client) as usize - removed);
    manager.expire_once(before).unwrap();
    assert_eq!(total(manager), 0);
    assert!(!manager.once_expiry_backlog());
}

/// A `once` record written in its request's own commit (a create, a size change, a file's
/// sync) leaves the store and the answers of a record committed apart: same records, same
/// stamps and window, same order position, in batches as one by one; retries of a folded
/// request are answered from its record, and a failed one keeps a commit of its own.
#[test]
fn once_records_in_their_requests_commit_leave_the_store_of_records_apart() {
    for seed in 0..4 {
        let mut group = replicas();
        let start = Instant::now();
        let mut commands = commands(seed, 150, &mut group[0].1, start);
        for file in 1..=12 {
            let sync = ManagerRequest::Once {
                client: file % 3,
                sequence: 1000 + file,
                request: Box::new(ManagerRequest::SyncFile {
                    file,
                    size: file << 12,
                }),
            };
            let command = Command::Request {
                request: sync,
                decision: Decision::default(),
            };
            commands.push(command.clone());
            commands.push(command);
        }
        let at = |index: usize| OrderPosition {
            epoch: 1,
            next: index as u64 + 1,
        };
        let mut answers = [Vec::new(), Vec::new()];
        for (replica, apart) in [(1, false), (2, true)] {
            crate::command::RECORDS_APART.with(|cell| cell.set(apart));
            let manager = &mut group[replica].1;
            for (chunk, batch) in commands.chunks(3).enumerate() {
                manager.begin_batch().unwrap();
                for (offset, command) in batch.iter().enumerate() {
                    manager.set_order_position(at(chunk * 3 + offset));
                    answers[replica - 1].push(manager.apply(command.clone(), start));
                }
                manager.end_batch().unwrap();
            }
        }
        crate::command::RECORDS_APART.with(|cell| cell.set(false));
        assert_eq!(answers[0], answers[1], "seed {seed}: answers differ");
        let dump = group[1].1.state_dump();
        assert!(
            dump.iter().any(|line| line.starts_with("once")),
            "seed {seed}"
        );
        assert_same_stores_and_durable(group, seed);
    }
}

/// Small puts of several clients (`Once` creates, grows and syncs), with refusals of every
/// kind a shared transaction must survive (a path that exists, a missing file, a size past
/// the largest, a superseded number), retries and ordered reads in the same batch, mixed
/// into the seeded command mix.
fn small_put_commands(seed: u64, decider: &mut Manager, now: Instant) -> Vec<Command> {
    let mut next = draws(seed ^ 0x9e37_79b9);
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 65536,
        width: Some(3),
    };
    let mut commands = commands(seed, 120, decider, now);
    for sequence in 2000..2200 {
        let path = format!("/p{}", next(24));
        let file = 1 + next(60);
        let request = match next(7) {
            0 | 1 => ManagerRequest::Create {
                path,
                layout: layout.clone(),
                replace: next(4) == 0,
            },
            2 => ManagerRequest::SetSize {
                file,
                size: 4096 * (1 + next(4)),
                grow_only: true,
            },
            3 => ManagerRequest::SetSize {
                file,
                size: u64::MAX,
                grow_only: true,
            },
            4 => ManagerRequest::SyncFile {
                file,
                size: 4096 * next(3),
            },
            5 => ManagerRequest::Lookup { path },
            _ => ManagerRequest::SyncFile { file, size: 1 },
        };
        // Client 9's numbers jump ahead, so its later small numbers are superseded.
        let (client, sequence) = match next(9) {
            0 => (9, if next(2) == 0 { sequence + 5000 } else { 1 }),
            _ => (next(3), sequence),
        };
        let request = ManagerRequest::Once {
            client,
            sequence,
            request: Box::new(request),
        };
        let command = Command::Request {
            decision: decider.decide(&request),
            request,
        };
        decider.apply(command.clone(), now);
        commands.push(command.clone());
        if next(4) == 0 {
            commands.push(command);
        }
    }
    commands
}

/// A batch's small puts applied in one write transaction (refused requests left out of it)
/// leave the store, the answers and the order position of one commit per request: batches
/// of 1 to 8 against batches of one with a commit each; the store reopened holds the same.
#[test]
fn a_batch_in_one_transaction_leaves_the_store_of_a_commit_per_request() {
    for seed in 0..6 {
        let mut group = replicas();
        let start = Instant::now();
        let commands = small_put_commands(seed, &mut group[0].1, start);
        let mut state = seed;
        let mut batch_len = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            1 + (state >> 33) as usize % 8
        };
        let mut answers = [Vec::new(), Vec::new()];
        for (replica, apart) in [(1, false), (2, true)] {
            crate::command::BATCH_TXN_APART.with(|cell| cell.set(apart));
            let manager = &mut group[replica].1;
            let mut at = 0;
            while at < commands.len() {
                let end = commands.len().min(at + if apart { 1 } else { batch_len() });
                manager.begin_batch().unwrap();
                for (index, command) in commands.iter().enumerate().take(end).skip(at) {
                    manager.set_order_position(OrderPosition {
                        epoch: 1,
                        next: index as u64 + 1,
                    });
                    answers[replica - 1].push(manager.apply(command.clone(), start));
                }
                manager.end_batch().unwrap();
                at = end;
            }
        }
        crate::command::BATCH_TXN_APART.with(|cell| cell.set(false));
        assert_eq!(answers[0], answers[1], "seed {seed}: answers differ");
        let refused = |what: fn(&ManagerError) -> bool| {
            answers[0].iter().any(|answer| match answer {
                ManagerResponse::Error(error) => what(error),
                _ => false,
            })
        };
        assert!(
            refused(|e| matches!(e, ManagerError::Exists(_))),
            "seed {seed}"
        );
        assert!(
            refused(|e| matches!(e, ManagerError::NotFound(_))),
            "seed {seed}"
        );
        assert!(
            refused(|e| matches!(e, ManagerError::TooLarge { .. })),
            "seed {seed}"
        );
        assert!(
            refused(|e| matches!(e, ManagerError::Superseded { .. })),
            "seed {seed}"
        );
        assert_same_stores_and_durable(group, seed);
    }
}

/// Replicas 1 and 2 of `group` hold the same store at the same order position, and replica
/// 1's store reopened (as after a restart) holds it too.
fn assert_same_stores_and_durable(mut group: Vec<(tempfile::TempDir, Manager)>, seed: u64) {
    let dump = group[1].1.state_dump();
    assert_eq!(group[2].1.state_dump(), dump, "seed {seed}: stores differ");
    assert_eq!(
        group[1].1.order_position().unwrap(),
        group[2].1.order_position().unwrap()
    );
    let (dir, manager) = group.remove(1);
    drop(manager);
    let config = ManagerConfig {
        cluster_id: Some(0x5eed),
        ..ManagerConfig::default()
    };
    let reopened = Manager::open_existing(dir.path(), config).unwrap();
    assert_eq!(reopened.state_dump(), dump, "seed {seed}: not durable");
}
