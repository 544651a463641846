//! The manager as a replicated state machine: the same commands applied on several replicas,
//! each with its own clock, leave the same store; retries of a `Once` request apply once.

use crate::command::{Command, Decision, Proposal};
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

/// A seeded sequence of commands as replica 0 would propose them (deciding with its own
/// liveness): server registrations and heartbeats, creates, atomic replaces, size changes,
/// removals, keys, lease expiries, and `Once` requests with retries.
fn commands(seed: u64, count: usize, decider: &mut Manager, now: Instant) -> Vec<Command> {
    let mut state = seed;
    let mut next = move |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
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
