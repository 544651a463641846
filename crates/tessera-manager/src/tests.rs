//! Manager scenarios: the namespace, liveness over virtual time, debts, wiped stores, restarts.

use super::*;
use std::path::Path;
use std::time::{Duration, Instant};
use tessera_layout::Scheme;
use tessera_wire::{
    FileId, FileMeta, FileView, IndexRange, LayoutRequest, ManagerError, ManagerRequest,
    ManagerResponse, MissedStripes, ServerId, ServerState, ServerStatus,
};

const STRIPE_UNIT: u32 = 65536;
const INCARNATION: u64 = 7;

/// A manager in a temporary directory with a virtual clock.
struct Harness {
    dir: tempfile::TempDir,
    /// Always present except while a reopen swaps it.
    manager: Option<Manager>,
    now: Instant,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let manager = Some(open(dir.path()));
        Harness {
            dir,
            manager,
            now: Instant::now(),
        }
    }

    /// A harness with `count` servers registered (ids 1..=count).
    fn with_servers(count: u32) -> Harness {
        let mut harness = Harness::new();
        for expected in 1..=count {
            assert_eq!(harness.register(None, INCARNATION), expected);
        }
        harness
    }

    fn manager(&mut self) -> &mut Manager {
        self.manager.as_mut().expect("manager open")
    }

    fn handle(&mut self, request: ManagerRequest) -> ManagerResponse {
        let now = self.now;
        self.manager().handle(request, now)
    }

    fn state(&mut self, server: ServerId) -> Option<ServerState> {
        self.manager().server_state(server)
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    /// Drops the manager and opens the store again, as a restart would.
    fn reopen(&mut self) {
        // Close the old manager first: the store cannot be open twice.
        drop(self.manager.take());
        self.manager = Some(open(self.dir.path()));
    }

    fn register(&mut self, server: Option<ServerId>, incarnation: u64) -> ServerId {
        // A new server (no id yet) at an address of its own: the same store registering
        // again from the same address keeps its id.
        let port = match server {
            Some(server) => 7000 + server as usize,
            None => 8000 + self.manager().known_servers(),
        };
        let addr = format!("127.0.0.1:{port}");
        match self.handle(ManagerRequest::Register {
            server,
            addr,
            incarnation,
            cluster: None,
        }) {
            ManagerResponse::Registered { server, .. } => server,
            other => panic!("register answered {other:?}"),
        }
    }

    fn heartbeat(&mut self, server: ServerId, incarnation: u64) -> ManagerResponse {
        let cluster = self.manager().cluster();
        self.handle(ManagerRequest::Heartbeat {
            server,
            incarnation,
            cluster,
        })
    }

    fn create_with(&mut self, path: &str, scheme: Scheme, width: Option<u32>) -> ManagerResponse {
        self.handle(ManagerRequest::Create {
            path: path.to_string(),
            layout: LayoutRequest {
                scheme,
                stripe_unit: STRIPE_UNIT,
                width,
            },
            replace: false,
        })
    }

    fn create(&mut self, path: &str, scheme: Scheme, width: Option<u32>) -> FileView {
        match self.create_with(path, scheme, width) {
            ManagerResponse::File(view) => view,
            other => panic!("create {path} answered {other:?}"),
        }
    }

    fn lookup(&mut self, path: &str) -> FileView {
        match self.handle(ManagerRequest::Lookup {
            path: path.to_string(),
        }) {
            ManagerResponse::File(view) => view,
            other => panic!("lookup {path} answered {other:?}"),
        }
    }

    fn list(&mut self, prefix: &str) -> Vec<String> {
        match self.handle(ManagerRequest::List {
            prefix: prefix.to_string(),
        }) {
            ManagerResponse::Files(metas) => metas.into_iter().map(|meta| meta.path).collect(),
            other => panic!("list {prefix} answered {other:?}"),
        }
    }

    fn missed(&mut self, server: ServerId, file: FileId, start: u64, end: u64) {
        let answer = self.handle(ManagerRequest::ReportMissed {
            server,
            file,
            stripes: IndexRange::new(start, end),
        });
        assert_eq!(answer, ManagerResponse::Done);
    }

    fn resynced(&mut self, server: ServerId, file: FileId, start: u64, end: u64) {
        let tag = self.debt_tag(server, file);
        let answer = self.handle(ManagerRequest::Resynced {
            server,
            file,
            stripes: IndexRange::new(start, end),
            tag,
        });
        assert_eq!(answer, ManagerResponse::Done);
    }

    /// The tag of what `server` owes of `file` (0 if nothing).
    fn debt_tag(&mut self, server: ServerId, file: FileId) -> u64 {
        match self.handle(ManagerRequest::FilesOnServer { server }) {
            ManagerResponse::Debts(debts) => debts
                .into_iter()
                .find(|debt| debt.meta.id == file)
                .map_or(0, |debt| debt.tag),
            other => panic!("files on server {server} answered {other:?}"),
        }
    }

    fn debts(&mut self, server: ServerId) -> Vec<(String, Vec<IndexRange>)> {
        match self.handle(ManagerRequest::FilesOnServer { server }) {
            ManagerResponse::Debts(debts) => debts
                .into_iter()
                .map(|debt| (debt.meta.path, debt.missed))
                .collect(),
            other => panic!("files on server {server} answered {other:?}"),
        }
    }

    fn states(&mut self) -> Vec<(ServerId, ServerState)> {
        match self.handle(ManagerRequest::Status) {
            ManagerResponse::Servers(servers) => servers
                .into_iter()
                .map(|status| (status.id, status.state))
                .collect(),
            other => panic!("status answered {other:?}"),
        }
    }
}

fn open(dir: &Path) -> Manager {
    Manager::open(dir, ManagerConfig::default()).unwrap()
}

fn error(answer: ManagerResponse) -> ManagerError {
    match answer {
        ManagerResponse::Error(error) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn whole() -> Vec<IndexRange> {
    vec![IndexRange::new(0, u64::MAX)]
}

#[test]
fn create_lookup_list_set_size_and_remove() {
    let mut harness = Harness::with_servers(3);
    let created = harness.create("/dir/a", Scheme::Raid5, None);
    assert_eq!(created.meta.id, 1);
    assert_eq!(created.meta.size, 0);
    assert_eq!(created.meta.layout.width, 3);
    assert_eq!(created.meta.layout.stripe_unit, STRIPE_UNIT);
    assert_eq!(created.columns.len(), 3);
    assert!(created.columns.iter().all(|c| c.state == ServerState::Up));
    assert!(created.missed.is_empty());
    harness.create("/dir/b", Scheme::Raid0, Some(2));
    harness.create("/other", Scheme::Raid1, Some(2));

    assert_eq!(harness.lookup("/dir/a"), created);
    let by_id = harness.handle(ManagerRequest::LookupId { file: 1 });
    assert_eq!(by_id, ManagerResponse::File(created.clone()));
    assert_eq!(harness.list("/dir/"), vec!["/dir/a", "/dir/b"]);
    assert_eq!(harness.list(""), vec!["/dir/a", "/dir/b", "/other"]);
    assert!(harness.list("/none").is_empty());

    let set_size = |size, grow_only| ManagerRequest::SetSize {
        file: 1,
        size,
        grow_only,
    };
    assert_eq!(harness.handle(set_size(5000, false)), ManagerResponse::Done);
    assert_eq!(harness.lookup("/dir/a").meta.size, 5000);
    assert_eq!(harness.handle(set_size(100, true)), ManagerResponse::Done);
    assert_eq!(harness.lookup("/dir/a").meta.size, 5000);
    assert_eq!(harness.handle(set_size(100, false)), ManagerResponse::Done);
    assert_eq!(harness.lookup("/dir/a").meta.size, 100);

    let removed = harness.handle(ManagerRequest::Remove {
        path: "/dir/a".into(),
    });
    let ManagerResponse::Meta(meta) = removed else {
        panic!("remove answered {removed:?}")
    };
    assert_eq!((meta.id, meta.size), (1, 100));
    assert_eq!(harness.list("/dir/"), vec!["/dir/b"]);
    assert_eq!(
        error(harness.handle(ManagerRequest::LookupId { file: 1 })),
        ManagerError::NotFound("1".into())
    );
}

#[test]
fn existing_path_is_refused_unless_replaced() {
    let mut harness = Harness::with_servers(3);
    let old = harness.create("/a", Scheme::Raid5, None);
    assert_eq!(
        error(harness.create_with("/a", Scheme::Raid0, None)),
        ManagerError::Exists("/a".into())
    );
    harness.missed(2, old.meta.id, 0, 4);
    assert_eq!(harness.state(2), Some(ServerState::Stale));

    let replaced = harness.handle(ManagerRequest::Create {
        path: "/a".into(),
        layout: LayoutRequest {
            scheme: Scheme::Raid0,
            stripe_unit: STRIPE_UNIT,
            width: Some(2),
        },
        replace: true,
    });
    let ManagerResponse::File(new) = replaced else {
        panic!("replace answered {replaced:?}")
    };
    // A new file with a new id; the old one is gone with its debts.
    assert_ne!(new.meta.id, old.meta.id);
    assert_eq!(new.meta.layout.scheme, Scheme::Raid0);
    assert_eq!(harness.lookup("/a"), new);
    assert_eq!(
        error(harness.handle(ManagerRequest::LookupId { file: old.meta.id })),
        ManagerError::NotFound(old.meta.id.to_string())
    );
    assert_eq!(harness.state(2), Some(ServerState::Up));
}

#[test]
fn missing_files_are_not_found() {
    let mut harness = Harness::with_servers(1);
    let not_found = |path: &str| ManagerError::NotFound(path.into());
    let lookup = ManagerRequest::Lookup { path: "/x".into() };
    assert_eq!(error(harness.handle(lookup)), not_found("/x"));
    let remove = ManagerRequest::Remove { path: "/x".into() };
    assert_eq!(error(harness.handle(remove)), not_found("/x"));
    let lookup_id = ManagerRequest::LookupId { file: 9 };
    assert_eq!(error(harness.handle(lookup_id)), not_found("9"));
    let set_size = ManagerRequest::SetSize {
        file: 9,
        size: 1,
        grow_only: false,
    };
    assert_eq!(error(harness.handle(set_size)), not_found("9"));
    let stripes = IndexRange::new(0, 1);
    let missed = ManagerRequest::ReportMissed {
        server: 1,
        file: 9,
        stripes,
    };
    assert_eq!(error(harness.handle(missed)), not_found("9"));
    let resynced = ManagerRequest::Resynced {
        server: 1,
        file: 9,
        stripes,
        tag: 0,
    };
    assert_eq!(error(harness.handle(resynced)), not_found("9"));
}

#[test]
fn unknown_servers_are_refused() {
    let mut harness = Harness::with_servers(3);
    let file = harness.create("/a", Scheme::Raid5, None).meta.id;
    let stripes = IndexRange::new(0, 1);
    let requests = [
        ManagerRequest::Heartbeat {
            server: 9,
            incarnation: INCARNATION,
            cluster: harness.manager().cluster(),
        },
        ManagerRequest::ReportMissed {
            server: 9,
            file,
            stripes,
        },
        ManagerRequest::Resynced {
            server: 9,
            file,
            stripes,
            tag: 0,
        },
        ManagerRequest::ReportDown { server: 9 },
        ManagerRequest::FilesOnServer { server: 9 },
    ];
    for request in requests {
        assert_eq!(
            error(harness.handle(request)),
            ManagerError::UnknownServer(9)
        );
    }
    assert_eq!(harness.state(9), None);
}

#[test]
fn width_beyond_servers_up_is_refused() {
    let mut harness = Harness::with_servers(3);
    assert_eq!(
        error(harness.create_with("/a", Scheme::Raid0, Some(4))),
        ManagerError::NotEnoughServers { wanted: 4, up: 3 }
    );
    // Down servers do not count.
    assert_eq!(
        harness.handle(ManagerRequest::ReportDown { server: 3 }),
        ManagerResponse::Done
    );
    assert_eq!(
        error(harness.create_with("/a", Scheme::Raid5, Some(3))),
        ManagerError::NotEnoughServers { wanted: 3, up: 2 }
    );
    // With no width given, a scheme needing more servers than are up is refused the same way.
    assert_eq!(
        error(harness.create_with("/a", Scheme::Raid5, None)),
        ManagerError::NotEnoughServers { wanted: 3, up: 2 }
    );
    let view = harness.create("/a", Scheme::Raid1, None);
    assert_eq!(view.meta.layout.width, 2);
    assert!(!view.meta.servers.contains(&3));
}

#[test]
fn bad_paths_and_layouts_are_refused() {
    let mut harness = Harness::with_servers(3);
    let too_long = "p".repeat(PATH_BYTES_MAX + 1);
    for path in [
        "",
        "/a\0b",
        too_long.as_str(),
        "..",
        "../x",
        "a/../b",
        "a/.",
        "./a",
    ] {
        let answer = harness.create_with(path, Scheme::Raid0, None);
        assert!(
            matches!(answer, ManagerResponse::Error(ManagerError::Layout(_))),
            "path {path:?} answered {answer:?}"
        );
    }
    harness.create(&"p".repeat(PATH_BYTES_MAX), Scheme::Raid0, None);

    let bad_unit = harness.handle(ManagerRequest::Create {
        path: "/a".into(),
        layout: LayoutRequest {
            scheme: Scheme::Raid0,
            stripe_unit: 1000,
            width: None,
        },
        replace: false,
    });
    assert!(matches!(
        bad_unit,
        ManagerResponse::Error(ManagerError::Layout(_))
    ));
    assert!(matches!(
        harness.create_with("/a", Scheme::Raid5, Some(2)),
        ManagerResponse::Error(ManagerError::Layout(_))
    ));
    // Nothing was created by the refused requests.
    assert_eq!(harness.list("/").len(), 0);
}

#[test]
fn silent_server_goes_down_on_tick_and_up_on_heartbeat() {
    let mut harness = Harness::with_servers(2);
    let timeout = HEARTBEAT_TIMEOUT_DEFAULT;
    assert_eq!(
        harness.manager().poll_timeout(),
        Some(harness.now + timeout)
    );

    harness.advance(timeout / 2);
    assert_eq!(
        harness.heartbeat(1, INCARNATION),
        ManagerResponse::Registered {
            server: 1,
            state: ServerState::Up,
            cluster: harness.manager().cluster(),
        }
    );
    harness.advance(timeout / 2);
    let now = harness.now;
    harness.manager().tick(now);
    assert_eq!(harness.state(1), Some(ServerState::Up));
    assert_eq!(harness.state(2), Some(ServerState::Down));
    assert_eq!(harness.manager().poll_timeout(), Some(now + timeout / 2));
    assert_eq!(
        harness.states(),
        vec![(1, ServerState::Up), (2, ServerState::Down)]
    );

    assert_eq!(
        harness.heartbeat(2, INCARNATION),
        ManagerResponse::Registered {
            server: 2,
            state: ServerState::Up,
            cluster: harness.manager().cluster(),
        }
    );
    assert_eq!(harness.state(2), Some(ServerState::Up));

    // Both fall silent; a request sees them down even if no tick came in between.
    harness.advance(timeout * 2);
    assert_eq!(
        harness.states(),
        vec![(1, ServerState::Down), (2, ServerState::Down)]
    );
    assert_eq!(harness.manager().poll_timeout(), None);
}

#[test]
fn reported_server_is_down_until_it_heartbeats() {
    let mut harness = Harness::with_servers(3);
    let view = harness.create("/a", Scheme::Raid5, None);
    let report = ManagerRequest::ReportDown { server: 2 };
    assert_eq!(harness.handle(report), ManagerResponse::Done);
    assert_eq!(harness.state(2), Some(ServerState::Down));
    let columns = harness.lookup("/a").columns;
    let down: Vec<ServerId> = columns
        .iter()
        .filter(|c| c.state == ServerState::Down)
        .map(|c| c.id)
        .collect();
    assert_eq!(down, vec![2]);
    assert_eq!(view.meta.servers.len(), columns.len());

    harness.heartbeat(2, INCARNATION);
    assert_eq!(harness.state(2), Some(ServerState::Up));
}

/// A restarted replica presumes the servers it knows in their stored state for one heartbeat
/// timeout (issue 17): a lookup sees them up, or stale while they owe stripes, not down; new
/// files go only on servers heard since; a server still silent then is down, one reported down
/// is down at once, and one that heartbeats is heard.
#[test]
fn servers_are_presumed_live_for_one_timeout_after_a_restart() {
    let mut harness = Harness::with_servers(4);
    let file = harness.create("/a", Scheme::Raid5, None).meta.id;
    harness.missed(2, file, 0, 1);
    harness.reopen();
    assert_eq!(harness.state(1), Some(ServerState::Down), "no presumption");
    let now = harness.now;
    harness.manager().presume_live(now);
    let states: Vec<_> = (1..=4).map(|server| harness.state(server)).collect();
    let (up, stale) = (Some(ServerState::Up), Some(ServerState::Stale));
    assert_eq!(states, vec![up, stale, up, up]);
    let columns = harness.lookup("/a").columns;
    assert!(
        columns.iter().all(|c| c.state != ServerState::Down),
        "{columns:?}"
    );
    assert_eq!(harness.manager().live_servers(), Vec::<ServerId>::new());
    let timeout = crate::ManagerConfig::default().heartbeat_timeout;
    harness.advance(timeout / 2);
    harness.heartbeat(3, INCARNATION);
    assert_eq!(harness.manager().live_servers(), vec![3], "heard");
    let report = ManagerRequest::ReportDown { server: 4 };
    assert_eq!(harness.handle(report), ManagerResponse::Done);
    assert_eq!(harness.state(4), Some(ServerState::Down));
    harness.advance(timeout / 2);
    let now = harness.now;
    harness.manager().tick(now);
    assert_eq!(
        harness.state(1),
        Some(ServerState::Down),
        "silent one timeout"
    );
    assert_eq!(harness.state(3), Some(ServerState::Up));
}

#[test]
fn missed_stripes_make_server_stale_until_resynced() {
    let mut harness = Harness::with_servers(3);
    let file = harness.create("/a", Scheme::Raid5, None).meta.id;
    let other = harness.create("/b", Scheme::Raid5, None).meta.id;
    harness.missed(2, file, 10, 20);
    harness.missed(2, file, 15, 30);
    harness.missed(2, file, 40, 50);
    harness.missed(3, other, 0, 1);
    assert_eq!(harness.state(2), Some(ServerState::Stale));
    assert_eq!(harness.state(1), Some(ServerState::Up));
    assert_eq!(
        harness.heartbeat(2, INCARNATION),
        ManagerResponse::Registered {
            server: 2,
            state: ServerState::Stale,
            cluster: harness.manager().cluster(),
        }
    );

    let view = harness.lookup("/a");
    assert_eq!(
        view.missed,
        vec![MissedStripes {
            server: 2,
            stripes: vec![IndexRange::new(10, 30), IndexRange::new(40, 50)],
        }]
    );
    let column_of_2 = view.meta.servers.iter().position(|&s| s == 2).unwrap();
    assert_eq!(view.columns[column_of_2].state, ServerState::Stale);
    assert_eq!(
        harness.debts(2),
        vec![
            (
                "/a".to_string(),
                vec![IndexRange::new(10, 30), IndexRange::new(40, 50)]
            ),
            ("/b".to_string(), vec![]),
        ]
    );

    // A server outside the file cannot owe stripes of it.
    let harness_file_width_2 = harness.create("/c", Scheme::Raid0, Some(2)).meta;
    let outsider = (1..=3)
        .find(|s| !harness_file_width_2.servers.contains(s))
        .unwrap();
    let answer = harness.handle(ManagerRequest::ReportMissed {
        server: outsider,
        file: harness_file_width_2.id,
        stripes: IndexRange::new(0, 1),
    });
    assert!(matches!(error(answer), ManagerError::Layout(_)));

    harness.resynced(2, file, 12, 25);
    assert_eq!(
        harness.lookup("/a").missed[0].stripes,
        vec![
            IndexRange::new(10, 12),
            IndexRange::new(25, 30),
            IndexRange::new(40, 50)
        ]
    );
    harness.resynced(2, file, 0, 100);
    assert!(harness.lookup("/a").missed.is_empty());
    assert_eq!(harness.state(2), Some(ServerState::Up));
    // Server 3 still owes stripe 0 of the other file.
    assert_eq!(harness.state(3), Some(ServerState::Stale));
    harness.resynced(3, other, 0, 1);
    assert_eq!(harness.state(3), Some(ServerState::Up));
}

/// A rebuild names the debt's tag as it listed it; a miss reported since (even of stripes
/// owed already: a write that skipped the server after the rebuild wrote them) changes the
/// tag, and the manager refuses the rebuild's `Resynced` rather than forget that write.
#[test]
fn a_miss_reported_during_a_rebuild_keeps_the_debt() {
    let mut harness = Harness::with_servers(3);
    let file = harness.create("/a", Scheme::Raid5, None).meta.id;
    harness.missed(2, file, 0, 10);
    let listed = harness.debt_tag(2, file);
    assert_ne!(listed, 0);
    harness.missed(2, file, 3, 4);
    let now = harness.debt_tag(2, file);
    assert_ne!(
        now, listed,
        "a miss of a stripe owed already changes the tag"
    );
    let stale = ManagerRequest::Resynced {
        server: 2,
        file,
        stripes: IndexRange::new(0, 10),
        tag: listed,
    };
    assert_eq!(
        error(harness.handle(stale)),
        ManagerError::DebtChanged { server: 2, file }
    );
    assert_eq!(
        harness.lookup("/a").missed[0].stripes,
        vec![IndexRange::new(0, 10)]
    );
    // Listed again, the rebuild's `Resynced` goes through, in parts, under one tag.
    for (start, end) in [(0, 4), (4, 10)] {
        let answer = harness.handle(ManagerRequest::Resynced {
            server: 2,
            file,
            stripes: IndexRange::new(start, end),
            tag: now,
        });
        assert_eq!(answer, ManagerResponse::Done);
    }
    assert!(harness.lookup("/a").missed.is_empty());
    // A debt owed again after it was paid never gets an old tag back.
    harness.missed(2, file, 0, 10);
    let again = harness.debt_tag(2, file);
    assert!(again != listed && again != now);
    // Resyncing what is not owed is a no-op whatever the tag.
    harness.resynced(2, file, 0, 10);
    let nothing = harness.handle(ManagerRequest::Resynced {
        server: 2,
        file,
        stripes: IndexRange::new(0, 10),
        tag: listed,
    });
    assert_eq!(nothing, ManagerResponse::Done);
}

#[test]
fn wiped_store_owes_every_file_it_holds() {
    let mut harness = Harness::with_servers(4);
    // Width 2 over 4 servers: files land on different pairs.
    let metas: Vec<FileMeta> = (0..4)
        .map(|n| {
            harness
                .create(&format!("/f{n}"), Scheme::Raid1, Some(2))
                .meta
        })
        .collect();
    let holds_3: Vec<&FileMeta> = metas.iter().filter(|m| m.servers.contains(&3)).collect();
    assert!(!holds_3.is_empty() && holds_3.len() < metas.len());

    // Server 3 restarts with an empty store: a new incarnation, noticed at its heartbeat.
    let answer = harness.heartbeat(3, INCARNATION + 1);
    assert_eq!(
        answer,
        ManagerResponse::Registered {
            server: 3,
            state: ServerState::Stale,
            cluster: harness.manager().cluster(),
        }
    );
    for meta in &metas {
        let missed = harness.lookup(&meta.path).missed;
        if meta.servers.contains(&3) {
            let expected = vec![MissedStripes {
                server: 3,
                stripes: whole(),
            }];
            assert_eq!(missed, expected, "{}", meta.path);
        } else {
            assert!(missed.is_empty(), "{}", meta.path);
        }
    }
    let debts = harness.debts(3);
    assert_eq!(debts.len(), holds_3.len());
    assert!(debts.iter().all(|(_, missed)| *missed == whole()));
    // The new incarnation is recorded: heartbeating with it again changes nothing.
    assert_eq!(harness.heartbeat(3, INCARNATION + 1), answer);
    assert_eq!(harness.state(4), Some(ServerState::Up));

    // The same through Register: server 4's store is wiped too.
    assert_eq!(harness.register(Some(4), INCARNATION + 5), 4);
    assert_eq!(harness.state(4), Some(ServerState::Stale));
    let holds_4 = metas.iter().filter(|m| m.servers.contains(&4)).count();
    assert_eq!(harness.debts(4).len(), holds_4);
}

#[test]
fn register_keeps_a_known_id_and_never_reuses_it() {
    let mut harness = Harness::with_servers(1);
    // A server the manager has never heard of keeps the id it brings.
    assert_eq!(harness.register(Some(10), INCARNATION), 10);
    assert_eq!(harness.register(None, INCARNATION), 11);
    // Re-registering updates the address and keeps the id.
    let cluster = harness.manager().cluster();
    let answer = harness.handle(ManagerRequest::Register {
        server: Some(1),
        addr: "10.0.0.1:9".into(),
        incarnation: INCARNATION,
        cluster: Some(cluster),
    });
    assert_eq!(
        answer,
        ManagerResponse::Registered {
            server: 1,
            state: ServerState::Up,
            cluster: harness.manager().cluster(),
        }
    );
    let ManagerResponse::Servers(servers) = harness.handle(ManagerRequest::Status) else {
        panic!()
    };
    assert_eq!(
        servers[0],
        ServerStatus {
            id: 1,
            addr: "10.0.0.1:9".into(),
            incarnation: INCARNATION,
            state: ServerState::Up
        }
    );
    let ids: Vec<ServerId> = servers.iter().map(|s| s.id).collect();
    assert_eq!(ids, vec![1, 10, 11]);
}

#[test]
fn everything_survives_reopen_and_servers_start_down() {
    let mut harness = Harness::with_servers(3);
    let a = harness.create("/a", Scheme::Raid5, None).meta;
    let b = harness.create("/b", Scheme::Raid0, Some(2)).meta;
    let set_size = ManagerRequest::SetSize {
        file: a.id,
        size: 123_456,
        grow_only: true,
    };
    assert_eq!(harness.handle(set_size), ManagerResponse::Done);
    harness.missed(a.servers[1], a.id, 3, 9);
    let stale = a.servers[1];
    let servers_before = harness.states();

    harness.reopen();

    // Everything known is there; every server is down until it speaks.
    let states = harness.states();
    assert_eq!(states.len(), servers_before.len());
    assert!(states.iter().all(|&(_, state)| state == ServerState::Down));
    let view = harness.lookup("/a");
    assert_eq!(view.meta.size, 123_456);
    assert_eq!(view.meta.servers, a.servers);
    assert!(view.columns.iter().all(|c| c.state == ServerState::Down));
    assert_eq!(
        view.missed,
        vec![MissedStripes {
            server: stale,
            stripes: vec![IndexRange::new(3, 9)]
        }]
    );
    assert_eq!(harness.lookup("/b").meta, b);
    assert_eq!(
        error(harness.create_with("/c", Scheme::Raid0, None)),
        ManagerError::NotEnoughServers { wanted: 1, up: 0 }
    );

    // Servers come back with their old incarnation: no new debts, the old one still stands.
    for server in 1..=3 {
        let expected = if server == stale {
            ServerState::Stale
        } else {
            ServerState::Up
        };
        assert_eq!(
            harness.heartbeat(server, INCARNATION),
            ManagerResponse::Registered {
                server,
                state: expected,
                cluster: harness.manager().cluster(),
            }
        );
    }
    let debts = harness.debts(stale);
    assert_eq!(debts[0], ("/a".to_string(), vec![IndexRange::new(3, 9)]));

    // Counters carried on: new ids follow the old ones.
    let c = harness.create("/c", Scheme::Raid0, None).meta;
    assert_eq!(c.id, b.id + 1);
    assert_eq!(harness.register(None, INCARNATION), 4);

    // Incarnations survived too: a changed one after reopen is still seen as a wipe.
    harness.reopen();
    harness.heartbeat(1, INCARNATION + 1);
    assert_eq!(harness.debts(1).len(), 3);
    assert!(harness
        .debts(1)
        .iter()
        .all(|(_, missed)| *missed == whole()));
}

#[test]
fn files_spread_over_servers() {
    let mut harness = Harness::with_servers(5);
    let firsts: std::collections::BTreeSet<ServerId> = (0..5)
        .map(|n| {
            harness
                .create(&format!("/f{n}"), Scheme::Raid5, Some(3))
                .meta
        })
        .map(|meta| {
            // Columns are consecutive live servers, wrapping around.
            for pair in meta.servers.windows(2) {
                assert_eq!(pair[1], pair[0] % 5 + 1);
            }
            meta.servers[0]
        })
        .collect();
    assert_eq!(firsts.len(), 5);
}

#[test]
fn unknown_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    {
        let db = redb::Database::create(dir.path().join(store::DB_FILE_NAME)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(store::META)
            .unwrap()
            .insert(store::KEY_FORMAT_VERSION, 99)
            .unwrap();
        txn.commit().unwrap();
    }
    match Manager::open(dir.path(), ManagerConfig::default()) {
        Err(ManagerOpenError::UnknownFormat {
            found: 99,
            expected: 1,
            ..
        }) => {}
        Err(other) => panic!("open failed otherwise: {other}"),
        Ok(_) => panic!("opened a store of an unknown format"),
    }
}

#[test]
fn open_creates_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    drop(open(&nested));
    assert!(nested.join("manager.redb").is_file());
}

#[test]
fn grown_size_is_durable_after_sync() {
    let mut harness = Harness::with_servers(3);
    let a = harness.create("/grown", Scheme::Raid5, None).meta;
    let grow = ManagerRequest::SetSize {
        file: a.id,
        size: 777,
        grow_only: true,
    };
    assert_eq!(harness.handle(grow), ManagerResponse::Done);
    assert_eq!(harness.handle(ManagerRequest::Sync), ManagerResponse::Done);
    harness.reopen();
    assert_eq!(harness.lookup("/grown").meta.size, 777);
}

/// A client's sync restates the size its writes gave the file: a manager that lost that
/// grow (answered without sync, then a crash; here, never told) grows the file in the sync's
/// durable commit, so the sync does not acknowledge a size the store no longer has.
#[test]
fn sync_file_grants_a_grow_the_store_lost() {
    let mut harness = Harness::with_servers(3);
    let a = harness.create("/lost-grow", Scheme::Raid5, None).meta;
    let sync = |size| ManagerRequest::SyncFile { file: a.id, size };
    assert_eq!(harness.handle(sync(777)), ManagerResponse::Done);
    harness.reopen();
    assert_eq!(harness.lookup("/lost-grow").meta.size, 777);
    // Never a shrink: a larger size from another writer stays.
    assert_eq!(harness.handle(sync(100)), ManagerResponse::Done);
    assert_eq!(harness.lookup("/lost-grow").meta.size, 777);
    let too_large = sync(a.layout.file_bytes_max() + 1);
    assert!(matches!(
        harness.handle(too_large),
        ManagerResponse::Error(ManagerError::TooLarge { .. })
    ));
    assert_eq!(harness.lookup("/lost-grow").meta.size, 777);
    // A file removed since is only synced.
    let remove = ManagerRequest::Remove {
        path: "/lost-grow".into(),
    };
    assert!(!matches!(harness.handle(remove), ManagerResponse::Error(_)));
    assert_eq!(harness.handle(sync(999)), ManagerResponse::Done);
}

#[test]
fn servers_of_another_cluster_are_refused_and_the_cluster_id_persists() {
    let mut harness = Harness::with_servers(2);
    let ours = harness.manager().cluster();
    assert_ne!(ours, 0);
    let theirs = ours ^ 0x5a5a;
    let refused = ManagerError::WrongCluster { ours, theirs };
    // A server of another cluster, whose manager's address this manager now has: neither a
    // fresh registration nor a heartbeat under an id this cluster also uses gets it in.
    let stranger = ManagerRequest::Register {
        server: Some(1),
        addr: "10.9.9.9:7000".into(),
        incarnation: INCARNATION + 99,
        cluster: Some(theirs),
    };
    assert_eq!(
        harness.handle(stranger),
        ManagerResponse::Error(refused.clone())
    );
    let heartbeat = ManagerRequest::Heartbeat {
        server: 2,
        incarnation: INCARNATION + 99,
        cluster: theirs,
    };
    assert_eq!(harness.handle(heartbeat), ManagerResponse::Error(refused));
    let ManagerResponse::Servers(servers) = harness.handle(ManagerRequest::Status) else {
        panic!()
    };
    assert!(
        servers
            .iter()
            .all(|s| s.incarnation == INCARNATION && !s.addr.starts_with("10.9.")),
        "the strangers changed nothing: {servers:?}"
    );
    assert!(harness.debts(1).is_empty() && harness.debts(2).is_empty());

    // A server of this cluster, or one that never joined any, is welcome.
    assert_eq!(harness.register(None, INCARNATION), 3);
    let member = ManagerRequest::Register {
        server: Some(1),
        addr: "127.0.0.1:7001".into(),
        incarnation: INCARNATION,
        cluster: Some(ours),
    };
    assert!(matches!(
        harness.handle(member),
        ManagerResponse::Registered { server: 1, cluster, .. } if cluster == ours
    ));
    harness.reopen();
    assert_eq!(harness.manager().cluster(), ours, "kept across a restart");
}

impl Harness {
    fn create_pending(&mut self, path: &str) -> (FileView, Duration) {
        let answer = self.handle(ManagerRequest::CreatePending {
            path: path.to_string(),
            layout: LayoutRequest {
                scheme: Scheme::Raid5,
                stripe_unit: STRIPE_UNIT,
                width: None,
            },
        });
        match answer {
            ManagerResponse::Pending { view, lease_ms } => (view, Duration::from_millis(lease_ms)),
            other => panic!("create pending {path} answered {other:?}"),
        }
    }

    fn orphans(&mut self, server: ServerId) -> Vec<FileId> {
        match self.handle(ManagerRequest::Orphans { server }) {
            ManagerResponse::Orphans(files) => files,
            other => panic!("orphans of {server} answered {other:?}"),
        }
    }
}

#[test]
fn pending_file_is_unnamed_until_committed_then_takes_the_path_in_one_step() {
    let mut harness = Harness::with_servers(3);
    let old = harness.create("/a", Scheme::Raid1, Some(2));
    let (pending, lease) = harness.create_pending("/a");
    assert_eq!(lease, PENDING_LEASE_DEFAULT);
    assert_ne!(pending.meta.id, old.meta.id);
    assert_eq!(pending.meta.path, "/a");
    // Readers still see the old file, and listings show one "/a".
    assert_eq!(harness.lookup("/a").meta.id, old.meta.id);
    assert_eq!(harness.list(""), vec!["/a"]);
    // The writer reaches the pending file by id and grows it.
    let id = pending.meta.id;
    let grow = ManagerRequest::SetSize {
        file: id,
        size: 12345,
        grow_only: true,
    };
    assert_eq!(harness.handle(grow), ManagerResponse::Done);
    assert_eq!(harness.lookup("/a").meta.size, 0);
    assert!(harness.orphans(1).is_empty());

    let committed = harness.handle(ManagerRequest::CommitPending { file: id });
    assert_eq!(
        committed,
        ManagerResponse::Committed {
            replaced: Some(old.meta.clone())
        }
    );
    let now = harness.lookup("/a").meta;
    assert_eq!((now.id, now.size), (id, 12345));
    assert_eq!(harness.list(""), vec!["/a"]);
    assert_eq!(
        error(harness.handle(ManagerRequest::LookupId { file: old.meta.id })),
        ManagerError::NotFound(old.meta.id.to_string())
    );
    // A second commit, and an abandon after it, find nothing pending.
    for request in [
        ManagerRequest::CommitPending { file: id },
        ManagerRequest::AbandonPending { file: id },
        ManagerRequest::RenewPending { file: id },
    ] {
        assert_eq!(error(harness.handle(request)), ManagerError::NotPending(id));
    }
    // The old file's servers are told to delete its data, until they say they did.
    for &server in &old.meta.servers {
        assert_eq!(harness.orphans(server), vec![old.meta.id]);
        let removed = ManagerRequest::OrphansRemoved {
            server,
            files: vec![old.meta.id],
        };
        assert_eq!(harness.handle(removed), ManagerResponse::Done);
        assert!(harness.orphans(server).is_empty());
    }
    // Committing to a free path just names the file.
    let (fresh, _) = harness.create_pending("/b");
    let committed = harness.handle(ManagerRequest::CommitPending {
        file: fresh.meta.id,
    });
    assert_eq!(committed, ManagerResponse::Committed { replaced: None });
    assert_eq!(harness.list(""), vec!["/a", "/b"]);
}

#[test]
fn a_sized_commit_sets_the_size_in_the_commit_and_refuses_one_past_the_maximum() {
    let mut harness = Harness::with_servers(3);
    let (pending, _) = harness.create_pending("/a");
    let id = pending.meta.id;
    let max = pending.meta.layout.file_bytes_max();
    // Too large: refused, and the file is still pending (nothing of the commit applied).
    let too_large = ManagerRequest::CommitPendingSized {
        file: id,
        size: max + 1,
    };
    assert!(matches!(
        error(harness.handle(too_large)),
        ManagerError::TooLarge { .. }
    ));
    assert!(harness.list("").is_empty());
    let committed = harness.handle(ManagerRequest::CommitPendingSized {
        file: id,
        size: 65536,
    });
    assert_eq!(committed, ManagerResponse::Committed { replaced: None });
    let now = harness.lookup("/a").meta;
    assert_eq!((now.id, now.size), (id, 65536));
    let again = ManagerRequest::CommitPendingSized { file: id, size: 1 };
    assert_eq!(error(harness.handle(again)), ManagerError::NotPending(id));
}

#[test]
fn pending_file_of_a_silent_writer_is_removed_after_its_lease() {
    let mut harness = Harness::with_servers(3);
    let old = harness.create("/a", Scheme::Raid5, None);
    let (pending, lease) = harness.create_pending("/a");
    let id = pending.meta.id;
    assert_eq!(harness.manager().pending_files(), vec![id]);
    assert_eq!(
        harness.manager().poll_timeout(),
        Some(harness.now + HEARTBEAT_TIMEOUT_DEFAULT)
    );

    // Renewals (explicit, or any lookup by id) keep it alive past its first lease.
    harness.advance(lease / 2);
    assert_eq!(
        harness.handle(ManagerRequest::RenewPending { file: id }),
        ManagerResponse::Done
    );
    harness.advance(lease * 3 / 4);
    assert!(matches!(
        harness.handle(ManagerRequest::LookupId { file: id }),
        ManagerResponse::File(_)
    ));
    harness.advance(lease - Duration::from_millis(1));
    let now = harness.now;
    harness.manager().tick(now);
    assert_eq!(harness.manager().pending_files(), vec![id]);

    // Silent for a whole lease: gone, with its data left to its servers to delete.
    harness.advance(Duration::from_millis(1));
    let now = harness.now;
    harness.manager().tick(now);
    assert!(harness.manager().pending_files().is_empty());
    assert_eq!(
        error(harness.handle(ManagerRequest::CommitPending { file: id })),
        ManagerError::NotPending(id)
    );
    for &server in &pending.meta.servers {
        assert_eq!(harness.orphans(server), vec![id]);
    }
    // The old file is untouched.
    assert_eq!(harness.lookup("/a").meta, old.meta);
}

#[test]
fn abandoned_pending_file_is_removed_and_leaves_the_path_alone() {
    let mut harness = Harness::with_servers(3);
    let old = harness.create("/a", Scheme::Raid5, None);
    let (pending, _) = harness.create_pending("/a");
    let abandoned = harness.handle(ManagerRequest::AbandonPending {
        file: pending.meta.id,
    });
    assert_eq!(abandoned, ManagerResponse::Meta(pending.meta.clone()));
    assert_eq!(harness.lookup("/a").meta, old.meta);
    assert!(harness.manager().pending_files().is_empty());
    for &server in &pending.meta.servers {
        assert_eq!(harness.orphans(server), vec![pending.meta.id]);
    }
}

#[test]
fn pending_file_survives_a_restart_with_a_fresh_lease() {
    let mut harness = Harness::with_servers(3);
    let (pending, lease) = harness.create_pending("/a");
    let id = pending.meta.id;
    harness.advance(lease - Duration::from_secs(1));
    harness.reopen();
    assert_eq!(harness.manager().pending_files(), vec![id]);
    assert!(harness.list("").is_empty());
    // The lease starts at the first tick after the restart.
    let now = harness.now;
    harness.manager().tick(now);
    harness.advance(lease - Duration::from_millis(1));
    let now = harness.now;
    harness.manager().tick(now);
    assert_eq!(harness.manager().pending_files(), vec![id]);
    harness.advance(Duration::from_millis(1));
    let now = harness.now;
    harness.manager().tick(now);
    assert!(harness.manager().pending_files().is_empty());
}

#[test]
fn sizes_past_the_layouts_maximum_are_refused() {
    let mut harness = Harness::with_servers(3);
    let file = harness.create("/a", Scheme::Raid5, None);
    let max = file.meta.layout.file_bytes_max();
    // Width 3, RAID-5: two data columns of 1 TiB each.
    assert_eq!(max, 2 << 40);
    for size in [max + 1, u64::MAX] {
        for grow_only in [true, false] {
            let request = ManagerRequest::SetSize {
                file: file.meta.id,
                size,
                grow_only,
            };
            let refused = error(harness.handle(request));
            assert!(
                matches!(refused, ManagerError::TooLarge { max: m, .. } if m == max),
                "{refused:?}"
            );
        }
    }
    assert_eq!(harness.lookup("/a").meta.size, 0);
    for size in [max - 1, max] {
        let request = ManagerRequest::SetSize {
            file: file.meta.id,
            size,
            grow_only: true,
        };
        assert_eq!(harness.handle(request), ManagerResponse::Done);
        assert_eq!(harness.lookup("/a").meta.size, size);
    }
}

#[test]
fn a_cluster_id_passed_in_is_used_for_a_new_store_only() {
    let dir = tempfile::tempdir().unwrap();
    let seeded = |cluster_id| ManagerConfig {
        cluster_id,
        ..ManagerConfig::default()
    };
    let manager = Manager::open(dir.path(), seeded(Some(0x1234))).unwrap();
    assert_eq!(manager.cluster(), 0x1234);
    drop(manager);
    // An existing store keeps its id whatever the configuration says.
    let manager = Manager::open(dir.path(), seeded(Some(0x9999))).unwrap();
    assert_eq!(manager.cluster(), 0x1234);
    // 0 names no cluster, so it is never drawn nor given.
    let other = tempfile::tempdir().unwrap();
    assert_eq!(
        Manager::open(other.path(), seeded(Some(0)))
            .unwrap()
            .cluster(),
        1
    );
}

fn snapshots(answer: ManagerResponse) -> Vec<tessera_wire::SnapshotInfo> {
    match answer {
        ManagerResponse::Snapshots(all) => all,
        other => panic!("expected snapshots, got {other:?}"),
    }
}

#[test]
fn snapshots_hold_their_files_past_removal_and_free_them_when_removed() {
    let mut harness = Harness::with_servers(3);
    let a = harness.create("/s/a", Scheme::Raid5, None).meta;
    harness.create("/s/b", Scheme::Raid1, Some(2));
    harness.create("/t", Scheme::Raid0, Some(1));
    let set_size = ManagerRequest::SetSize {
        file: a.id,
        size: 1 << 30,
        grow_only: false,
    };
    assert_eq!(harness.handle(set_size), ManagerResponse::Done);
    let create = |name: &str| ManagerRequest::SnapshotCreate {
        name: name.into(),
        prefix: "/s/".into(),
    };
    let first = snapshots(harness.handle(create("one"))).remove(0);
    assert_eq!((first.epoch, first.ready, first.file_count), (1, false, 2));
    assert_eq!(first.bytes, 1 << 30);
    assert_eq!(first.files[0].meta.id, a.id);
    assert_eq!(
        error(harness.handle(create("one"))),
        ManagerError::Exists("snapshot one".into())
    );
    let ready = ManagerRequest::SnapshotReady { name: "one".into() };
    assert_eq!(harness.handle(ready), ManagerResponse::Done);
    let second = snapshots(harness.handle(create("two"))).remove(0);
    assert_eq!(second.epoch, 2);
    harness.reopen();
    let listed = snapshots(harness.handle(ManagerRequest::SnapshotList { name: None }));
    let names: Vec<(&str, u64, bool, usize)> = listed
        .iter()
        .map(|s| (s.name.as_str(), s.epoch, s.ready, s.files.len()))
        .collect();
    assert_eq!(names, vec![("one", 1, true, 0), ("two", 2, false, 0)]);

    // Removing a held file keeps its record (and data) for the snapshots.
    let removed = harness.handle(ManagerRequest::Remove {
        path: "/s/a".into(),
    });
    let a = FileMeta { size: 1 << 30, ..a };
    assert_eq!(removed, ManagerResponse::Retained(a.clone()));
    assert!(!harness.list("/s/").contains(&"/s/a".to_string()));
    assert!(matches!(
        harness.handle(ManagerRequest::LookupId { file: a.id }),
        ManagerResponse::File(_)
    ));
    let orphans = harness.handle(ManagerRequest::Orphans { server: 1 });
    assert_eq!(orphans, ManagerResponse::Orphans(Vec::new()));

    let remove = |name: &str| ManagerRequest::SnapshotRemove { name: name.into() };
    let ManagerResponse::SnapshotRemoved { live, freed, .. } = harness.handle(remove("one")) else {
        panic!("snapshot remove answered otherwise")
    };
    assert!(freed.is_empty(), "snapshot two still holds it");
    assert_eq!(live[0], (a.id, vec![2]));
    let ManagerResponse::SnapshotRemoved { live, freed, .. } = harness.handle(remove("two")) else {
        panic!("snapshot remove answered otherwise")
    };
    assert_eq!(freed, vec![a.clone()]);
    assert_eq!(live[0], (a.id, vec![]));
    assert_eq!(
        error(harness.handle(ManagerRequest::LookupId { file: a.id })),
        ManagerError::NotFound(a.id.to_string())
    );
    let ManagerResponse::Orphans(orphans) = harness.handle(ManagerRequest::Orphans {
        server: a.servers[0],
    }) else {
        panic!("orphans")
    };
    assert_eq!(orphans, vec![a.id]);
    assert_eq!(
        error(harness.handle(remove("two"))),
        ManagerError::NotFound("snapshot two".into())
    );
    // Epochs are never reused.
    assert_eq!(snapshots(harness.handle(create("three")))[0].epoch, 3);
}
