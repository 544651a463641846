//! The manager's store lost and found again: deleted or replaced while the manager runs,
//! missing at start, rebuilt from the servers' records (issue 15, item 8).

use crate::recovery::{self, RecoveryError, ServerReport, RECOVERED_FILE_ID_GAP};
use crate::{refuse_without_store, Manager, ManagerConfig, ManagerOpenError};
use std::path::Path;
use std::time::Instant;
use tessera_layout::{Layout, Scheme};
use tessera_wire::{
    ClusterId, FileMeta, IndexRange, LayoutRequest, ManagerError, ManagerRequest, ManagerResponse,
    ServerState,
};

const INCARNATION: u64 = 7;

/// A manager with three servers registered and two files, one grown to 5000 bytes.
fn populated(dir: &Path) -> (Manager, Instant) {
    let mut manager = Manager::open(dir, ManagerConfig::default()).unwrap();
    let now = Instant::now();
    for port in 1..=3 {
        let request = ManagerRequest::Register {
            server: None,
            addr: format!("127.0.0.1:700{port}"),
            incarnation: INCARNATION + port,
            cluster: None,
        };
        assert!(matches!(
            manager.handle(request, now),
            ManagerResponse::Registered { .. }
        ));
    }
    for path in ["/a", "/b"] {
        let create = ManagerRequest::Create {
            path: path.into(),
            layout: LayoutRequest {
                scheme: Scheme::Raid5,
                stripe_unit: 65536,
                width: None,
            },
            replace: false,
        };
        assert!(matches!(
            manager.handle(create, now),
            ManagerResponse::File(_)
        ));
    }
    let grow = ManagerRequest::SetSize {
        file: 1,
        size: 5000,
        grow_only: true,
    };
    assert_eq!(manager.handle(grow, now), ManagerResponse::Done);
    (manager, now)
}

fn create(path: &str) -> ManagerRequest {
    ManagerRequest::Create {
        path: path.into(),
        layout: LayoutRequest {
            scheme: Scheme::Raid1,
            stripe_unit: 65536,
            width: Some(2),
        },
        replace: false,
    }
}

fn store_lost(answer: ManagerResponse) -> String {
    match answer {
        ManagerResponse::Error(ManagerError::StoreLost { what, .. }) => what,
        other => panic!("expected the store to be lost, got {other:?}"),
    }
}

/// Deleting `manager.redb` under a running manager: it notices at the next check (the
/// daemon's tick) and refuses every change, which would otherwise be acknowledged into an
/// unlinked file and gone at the next start. Reads and heartbeats go on from the open copy.
#[test]
fn deleted_store_is_noticed_and_changes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut manager, now) = populated(dir.path());
    let missed = ManagerRequest::ReportMissed {
        server: 2,
        file: 1,
        stripes: IndexRange::new(3, 9),
    };
    assert_eq!(manager.handle(missed, now), ManagerResponse::Done);
    let key = ManagerRequest::KeyCreate { name: "k".into() };
    assert!(matches!(
        manager.handle(key, now),
        ManagerResponse::KeyCreated { .. }
    ));
    let (cluster, files) = (manager.cluster(), records_of(&mut manager, now));
    assert_eq!(manager.check_store(), Ok(()));
    let whole = manager.state_dump();
    std::fs::remove_file(dir.path().join("manager.redb")).unwrap();

    let lost = manager.check_store().unwrap_err();
    assert!(
        lost.to_string()
            .contains("was deleted while the manager ran"),
        "{lost}"
    );
    assert_eq!(store_lost(manager.handle(create("/c"), now)), "deleted");
    let grow = ManagerRequest::SetSize {
        file: 1,
        size: 9000,
        grow_only: true,
    };
    assert_eq!(store_lost(manager.handle(grow, now)), "deleted");
    let remove = ManagerRequest::Remove { path: "/a".into() };
    assert_eq!(store_lost(manager.handle(remove, now)), "deleted");
    // Still served: what it knows, unchanged.
    let ManagerResponse::File(view) =
        manager.handle(ManagerRequest::Lookup { path: "/a".into() }, now)
    else {
        panic!("lookup refused")
    };
    assert_eq!(view.meta.size, 5000);
    let heartbeat = ManagerRequest::Heartbeat {
        server: 1,
        incarnation: INCARNATION + 1,
        cluster: manager.cluster(),
    };
    assert!(matches!(
        manager.handle(heartbeat, now),
        ManagerResponse::Registered { .. }
    ));
    // Nothing was written anywhere the next start would find.
    drop(manager);
    assert!(matches!(
        Manager::open_existing(dir.path(), ManagerConfig::default()),
        Err(ManagerOpenError::NoStore { .. })
    ));
    // But the whole store was copied aside: moved into place, it is the store as it was,
    // the debt of server 2 included.
    let rescued: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.display().to_string().contains("manager.redb.rescued-"))
        .collect();
    assert_eq!(rescued.len(), 1, "{rescued:?}");
    std::fs::rename(&rescued[0], dir.path().join("manager.redb")).unwrap();
    let mut manager = Manager::open_existing(dir.path(), ManagerConfig::default()).unwrap();
    // Every table, access keys included.
    assert_eq!(manager.state_dump(), whole);
    assert_eq!(manager.cluster(), cluster);
    assert_eq!(records_of(&mut manager, now), files);
    let ManagerResponse::Debts(debts) =
        manager.handle(ManagerRequest::FilesOnServer { server: 2 }, now)
    else {
        panic!("files on server 2 refused")
    };
    let owed: Vec<_> = debts
        .iter()
        .map(|d| (d.meta.id, d.missed.clone()))
        .collect();
    assert!(owed.contains(&(1, vec![IndexRange::new(3, 9)])), "{owed:?}");
}

/// A file put in the store's place (another store, an old copy) is noticed the same way: the
/// manager never writes into the file it opened while another is at its path.
#[test]
fn replaced_store_is_noticed_on_the_next_change() {
    let dir = tempfile::tempdir().unwrap();
    let (mut manager, now) = populated(dir.path());
    let other = tempfile::tempdir().unwrap();
    drop(Manager::open(other.path(), ManagerConfig::default()).unwrap());
    std::fs::rename(
        other.path().join("manager.redb"),
        dir.path().join("manager.redb"),
    )
    .unwrap();
    // No tick in between: the change itself checks first.
    let what = store_lost(manager.handle(create("/c"), now));
    assert!(what.starts_with("replaced by another file"), "{what}");
}

/// A manager started without `--init` where there is no store does not start a new cluster:
/// it refuses every server, naming the cluster the server's data belongs to and the way out.
#[test]
fn missing_store_is_not_created_and_servers_are_refused_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let opened = Manager::open_existing(dir.path(), ManagerConfig::default());
    assert!(matches!(opened, Err(ManagerOpenError::NoStore { .. })));
    assert!(!dir.path().join("manager.redb").exists());

    let store = dir.path().join("manager.redb");
    let register = ManagerRequest::Register {
        server: Some(2),
        addr: "127.0.0.1:7002".into(),
        incarnation: INCARNATION,
        cluster: Some(0xabcd),
    };
    let ManagerResponse::Error(refusal) = refuse_without_store(&store, &register) else {
        panic!("a server was let in without a store")
    };
    assert_eq!(
        refusal,
        ManagerError::NoStore {
            path: store.display().to_string(),
            cluster: Some(0xabcd),
        }
    );
    let text = refusal.to_string();
    assert!(
        text.contains("0xabcd") && text.contains("tessera manager recover"),
        "{text}"
    );
    let lookup = ManagerRequest::Lookup { path: "/a".into() };
    assert!(matches!(
        refuse_without_store(&store, &lookup),
        ManagerResponse::Error(ManagerError::NoStore { cluster: None, .. })
    ));
    // With --init (Manager::open) a store is created: a new cluster.
    let manager = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
    assert_ne!(manager.cluster(), 0);
}

fn report(addr: &str, server: u32, cluster: ClusterId, records: Vec<FileMeta>) -> ServerReport {
    ServerReport {
        addr: addr.into(),
        server: Some(server),
        incarnation: INCARNATION + u64::from(server),
        cluster: Some(cluster),
        records,
        damaged: Vec::new(),
        unrecorded: Vec::new(),
        uncommitted: Vec::new(),
    }
}

/// What the servers hold of a populated manager's files.
fn records_of(manager: &mut Manager, now: Instant) -> Vec<FileMeta> {
    match manager.handle(ManagerRequest::List { prefix: "".into() }, now) {
        ManagerResponse::Files(files) => files,
        other => panic!("list answered {other:?}"),
    }
}

/// Recovery from the servers' records: the same namespace, sizes and cluster id, servers
/// accepted as they are (up, owing nothing), and new files numbered above every old one.
#[test]
fn recovered_store_has_the_namespace_cluster_and_servers() {
    let dir = tempfile::tempdir().unwrap();
    let (mut manager, now) = populated(dir.path());
    let cluster = manager.cluster();
    let files = records_of(&mut manager, now);
    drop(manager);
    std::fs::remove_file(dir.path().join("manager.redb")).unwrap();

    // Server 3 missed the last size change of /a.
    let mut stale = files.clone();
    stale[0].size = 0;
    let reports = vec![
        report("127.0.0.1:7001", 1, cluster, files.clone()),
        report("127.0.0.1:7002", 2, cluster, files.clone()),
        report("127.0.0.1:7003", 3, cluster, stale),
    ];
    let recovered = recovery::merge(&reports).unwrap();
    recovery::write_store(dir.path(), &recovered).unwrap();
    assert!(matches!(
        recovery::write_store(dir.path(), &recovered),
        Err(ManagerOpenError::StoreExists { .. })
    ));

    let mut manager = Manager::open_existing(dir.path(), ManagerConfig::default()).unwrap();
    assert_eq!(manager.cluster(), cluster);
    assert_eq!(records_of(&mut manager, now), files);
    for server in 1..=3u32 {
        let heartbeat = ManagerRequest::Heartbeat {
            server,
            incarnation: INCARNATION + u64::from(server),
            cluster,
        };
        assert!(matches!(
            manager.handle(heartbeat, now),
            ManagerResponse::Registered {
                state: ServerState::Up,
                ..
            }
        ));
    }
    let ManagerResponse::File(view) = manager.handle(create("/c"), now) else {
        panic!("create refused after recovery")
    };
    assert_eq!(
        view.meta.id,
        2 + RECOVERED_FILE_ID_GAP,
        "past every id seen, by the gap"
    );
    let register = ManagerRequest::Register {
        server: None,
        addr: "127.0.0.1:7004".into(),
        incarnation: 99,
        cluster: None,
    };
    assert!(matches!(
        manager.handle(register, now),
        ManagerResponse::Registered { server: 4, .. }
    ));
}

fn meta(id: u64, path: &str, size: u64, servers: Vec<u32>) -> FileMeta {
    FileMeta {
        id,
        path: path.into(),
        layout: Layout::new(Scheme::Raid1, 65536, servers.len() as u32).unwrap(),
        servers,
        size,
    }
}

/// The merge rules of the recovery module's doc, one by one.
#[test]
fn merge_takes_the_largest_size_the_common_path_and_keeps_every_file() {
    let cluster = 0x5eed;
    let reports = vec![
        report("a:1", 1, cluster, vec![meta(4, "/x", 10, vec![1, 2])]),
        report(
            "a:2",
            2,
            cluster,
            vec![meta(4, "/x", 70, vec![1, 2]), meta(9, "/x", 5, vec![2, 3])],
        ),
        report("a:3", 3, cluster, vec![meta(9, "/x", 8, vec![2, 3])]),
    ];
    let recovered = recovery::merge(&reports).unwrap();
    assert_eq!(recovered.cluster, cluster);
    assert_eq!(recovered.file_id_next, 9 + RECOVERED_FILE_ID_GAP);
    assert_eq!(
        recovered.files,
        vec![
            meta(4, "lost+found/4", 70, vec![1, 2]),
            meta(9, "/x", 8, vec![2, 3])
        ]
    );
    assert!(recovered.notes.iter().any(|n| n.contains("lost+found/4")));

    // A renamed file whose rename one server missed: the path most records name.
    let renamed = vec![
        report("a:1", 1, cluster, vec![meta(5, "/new", 1, vec![1, 2, 3])]),
        report("a:2", 2, cluster, vec![meta(5, "/old", 1, vec![1, 2, 3])]),
        report("a:3", 3, cluster, vec![meta(5, "/new", 1, vec![1, 2, 3])]),
    ];
    assert_eq!(recovery::merge(&renamed).unwrap().files[0].path, "/new");

    // The new file of an interrupted put (never recorded committed) does not take the path.
    let mut interrupted = report("a:1", 1, cluster, vec![meta(4, "/x", 9, vec![1, 2])]);
    interrupted.records.push(meta(6, "/x", 3, vec![1, 2]));
    interrupted.uncommitted = vec![6];
    let mut committed_elsewhere = report("a:2", 2, cluster, vec![meta(4, "/x", 9, vec![1, 2])]);
    committed_elsewhere
        .records
        .push(meta(6, "/x", 3, vec![1, 2]));
    committed_elsewhere.uncommitted = vec![6];
    let recovered = recovery::merge(&[interrupted.clone(), committed_elsewhere.clone()]).unwrap();
    assert_eq!(recovered.files, vec![meta(4, "/x", 9, vec![1, 2])]);
    assert_eq!(recovered.abandoned, vec![meta(6, "/x", 3, vec![1, 2])]);
    assert_eq!(recovered.file_id_next, 6 + RECOVERED_FILE_ID_GAP);
    // One server that saw the commit is enough.
    committed_elsewhere.uncommitted.clear();
    let recovered = recovery::merge(&[interrupted, committed_elsewhere]).unwrap();
    assert_eq!(recovered.files[1], meta(6, "/x", 3, vec![1, 2]));
    assert_eq!(recovered.files[0].path, "lost+found/4");

    // Ids of files without a whole record are never handed out again.
    let mut unrecorded = report("a:1", 1, cluster, vec![meta(4, "/x", 1, vec![1, 2])]);
    unrecorded.damaged = vec![77];
    unrecorded.unrecorded = vec![50];
    let recovered = recovery::merge(&[unrecorded, report("a:2", 2, cluster, vec![])]).unwrap();
    assert_eq!(recovered.file_id_next, 77 + RECOVERED_FILE_ID_GAP);
    assert_eq!(recovered.files.len(), 1);
    assert!(
        recovered.notes.iter().any(|n| n.contains("[50, 77]")),
        "{:?}",
        recovered.notes
    );

    let missing = vec![report(
        "a:1",
        1,
        cluster,
        vec![meta(4, "/x", 1, vec![1, 2])],
    )];
    assert_eq!(
        recovery::merge(&missing),
        Err(RecoveryError::MissingServers { missing: vec![2] })
    );
    let mixed = vec![report("a:1", 1, 1, vec![]), report("a:2", 2, 2, vec![])];
    assert!(matches!(
        recovery::merge(&mixed),
        Err(RecoveryError::MixedClusters(_))
    ));
    let twice = vec![report("a:1", 1, 1, vec![]), report("a:2", 1, 1, vec![])];
    assert!(matches!(
        recovery::merge(&twice),
        Err(RecoveryError::DuplicateServer { server: 1, .. })
    ));
    let conflict = vec![
        report("a:1", 1, cluster, vec![meta(4, "/x", 1, vec![1, 2])]),
        report("a:2", 2, cluster, vec![meta(4, "/x", 1, vec![2, 1])]),
    ];
    assert!(matches!(
        recovery::merge(&conflict),
        Err(RecoveryError::Conflict { file: 4, .. })
    ));
    let strangers = vec![ServerReport {
        cluster: None,
        ..report("a:1", 1, 1, vec![])
    }];
    assert_eq!(recovery::merge(&strangers), Err(RecoveryError::NoCluster));
}

/// Flips one bit of a stopped manager's store at a time, at seeded random places (the seed
/// printed; `TESSERA_FLIP_SEED` replays one, `TESSERA_FLIPS` sets how many), and opens it again: every flip must either
/// keep the manager from starting (with an error naming the file) or leave the store it
/// reads exactly as it was. A flipped bit that changed a file's layout, size, columns or
/// debts unnoticed would have the client read or rebuild the wrong bytes.
#[test]
fn a_flipped_bit_in_the_managers_store_is_refused_or_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let (mut manager, now) = populated(dir.path());
    for index in 0..200 {
        let answer = manager.handle(create(&format!("/many/file-{index:04}")), now);
        let ManagerResponse::File(view) = answer else {
            panic!("{answer:?}")
        };
        let missed = ManagerRequest::ReportMissed {
            server: view.columns[0].id,
            file: view.meta.id,
            stripes: IndexRange {
                start: index,
                end: index + 3,
            },
        };
        assert_eq!(manager.handle(missed, now), ManagerResponse::Done);
    }
    let expected = manager.state_dump();
    drop(manager);
    let path = dir.path().join(crate::store::DB_FILE_NAME);
    let clean = std::fs::read(&path).unwrap();
    let seed: u64 = std::env::var("TESSERA_FLIP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!(
        "seed {seed} (TESSERA_FLIP_SEED replays it); store of {} bytes",
        clean.len()
    );
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let (mut refused, mut unchanged) = (0, 0);
    let flips: u32 = std::env::var("TESSERA_FLIPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(FLIPS);
    for flip in 0..flips {
        let bit = rand::Rng::gen_range(&mut rng, 0..clean.len() as u64 * 8);
        let mut bytes = clean.clone();
        bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
        std::fs::write(&path, &bytes).unwrap();
        match Manager::open_existing(dir.path(), ManagerConfig::default()) {
            Err(error) => {
                assert!(error.to_string().contains("manager.redb"), "{error}");
                refused += 1;
            }
            Ok(manager) => {
                let dump = crate::store::dump(&manager.db).expect("an opened store reads");
                let changed: Vec<_> = (dump.iter().filter(|line| !expected.contains(line)))
                    .chain(expected.iter().filter(|line| !dump.contains(line)))
                    .take(4)
                    .collect();
                assert!(
                    changed.is_empty(),
                    "seed {seed}, flip {flip} (bit {bit}): the store opened and reads otherwise: \
                     {changed:?}"
                );
                unchanged += 1;
            }
        }
    }
    println!("{flips} flips: {refused} refused at open, {unchanged} left the store as it was");
}

/// Single-bit flips per run of [`a_flipped_bit_in_the_managers_store_is_refused_or_harmless`]
/// (`TESSERA_FLIPS` sets another count: each opens and checks the whole store).
const FLIPS: u32 = 400;

/// A stopped manager's store cut short (a torn copy, a file system that lost its tail, a
/// truncation to zero): the manager must refuse it with an error naming the file, or read it
/// exactly as it was. An empty file is what redb initializes a new database in, so without a
/// check the manager would start with no files at all.
#[test]
fn a_truncated_manager_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _now) = populated(dir.path());
    let expected = manager.state_dump();
    drop(manager);
    let path = dir.path().join(crate::store::DB_FILE_NAME);
    let clean = std::fs::read(&path).unwrap();
    let len = clean.len();
    let mut lengths = vec![0, 1, 511, 512, 4096, len / 2, len - 4096, len - 1];
    lengths.extend((1..16).map(|i| len * i / 16));
    for cut in lengths {
        std::fs::write(&path, &clean[..cut]).unwrap();
        match Manager::open_existing(dir.path(), ManagerConfig::default()) {
            Err(error) => assert!(error.to_string().contains("manager.redb"), "{error}"),
            Ok(manager) => {
                let dump = crate::store::dump(&manager.db).expect("an opened store reads");
                assert_eq!(
                    dump, expected,
                    "store cut to {cut} of {len} bytes opened and reads otherwise"
                );
            }
        }
    }
}
