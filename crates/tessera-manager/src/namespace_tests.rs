//! The directory tree: made directories, renames of files and directories, listings and
//! times, checked case by case and against a model under random operations.

use crate::{Manager, ManagerConfig};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Instant;
use tessera_layout::Scheme;
use tessera_wire::{
    DirListing, LayoutRequest, ManagerError, ManagerRequest, ManagerResponse, NamespaceEntry,
    NamespaceRequest, Times, TimesOf,
};

struct Tree {
    _dir: tempfile::TempDir,
    manager: Manager,
    now: Instant,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let mut manager = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
        let now = Instant::now();
        for port in 0..3 {
            let answer = manager.handle(
                ManagerRequest::Register {
                    server: None,
                    addr: format!("127.0.0.1:{}", 8000 + port),
                    incarnation: 7,
                    cluster: None,
                },
                now,
            );
            assert!(matches!(answer, ManagerResponse::Registered { .. }));
        }
        Tree {
            _dir: dir,
            manager,
            now,
        }
    }

    fn ask(&mut self, request: NamespaceRequest) -> ManagerResponse {
        self.manager
            .handle(ManagerRequest::Namespace(request), self.now)
    }

    fn done(&mut self, request: NamespaceRequest) -> Result<(), ManagerError> {
        match self.ask(request) {
            ManagerResponse::Done => Ok(()),
            ManagerResponse::Error(error) => Err(error),
            other => panic!("answered {other:?}"),
        }
    }

    fn create(&mut self, path: &str) -> Result<u64, ManagerError> {
        let request = ManagerRequest::Create {
            path: path.to_string(),
            layout: LayoutRequest {
                scheme: Scheme::Raid5,
                stripe_unit: 65536,
                width: None,
            },
            replace: false,
        };
        match self.manager.handle(request, self.now) {
            ManagerResponse::File(view) => Ok(view.meta.id),
            ManagerResponse::Error(error) => Err(error),
            other => panic!("create answered {other:?}"),
        }
    }

    fn mkdir(&mut self, path: &str) -> Result<(), ManagerError> {
        self.done(NamespaceRequest::MakeDir { path: path.into() })
    }

    fn rmdir(&mut self, path: &str) -> Result<(), ManagerError> {
        self.done(NamespaceRequest::RemoveDir { path: path.into() })
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), ManagerError> {
        self.done(NamespaceRequest::Rename {
            from: from.into(),
            to: to.into(),
        })
    }

    fn ls(&mut self, path: &str) -> Result<DirListing, ManagerError> {
        match self.ask(NamespaceRequest::ListDir { path: path.into() }) {
            ManagerResponse::Dir(listing) => Ok(listing),
            ManagerResponse::Error(error) => Err(error),
            other => panic!("list answered {other:?}"),
        }
    }

    /// `d:name` for directories, `f:name@id` for files.
    fn names(&mut self, path: &str) -> Vec<String> {
        let listing = self.ls(path).unwrap();
        let mut names: Vec<String> = listing.dirs.iter().map(|d| format!("d:{d}")).collect();
        for (meta, _) in &listing.files {
            let name = meta.path.rsplit('/').next().unwrap();
            names.push(format!("f:{name}@{}", meta.id));
        }
        names
    }

    fn entry(&mut self, path: &str) -> Option<NamespaceEntry> {
        match self.ask(NamespaceRequest::Entry { path: path.into() }) {
            ManagerResponse::Entry(entry) => entry,
            other => panic!("entry answered {other:?}"),
        }
    }
}

#[test]
fn directories_are_made_listed_and_removed_only_when_empty() {
    let mut tree = Tree::new();
    assert!(matches!(
        tree.mkdir("a/b"),
        Err(ManagerError::NotFound(parent)) if parent == "a"
    ));
    tree.mkdir("a").unwrap();
    tree.mkdir("a/b").unwrap();
    assert!(matches!(tree.mkdir("a"), Err(ManagerError::Exists(_))));
    let file = tree.create("a/f").unwrap();
    assert_eq!(
        tree.names("a"),
        vec!["d:b".to_string(), format!("f:f@{file}")]
    );
    assert_eq!(tree.names(""), vec!["d:a".to_string()]);
    assert!(matches!(tree.rmdir("a"), Err(ManagerError::NotEmpty(_))));
    assert!(matches!(tree.rmdir("a/f"), Err(ManagerError::NotDir(_))));
    assert!(matches!(tree.ls("a/f"), Err(ManagerError::NotDir(_))));
    assert!(matches!(tree.ls("nope"), Err(ManagerError::NotFound(_))));
    assert!(matches!(tree.mkdir("a/f/g"), Err(ManagerError::NotDir(_))));
    assert!(matches!(tree.create("a/b"), Err(ManagerError::IsDir(_))));
    tree.rmdir("a/b").unwrap();
    assert_eq!(tree.entry("a/b"), None);
    assert!(matches!(tree.entry("a"), Some(NamespaceEntry::Dir { .. })));
    assert!(matches!(tree.entry(""), Some(NamespaceEntry::Dir { .. })));
}

#[test]
fn a_file_put_below_a_path_makes_its_directories() {
    let mut tree = Tree::new();
    tree.create("x/y/z").unwrap();
    assert!(matches!(tree.entry("x"), Some(NamespaceEntry::Dir { .. })));
    assert_eq!(tree.names("x"), vec!["d:y".to_string()]);
    // `x/y` is not made: it goes with its last file, like an S3 prefix.
    assert!(matches!(tree.rmdir("x/y"), Err(ManagerError::NotEmpty(_))));
}

#[test]
fn a_rename_moves_files_and_whole_directories_in_one_change() {
    let mut tree = Tree::new();
    tree.mkdir("src").unwrap();
    tree.mkdir("src/empty").unwrap();
    let one = tree.create("src/one").unwrap();
    let deep = tree.create("src/sub/deep").unwrap();
    // A neighbour whose name starts like the directory must not move with it.
    let neighbour = tree.create("src-other").unwrap();
    tree.rename("src", "dst").unwrap();
    assert_eq!(tree.entry("src"), None);
    assert_eq!(
        tree.names("dst"),
        vec![
            "d:empty".to_string(),
            "d:sub".to_string(),
            format!("f:one@{one}")
        ]
    );
    assert_eq!(tree.names("dst/sub"), vec![format!("f:deep@{deep}")]);
    match tree.entry("dst/one") {
        Some(NamespaceEntry::File { meta, .. }) => assert_eq!(meta.path, "dst/one"),
        other => panic!("dst/one is {other:?}"),
    }
    assert!(tree.names("").contains(&format!("f:src-other@{neighbour}")));
    assert!(matches!(
        tree.rename("dst", "dst/sub/in"),
        Err(ManagerError::Layout(_))
    ));
}

#[test]
fn a_rename_replaces_a_file_and_frees_its_data_but_never_a_directory() {
    let mut tree = Tree::new();
    let a = tree.create("a").unwrap();
    let b = tree.create("b").unwrap();
    tree.rename("a", "b").unwrap();
    assert_eq!(tree.names(""), vec![format!("f:b@{a}")]);
    let orphans = tree
        .manager
        .handle(ManagerRequest::Orphans { server: 1 }, tree.now);
    assert!(
        matches!(&orphans, ManagerResponse::Orphans(files) if files.contains(&b)),
        "replaced file not orphaned: {orphans:?}"
    );
    tree.mkdir("d").unwrap();
    assert!(matches!(tree.rename("b", "d"), Err(ManagerError::IsDir(_))));
    assert!(matches!(
        tree.rename("d", "b"),
        Err(ManagerError::NotDir(_))
    ));
    tree.create("e/inside").unwrap();
    assert!(matches!(
        tree.rename("d", "e"),
        Err(ManagerError::NotEmpty(_))
    ));
    assert!(matches!(
        tree.rename("nope", "x"),
        Err(ManagerError::NotFound(_))
    ));
}

#[test]
fn a_rename_that_would_push_a_path_below_past_the_limit_changes_nothing() {
    let mut tree = Tree::new();
    let long_leaf = "f".repeat(crate::PATH_BYTES_MAX - 4);
    let file = tree.create(&format!("d/{long_leaf}")).unwrap();
    let to = "e".repeat(8);
    assert!(matches!(
        tree.rename("d", &to),
        Err(ManagerError::Layout(_))
    ));
    assert_eq!(tree.names("d"), vec![format!("f:{long_leaf}@{file}")]);
    assert_eq!(tree.entry(&to), None);
}

#[test]
fn a_file_never_takes_the_place_of_a_directory_or_sits_below_a_file() {
    let mut tree = Tree::new();
    let file = tree.create("f").unwrap();
    tree.create("d/x").unwrap();
    tree.mkdir("e").unwrap();
    for (path, dir) in [("f/x", "f"), ("f/y/z", "f")] {
        assert!(
            matches!(tree.create(path), Err(ManagerError::NotDir(at)) if at == dir),
            "{path}"
        );
    }
    for path in ["d", "e"] {
        assert!(
            matches!(tree.create(path), Err(ManagerError::IsDir(_))),
            "{path}"
        );
    }
    assert_eq!(
        tree.names(""),
        vec!["d:d".to_string(), "d:e".to_string(), format!("f:f@{file}")]
    );
}

#[test]
fn dot_components_are_refused_in_every_change() {
    let mut tree = Tree::new();
    tree.create("d/f").unwrap();
    for bad in ["..", "d/..", "./d", "d/./e"] {
        assert!(
            matches!(tree.mkdir(bad), Err(ManagerError::Layout(_))),
            "{bad}"
        );
        assert!(
            matches!(tree.rename("d/f", bad), Err(ManagerError::Layout(_))),
            "{bad}"
        );
        assert!(
            matches!(tree.create(bad), Err(ManagerError::Layout(_))),
            "{bad}"
        );
    }
    assert_eq!(tree.names(""), vec!["d:d".to_string()]);
    assert_eq!(tree.names("d").len(), 1);
}

#[test]
fn times_are_kept_with_the_file_and_go_with_it() {
    let mut tree = Tree::new();
    let file = tree.create("t").unwrap();
    tree.done(NamespaceRequest::Touch {
        file,
        modified: 1_700_000_000_123_456_789,
    })
    .unwrap();
    tree.rename("t", "u").unwrap();
    let listing = tree.ls("").unwrap();
    assert_eq!(listing.files[0].1, Some(1_700_000_000_123_456_789));
    assert!(matches!(
        tree.done(NamespaceRequest::Touch {
            file: 999,
            modified: 1
        }),
        Err(ManagerError::NotFound(_))
    ));
}

impl Tree {
    fn touch_dir(&mut self, path: &str, modified: u64) -> Result<(), ManagerError> {
        self.done(NamespaceRequest::TouchDir {
            path: path.into(),
            modified,
        })
    }

    fn dir_time(&mut self, path: &str) -> Option<u64> {
        match self.entry(path) {
            Some(NamespaceEntry::Dir { times }) => times.modified,
            other => panic!("{path} is {other:?}"),
        }
    }
}

#[test]
fn directory_times_move_with_a_rename_and_go_with_a_removal() {
    let mut tree = Tree::new();
    tree.mkdir("a").unwrap();
    tree.mkdir("a/b").unwrap();
    tree.create("a/c/f").unwrap();
    assert_eq!(tree.dir_time("a"), None, "no time before one is recorded");
    tree.touch_dir("", 1).unwrap();
    tree.touch_dir("a", 2).unwrap();
    tree.touch_dir("a/b", 3).unwrap();
    tree.touch_dir("a/c", 4).unwrap();
    // A neighbour whose name starts like the directory keeps its own time.
    tree.mkdir("a-x").unwrap();
    tree.touch_dir("a-x", 5).unwrap();
    assert_eq!(tree.dir_time(""), Some(1));
    assert!(matches!(
        tree.touch_dir("a/c/f", 9),
        Err(ManagerError::NotDir(_))
    ));
    assert!(matches!(
        tree.touch_dir("nope", 9),
        Err(ManagerError::NotFound(_))
    ));
    tree.rename("a", "z").unwrap();
    assert_eq!(tree.entry("a"), None);
    assert_eq!(
        (
            tree.dir_time("z"),
            tree.dir_time("z/b"),
            tree.dir_time("z/c")
        ),
        (Some(2), Some(3), Some(4))
    );
    assert_eq!(tree.dir_time("a-x"), Some(5));
    // A directory renamed over an empty one takes its place with its own time.
    tree.mkdir("y").unwrap();
    tree.touch_dir("y", 6).unwrap();
    tree.rename("z/b", "y").unwrap();
    assert_eq!(tree.dir_time("y"), Some(3));
    // Removed and made again: no time of the old one.
    tree.rmdir("y").unwrap();
    tree.mkdir("y").unwrap();
    assert_eq!(tree.dir_time("y"), None);
}

impl Tree {
    fn set_times(&mut self, of: TimesOf, times: Times) -> Result<(), ManagerError> {
        self.done(NamespaceRequest::SetTimes { of, times })
    }

    fn times(&mut self, path: &str) -> Times {
        match self.entry(path) {
            Some(NamespaceEntry::Dir { times } | NamespaceEntry::File { times, .. }) => times,
            None => panic!("{path} is missing"),
        }
    }
}

fn times(accessed: Option<u64>, modified: Option<u64>, changed: Option<u64>) -> Times {
    Times {
        accessed,
        modified,
        changed,
    }
}

#[test]
fn access_and_change_times_are_set_apart_and_follow_the_entry() {
    let mut tree = Tree::new();
    let file = tree.create("d/f").unwrap();
    assert_eq!(tree.times("d/f"), Times::default());
    // A modification is a change.
    tree.done(NamespaceRequest::Touch { file, modified: 10 })
        .unwrap();
    assert_eq!(tree.times("d/f"), times(None, Some(10), Some(10)));
    // utimensat: access and modification given, the change time is the call's.
    let by_path = TimesOf::Path("d/f".into());
    tree.set_times(by_path.clone(), times(Some(5), Some(6), Some(20)))
        .unwrap();
    assert_eq!(tree.times("d/f"), times(Some(5), Some(6), Some(20)));
    // A read: only the access time; a rename: only the change time, by file id.
    tree.set_times(by_path, times(Some(30), None, None))
        .unwrap();
    tree.rename("d/f", "d/g").unwrap();
    tree.set_times(TimesOf::File(file), times(None, None, Some(40)))
        .unwrap();
    assert_eq!(tree.times("d/g"), times(Some(30), Some(6), Some(40)));
    // A later write keeps the access time.
    tree.done(NamespaceRequest::Touch { file, modified: 50 })
        .unwrap();
    assert_eq!(tree.times("d/g"), times(Some(30), Some(50), Some(50)));
    // Directories: the same rules, and the times move with a rename and go with rmdir.
    tree.mkdir("d/s").unwrap();
    tree.touch_dir("d/s", 60).unwrap();
    tree.set_times(TimesOf::Path("d/s".into()), times(Some(61), None, None))
        .unwrap();
    tree.rename("d", "e").unwrap();
    assert_eq!(tree.times("e/s"), times(Some(61), Some(60), Some(60)));
    tree.rmdir("e/s").unwrap();
    tree.mkdir("e/s").unwrap();
    assert_eq!(tree.times("e/s"), Times::default());
    // Nothing there: refused, nothing recorded.
    for of in [TimesOf::Path("nope".into()), TimesOf::File(999)] {
        assert!(matches!(
            tree.set_times(of, times(Some(1), Some(1), Some(1))),
            Err(ManagerError::NotFound(_))
        ));
    }
    // A removed file's times go with it.
    let again = tree.create("x").unwrap();
    tree.set_times(TimesOf::File(again), times(Some(1), None, Some(2)))
        .unwrap();
    let removed = tree
        .manager
        .handle(ManagerRequest::Remove { path: "x".into() }, tree.now);
    assert!(matches!(removed, ManagerResponse::Meta(_)), "{removed:?}");
    let dump = crate::store::dump(&tree.manager.db).unwrap();
    assert!(
        !dump
            .iter()
            .any(|line| line.starts_with(&format!("access_change {again} "))),
        "{dump:?}"
    );
}

#[test]
fn a_copy_of_the_store_carries_every_table_with_records() {
    // A replica that catches up gets a copy made table by table (`store::copy_tables`): a
    // table left out of that list would be lost on the replica without any error.
    use redb::{ReadableDatabase, TableHandle};
    let mut tree = Tree::new();
    tree.mkdir("a").unwrap();
    let file = tree.create("a/f").unwrap();
    tree.done(NamespaceRequest::Touch { file, modified: 7 })
        .unwrap();
    tree.touch_dir("a", 8).unwrap();
    let copy = tempfile::tempdir().unwrap();
    let path = copy.path().join("copy.redb");
    crate::store::copy_store(&tree.manager.db, &path).unwrap();
    let whole = crate::store::dump(&tree.manager.db).unwrap();
    let copied = crate::store::dump(&redb::Database::open(&path).unwrap()).unwrap();
    assert_eq!(copied, whole);
    let txn = tree.manager.db.begin_read().unwrap();
    for table in txn.list_tables().unwrap() {
        let name = table.name().to_string();
        let has_records =
            redb::ReadableTableMetadata::len(&txn.open_untyped_table(table).unwrap()).unwrap() > 0;
        if has_records {
            let prefix = format!("{name} ");
            assert!(
                whole.iter().any(|line| line.starts_with(&prefix)),
                "table {name} has records but is not copied or dumped"
            );
        }
    }
}

/// A model of the tree: paths to file ids, and made directories.
#[derive(Default, Debug)]
struct Model {
    files: BTreeMap<String, u64>,
    dirs: std::collections::BTreeSet<String>,
}

impl Model {
    fn is_dir(&self, path: &str) -> bool {
        let below = format!("{path}/");
        path.is_empty()
            || self.dirs.contains(path)
            || self.files.keys().any(|p| p.starts_with(&below))
            || self.dirs.iter().any(|p| p.starts_with(&below))
    }

    fn listing(&self, dir: &str) -> Vec<String> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut dirs = std::collections::BTreeSet::new();
        let mut files = Vec::new();
        for (path, id) in &self.files {
            if let Some(rest) = path.strip_prefix(&prefix) {
                match rest.split_once('/') {
                    Some((d, _)) => drop(dirs.insert(d.to_string())),
                    None => files.push(format!("f:{rest}@{id}")),
                }
            }
        }
        for path in &self.dirs {
            if let Some(rest) = path.strip_prefix(&prefix) {
                dirs.insert(rest.split('/').next().unwrap().to_string());
            }
        }
        let mut names: Vec<String> = dirs.into_iter().map(|d| format!("d:{d}")).collect();
        names.extend(files);
        names
    }
}

fn path_strategy() -> impl Strategy<Value = String> {
    proptest::collection::vec(prop_oneof!["a", "b", "a-"], 1..4).prop_map(|parts| parts.join("/"))
}

#[derive(Debug, Clone)]
enum Op {
    Create(String),
    MakeDir(String),
    RemoveDir(String),
    Rename(String, String),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        path_strategy().prop_map(Op::Create),
        path_strategy().prop_map(Op::MakeDir),
        path_strategy().prop_map(Op::RemoveDir),
        (path_strategy(), path_strategy()).prop_map(|(a, b)| Op::Rename(a, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever succeeds changes the tree as the model says; every listing agrees with the
    /// model after every step. (The model is only checked where the manager said yes; a
    /// refusal must leave the tree as it was.)
    #[test]
    fn the_tree_follows_a_model(ops in proptest::collection::vec(op_strategy(), 1..40)) {
        let mut tree = Tree::new();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Create(path) => {
                    if let Ok(id) = tree.create(&path) {
                        model.files.insert(path, id);
                    }
                }
                Op::MakeDir(path) => {
                    if tree.mkdir(&path).is_ok() {
                        model.dirs.insert(path);
                    }
                }
                Op::RemoveDir(path) => {
                    if tree.rmdir(&path).is_ok() {
                        prop_assert!(model.is_dir(&path));
                        model.dirs.remove(&path);
                    }
                }
                Op::Rename(from, to) => {
                    if tree.rename(&from, &to).is_ok() && from != to {
                        apply_rename(&mut model, &from, &to);
                    }
                }
            }
            for dir in ["", "a", "b", "a-", "a/a", "a/b", "b/a"] {
                let expected = if model.is_dir(dir) { Some(model.listing(dir)) } else { None };
                let got = tree.ls(dir).ok().map(|_| tree.names(dir));
                prop_assert_eq!(got, expected, "listing {}", dir);
            }
        }
    }
}

fn apply_rename(model: &mut Model, from: &str, to: &str) {
    if let Some(id) = model.files.remove(from) {
        model.files.insert(to.to_string(), id);
        return;
    }
    let below = format!("{from}/");
    let moved = |p: &str| format!("{to}/{}", &p[below.len()..]);
    let files: Vec<_> = model
        .files
        .iter()
        .filter(|(p, _)| p.starts_with(&below))
        .map(|(p, id)| (p.clone(), *id))
        .collect();
    for (path, id) in files {
        model.files.remove(&path);
        model.files.insert(moved(&path), id);
    }
    let dirs: Vec<_> = model
        .dirs
        .iter()
        .filter(|p| p.starts_with(&below))
        .cloned()
        .collect();
    for dir in dirs {
        model.dirs.remove(&dir);
        model.dirs.insert(moved(&dir));
    }
    model.dirs.remove(from);
    model.dirs.remove(to);
    model.dirs.insert(to.to_string());
}
